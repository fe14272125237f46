"""Shared CLI helpers: project resolution, error printing, the options several commands take."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from tileship.errors import TileshipError

#: what commands print goes through rich markup: text from outside (messages, reasons, paths) through
#: ``escape``, so that "[tool.tileship]" prints as written and a "[/" cannot raise
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)  # an error line keeps its paths whole
F = TypeVar("F", bound=Callable[..., Any])

#: exit statuses of the commands that measure a release (``verify``, ``tune``), as ``build``'s: 0 everything
#: measured passed; ``EXIT_ERROR`` the command could not run (``handle_errors``: nothing to verify or tune on this
#: machine, a release that is not intact, blocking drift); ``EXIT_SOME_FAILED`` it ran and stored its evidence, but
#: some specialization or group failed (the reference serves them; the last lines name them)
EXIT_ERROR = 1
EXIT_SOME_FAILED = 2

#: ``--project``: the project a command reads (``tileship.declare.project.find_project``)
ProjectOption = Annotated[Path | None, typer.Option(help="tileship.toml / pyproject.toml (default: search from cwd, "
                                                         "else the built-in catalog)")]
#: ``--out`` and ``--jobs`` of the commands that build (``build``, ``promote``)
BuildOutOption = Annotated[Path | None, typer.Option("--out", "-o", help="releases are written to OUT/<release id> "
                                                                         "(default .tileship/builds)")]
JobsOption = Annotated[int, typer.Option("--jobs", "-j", min=1, help="parallel compiles")]
#: the release directory that ``verify``, ``tune`` and ``explain`` read their evidence from
ReleaseDir = Annotated[Path, typer.Argument(help="release directory")]
#: ``--limit``: how far ``verify`` and ``tune`` go into a ``T.dynamic`` range
LimitOption = Annotated[int | None, typer.Option(help="cap on T.dynamic sizes (default: up to the declared maximum)")]
#: ``--verifier-key``: who signs the evidence ``verify`` and ``tune`` write
VerifierKeyOption = Annotated[Path | None, typer.Option(help="ed25519 private key of the verifier role that signs the "
                                                             "evidence (default: $TILESHIP_VERIFIER_KEY; none: "
                                                             "unsigned)")]


class Device(StrEnum):
    """``--device``: which specializations a command runs on this machine."""

    all = "all"
    cuda = "cuda"
    cpu = "cpu"

    def devices(self) -> tuple[str, ...]:
        return ("cuda", "cpu") if self is Device.all else (self.value,)


#: ``--device`` of ``verify`` and ``tune``
DeviceOption = Annotated[Device, typer.Option(help="run the cuda, cpu or all specializations this machine can run")]
#: ``--seeds`` of ``verify`` and ``tune`` (the default is each command's), read with ``parse_seeds``
SeedsOption = Annotated[str, typer.Option(help="comma-separated base seeds of the correctness check; each shape "
                                               "gets fresh inputs per seed")]


def parse_seeds(seeds: str) -> tuple[int, ...]:
    """``--seeds 0,1,2`` -> (0, 1, 2). Raises BadParameter on a non-integer or an empty list."""
    try:
        out = tuple(int(s) for s in seeds.split(",") if s.strip())
    except ValueError:
        raise typer.BadParameter(f"{seeds!r}: expected comma-separated integers", param_hint="--seeds") from None
    if not out:
        raise typer.BadParameter("at least one seed is needed", param_hint="--seeds")
    return out


def handle_errors(fn: F) -> F:
    """Print a TileshipError (message + hint), or an OSError with the file it names (a folder that does not
    exist, no permission, a full disk), and exit 1 instead of a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TileshipError as exc:
            err_console.print(f"[bold red]error[/]: {escape(exc.message)}")
            if exc.hint:
                err_console.print(f"  [dim]hint: {escape(exc.hint)}[/]")
            raise typer.Exit(EXIT_ERROR) from None
        except OSError as exc:
            where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
            what = f"{where}: {exc.strerror or exc}" if where else str(exc.strerror or exc)
            err_console.print(f"[bold red]error[/]: {escape(what)}")
            raise typer.Exit(EXIT_ERROR) from None

    return wrapper  # type: ignore[return-value]


def resolve_project(project: Path | None) -> Any:
    from tileship.declare.project import find_project

    return find_project(project)


def default_out() -> Path:
    from tileship import env

    return env.home() / "builds"
