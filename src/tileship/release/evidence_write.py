"""Writing a release's evidence in place (``evidence/verification.json``, its seal, the manifest).

``write`` replaces the evidence. ``update`` changes it (``tileship tune``: its table and verdicts merged into
what is there; ``tileship verify``: its verdicts merged, ``verify.verify_evidence``): the evidence is
read, merged and written back under the release's writer lock (``inplace.writing``), so a writer
that stored evidence meanwhile (a ``verify``, another ``tune``) is never overwritten by a merge made
from what was there before it. Both are crash-safe: killed at any instant, the release checks as
before or as after the write (``inplace``: staged files, the new manifest on disk first).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tileship.errors import BundleIntegrityError
from tileship.release.evidence import EVIDENCE, read


def write(root: Path, data: Mapping[str, Any], *, verifier_key: Path | None = None) -> dict[str, Any]:
    """Store ``data`` as the release's evidence and re-hash the release. Returns the manifest.

    ``verifier_key`` (an ed25519 private key of the verifier role): sign the evidence
    (``evidence_seal.SIGNATURE``); without one, a signature of earlier evidence is removed.
    Crash-safe: killed at any instant, the release checks as before or as after the write (a
    pending manifest, ``integrity.check``). The release id does not change (evidence is not part of it); the manifest
    signature does not survive (the manifest changed): re-sign afterwards. Raises
    BundleIntegrityError when the release was not intact before writing, SignatureError for an
    unusable key (before anything is written). Concurrent writers of one release (``tileship verify``
    and ``tileship tune`` at once, ``sign``) take turns (``inplace.writing``); the last one's evidence stays.
    """
    return _store(Path(root), lambda: data, verifier_key)[0]


def update(root: Path, merge: Callable[[dict[str, Any] | None], Mapping[str, Any]], *,
           verifier_key: Path | None = None,
           on_unreadable: Callable[[BundleIntegrityError], None] | None = None) -> dict[str, Any]:
    """Change the release's evidence: ``merge`` gets it as it is once this writer holds the release's
    lock (``evidence.read``: None when there is none) and returns what to store, which is written as
    ``write`` does, before the lock is let go. Returns the evidence stored. Raises as ``write`` does,
    and BundleIntegrityError when the evidence there is not tileship evidence (nothing is written);
    what ``merge`` raises propagates, nothing written. With ``on_unreadable``, evidence that is not tileship
    evidence is told to it (the error naming the file) and ``merge`` gets None instead."""

    def current() -> dict[str, Any] | None:
        try:
            return read(root)
        except BundleIntegrityError as exc:
            if on_unreadable is None:
                raise
            on_unreadable(exc)
            return None

    return _store(Path(root), lambda: merge(current()), verifier_key)[1]


def _store(root: Path, make: Callable[[], Mapping[str, Any]],
           verifier_key: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, evidence) after storing ``make()``, called under the lock once the release is
    checked and what a killed writer left is settled."""
    from tileship.release import bundle, evidence_seal, inplace, integrity

    key = bundle.load_private_key(verifier_key) if verifier_key is not None else None
    with inplace.writing(root):  # one writer of this release at a time (verify and tune at once)
        checked = integrity.check(root, trusted_keys=[])
        inplace.settle(root, checked.manifest_bytes)
        data = dict(make())
        files = dict(checked.manifest["files"])
        body = bundle.json_bytes(data)
        (root / EVIDENCE).parent.mkdir(exist_ok=True)
        moves = [(inplace.stage(root / EVIDENCE, body), root / EVIDENCE)]
        files[EVIDENCE] = "sha256:" + hashlib.sha256(body).hexdigest()
        sig = root / evidence_seal.SIGNATURE
        if key is not None:
            seal = bundle.json_bytes(bundle.signature_record(key, evidence_seal.DOMAIN + body))
            moves.append((inplace.stage(sig, seal), sig))
            files[evidence_seal.SIGNATURE] = "sha256:" + hashlib.sha256(seal).hexdigest()
        else:
            files.pop(evidence_seal.SIGNATURE, None)
        manifest = {"schema": 1, "release_id": bundle.release_id_of(files), "files": files}
        if manifest["release_id"] != checked.release_id:  # would mean evidence leaked into the identity files
            for tmp, _ in moves:
                tmp.unlink(missing_ok=True)
            raise BundleIntegrityError(f"{root}: writing evidence changed the release id {checked.release_id} -> "
                                       f"{manifest['release_id']}", path=str(root))
        # the manifests are on disk before any file moves: killed from here on, the files match the old one,
        # ``_between`` or the new one; ``integrity.check`` accepts a pending manifest the files match
        pending = inplace.stage(root / bundle.MANIFEST, bundle.json_bytes(manifest))
        between = _between(manifest, checked.manifest, root)
        (root / bundle.SIGNATURE).unlink(missing_ok=True)  # the manifest changes: never a stale signature
        for tmp, final in moves:
            os.replace(tmp, final)
        if key is None:
            sig.unlink(missing_ok=True)
        if between is not None:
            between.unlink(missing_ok=True)
        os.replace(pending, root / bundle.MANIFEST)
        return manifest, data


def _between(new: Mapping[str, Any], old: Mapping[str, Any], root: Path) -> Path | None:
    """Stage the manifest of the state where the new evidence has moved and its seal not yet (the old
    seal or none, which does not vouch for it: not trusted). None when that is the new manifest. Named
    as a dead writer's pending manifest (pid above pid_max): the next writer (after the lock) removes it."""
    from tileship.release import bundle, evidence_seal, inplace

    files = dict(new["files"])
    files.pop(evidence_seal.SIGNATURE, None)
    if evidence_seal.SIGNATURE in old["files"]:
        files[evidence_seal.SIGNATURE] = old["files"][evidence_seal.SIGNATURE]
    if files == new["files"]:
        return None
    body = bundle.json_bytes({**new, "files": files})
    return inplace.stage(root / bundle.MANIFEST, body, pid=os.getpid() + (1 << 22))


__all__ = ["update", "write"]
