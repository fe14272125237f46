"""Registry records: the active pointer (read, atomic write, full-disk reserve), a stored release as listed
(``release_info``), and its verification status.

A pointer state and each history entry: ``{"release_id", "reference_only", "evidence"}``. ``evidence``
is the evidence pin recorded on activation (``evidence_seal.pin``: the evidence's sha256, null for a
release without evidence); a pointer written before pins has no such key: then nothing is checked.
Schema 1 either way (older readers ignore the key; an older writer drops it, which unpins). The pointer
(not its history entries) also holds ``generation``, ``registry_id`` (the registry it was written in:
``registry_id``) and, when sealed by an activator key, ``sealed_by`` and ``signature`` (``pointer_seal``), and
with a validity ``expires`` (``pointer_expiry``); older readers ignore them too.
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tileship.errors import BundleError, BundleIntegrityError, RegistryError
from tileship.release import bundle, evidence_seal, nofollow, small_file, strict_json, tuning
from tileship.release.evidence_seal import NO_EVIDENCE

POINTER_SCHEMA = 1
POINTER_TMP_PREFIX = ".active.tmp-"
RESERVE = ".reserve"
RESERVE_BYTES = 64 * 1024
PIN = re.compile(r"sha256:[0-9a-f]{64}")
#: the most of a pointer read: 33 states of a few hundred bytes each fit many times over
POINTER_READ_LIMIT = 1 << 20
#: what a pointer may name as a release (``Registry.resolve`` takes no other id)
RELEASE_ID = re.compile(r"[0-9A-Za-z_-]{1,128}")
#: how ``bundle.key_id`` names a key: what a pointer's ``sealed_by`` may say
KEY_ID = re.compile(r"ed25519:[0-9a-f]{16}")
#: what a pointer's ``registry_id`` may say (``registry_id.ID``)
REGISTRY_ID = re.compile(r"[0-9a-f]{32}")
#: the longest ``signature`` a pointer may hold (an ed25519 signature is 88 characters of base64)
SIGNATURE_CHARS = 128


@dataclass(frozen=True)
class Active:
    """What a server should serve. ``release_id`` is None when nothing was ever activated.

    ``reference_only``: serve that release's operators through their PyTorch references
    only (no native code is loaded). ``previous``: the release ``rollback`` would return to.
    ``evidence``: the evidence pin recorded when it was activated (a sha256, or ``none`` for a
    release without evidence), which a load through the registry expects; None when the pointer
    predates pins (nothing is checked). ``generation``: the pointer's counter (``pointer_seal``; None
    before generations); ``sealed_by``: the activator key id the pointer names (None: unsigned), checked
    only by a reader that trusts activator keys; ``expires``: the instant the pointer states it is valid
    until (``pointer_expiry``; None: none). None of the three takes part in ``==``: they say which pointer
    named the state, not what it is.
    """

    release_id: str | None
    path: Path | None
    reference_only: bool
    previous: str | None
    evidence: str | None = None
    generation: int | None = field(default=None, compare=False)
    sealed_by: str | None = field(default=None, compare=False)
    expires: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ReleaseInfo:
    """One published release as ``releases()`` lists it."""

    release_id: str
    path: Path
    model: str
    kernel_revision: str
    verification: str  # passed | failed | unverified | unreadable
    verification_detail: str
    integrity_ok: bool
    integrity_error: str | None
    active: bool
    reference_only: bool
    published_at: float
    #: its evidence pin now (``evidence_seal.pin``) and, for the active release, the one activated
    evidence: str = NO_EVIDENCE
    pinned: str | None = None


def verification_status(root: Path) -> tuple[str, str]:
    """(status, detail) from ``evidence/verification.json``.

    ``unverified`` when there is no evidence; ``failed`` when any specialization failed
    (the detail names them) or ``tileship tune`` recorded a candidate whose artifact did not load (the detail
    names the group, the candidate and the loader's message: tune exited 2 and ``promote`` stops there; such a
    candidate is never excused as one that wins no bucket); ``unreadable`` when the file is not valid JSON.
    """
    p = Path(root) / "evidence" / "verification.json"
    if not p.exists():
        return "unverified", "no evidence/verification.json"
    try:
        data = strict_json.loads(p.read_bytes(), p, "evidence")
    except OSError as exc:
        return "unreadable", f"{p}: {exc}"
    except BundleIntegrityError as exc:
        return "unreadable", exc.message
    specs = data.get("specializations") if isinstance(data, dict) else None
    if not isinstance(specs, dict):
        return "unreadable", f"{p}: no 'specializations' mapping"
    failed = sorted(sid for sid, e in specs.items() if not (isinstance(e, dict) and e.get("passed", False)))
    unloaded = _unloaded(data.get("tuning"))
    losers = _losing_candidates(data.get("tuning")) - {f"{g}.{c}" for g, c, _ in unloaded}  # lost: did not load
    excused = [sid for sid in failed if sid in losers]  # tuning never routes to them: they cannot serve
    failed = [sid for sid in failed if sid not in losers]
    unchecked = sorted(tuning.failures(data.get("tuning")))  # their groups serve the reference
    tune_note = (f"; tune could not check the reference of {len(unchecked)} groups, which the reference serves: "
                 + ", ".join(unchecked[:3]) + (" ..." if len(unchecked) > 3 else "")) if unchecked else ""
    if unloaded:  # tune exits 2 and promote stops: the release's artifacts must load where it serves
        g, c, why = unloaded[0]
        load_note = (f"tune could not load {len(unloaded)} candidates: {g}/{c} ({why})"
                     + "".join(f", {g}/{c}" for g, c, _ in unloaded[1:3]) + (" ..." if len(unloaded) > 3 else ""))
        if not failed:
            return "failed", load_note + tune_note
        tune_note = f"; {load_note}{tune_note}"
    if failed:
        shown = ", ".join(failed[:5]) + (" ..." if len(failed) > 5 else "")
        return "failed", f"{len(failed)} of {len(specs)} specializations failed verification: {shown}{tune_note}"
    device = (data.get("device") or {}).get("name", "?")
    lost = f"; {len(excused)} failed candidates never win a tuned bucket" if excused else ""
    return "passed", f"{len(specs) - len(excused)} specializations passed on {device}{lost}{tune_note}"


def release_info(rid: str, root: Path, state: dict[str, Any]) -> ReleaseInfo:
    """Published release ``rid`` at ``root`` as ``Registry.releases`` lists it, against the pointer ``state``
    (integrity re-checked: every file hashed). Raises FileNotFoundError when the copy went meanwhile."""
    try:
        held = bundle.check_integrity(root)["release_id"]
        ok, err = held == rid, None if held == rid else f"{root} holds release {held}, not {rid} (replaced or renamed)"
    except BundleError as exc:
        ok, err = False, exc.message
    status, detail = verification_status(root)
    try:
        rel = strict_json.loads((root / "release.json").read_bytes(), root / "release.json")
        model = f"{rel['model']['name']}:{rel['model']['version']}"
        revision = str(rel.get("kernel_revision", "?"))
    except (OSError, BundleError, KeyError, TypeError, AttributeError):
        model, revision = "?", "?"
    is_active = rid == state["release_id"]
    return ReleaseInfo(rid, root, model, revision, status, detail, ok, err, is_active,
                       is_active and bool(state["reference_only"]), root.stat().st_mtime,
                       evidence_seal.pin(root), pin_of(state) if is_active else None)


def _unloaded(table: Any) -> list[tuple[str, str, str]]:
    """(group id, candidate id, the loader's message) of every tuned candidate whose artifact did not load
    (``tuning.unloaded``), sorted."""
    if not isinstance(table, dict):
        return []
    return sorted((gid, cid, why) for gid, group in table.items() if isinstance(group, dict)
                  for cid, why in tuning.unloaded(group).items())


def _losing_candidates(table: Any) -> set[str]:
    """Spec ids (``<group>.<candidate>``) of tuned candidates that win no bucket of their group (every candidate
    of a group tune could not check the reference of: the reference serves it)."""
    if not isinstance(table, dict):
        return set()
    out: set[str] = set()
    for gid, group in table.items():
        if not isinstance(group, dict):
            continue
        won = {p.get("winner") for p in group.get("points") or [] if isinstance(p, dict)}
        out.update(f"{gid}.{c}" for c in group.get("candidates") or [] if c not in won)
    return out


def entry(release_id: str, reference_only: bool, pin: str | None) -> dict[str, Any]:
    """A pointer state or history entry as stored: ``pin`` (``evidence_seal.pin``) as ``evidence``,
    null for ``none``; no ``evidence`` key when ``pin`` is None (unpinned)."""
    out: dict[str, Any] = {"release_id": release_id, "reference_only": bool(reference_only)}
    if pin is not None:
        out["evidence"] = None if pin == NO_EVIDENCE else pin
    return out


def pin_of(state: dict[str, Any]) -> str | None:
    """The evidence pin of a stored state or history entry (``entry``'s inverse); None: unpinned."""
    if "evidence" not in state:
        return None
    return state["evidence"] if state["evidence"] is not None else NO_EVIDENCE


def _state_ok(state: Any) -> bool:
    """Whether ``state`` names a release by an id (never a path: ``..`` would leave the registry) and a mode."""
    return (isinstance(state, dict) and isinstance(rid := state.get("release_id"), str)
            and RELEASE_ID.fullmatch(rid) is not None and isinstance(state.get("reference_only"), bool))


def _pin_ok(state: Any) -> bool:
    pin = state.get("evidence") if isinstance(state, dict) else None
    return pin is None or (isinstance(pin, str) and PIN.fullmatch(pin) is not None)


def read_pointer(pointer: Path) -> dict[str, Any]:
    """The pointer's state (an empty state when there is none). Raises RegistryError naming the pointer and what
    is wrong when it is not one: unreadable, not a regular file (never blocking on a FIFO), over
    ``POINTER_READ_LIMIT`` bytes, not strict JSON, or a field of the wrong type or shape."""
    hint = "it is only ever replaced whole; move it aside and activate again (`tileship activate ID`)"
    try:
        raw = small_file.read(pointer, POINTER_READ_LIMIT)
    except FileNotFoundError:
        return {"schema": POINTER_SCHEMA, "release_id": None, "reference_only": False, "history": []}
    except OSError as exc:
        raise RegistryError(f"{pointer}: cannot be read ({exc.strerror or exc})", hint=hint) from None
    try:
        data = strict_json.loads(raw, pointer, error=RegistryError)
    except RegistryError as exc:
        raise RegistryError(exc.message, hint=hint) from None
    if (why := _not_a_pointer(data)) is not None:
        raise RegistryError(f"{pointer}: not a tileship active pointer (schema {POINTER_SCHEMA}): {why}", hint=hint)
    return data


def _not_a_pointer(data: Any) -> str | None:
    """What makes ``data`` not a pointer state, or None."""
    if not isinstance(data, dict) or data.get("schema") != POINTER_SCHEMA:
        return f"not an object with schema {POINTER_SCHEMA}"
    if not isinstance(data.get("reference_only"), bool):
        return "reference_only is not true or false"
    if not (data.get("release_id") is None or _state_ok(data)):
        return "release_id is neither null nor a release id ([0-9A-Za-z_-], 1 to 128 characters)"
    history = data.get("history")
    if not isinstance(history, list) or not all(_state_ok(h) for h in history):
        return "history is not a list of states, each a release id and reference_only true or false"
    if not (_pin_ok(data) and all(_pin_ok(h) for h in history)):
        return "an evidence pin is neither null nor sha256:<64 hex digits>"
    gen = data.get("generation", 0)
    if not (type(gen) is int and 0 <= gen < 10**18):
        return "generation is not a whole number of at most 18 digits"
    kid, sig = data.get("sealed_by"), data.get("signature")
    if not (kid is None or (isinstance(kid, str) and KEY_ID.fullmatch(kid))):
        return "sealed_by is not a key id (ed25519:<16 hex digits>)"
    if not (sig is None or (isinstance(sig, str) and len(sig) <= SIGNATURE_CHARS)):
        return f"signature is not a string of at most {SIGNATURE_CHARS} characters"
    bound = data.get("registry_id")
    if not (bound is None or (isinstance(bound, str) and REGISTRY_ID.fullmatch(bound))):
        return "registry_id is not a registry id (32 hex digits)"
    return None


def write_pointer(pointer: Path, state: dict[str, Any]) -> None:
    """Atomic: write a temp file, fsync it, rename it over the pointer, fsync the directory.

    On a full disk the reserve is given up for it (and re-made when space allows), so that
    ``activate --reference`` and ``rollback`` still work there.
    """
    try:
        try:
            _write_pointer_once(pointer, state)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not (pointer.parent / RESERVE).exists():
                raise
            (pointer.parent / RESERVE).unlink()
            _write_pointer_once(pointer, state)
            make_reserve(pointer.parent)
    except OSError as exc:
        raise RegistryError(f"{pointer}: cannot be written ({exc.strerror}); the old pointer is intact",
                            hint="free space on the registry's filesystem") from None


def make_reserve(root: Path) -> None:
    """Best effort: 64 KiB of real (non-sparse) blocks the pointer may use on a full disk."""
    path = root / RESERVE
    if path.exists():
        return
    try:
        with open(path.with_name(RESERVE + ".tmp"), "wb") as f:
            f.write(b"\0" * RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path.with_name(RESERVE + ".tmp"), path)
    except OSError:
        path.with_name(RESERVE + ".tmp").unlink(missing_ok=True)


def _write_pointer_once(pointer: Path, state: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=pointer.parent, prefix=POINTER_TMP_PREFIX)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(state, indent=2, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, pointer)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    nofollow.fsync_dir(pointer.parent)
