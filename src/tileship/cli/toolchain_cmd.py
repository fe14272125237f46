"""``tileship toolchain lock | create | check``: the hermetic build toolchain."""

from __future__ import annotations

from pathlib import Path

import typer

from tileship.cli._common import console, escape, handle_errors

LOCK_HELP = "the project's lock (or a release directory): TileLang, apache-tvm-ffi, z3 and nvcc versions"


def default_dir(cuda: str) -> Path:
    from tileship import env

    return env.home() / "toolchain" / f"cuda-{cuda}"


def default_requirements(cuda: str) -> Path:
    return Path(f"toolchain-cuda{cuda}.txt")


def _lock(path: Path) -> dict:
    from tileship.build.lock import read_lock

    return read_lock(path / "tileship.lock" if path.is_dir() else path)


def register(app: typer.Typer) -> None:
    tc_app = typer.Typer(no_args_is_help=True,
                         help="The hermetic build toolchain: a hash-locked venv with the CUDA compiler as wheels.")
    app.add_typer(tc_app, name="toolchain")

    @tc_app.command("lock")
    @handle_errors
    def lock_cmd(
        lock: Path = typer.Option(Path("tileship.lock"), "--lock", help=LOCK_HELP),
        cuda: str | None = typer.Option(None, help="nvcc version (default: the lock's backend.nvcc)"),
        out: Path | None = typer.Option(None, "--out", "-o", help="default: toolchain-cuda<VERSION>.txt"),
    ) -> None:
        """Resolve the lock's toolchain with pip-tools into a hash-locked requirements file."""
        from tileship.build.toolchain import compile_requirements, cuda_of, pins

        top = pins(_lock(lock), cuda)
        version = cuda_of("\n".join(top)) or ""
        dest = out or default_requirements(version)
        text = compile_requirements(top, dest)
        n = sum(1 for line in text.splitlines() if "==" in line)
        console.print(f"[green]wrote[/] {dest}: {n} distributions, each pinned with its sha256 (CUDA {version})")

    @tc_app.command("create")
    @handle_errors
    def create_cmd(
        requirements: Path | None = typer.Option(None, "--requirements", "-r",
                                                 help="hash-locked file (default: toolchain-cuda<V>.txt)"),
        lock: Path = typer.Option(Path("tileship.lock"), "--lock", help=LOCK_HELP + "; used to make a missing file"),
        cuda: str | None = typer.Option(None, help="nvcc version (default: the lock's)"),
        directory: Path | None = typer.Option(None, "--dir", help="the venv (default .tileship/toolchain/cuda-<V>)"),
    ) -> None:
        """Create the toolchain venv with `pip install --require-hashes` (locking first if needed)."""
        from tileship.build.toolchain import compile_requirements, create, cuda_of, pins

        if requirements is None or not requirements.is_file():
            top = pins(_lock(lock), cuda)
            requirements = requirements or default_requirements(cuda_of("\n".join(top)) or "")
            compile_requirements(top, requirements)
            console.print(f"[green]locked[/] {requirements}")
        version = cuda_of(requirements.read_text()) or "unknown"
        tc = create(directory or default_dir(version), requirements)
        rec = tc.record() or {}
        console.print(f"[green]created[/] {tc.root}: {len(rec.get('wheels', {}))} wheels, hash-checked; "
                      f"nvcc {tc.nvcc_version()} at {tc.nvcc}")
        console.print(f"build with: tileship build --toolchain {tc.root}")

    @tc_app.command("check")
    @handle_errors
    def check_cmd(
        directory: Path = typer.Argument(..., help="the toolchain venv"),
        lock: Path | None = typer.Option(None, "--lock", help="compare with this lock's (or release's) toolchain entry "
                                         "instead of the venv's own install record"),
    ) -> None:
        """Compare a toolchain with a lock (or its own hash-checked install). Exit 1 on any difference."""
        from tileship.build.toolchain import Toolchain, compare

        tc = Toolchain(directory)
        locked = _lock(lock).get("toolchain") if lock else tc.record()
        if lock and not locked:
            console.print(f"[yellow]{lock} records no toolchain[/] (not built with `tileship build --toolchain`)")
            raise typer.Exit(1)
        diffs = compare(locked or {"cuda": None}, tc)
        for d in diffs:
            console.print("[bold red]differs[/] " + escape(f"{d.field}: locked {d.locked!r} -> here {d.current!r}\n"
                                                         f"    {d.consequence}"))
        if diffs:
            raise typer.Exit(1)
        n = len((locked or {}).get("wheels", {}))
        console.print(f"[green]toolchain matches[/]: {n} wheels, nvcc {tc.nvcc_version()}")


def print_toolchain_drift(lock: dict, directory: Path | None) -> None:
    """For ``tileship check``: how the build toolchain here differs from the lock's (informational:
    the artifacts are already built; each line says what it means for a rebuild)."""
    if not lock.get("toolchain"):
        return
    from tileship.build.toolchain import Toolchain, compare

    diffs = compare(lock["toolchain"], Toolchain(directory) if directory else None)
    for d in diffs:
        console.print("[yellow]toolchain[/] " + escape(f"{d.field}: locked {d.locked!r} -> here {d.current!r}\n"
                                                         f"    {d.consequence}"))
    if not diffs:
        console.print(f"[green]toolchain matches the lock[/]: {len(lock['toolchain'].get('wheels', {}))} wheels")
