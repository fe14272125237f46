from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from tileship.cli._common import console, escape, handle_errors


def register(app: typer.Typer) -> None:
    @app.command("check")
    @handle_errors
    def check(lock: Path = typer.Argument(Path("tileship.lock"), help="a lock file, or a release directory"),
              toolchain: Path | None = typer.Option(None, help="a toolchain venv to compare with the lock's")) -> None:
        """Compare the running environment with a lock. Exit 1 on blocking drift, 0 otherwise.

        Blocking: a reference module that differs from the one the release pinned (the fallback
        changed since verification: `load` refuses it), TileLang version, its native-lib hashes,
        apache-tvm-ffi, platform, GPU arch (the compiled artifacts depend on them). Informational:
        Python, torch, nvcc, z3, C++ compiler, driver, GPU name/SM count (not inside the
        artifacts; they change references, rebuilds or speed evidence). A lock built with
        ``--toolchain`` names its wheels: a toolchain that differs (or none) is reported with
        what it means for a rebuild.
        """
        from tileship.build import pins
        from tileship.build.lock import RULES, DriftReport, capture_environment, compare, read_lock

        path = lock / "tileship.lock" if lock.is_dir() else lock
        data = read_lock(path)
        with _sources_first(lock / "sources" if lock.is_dir() else None):  # as `load` imports them
            references = pins.compare(pins.lock_pins(data))
        report = DriftReport(compare(data, capture_environment()).differences + references)
        from tileship.cli.toolchain_cmd import print_toolchain_drift

        print_toolchain_drift(data, toolchain)
        if not report.differences:
            console.print(f"[green]no drift[/]: the running environment matches {path}")
            return
        for d in report.differences:
            style = "bold red" if d.blocking else "yellow"
            console.print(f"[{style}]{'BLOCKING' if d.blocking else 'info'}[/] "
                          + escape(f"{d.field}: locked {d.locked!r} -> running {d.current!r}\n    {d.consequence}"))
        blocking = sorted(f for f, (b, _) in RULES.items() if b)
        console.print(f"[dim]blocking fields: {', '.join(blocking)}[/]")
        if any(d.blocking for d in references):
            console.print(f"[bold red]reference drift[/]: {pins.CONSEQUENCE}; `load` refuses this release "
                          "(TILESHIP_ALLOW_REFERENCE_DRIFT=1 serves it anyway)")
        if any(d.blocking for d in report.differences if d not in references):
            console.print("[bold red]blocking drift[/]: compiled artifacts are not trusted here; "
                          "serving will use the reference")
        if report.blocking:
            raise typer.Exit(1)
        console.print("[green]only informational drift[/]: artifacts remain trusted")


@contextmanager
def _sources_first(sources: Path | None) -> Iterator[None]:
    """A release's shipped sources first on ``sys.path`` while the pins are compared."""
    if sources is None or not sources.is_dir() or str(sources) in sys.path:
        yield
        return
    sys.path.insert(0, str(sources))
    try:
        yield
    finally:
        sys.path.remove(str(sources))
