"""What a server's source names: the release to serve now (``resolve``), the state a registry rollback
returns to (``rollback_target``), and the release id a directory claims (``release_id_at``).

A source is a release directory or a registry directory. A registry's pointer is read once and what was
read is followed: its evidence pin goes to the loader (``Target.evidence``); with trusted activator keys it
must be sealed by one of them and, on reload, not older than the pointer serving (``release.pointer_seal``:
an unsigned, forged, re-signed, replayed or another registry's pointer is a PointerSignatureError, and nothing
is loaded).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tileship.errors import RegistryError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from tileship.release.pointer_seal import Sealed
    from tileship.release.registry import Registry


@dataclass(frozen=True)
class Target:
    """What a source points at now: a release directory, maybe in reference-only mode. ``evidence``:
    the evidence pin the registry recorded on activation (``Active.evidence``), which the loader
    checks; None for a release directory or a pointer written before pins (not checked). ``sealed``: the
    registry pointer accepted under trusted activator keys (not compared: it names the state, is not it).
    ``release_id``: the id a registry names this copy by (its pointer, history or a canary's id), which the
    release loaded must carry (``holder.prepare``: a copy holding another release is refused); None for a
    release directory given by path (its manifest's id is used, with a warning when the name differs)."""

    path: Path
    reference_only: bool
    evidence: str | None = None
    sealed: Sealed | None = field(default=None, compare=False)
    release_id: str | None = None


def resolve(source: Path, *, force_reference: bool = False, activator_keys: Sequence[Ed25519PublicKey] = (),
            after: Sealed | None = None, registry_id: str | None = None) -> Target:
    """The release ``source`` names now. Raises RegistryError naming what is missing. With ``activator_keys``,
    a registry's pointer must be sealed by one of them, bound to ``registry_id`` (else
    ``TILESHIP_TRUSTED_REGISTRY_ID``; none: the registry's own) and not older than ``after`` (the pointer
    serving): else PointerSignatureError (``pointer_seal.check``)."""
    source = Path(source)
    if (source / "manifest.json").is_file():
        return Target(source, force_reference)
    if not source.is_dir():
        raise RegistryError(f"{source}: no such release or registry directory")
    reg, state, sealed = _pointer(source, activator_keys, after, registry_id)  # a registry: follow what it checked
    active = reg.active_of(state)
    if active.path is None:
        raise RegistryError(f"registry {source} has no active release",
                            hint="run `tileship activate ID` (or `tileship activate --reference ID`)")
    return Target(Path(active.path), bool(active.reference_only) or force_reference, active.evidence, sealed,
                  active.release_id)


#: the most of a manifest ``release_id_at`` reads (a release's manifest is a few KiB)
MANIFEST_READ_LIMIT = 1 << 20


def release_id_at(path: Path) -> str | None:
    """The release id its manifest claims (unchecked), or None when unreadable. Callable on the event
    loop with any path a client names: only a regular file is read (opened without blocking, so a
    FIFO or a device never stalls it), and at most ``MANIFEST_READ_LIMIT`` bytes of it."""
    try:
        fd = os.open(path / "manifest.json", os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MANIFEST_READ_LIMIT:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MANIFEST_READ_LIMIT + 1)
        if len(data) > MANIFEST_READ_LIMIT:
            return None
        rid = json.loads(data)["release_id"]
        return rid if isinstance(rid, str) and len(rid) <= 128 else None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    finally:
        os.close(fd)


def _pointer(source: Path, keys: Sequence[Ed25519PublicKey], after: Sealed | None,
             registry_id: str | None = None) -> tuple[Registry, dict[str, Any], Sealed | None]:
    """(the registry, its pointer state read once, what ``pointer_seal.check`` accepted or None without keys)."""
    from tileship.release import pointer_seal

    return pointer_seal.follow(source, keys, after, registry_id)


def rollback_target(source: Path, *, force_reference: bool = False, activator_keys: Sequence[Ed25519PublicKey] = (),
                    registry_id: str | None = None) -> Target | None:
    """What ``tileship rollback`` would make ``source`` serve: the newest state in a registry's history. None
    for a release directory or an empty history. Raises RegistryError, and PointerSignatureError for a pointer
    no trusted activator key sealed (nothing is loaded from it)."""
    if (source / "manifest.json").is_file() or not source.is_dir():
        return None
    from tileship.release.registry import pin_of

    reg, state, _ = _pointer(source, activator_keys, None, registry_id)
    if not state["history"]:
        return None
    prev = state["history"][0]
    return Target(reg.path_of(prev["release_id"]), bool(prev["reference_only"]) or force_reference, pin_of(prev),
                  release_id=prev["release_id"])
