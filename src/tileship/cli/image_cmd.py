"""``tileship image``: a Dockerfile and build context per CUDA version for one release."""

from __future__ import annotations

from pathlib import Path

import typer

from tileship.cli._common import console, handle_errors


def register(app: typer.Typer) -> None:
    @app.command("image")
    @handle_errors
    def image(
        release: Path = typer.Argument(..., help="a release directory"),
        requirements: Path = typer.Option(..., "--requirements", "-r", help="hash-locked serving requirements"),
        wheel: Path = typer.Option(..., help="the tileship wheel to install (pip wheel --no-deps -w dist .)"),
        cuda: str = typer.Option("13.0.88", help="CUDA version the image is for"),
        base: str | None = typer.Option(None, help="CUDA runtime base image, name@sha256:<64 hex>"),
        known_digests: Path | None = typer.Option(None,
                                                  help='JSON {"<cuda>": {"ref": ..., "apt": {...}}} of known bases'),
        apt: list[str] = typer.Option([], help="apt package pinned as name=version (with --base)"),
        out: Path = typer.Option(Path("image"), "--out", "-o", help="the build context directory"),
    ) -> None:
        """Write a Dockerfile + .dockerignore build context for RELEASE. No image is built here: build it
        elsewhere, then record its digest with `tileship publish RELEASE --image-digest`."""
        from tileship.errors import BuildError
        from tileship.release.image import BaseImage, known_base, write_context

        if (base is None) == (known_digests is None):
            raise BuildError("give exactly one of --base and --known-digests")
        pins = dict(a.split("=", 1) for a in apt if "=" in a)
        if len(pins) != len(apt):
            raise BuildError(f"--apt takes name=version, got {apt}")
        img = BaseImage(base, pins) if base else known_base(known_digests, cuda)  # type: ignore[arg-type]
        path = write_context(release, out, img, cuda=cuda, requirements=requirements, wheel=wheel)
        console.print(f"[green]wrote[/] {path} (+ .dockerignore, release/, requirements-serve.txt, {wheel.name})")
        console.print("[dim]this machine has no container engine: build and push it elsewhere, then pin its digest[/]")
