"""Shared CLI helpers: project resolution, error printing."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console

from tileship.errors import TileshipError

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(fn: F) -> F:
    """Print a TileshipError (message + hint) and exit 1 instead of a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TileshipError as exc:
            err_console.print(f"[bold red]error[/]: {exc.message}")
            if exc.hint:
                err_console.print(f"  [dim]hint: {exc.hint}[/]")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def resolve_project(project: Path | None) -> Any:
    from tileship.declare.project import find_project

    return find_project(project)


def default_out() -> Path:
    from tileship import env

    return env.home() / "builds"
