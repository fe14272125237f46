"""``tileship releases | publish | activate | rollback | gc``: the release registry (each says the evidence pin;
``releases``, ``activate`` and ``rollback`` also the pointer's generation and the activator key that sealed it,
which ``releases`` checks against trusted activator keys and shows, not refuses)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tileship.cli._common import console, escape, handle_errors

if TYPE_CHECKING:
    from tileship.release.registry import Active, Registry

REGISTRY_HELP = "registry directory (default: $TILESHIP_HOME/registry, i.e. ./.tileship/registry)"
SIGN_KEY_HELP = ("ed25519 private key of the activator role that seals the new active.json, which a server with "
                 "--trusted-activator-key requires (default: $TILESHIP_ACTIVATOR_KEY; none: unsigned)")
VALID_FOR_HELP = ("how long the sealed pointer stays valid, e.g. 7d, 12h, 30m (w d h m s): it states `expires` and "
                  "readers that check the seal refuse it after; activating the active release again refreshes it "
                  "(default: $TILESHIP_POINTER_VALID_FOR; none: no expiry). Needs an activator key")


def _registry(path: Path | None, sign_key: Path | None = None, valid_for: str | None = None) -> Registry:
    from tileship.release.pointer_expiry import parse_duration
    from tileship.release.registry import Registry

    return Registry(path, activator_key=sign_key, valid_for=parse_duration(valid_for) if valid_for else None)


def _pin_text(pin: str | None) -> str:
    """An evidence pin (``Active.evidence``) in words."""
    if pin is None:
        return "not pinned (the pointer predates evidence pins: nothing is checked; activate again to pin)"
    return "none (the release has no evidence; evidence added later is ignored)" if pin == "none" else pin


def _say_active(a: Active) -> None:
    from tileship.release.pointer_expiry import soon

    mode = " [yellow](reference only: every operator on its PyTorch reference)[/]" if a.reference_only else ""
    prev = f"; rollback would return to {a.previous}" if a.previous else ""
    console.print(f"[green]active[/]: {a.release_id}{mode}{prev}")
    console.print(f"evidence pinned: {_pin_text(a.evidence)}")
    seal = f"sealed by activator key {a.sealed_by}" if a.sealed_by else (
        "[yellow]not signed[/] (a server that trusts activator keys refuses it; seal it with --sign-key)")
    console.print(f"pointer generation {a.generation if a.generation is not None else 0}: {seal}"
                  + (f", valid until {a.expires}" if a.expires else ""))
    if (warning := soon(a.expires)) is not None:
        console.print(f"[yellow]warning[/]: {escape(warning)}")
    console.print("[dim]a server following this registry switches on `POST /v2/repository/reload`[/]")


def _seal_text(reg: Registry, keys: list[Path] | None) -> str | None:
    """The pointer's generation, seal, expiry and registry id in words, checked (``pointer_seal.check``; bound to
    ``TILESHIP_TRUSTED_REGISTRY_ID`` when set) when activator keys are trusted (``keys``; None:
    ``TILESHIP_TRUSTED_ACTIVATOR_KEYS``): a refusal is said, not raised. None: no pointer."""
    from tileship.errors import PointerSignatureError
    from tileship.release import pointer_expiry, pointer_seal
    from tileship.release import registry_id as regid
    from tileship.release.registry import read_pointer

    if not reg.pointer.exists():
        return None
    state = read_pointer(reg.pointer)
    gen, kid = pointer_seal.generation_of(state), pointer_seal.sealed_by(state)
    said = f"pointer generation {gen}: " + (f"sealed by activator key {kid}" if kid else "[yellow]not signed[/]")
    said += f", valid until {escape(str(state['expires'])[:64])}" if "expires" in state else ""
    bound = state.get("registry_id")  # shape checked by read_pointer
    ident = (f"\nthe pointer is bound to registry id {bound} (`tileship serve --trusted-registry-id {bound}` "
             "refuses any other registry's pointer, from the first one on)") if bound else ""
    if not (trusted := pointer_seal.trusted(keys)):
        return said + " (not checked: no trusted activator key)" + ident
    try:
        sealed = pointer_seal.check(reg.pointer, state, trusted, registry=regid.trusted(None))
    except PointerSignatureError as exc:
        return said + f"; [red]REFUSED[/] by the trusted activator keys: {escape(exc.message)}" + ident
    warning = pointer_expiry.soon(sealed.expires)
    return said + "; [green]verified[/] (a trusted activator key)" + ident + (
        f"\n[yellow]warning[/]: {escape(warning)}" if warning else "")


def register(app: typer.Typer) -> None:
    @app.command("releases")
    @handle_errors
    def releases(registry: Path | None = typer.Option(None, "--registry", help=REGISTRY_HELP),
                 trusted_activator_key: list[Path] = typer.Option(
                     [], help="ed25519 public key(s) of the activator role the pointer's seal is checked against "
                              "(default: $TILESHIP_TRUSTED_ACTIVATOR_KEYS; shown, not refused)")) -> None:
        """List published releases: verification status, integrity, which one is active, and the pointer's seal."""
        from rich.table import Table

        reg = _registry(registry)
        # the pointer first: a refused or unreadable one (or an unusable key file) is its error alone, no table
        seal = _seal_text(reg, trusted_activator_key or None)
        rows = reg.releases()
        if not rows:
            console.print(f"no releases in {reg.root} (publish one: `tileship publish BUNDLE`)")
            return
        table = Table(title=f"releases in {reg.root}")
        for col in ("", "release", "model", "kernel rev", "verification", "integrity"):
            table.add_column(col)
        for r in rows:
            mark = ("[bold green]* ref-only[/]" if r.reference_only else "[bold green]*[/]") if r.active else ""
            ver = {"passed": "[green]passed[/]", "failed": "[red]FAILED[/]",
                   "unreadable": "[red]unreadable[/]"}.get(r.verification, "[yellow]unverified[/]")
            integrity = "[green]ok[/]" if r.integrity_ok else f"[red]BROKEN[/] {r.integrity_error}"
            table.add_row(mark, r.release_id, r.model, r.kernel_revision, ver, integrity)
        console.print(table)
        for r in rows:
            if r.active:
                console.print(f"active {r.release_id}: evidence pinned: {_pin_text(r.pinned)}")
                if r.pinned not in (None, r.evidence):
                    console.print(f"[red]its evidence is now {r.evidence}[/]: a server following the registry "
                                  "ignores it (every operator on the reference); if it was re-verified on purpose, "
                                  f"run `tileship activate {r.release_id}`")
        if seal is not None:
            console.print(seal)

    @app.command("publish")
    @handle_errors
    def publish(
        bundle: Path = typer.Argument(..., help="a release directory (from `tileship build`) or a `tileship pack` "
                                      "archive"),
        registry: Path | None = typer.Option(None, "--registry", help=REGISTRY_HELP),
        replace: bool = typer.Option(False, help="overwrite a published copy of the same id whose evidence or build "
                                     "log differs"),
        image_digest: str | None = typer.Option(None, help="the image built from this release (tileship image), "
                                                "sha256:<hex>: recorded next to it, the release unchanged"),
    ) -> None:
        """Copy a release into the registry (integrity checked; atomic). Does not activate it."""
        reg = _registry(registry)
        rid = reg.publish(bundle, replace=replace, image_digest=image_digest)
        console.print(f"[green]published[/] {rid} -> {reg.path_of(rid)}")
        from tileship.release.evidence_seal import pin

        active = reg.active()
        if active.release_id == rid and active.evidence not in (None, now := pin(reg.path_of(rid))):
            console.print(f"[yellow]{rid} is active with other evidence pinned[/] ({active.evidence}; now {now}): "
                          f"a server following the registry ignores the new evidence until `tileship activate {rid}`")
        if image_digest is not None:
            console.print(f"image {image_digest} recorded for {rid} (a server in another image reports the mismatch)")

    @app.command("activate")
    @handle_errors
    def activate(
        release_id: str | None = typer.Argument(None, help="release id (or a unique prefix); with --reference, "
                                                "default: the active one"),
        reference: bool = typer.Option(False, "--reference",
                                       help="serve every operator through its PyTorch reference only"),
        force: bool = typer.Option(False, "--force", help="activate even if integrity or verification checks fail"),
        registry: Path | None = typer.Option(None, "--registry", help=REGISTRY_HELP),
        sign_key: Path | None = typer.Option(None, "--sign-key", help=SIGN_KEY_HELP),
        valid_for: str | None = typer.Option(None, "--valid-for", metavar="DURATION", help=VALID_FOR_HELP),
    ) -> None:
        """Make a release active (atomic; concurrent activations are serialized).

        Refused, naming why, when the release fails its integrity check or its verification
        evidence records a failure; --force overrides. With --sign-key the pointer is sealed (activating
        the active release again seals it, when that key did not); with --valid-for too it expires
        (activating the active release again with --valid-for seals a fresh pointer: the refresh).
        """
        reg = _registry(registry, sign_key, valid_for)
        if reference:
            active = reg.activate_reference(release_id)
        elif release_id is None:
            raise typer.BadParameter("give a release id (or --reference)")
        else:
            active = reg.activate(release_id, force=force)
        _say_active(active)

    @app.command("rollback")
    @handle_errors
    def rollback(
        force: bool = typer.Option(False, "--force", help="roll back even if the earlier release now fails its checks"),
        registry: Path | None = typer.Option(None, "--registry", help=REGISTRY_HELP),
        sign_key: Path | None = typer.Option(None, "--sign-key", help=SIGN_KEY_HELP),
        valid_for: str | None = typer.Option(None, "--valid-for", metavar="DURATION", help=VALID_FOR_HELP),
    ) -> None:
        """Return to the previously active release (repeat to go further back); --sign-key seals the pointer,
        --valid-for gives it an expiry."""
        _say_active(_registry(registry, sign_key, valid_for).rollback(force=force))

    @app.command("gc")
    @handle_errors
    def gc(registry: Path | None = typer.Option(None, "--registry", help=REGISTRY_HELP)) -> None:
        """Remove what killed registry writers left behind (also done at the start of every change)."""
        removed = _registry(registry).collect()
        console.print(f"removed {len(removed)} leftover(s)" + (f": {', '.join(removed)}" if removed else ""))
