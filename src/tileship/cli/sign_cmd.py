from __future__ import annotations

from pathlib import Path

import typer

from tileship.cli._common import console, handle_errors


def register(app: typer.Typer) -> None:
    @app.command("keygen")
    @handle_errors
    def keygen(path: Path = typer.Argument(...,
                                           help="private key path; the public key is written to PATH.pub")) -> None:
        """Create an ed25519 signing key pair."""
        from tileship.release.bundle import generate_key

        pub = generate_key(path)
        console.print(f"[green]wrote[/] {path} (private, 0600) and {pub}")

    @app.command("sign")
    @handle_errors
    def sign(release: Path, key: Path = typer.Option(..., help="ed25519 private key (PEM)")) -> None:
        """Sign a release's manifest (after checking every file's hash)."""
        from tileship.release.bundle import sign as do_sign

        kid = do_sign(release, key)
        console.print(f"[green]signed[/] {release} with {kid}")

    @app.command("inspect")
    @handle_errors
    def inspect(release: Path,
                trusted_key: list[Path] = typer.Option([],
                                                       help="require a signature by one of these public keys")) -> None:
        """Check a release's integrity (and signature) without loading it."""
        from tileship.release.bundle import check_integrity, load_public_key, verify_signature

        manifest = check_integrity(release)
        console.print(f"[green]intact[/]: release {manifest['release_id']}, {len(manifest['files'])} files")
        if trusted_key:
            kid = verify_signature(release, [load_public_key(k) for k in trusted_key])
            console.print(f"[green]signature ok[/]: {kid}")
