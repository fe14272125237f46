from __future__ import annotations

import os
from pathlib import Path

import typer

from tileship.cli._common import (
    BuildOutOption,
    JobsOption,
    ProjectOption,
    console,
    default_out,
    escape,
    handle_errors,
    resolve_project,
)


def run_build(project: Path | None, out: Path | None, jobs: int, timeout: float, sign: Path | None,
              image_digest: str | None, toolchain: Path | None = None, ray: bool = False,
              ray_address: str | None = None) -> object:
    """Build with a progress bar and print the summary. Returns the BuildResult. With ``ray`` (or
    a ``ray_address``) every specialization compiles as a task on that Ray cluster (the farm
    draws its own progress: done, running, failed, per node)."""
    from contextlib import nullcontext

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from tileship.build.builder import BuildOptions, build
    from tileship.build.toolchain import Toolchain
    from tileship.declare.project import load_operators, specializations

    proj = resolve_project(project)
    ops = load_operators(proj)
    total = len(specializations(proj, ops))
    tc = Toolchain(toolchain) if toolchain else None
    farm = None
    if ray or ray_address:
        from tileship.build.ray_farm import RayFarm, require_ray

        require_ray()  # BuildError naming the extra, before anything is locked or shipped
        farm = RayFarm(address=ray_address, progress=True)
    with (nullcontext() if farm else Progress(TextColumn("[bold]building[/]"), BarColumn(), MofNCompleteColumn(),
                                              TimeElapsedColumn(), TextColumn("{task.description}"), console=console,
                                              transient=False)) as progress:
        task = progress.add_task("", total=total) if progress else None

        def tick(r: object) -> None:
            progress.update(task, advance=1, description=f"{r.spec.id} {'ok' if r.ok else 'FAILED'}")  # type: ignore[attr-defined,union-attr,arg-type]

        result = build(proj, ops, out or default_out(),
                       BuildOptions(jobs=jobs, timeout_s=timeout, sign_key=sign, image_digest=image_digest,
                                    on_progress=None if farm else tick, toolchain=tc, ray=farm))
    for line in result.recovered:
        console.print(f"[yellow]recovered[/]: {line}")
    table = Table(title=f"release {result.release_id}")
    for col in ("specialization", "status", "seconds", "error"):
        table.add_column(col)
    for r in result.results:
        table.add_row(r.spec.id, "[green]built[/]" if r.ok else "[red]failed[/]", f"{r.seconds:.1f}",
                      (r.error or "")[:90])
    console.print(table)
    console.print(f"{len(result.built)} built, {len(result.failed)} failed in {result.seconds:.1f} s -> {result.path}"
                  + (f" (signed by {result.key_id})" if result.key_id else ""))
    if result.failed:
        from tileship.release.diagnostics import capture_build

        try:
            ref = capture_build(result.path)
            if ref is not None:
                console.print(f"[yellow]diagnostics {ref.id}[/]: compiler commands and logs of the failures "
                              f"-> {ref.archive}")
        except OSError as exc:
            console.print(f"[yellow]no diagnostics bundle[/]: {escape(str(exc))}")
    return result


def register(app: typer.Typer) -> None:
    @app.command("build")
    @handle_errors
    def build_cmd(
        project: ProjectOption = None,
        out: BuildOutOption = None,
        jobs: JobsOption = os.cpu_count() or 1,
        timeout: float = typer.Option(300.0, help="seconds before one specialization's compile is killed"),
        sign: Path | None = typer.Option(None, help="ed25519 private key (PEM) to sign the manifest with"),
        image_digest: str | None = typer.Option(None, help="container image digest to pin, sha256:<hex>"),
        toolchain: Path | None = typer.Option(None, help="compile in this hermetic toolchain venv (`tileship toolchain "
                                              "create`): its locked wheels' nvcc and headers, never the system's"),
        ray: bool = typer.Option(False, "--ray", help="compile each specialization as a task on a Ray cluster "
                                 "(a local one unless --ray-address or RAY_ADDRESS names one); "
                                 "needs `pip install 'tileship[ray]'`"),
        ray_address: str | None = typer.Option(None, "--ray-address", help="the Ray cluster to build on, e.g. "
                                               "HOST:6379 or ray://HOST:10001 (implies --ray); see docs/ray.md"),
    ) -> None:
        """Compile every (operator x shape x target) ahead of time into a release bundle.

        Exit 0: all built. Exit 2: some failed (the release holds the rest; failures are in
        build-log.json with compiler commands and logs). Exit 1: nothing could be built.
        """
        result = run_build(project, out, jobs, timeout, sign, image_digest, toolchain, ray, ray_address)
        if not result.built:  # type: ignore[attr-defined]
            raise typer.Exit(1)
        if result.failed:  # type: ignore[attr-defined]
            raise typer.Exit(2)

    @app.command("pack")
    @handle_errors
    def pack(release: Path, output: Path | None = typer.Option(None, "--output", "-o")) -> None:
        """Pack a release directory into one reproducible .tar.gz (integrity checked first)."""
        from tileship.release.bundle import pack as do_pack

        dest = output or Path(f"{release.name}.tileship.tar.gz")
        do_pack(release, dest)
        console.print(f"[green]packed[/] {release} -> {dest}")
