from __future__ import annotations

from pathlib import Path

import typer

from tileship.cli._common import ProjectOption, console, handle_errors, resolve_project


def register(app: typer.Typer) -> None:
    @app.command("lock")
    @handle_errors
    def lock(
        project: ProjectOption = None,
        out: Path = typer.Option(Path("tileship.lock"), "--out", "-o", help="where to write the lock"),
        image_digest: str | None = typer.Option(None, help="container image digest, sha256:<hex>"),
    ) -> None:
        """Write the lock: toolchain, native-lib hashes, device, kernel revision, shapes, fallbacks."""
        from tileship.build import pins
        from tileship.build.lock import capture_environment, dump_lock, kernel_revision, make_lock, write_lock
        from tileship.build.sources import collect
        from tileship.declare.project import load_operators, revision_root, source_digest
        from tileship.declare.spec import describe

        proj = resolve_project(project)
        ops = load_operators(proj)
        collected = {n: collect(o, proj.root) for n, o in ops.items()}
        descs = {n: {**describe(o), "reference_imports": collected[n][1], pins.KEY: pins.pin(o, collected[n][0])}
                 for n, o in ops.items()}
        lk = make_lock(env=capture_environment(), revision=kernel_revision(revision_root(proj, ops)),
                       sources=source_digest(ops), operators=descs, targets=list(proj.targets),
                       model={"name": proj.model, "version": proj.model_version}, image_digest=image_digest)
        write_lock(lk, out)
        summary = {k: lk[k] for k in ("kernel_revision", "framework", "device_arch", "image_digest")}
        console.print(dump_lock(summary).rstrip())
        console.print(f"[green]wrote[/] {out} ({len(ops)} operators)")
