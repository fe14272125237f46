from __future__ import annotations

from pathlib import Path

import typer

from tileship.cli._common import console, escape, handle_errors


def register(app: typer.Typer) -> None:
    @app.command("keygen")
    @handle_errors
    def keygen(path: Path = typer.Argument(...,
                                           help="private key path; the public key is written to PATH.pub")) -> None:
        """Create an ed25519 signing key pair. Never overwrites a key; a private key left without its
        public key (a keygen killed between the two) gets the public key written from it."""
        from tileship.release.keys import complete_pair, generate_key, public_path

        if path.is_file() and not public_path(path).exists():
            pub = complete_pair(path)
            console.print(f"[yellow]completed[/] {path}: its public key was missing (an interrupted keygen?); "
                          f"wrote {pub} from it")
            return
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
                trusted_key: list[Path] = typer.Option([], help="require a signature by one of these public keys "
                                                           "(default: $TILESHIP_TRUSTED_KEYS, as `load`)"),
                trusted_verifier_key: list[Path] = typer.Option([], help="verifier keys the evidence must be signed by "
                                                                    "(default: $TILESHIP_TRUSTED_VERIFIER_KEYS, as "
                                                                    "`load`)")) -> None:
        """Check a release exactly as `load` does (paths, file types, hashes, signature) without loading it.

        Prints "intact" only after every check passed; exits 1 on the first failure, naming the file.
        The evidence line says what `load` makes of the evidence (verified, unchecked, ignored and why).
        """
        from tileship.release.evidence_seal import open_evidence
        from tileship.release.integrity import check

        checked = check(release, trusted_keys=trusted_key or None)
        _, seal = open_evidence(checked.root, checked.release_id, checked.manifest["files"],
                                trusted_verifier_key or None)
        for warning in checked.warnings:
            console.print(f"[yellow]warning[/]: {escape(str(warning))}")
        if checked.key_id:
            console.print(f"[green]signature ok[/]: {checked.key_id}")
        style = "yellow" if seal.state == "ignored" else "dim"
        console.print(f"[{style}]evidence {seal.state}[/]: {escape(str(seal.reason))} (digest {seal.label})")
        console.print(f"[green]intact[/]: release {checked.release_id}, {len(checked.manifest['files'])} files")
