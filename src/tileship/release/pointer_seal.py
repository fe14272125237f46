"""The signed activation pointer: who moved a registry's ``active.json``, and that it is not an older one.

Release signatures and evidence pins guard the release directories, not the pointer: whoever can write
the registry root can rewrite ``active.json`` to name another published release, change its evidence
pin, or put back an older pointer (one naming a release since rolled back, or a pin since superseded).
As TUF's timestamp/snapshot roles and Uptane's director do for their metadata, the pointer therefore has
a role and a counter of its own:

- Every registry change of the pointer (``activate``, ``activate --reference``, ``rollback``, a
  promotion, the drill) writes ``generation``: one above the pointer's before (a pointer from before
  generations counts as 0) and above the highest the registry wrote (``.generation``, a hint: an older
  pointer put back does not make the next ones older), so a later pointer always has a higher one.
- With an *activator* key (``Registry(activator_key=)``, ``--sign-key``, else ``TILESHIP_ACTIVATOR_KEY``;
  the ed25519 PEM keys ``tileship keygen`` writes) the pointer also holds ``sealed_by`` (the key id) and
  ``signature``: ed25519 over ``DOMAIN`` + the canonical JSON (sorted keys, no whitespace, ASCII) of every
  other field, ``generation``, ``sealed_by``, the history and every evidence pin included. The domain
  prefix keeps the role apart from manifest and evidence signatures even if one key were trusted for two.
- The signature lives in the pointer itself: the one ``os.replace`` that publishes a pointer publishes
  its signature, so no crash leaves a pointer beside another pointer's signature (a sibling ``active.sig``
  would need two renames, and a crash between them would leave a pointer its signature does not cover).
- Every pointer is bound to its registry: it holds ``registry_id``, the id in the registry's ``registry.json``
  (``registry_id``: random, written once, by the registry's first pointer write of a tileship that knows ids),
  inside what the signature covers.
- A reader that trusts activator keys (``check``; ``tileship serve REGISTRY --trusted-activator-key``,
  ``TILESHIP_TRUSTED_ACTIVATOR_KEYS``) refuses a pointer that is unsigned, malformed, sealed by a key it
  does not trust, changed after sealing, bound to another registry than the one it is read from, or older
  than the pointer it serves (``after``): a lower generation, the same generation with other content, or a
  pointer bound to another registry id than that one was (the registry's ``registry.json`` replaced).
  Refusals are ``PointerSignatureError``; one of binding names both registry ids.
- Pointers from before registry ids (no ``registry_id``), under trusted keys: accepted while the registry has
  no ``registry.json`` (it was never written since: nothing to bind to), and in a registry that has one only
  when their generation is below its ``since_generation`` (the generation of its first bound pointer: they
  predate the id, which is what a writer killed between writing the id and the pointer leaves); one at or
  above it was written by an older tileship after the id, or copied in, and is refused, as is any unbound
  pointer once the pointer a reader serves was bound. A pointer bound to an id where the registry has none is
  refused. Re-activating the active release with the key (``activate ID --sign-key``) binds an unbound pointer.
- With a validity (``--valid-for``, ``TILESHIP_POINTER_VALID_FOR``) the pointer states ``expires`` among the signed
  fields, and ``check`` refuses it once that instant has passed (``pointer_expiry``; PointerExpiredError).
- Schema 1 still: an older tileship reads a sealed pointer (it ignores the four keys) and, writing one,
  drops them, which a reader trusting activator keys refuses as unsigned (or, sealed by an older tileship with
  the key, as unbound). With no activator key trusted nothing here is checked.

A server may keep the pointer it served across restarts (``pointer_served``: ``tileship serve --generation-state
FILE``, ``TILESHIP_POINTER_STATE``), so that a restarted server refuses an older pointer, or a registry whose id
changed, too.

A reader may be given the registry id to trust (``check(registry=)``; ``serve --trusted-registry-id``,
``TILESHIP_TRUSTED_REGISTRY_ID``): then only a pointer bound to that id is accepted, from the first one on.

Not covered: without that file, the first pointer a fresh server process sees is trusted on first use for its
generation and (without a trusted registry id) its registry id; ``registry.json`` is as writable as the pointer,
so whoever can write the registry root can replace it with another registry's id (or remove it and put in a
pointer from before ids) and hand a fresh server without a trusted registry id that registry's pointers (a
server that served a bound pointer refuses them: ``after``);
an activator that stops signing (a frozen pointer) is detected only for pointers written with a validity
(``pointer_expiry``): one without ``expires`` is accepted for as long as it is the newest.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tileship import env
from tileship.digits import parse_uint
from tileship.errors import PointerSignatureError
from tileship.release import bundle, pointer_expiry, small_file
from tileship.release import registry_id as regid

if TYPE_CHECKING:
    from tileship.release.records import Active
    from tileship.release.registry import Registry

DOMAIN = b"tileship-pointer-v1\0"
#: the fields this module writes into every pointer (``signature`` is the one not signed; with a validity,
#: ``pointer_expiry.FIELD`` too)
FIELDS = ("generation", "registry_id", "sealed_by", "signature")
#: beside the pointer: the highest generation the registry wrote (``next_generation``)
HIGH_WATER = ".generation"
_RESEAL_HINT = "restore it with `tileship activate ID --sign-key KEY` (or `tileship rollback --sign-key KEY`)"


@dataclass(frozen=True)
class Sealed:
    """A pointer a reader accepted: its ``generation``, the trusted activator key that sealed it
    (``key_id``), the sha256 of its signed bytes (``digest``: two pointers of one generation differ) and the
    registry it is bound to (``registry_id``; None: a pointer from before registry ids). ``expires``: the instant
    it is valid until (``pointer_expiry``; None: no expiry), covered by ``digest`` and so not compared."""

    generation: int
    key_id: str
    digest: str
    registry_id: str | None = None
    expires: str | None = field(default=None, compare=False)


def generation_of(state: Mapping[str, Any]) -> int:
    """A pointer's generation; 0 for one written before generations."""
    gen = state.get("generation", 0)
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else 0


def signed_bytes(state: Mapping[str, Any]) -> bytes:
    """What the signature is over: ``DOMAIN`` + the canonical JSON of every field but ``signature``.
    Raises ValueError for a state JSON cannot represent canonically (NaN)."""
    body = {k: v for k, v in state.items() if k != "signature"}
    return DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                               allow_nan=False).encode()


def seal(state: Mapping[str, Any], generation: int, key: Ed25519PrivateKey | None,
         registry_id: str | None = None, expires: str | None = None) -> dict[str, Any]:
    """``state`` as the next pointer: ``generation``, ``registry_id`` (the registry's, ``registry_id.ensure``;
    None: unbound) and ``expires`` (``pointer_expiry.stamp``; None: none, an earlier one dropped) set and, with
    ``key``, ``sealed_by`` and ``signature`` over them (without one, an earlier seal is dropped: unsigned)."""
    out = {k: v for k, v in state.items() if k not in FIELDS and k != pointer_expiry.FIELD}
    out["generation"] = generation
    if expires is not None:
        out[pointer_expiry.FIELD] = expires
    if registry_id is not None:
        out["registry_id"] = registry_id
    if key is not None:
        out["sealed_by"] = bundle.key_id(key.public_key())
        out["signature"] = base64.b64encode(key.sign(signed_bytes(out))).decode()
    return out


def next_generation(root: Path, old: Mapping[str, Any]) -> int:
    """The next pointer's generation: one above both the pointer ``old``'s and the highest this registry wrote
    (``HIGH_WATER``), so that after an older pointer is put back (which servers that served a newer one refuse)
    the activator's next pointer is newer than theirs at once. The mark is a hint, not trusted: an unreadable one
    counts as 0 (garbage, a FIFO, a directory, a huge file: never read whole), and one lowered or removed only
    delays that recovery."""
    try:
        mark = parse_uint(small_file.read(Path(root) / HIGH_WATER, 64).decode("ascii", "replace").strip()) or 0
    except OSError:
        mark = 0
    return max(generation_of(old), mark) + 1


def record_generation(root: Path, generation: int) -> None:
    """Best effort, once the pointer of ``generation`` is in place: ``HIGH_WATER`` says it (through a temporary
    that the registry's ``gc`` removes if a kill leaves it; a failure, a full disk included, is ignored)."""
    tmp = Path(root) / f"{HIGH_WATER}.tmp{os.getpid()}"
    try:
        tmp.write_text(f"{generation}\n")
        os.replace(tmp, Path(root) / HIGH_WATER)
    except OSError:
        tmp.unlink(missing_ok=True)


def sealed_by(state: Mapping[str, Any]) -> str | None:
    """The key id a pointer says sealed it (not checked), or None."""
    kid = state.get("sealed_by")
    return kid if isinstance(kid, str) else None


def reseals(state: Mapping[str, Any], key: Ed25519PrivateKey | None, own: str | None = None,
            valid_for: timedelta | None = None) -> bool:
    """Whether ``key`` is an activator key that did not seal ``state``, or ``state`` is not bound to ``own`` (the
    registry's id; None: it has none yet), or the write has a validity (``pointer_expiry.valid_for``: a refresh):
    writing the same state again (activating the active release) then seals it anew, bound to the registry, with
    its new expiry, rather than leaving it as it is. Raises RegistryError for a malformed validity variable."""
    if pointer_expiry.valid_for(valid_for) is not None:
        return True
    return key is not None and (sealed_by(state) != bundle.key_id(key.public_key())
                                or own is None or state.get("registry_id") != own)


def signing_key(key: Path | Ed25519PrivateKey | None) -> Ed25519PrivateKey | None:
    """The activator key to seal with: ``key``, else ``TILESHIP_ACTIVATOR_KEY``; None: unsigned.
    Raises SignatureError naming an unusable key file."""
    key = key if key is not None else env.activator_key()
    return key if key is None or isinstance(key, Ed25519PrivateKey) else bundle.load_private_key(key)


def trusted(keys: Iterable[Path | Ed25519PublicKey] | None) -> list[Ed25519PublicKey]:
    """Trusted activator public keys from paths or key objects; None reads ``TILESHIP_TRUSTED_ACTIVATOR_KEYS``.
    Raises SignatureError naming an unusable key file."""
    raw = list(keys) if keys is not None else env.trusted_activator_key_paths()
    return [k if isinstance(k, Ed25519PublicKey) else bundle.load_public_key(Path(k)) for k in raw]


def check(path: Path, state: Mapping[str, Any], keys: Sequence[Ed25519PublicKey],
          after: Sealed | None = None, now: datetime | None = None, registry: str | None = None) -> Sealed:
    """Accept the pointer ``state`` (read from ``path``) only when sealed by one of ``keys``, unchanged
    since, not expired at ``now`` (default: the system clock; ``pointer_expiry``), bound to ``registry`` (a
    registry id the reader trusts, ``registry_id.trusted``; None: the registry's own, trusted on first use) and not
    older than ``after`` (the pointer a server serves: a lower generation, or the same one with other content, is
    a replay). Returns what was accepted.

    Raises PointerSignatureError naming ``path``, the key id and what is wrong (PointerExpiredError, naming the
    instant, for an expired one)."""
    kid, sig = state.get("sealed_by"), state.get("signature")
    if kid is None and sig is None:
        raise PointerSignatureError(f"{path}: the pointer is not signed, but activator keys are trusted",
                                    path=str(path), hint=_RESEAL_HINT)
    if not isinstance(kid, str) or not isinstance(sig, str):
        raise PointerSignatureError(f"{path}: malformed pointer seal (sealed_by and signature must be strings)",
                                    path=str(path), key_id=sealed_by(state), hint=_RESEAL_HINT)
    by_id = {bundle.key_id(k): k for k in keys}
    if (key := by_id.get(kid)) is None:
        raise PointerSignatureError(f"{path}: sealed by activator key {kid}, which is not trusted (trusted: "
                                    f"{', '.join(sorted(by_id))})", path=str(path), key_id=kid,
                                    hint="seal it with a trusted activator key, or trust that key's public half "
                                         "(--trusted-activator-key, TILESHIP_TRUSTED_ACTIVATOR_KEYS)")
    try:
        body = signed_bytes(state)
        key.verify(base64.b64decode(sig, validate=True), body)
    except (ValueError, InvalidSignature):
        raise PointerSignatureError(f"{path}: the signature of activator key {kid} does not verify: the pointer "
                                    "was changed after it was sealed", path=str(path), key_id=kid,
                                    hint=_RESEAL_HINT) from None
    gen, digest = generation_of(state), "sha256:" + hashlib.sha256(body).hexdigest()
    expires = pointer_expiry.check(path, state, kid, now)
    bound = _bound(path, state, kid, after, registry)
    if after is not None and (gen < after.generation or (gen == after.generation and digest != after.digest)):
        what = "older than" if gen < after.generation else "another pointer of the same generation as"
        raise PointerSignatureError(f"{path}: generation {gen} is {what} generation {after.generation}, the "
                                    f"pointer this server serves: an earlier pointer put back is refused (replay)",
                                    path=str(path), key_id=kid,
                                    hint="activate or roll back again (`tileship activate ID --sign-key KEY`) to "
                                         "seal a newer pointer; the release serving keeps serving")
    return Sealed(gen, kid, digest, bound, expires)


def _bound(path: Path, state: Mapping[str, Any], kid: str, after: Sealed | None, trusted_id: str | None) -> str | None:
    """The registry id the sealed pointer ``state`` is bound to, when that is the registry's own (``registry.json``
    beside ``path``), the one the pointer ``after`` was bound to and ``trusted_id`` (when given). Refused
    (PointerSignatureError naming both ids): a pointer not bound to ``trusted_id``, unbound ones included; a pointer
    bound to another registry, or to one where this registry has no id; an unbound pointer (from before registry
    ids) of a generation at or above the registry's ``since_generation`` (an unbound pointer older than that
    predates the id and is accepted); any pointer not bound to the registry id of the pointer served."""
    claimed = state.get("registry_id")
    claimed = claimed if isinstance(claimed, str) else None
    own = regid.read(path.parent, PointerSignatureError)
    own_id, gen = (own.registry_id if own else None), generation_of(state)
    why = None
    if trusted_id is not None and claimed != trusted_id:
        why = (f"the pointer is bound to registry {claimed or 'none'}, but this reader trusts only registry "
               f"{trusted_id} (--trusted-registry-id, TILESHIP_TRUSTED_REGISTRY_ID): another registry's pointer, "
               f"or one from before registry ids, is refused")
    elif claimed is not None and claimed != own_id:
        why = (f"the pointer is bound to registry {claimed}, but this registry is "
               f"{own_id or f'not bound to any id (no {regid.NAME})'}: a pointer copied from another registry "
               f"is refused")
    elif claimed is None and own is not None and gen >= own.since:
        why = (f"the pointer is bound to no registry, but this registry is {own_id}, which binds every pointer from "
               f"generation {own.since} on (this one is generation {gen}): written by a tileship before registry ids, "
               f"or copied from another registry")
    elif after is not None and after.registry_id is not None and claimed != after.registry_id:
        why = (f"the pointer is bound to registry {claimed or 'none'}, but the pointer this server serves is bound to "
               f"registry {after.registry_id}: the registry's identity changed ({regid.NAME} replaced?)")
    if why is not None:
        raise PointerSignatureError(f"{path}: {why}", path=str(path), key_id=kid, hint=_RESEAL_HINT + (
            f" with a tileship that knows registry ids; never copy {path.name} between registries"))
    return claimed


def follow(root: Path, keys: Sequence[Ed25519PublicKey], after: Sealed | None = None,
           registry: str | None = None) -> tuple[Registry, dict[str, Any], Sealed | None]:
    """(the registry at ``root``, its pointer state read once, what ``check`` accepted of it, bound to the registry
    id ``registry_id.trusted(registry)``): how every reader that follows a pointer reads it (``serve.source``, the Ray
    fleet's controller, ``tileship diagnose``). None is accepted without ``keys``, and for a pointer naming nothing
    (nothing to load). Raises RegistryError for an unreadable pointer or a malformed trusted registry id,
    PointerSignatureError for a pointer the keys refuse."""
    from tileship.release.registry import Registry, read_pointer

    reg = Registry(root)
    state = read_pointer(reg.pointer)
    if not keys or (state["release_id"] is None and not state["history"]):
        return reg, state, None
    return reg, state, check(reg.pointer, state, keys, after, registry=regid.trusted(registry))


def active_checked(root: Path, keys: Sequence[Ed25519PublicKey], after: Sealed | None = None,
                   registry: str | None = None) -> tuple[Active, Sealed | None]:
    """The active state of the registry at ``root``, its pointer read and checked once (``follow``), and what
    the check accepted. Raises as ``follow`` does."""
    reg, state, sealed = follow(root, keys, after, registry)
    return reg.active_of(state), sealed
