"""Signed evidence: who measured a release, and whether a server may believe it.

Evidence (``evidence/verification.json``) is hashed by the manifest but is not part of the
release id, so on an unsigned bundle anyone who can write it can recompute the manifest and
change routing without changing the id. ``tileship verify`` and ``tileship tune`` therefore sign
it with a *verifier* key, a role separate from the build key that signs the manifest:

- ``evidence/verification.sig`` holds ``{"key_id", "signature"}``: ed25519 over ``DOMAIN`` +
  the exact bytes of ``verification.json`` (which name the release id and lock digest it was
  taken against). The domain prefix keeps the roles apart even if one key were trusted for
  both: an evidence signature never verifies as a manifest signature, nor the reverse.
- Trusted verifier keys: ``load(trusted_verifier_keys=...)``, else
  ``TILESHIP_TRUSTED_VERIFIER_KEYS`` (as ``TILESHIP_TRUSTED_KEYS`` is for build keys). When
  some are trusted, evidence that is unsigned, forged, signed by another key or signed for
  another release is *ignored*: the release serves as unverified, and ``Seal.reason`` says why
  (a note on the release). With none trusted, evidence is used unchecked, as before.
- ``Seal.digest`` (the manifest's sha256 of the evidence in effect) is what a server reports
  next to the release id (``GET /v2``, the ``x-tileship-evidence`` header, the
  ``tileship_release`` info metric), so two servers of one release with different evidence
  are told apart.

Freshness (rollback protection, as TUF's and Uptane's): a signature says who measured the release,
not that the evidence is the *latest* measurement. Anyone who can write the release directory can
put back an older, validly signed evidence file (from before a kernel was found wrong on this
device) and recompute the manifest. So the registry *pins* the evidence when a release is
activated: ``active.json`` (and each history entry, so ``rollback`` restores it) records
``pin(root)``, the evidence's sha256 as the manifest records it (what ``Seal.digest`` is when the
evidence is used), or null when there is none. A load through the registry (``tileship serve
REGISTRY``, its worker processes, ``tileship diagnose``) passes the pin as ``expect``
(``load(expect_evidence_digest=...)``, which users loading by path may pass themselves). Evidence
that is not the pinned one (replayed, replaced, added or removed) is ignored before its signature
is even read, and ``Seal.stale`` says the pin failed: then *every* specialization serves the
reference, CPU ones and ``allow_unverified`` ones included (the directory is known not to hold the
state that was activated). A deliberate re-verify is re-pinned by activating again (``publish
--replace`` then ``activate``). A pointer written before pins (no ``evidence`` key) checks nothing.
The pin is as trustworthy as ``active.json`` itself: sealed by an activator key, which a server that
trusts activator keys checks (``pointer_seal``), else unchecked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tileship import env
from tileship.errors import BundleError, BundleIntegrityError, SignatureError
from tileship.release import bundle
from tileship.release.evidence import EVIDENCE, parse

SIGNATURE = "evidence/verification.sig"
DOMAIN = b"tileship-evidence-v1\0"
#: Seal.state values
NONE, UNCHECKED, VERIFIED, IGNORED = "none", "unchecked", "verified", "ignored"
#: the pin of a release without evidence (also ``Seal.label`` when none is in effect)
NO_EVIDENCE = "none"


@dataclass(frozen=True)
class Seal:
    """What a loader made of a release's evidence. ``digest``: sha256 of the evidence in effect
    (None when there is none or it was ignored); ``signer``: the trusted verifier key id that
    signed it; ``state``: none | unchecked (no verifier key trusted) | verified | ignored;
    ``pinned``: the evidence pin it was checked against (None: not pinned); ``stale``: the
    evidence found was not the pinned one (state ignored, every specialization on the reference)."""

    state: str
    digest: str | None = None
    signer: str | None = None
    reason: str = ""
    pinned: str | None = None
    stale: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "digest": self.digest, "signer": self.signer, "reason": self.reason,
                "pinned": self.pinned, "stale": self.stale}

    @property
    def label(self) -> str:
        """The digest as a header/metric label: ``none`` when no evidence is in effect."""
        return self.digest or "none"


def seal(root: Path, key: Ed25519PrivateKey | None) -> str | None:
    """Sign ``root``'s evidence file with ``key`` (writes ``SIGNATURE``); with no key, remove a
    signature of earlier evidence. Returns the key id. The caller re-writes the manifest."""
    sig = Path(root) / SIGNATURE
    if key is None:
        sig.unlink(missing_ok=True)
        return None
    record = bundle.signature_record(key, DOMAIN + (Path(root) / EVIDENCE).read_bytes())
    bundle.write_json_atomic(sig, record)
    return record["key_id"]


def found(digests: Mapping[str, str]) -> str:
    """The evidence pin of a release whose manifest lists ``digests``: the evidence's sha256 as the
    manifest records it (``Seal.digest`` when the evidence is used), or ``NO_EVIDENCE``."""
    digest = digests.get(EVIDENCE)
    return digest if isinstance(digest, str) else NO_EVIDENCE


def pin(root: Path) -> str:
    """The evidence pin of the release directory ``root`` (what the registry records on activation):
    ``found`` over its manifest, which the loader checks every file against. ``NO_EVIDENCE`` when
    the manifest cannot be read (only a forced activation gets that far; the loader refuses it)."""
    try:
        return found(bundle.read_manifest(Path(root))["files"])
    except BundleError:
        return NO_EVIDENCE


def check_pin(found_: str, expect: str | None) -> str | None:
    """Why evidence ``found_`` (a pin) is not the pinned ``expect``, or None when it is (or nothing is pinned)."""
    if expect is None or found_ == expect:
        return None
    return (f"evidence digest {found_} is not the one pinned when the release was activated ({expect}): older or "
            "replaced evidence is not used; after a deliberate re-verify, publish the release again (`tileship "
            "publish --replace`) and re-activate it (`tileship activate ID`) to pin its new evidence")


def trusted(keys: Iterable[Path | Ed25519PublicKey] | None) -> list[Ed25519PublicKey]:
    """Public keys from paths or key objects; None reads ``TILESHIP_TRUSTED_VERIFIER_KEYS``.
    Raises SignatureError naming an unusable key file."""
    raw = list(keys) if keys is not None else env.trusted_verifier_key_paths()
    return [k if isinstance(k, Ed25519PublicKey) else bundle.load_public_key(Path(k)) for k in raw]


def open_evidence(root: Path, release_id: str, digests: Mapping[str, str],
                  keys: Iterable[Path | Ed25519PublicKey] | None = None,
                  expect: str | None = None) -> tuple[dict[str, Any] | None, Seal]:
    """(evidence in effect or None, its Seal) for the checked release (or snapshot) at ``root``.

    ``digests``: the manifest's file hashes (the evidence was hashed against them by the
    integrity check). ``expect``: the evidence pin (a sha256 ``found`` gives, or ``NO_EVIDENCE``;
    None: not pinned); evidence that is not the pinned one is ignored first, with ``Seal.stale``.
    With trusted verifier keys the signature is checked before the evidence is
    parsed: anything not signed by one of them (garbage included) is ignored, a value, and
    ``Seal.reason`` says why. Raises BundleIntegrityError for evidence that is not tileship evidence
    but is used (signed, or no key trusted: as ``evidence.read``) and SignatureError for an
    unusable trusted key file.
    """
    path = Path(root) / EVIDENCE
    try:
        body: bytes | None = path.read_bytes()
    except FileNotFoundError:
        body = None
    if (stale := check_pin(found(digests) if body is not None else NO_EVIDENCE, expect)) is not None:
        return None, Seal(IGNORED, reason=stale, pinned=expect, stale=True)
    if body is None:
        return None, Seal(NONE, reason="the release has no verification evidence", pinned=expect)
    digest = digests.get(EVIDENCE)
    pubs = trusted(keys)
    if not pubs:
        why = "no verifier key is trusted (TILESHIP_TRUSTED_VERIFIER_KEYS): evidence used unchecked"
        return parse(body, path), Seal(UNCHECKED, digest, reason=why, pinned=expect)
    try:
        sig = (Path(root) / SIGNATURE).read_bytes()
    except FileNotFoundError:
        sig = None
    try:
        signer = bundle.verify_signature_bytes(DOMAIN + body, sig, Path(root) / SIGNATURE, pubs)
    except SignatureError as exc:
        why = "unsigned" if sig is None else exc.message.split(": ", 1)[-1]
        return None, Seal(IGNORED, reason=f"evidence {why} (trusted verifier keys are set)", pinned=expect)
    data = parse(body, path)
    if data.get("release_id") != release_id:
        return None, Seal(IGNORED, reason=f"evidence is signed for release {data.get('release_id')}, this is "
                                          f"{release_id}", pinned=expect)
    return data, Seal(VERIFIED, digest, signer, f"signed by verifier key {signer}", pinned=expect)


def note(seal_: Seal, *, cuda: bool = False, allow_unverified: bool = False) -> str | None:
    """The release-status line for ignored evidence, saying what serves (None otherwise)."""
    if seal_.state != IGNORED:
        return None
    if seal_.stale:
        return f"verification evidence ignored: {seal_.reason}; every specialization serves the PyTorch reference"
    what = ""
    if cuda:
        what = (": CUDA kernels run UNVERIFIED (allow_unverified is on)" if allow_unverified
                else ": CUDA specializations serve the reference (allow_unverified is off)")
    return f"verification evidence ignored: {seal_.reason}; the release serves as unverified{what}"


def check_dir(root: Path, keys: Iterable[Path | Ed25519PublicKey]) -> Seal:
    """The Seal of a release directory's current evidence under ``keys`` (for ``tune``, which keeps
    earlier evidence only when it can vouch for it). Raises BundleIntegrityError when not intact."""
    manifest = bundle.check_integrity(Path(root))
    try:
        return open_evidence(root, manifest["release_id"], manifest["files"], keys)[1]
    except BundleIntegrityError:
        return Seal(IGNORED, reason="evidence is not tileship evidence")

