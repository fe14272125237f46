"""``tileship diagnose`` (a diagnostics bundle on demand) and ``tileship drill`` (rollback rehearsal)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tileship.cli._common import console, err_console, escape, handle_errors
from tileship.cli.registry_cmd import REGISTRY_HELP

if TYPE_CHECKING:
    from tileship.errors import TileshipError


def _release_dir(release: str | None, registry: Path | None,
                 activator_keys: list[Path] | None = None) -> tuple[Path, str | None, str | None]:
    """(the release directory, the evidence pin a load expects: the registry's, for the active release, the id the
    registry names the copy by: None for a directory given by path). The
    active release is followed as a server follows it: with trusted activator keys (``activator_keys``, None:
    ``TILESHIP_TRUSTED_ACTIVATOR_KEYS``) its pointer must be sealed by one and not expired (else
    PointerSignatureError); an expiry less than a day away is warned of."""
    from tileship.errors import RegistryError
    from tileship.release import pointer_expiry, pointer_seal
    from tileship.release.registry import Registry

    if release is not None and Path(release).is_dir():
        return Path(release), None, None
    reg = Registry(registry)
    if release is not None:
        rid = reg.resolve(release)
        return reg.path_of(rid), None, rid
    active, _ = pointer_seal.active_checked(reg.root, pointer_seal.trusted(activator_keys))
    if (warning := pointer_expiry.soon(active.expires)) is not None:  # checked where keys are trusted
        err_console.print(f"[yellow]warning[/]: {escape(warning)}")
    if active.path is None:
        raise RegistryError(f"no RELEASE given and registry {reg.root} has no active release",
                            hint="pass a release directory or id")
    return active.path, active.evidence, active.release_id


def _other_release(path: Path, named: str | None) -> TileshipError | None:
    """A BundleIntegrityError naming both ids when the registry's copy at ``path``, named ``named``, holds another
    release (replaced or renamed: activate, rollback and a server following the registry refuse it); else None."""
    from tileship.errors import BundleIntegrityError
    from tileship.serve.source import release_id_at

    held = release_id_at(path)
    if named is None or held is None or held == named:  # an unreadable manifest: the load says what is wrong
        return None
    return BundleIntegrityError(f"{path}: holds release {held}, not {named} as the registry names it (the copy was "
                                "replaced or renamed); activate, rollback and a server following the registry refuse "
                                "it", path=str(path),
                                hint=f"publish release {named} again (tileship publish --replace) or activate another")


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    @handle_errors
    def diagnose(
        release: str | None = typer.Argument(None, help="a release directory or a registry release id "
                                             "(default: the active release)"),
        spec: str | None = typer.Option(None, "--spec",
                                        help="one specialization id (default: those in trouble, else all)"),
        out: Path | None = typer.Option(None, "--out", "-o",
                                        help="where bundles go (default: $TILESHIP_HOME/diagnostics)"),
        load: bool = typer.Option(True, help="load the release here too, recording load errors, drift and routing "
                                  "decisions"),
        registry: Path | None = typer.Option(None, "--registry", help=REGISTRY_HELP),
        trusted_activator_key: list[Path] = typer.Option([], help="ed25519 public key(s) of the activator role: "
                                                         "the active release is taken only from a pointer sealed by "
                                                         "one (default: $TILESHIP_TRUSTED_ACTIVATOR_KEYS)"),
    ) -> None:
        """Write a diagnostics bundle: kernel sources, SASS/PTX, compiler commands and logs, the
        lock next to this environment, nvidia-smi -q, and (with --load) what loading does here."""
        from tileship.errors import TileshipError
        from tileship.release import diagnostics

        path, pin, named = _release_dir(release, registry, trusted_activator_key or None)
        target: object = path
        reason = "on_demand"
        if (failure := _other_release(path, named)) is not None:  # loaded as the id it claims, it would look healthy
            reason = "wrong_release"
            err_console.print(f"[yellow]the registry's copy holds another release[/]: {escape(failure.message)}")
        elif load:
            from tileship.runtime.loader import load as do_load

            try:
                target = do_load(path, expect_evidence_digest=pin)  # as a server following the registry
            except TileshipError as exc:  # a release that will not load is exactly what to diagnose
                failure, reason = exc, "load_refused"
                err_console.print(f"[yellow]the release does not load here[/]: {escape(exc.message)}")
        ref = diagnostics.capture(target, spec_id=spec, exc=failure, out_dir=out, reason=reason)
        console.print(f"[green]diagnostics {ref.id}[/]\n  {ref.path}/\n  {ref.archive}")

    @app.command("drill")
    @handle_errors
    def drill(
        registry: Path | None = typer.Option(None, "--registry", help=REGISTRY_HELP),
        new: str | None = typer.Option(None, "--new", help="release N (default: the active one)"),
        old: str | None = typer.Option(None, "--old", help="release N-1 (default: the one rollback would return to)"),
        out: Path = typer.Option(Path("drill-report"), "--out", "-o",
                                 help="where drill.json, drill.txt, server.log go"),
        url: str | None = typer.Option(None, help="use a running server that follows REGISTRY instead of starting one"),
        port: int = typer.Option(0, min=0, max=65535, help="port for the started server (0: a free one)"),
        phase_seconds: float = typer.Option(5.0, help="seconds of load in each phase"),
        concurrency: int = typer.Option(4, help="concurrent clients (closed loop: one request in flight each)"),
        op: list[str] = typer.Option([], "--op", help="operators to load (default: all that both releases serve)"),
        per_op: int = typer.Option(4, help="request shapes per operator"),
        max_request_mib: float = typer.Option(48.0, help="skip request shapes larger than this"),
        server_arg: list[str] = typer.Option([], "--server-arg",
                                             help="extra argument for `tileship serve` (repeatable)"),
        startup_timeout: float = typer.Option(600.0, help="seconds to wait for the server to become ready"),
    ) -> None:
        """Rehearse a rollback under load: N -> N-1 -> reference -> N through the registry and
        POST /v2/repository/reload; every answer checked against the reference. Exit 0 only
        when no request failed, was dropped, answered wrongly or came from the wrong release."""
        from tileship.release.registry import default_root
        from tileship.verify.drill import DrillOptions, run_drill

        if phase_seconds <= 0 or concurrency < 1 or per_op < 1 or max_request_mib <= 0:
            raise typer.BadParameter("--phase-seconds and --max-request-mib must be > 0; "
                                     "--concurrency and --per-op >= 1")
        opts = DrillOptions(registry=registry or default_root(), new=new, old=old, out_dir=out, url=url, port=port,
                            server_args=tuple(server_arg), phase_seconds=phase_seconds, concurrency=concurrency,
                            ops=tuple(op), per_op=per_op, max_request_bytes=int(max_request_mib * (1 << 20)),
                            startup_timeout_s=startup_timeout)
        report = run_drill(opts)
        typer.echo((out / "drill.txt").read_text(), nl=False)
        console.print(f"report: {out / 'drill.json'}, {out / 'drill.txt'}")
        if not report["passed"]:
            raise typer.Exit(1)
