from __future__ import annotations

import os
from pathlib import Path

import typer

from tileship.cli._common import console, handle_errors


def register(app: typer.Typer) -> None:
    @app.command("demo")
    @handle_errors
    def demo(
        out: Path = typer.Option(Path(".tileship/demo"), "--out", "-o", help="where the lock and the release go"),
        jobs: int = typer.Option(os.cpu_count() or 1, "--jobs", "-j"),
        cpu_only: bool = typer.Option(False, help="build only the CPU (\"c\") target"),
    ) -> None:
        """The pipeline on the built-in catalog: lock -> build (CUDA sm_90a with nvcc, and CPU)
        -> load (no JIT) -> call every specialization this machine can run vs its reference."""
        import dataclasses

        from rich.table import Table

        from tileship.build.lock import dump_lock
        from tileship.cli.build_cmd import run_build
        from tileship.declare.project import builtin_project
        from tileship.release.atomic_file import write_file
        from tileship.runtime.loader import load
        from tileship.verify.demo import exercise

        out.mkdir(parents=True, exist_ok=True)
        proj = builtin_project()
        if cpu_only:
            proj = dataclasses.replace(proj, targets=("c",))
        project_file = out / "tileship.toml"
        write_file(project_file,  # whole at any kill; a symlinked file stays a link, its mode kept
            f'model = "{proj.model}"\nmodel_version = "{proj.model_version}"\n'
            f"operators = {list(proj.operator_modules)!r}\ntargets = {list(proj.targets)!r}\n".replace("'", '"'))
        console.rule("[bold]1. lock + build")
        result = run_build(project_file, out / "releases", jobs, 600.0, None, None)
        write_file(out / "tileship.lock", (result.path / "tileship.lock").read_bytes())  # type: ignore[attr-defined]
        console.rule("[bold]2. load (no JIT)")
        release = load(result.path)  # type: ignore[attr-defined]
        lock_view = {k: release.lock[k] for k in ("kernel_revision", "framework", "device_arch")}
        console.print(dump_lock(lock_view).rstrip())
        console.print(f"release {release.release_id}: loaded {len(release.load_seconds) - 1} specializations in "
                      f"{release.load_seconds['__total__'] * 1e3:.0f} ms; drift: {release.drift.reason}")
        for note in release.notes:
            console.print(f"[yellow]note[/]: {note}")
        console.rule("[bold]3. call every specialization vs its reference")
        rows = exercise(release)
        table = Table()
        for col in ("specialization", "called with", "path", "reason", "max |err|", "check"):
            table.add_column(col)
        bad = 0
        for r in rows:
            ok = r["ok"]
            bad += ok is False
            check = "[green]ok[/]" if ok else ("[red]MISMATCH[/]" if ok is False else "[dim]-[/]")
            table.add_row(r["spec_id"], r["dims"], r["path"], r["reason"], r["err"], check)
        console.print(table)
        from tileship.runtime import nojit

        console.print(f"compile attempts while serving: {nojit.attempts()}; counters: {release.counters()}")
        if bad:
            raise typer.Exit(1)
