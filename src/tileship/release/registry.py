"""The release registry: published releases by id and an atomic "active" pointer.

Layout (default ``$TILESHIP_HOME/registry``)::

    releases/<release id>[@<n>]/  a complete, integrity-checked, fsynced copy of a release bundle; ``publish
                             --replace`` renames a complete ``<id>@<n+1>`` into place (the highest n is current)
                             before the older copy is removed: there is no instant without a valid copy of the id
    active.json              {"schema", "release_id", "reference_only", "evidence", "history": [...], "generation",
                             "registry_id", "expires", "sealed_by", "signature"}
    images/<release id>.json the image the release ships in (``publish --image-digest``; ``release.images``)
    .lock                    serializes every change (filelock)
    .reserve                 64 KiB kept free so that the pointer can be rewritten on a full disk
    .generation              the highest pointer generation written (``pointer_seal.next_generation``)
    registry.json            the registry's id, written once by its first pointer write (``registry_id``)

Leftovers of a killed writer (``.tmp*``, ``.incoming-*``, ``.trash-*``, ``.unpack-*``, copies superseded by a
newer ``@<n>``) are removed at the start of the next change (``gc``).

``active.json`` names the release a server should serve (or that release in reference-only mode) and the states
active before it, newest first: ``rollback`` pops that stack. It is only ever replaced whole (temp file, fsync,
``os.replace``, fsync of the directory), so a process killed at any instant leaves the old pointer or the new
one, never a torn file. Each state pins the evidence in effect when it was activated (``evidence``,
``records``): a load through the registry ignores evidence other than the pinned one (``evidence_seal``);
activating the active release again re-pins it in place (after ``publish --replace``). Every write moves the
pointer's ``generation`` up and, with an activator key, seals it in the same file (``pointer_seal``), so a
server that trusts activator keys refuses a forged or older pointer. Readers (``active()``) take no lock.
Nothing here imports torch or TileLang.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from filelock import FileLock, Timeout

from tileship import env
from tileship.errors import BundleError, RegistryError
from tileship.release import evidence_seal, integrity, layout, pointer_expiry, pointer_seal
from tileship.release import registry_id as regid
from tileship.release.publishing import Publishing
from tileship.release.records import (  # noqa: F401 (re-exported)
    POINTER_SCHEMA,
    RESERVE,
    Active,
    ReleaseInfo,
    entry,
    make_reserve,
    pin_of,
    read_pointer,
    release_info,
    verification_status,
    write_pointer,
)

POINTER = "active.json"
HISTORY_LIMIT = 32
LOCK_TIMEOUT_S = 60.0


def default_root() -> Path:
    """``$TILESHIP_HOME/registry`` (``./.tileship/registry`` by default)."""
    return env.home() / "registry"


class Registry(Publishing):
    """A registry rooted at ``root`` (created on first write). Every method is safe to call
    from several processes at once: changes are serialized by a file lock. ``activator_key`` (a PEM path or
    key; default ``TILESHIP_ACTIVATOR_KEY``, else unsigned) seals every pointer written (``pointer_seal``), with
    an expiry ``valid_for`` after the write (default ``TILESHIP_POINTER_VALID_FOR``, else none; ``pointer_expiry``)."""

    def __init__(self, root: Path | str | None = None, *,
                 activator_key: Path | Ed25519PrivateKey | None = None, valid_for: timedelta | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.activator_key, self.valid_for = activator_key, valid_for
        self.releases_dir = self.root / "releases"
        self.pointer = self.root / POINTER

    # -- reading ----------------------------------------------------------------
    def active(self) -> Active:
        """The active state. Takes no lock (the pointer is replaced whole).

        Raises RegistryError when the pointer exists but is not a valid pointer file.
        """
        return self.active_of(self._read_pointer())

    def active_of(self, state: dict[str, Any]) -> Active:
        """What the pointer state ``state`` (``read_pointer(self.pointer)``) names: a reader that checks the
        pointer (``pointer_seal.check``) resolves the very state it checked."""
        rid, history = state["release_id"], state["history"]
        return Active(release_id=rid, path=self._current(rid) if rid else None,
                      reference_only=bool(state["reference_only"]),
                      previous=history[0]["release_id"] if history else None, evidence=pin_of(state),
                      generation=pointer_seal.generation_of(state) if "generation" in state else None,
                      sealed_by=pointer_seal.sealed_by(state), expires=pointer_expiry.stated(state))

    def history(self) -> list[dict[str, Any]]:
        """Earlier active states, newest first: ``{"release_id", "reference_only", "evidence"}`` (``records``)."""
        return list(self._read_pointer()["history"])

    def path_of(self, release_id: str) -> Path:
        """The directory of a published release (``release_id`` may be a unique prefix)."""
        return self._current(self.resolve(release_id))

    def resolve(self, release_id: str) -> str:
        """The full id of a published release given its id or a unique prefix of it."""
        if not release_id or not re.fullmatch(r"[0-9A-Za-z_-]+", release_id):
            raise RegistryError(f"{release_id!r} is not a release id", hint="run `tileship releases` to list them")
        if release_id in self._ids():
            return release_id
        matches = [r for r in self._ids() if r.startswith(release_id)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise RegistryError(f"no release {release_id!r} in {self.releases_dir}",
                                hint="publish it first (`tileship publish BUNDLE`); `tileship releases` lists what is "
                                     "there")
        raise RegistryError(f"release id prefix {release_id!r} is ambiguous: {', '.join(sorted(matches))}",
                            hint="give more characters")

    def releases(self) -> list[ReleaseInfo]:
        """Every published release, oldest first, each with integrity re-checked (hashes every file)."""
        try:
            state = self._read_pointer()
        except RegistryError:
            state = {"release_id": None, "reference_only": False}
        out = []
        for rid in self._ids():
            for attempt in range(3):  # a copy retired by a concurrent ``publish --replace``: read the next one
                try:
                    out.append(release_info(rid, self._current(rid), state))
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise RegistryError(f"release {rid} kept changing while it was listed (concurrent "
                                            f"`publish --replace`?)", hint="list the registry again") from None
        return sorted(out, key=lambda r: (r.published_at, r.release_id))

    # -- changing ---------------------------------------------------------------
    def activate(self, release_id: str, *, force: bool = False, reference_only: bool = False,
                 evidence: str | None = None) -> Active:
        """Make ``release_id`` active (atomically), pinning its evidence (``Active.evidence``). Returns the new state.

        Refused with RegistryError naming why, unless ``force``: the release fails its integrity check
        (or its signature, when trusted keys are configured), or its verification evidence records a
        failure (not when re-pinning the active release: failed specializations serve the reference).
        ``reference_only``: every operator on the PyTorch reference (no checks: no native code runs).
        ``evidence``: the pin the caller loaded it with (a canary); refused when its evidence is now other.
        """
        with self._locked():
            rid = self.resolve(release_id)
            if not (force or reference_only):
                state = self._read_pointer()
                self._check_activatable(rid, repin=(state["release_id"], bool(state["reference_only"])) == (rid, False))
            self._write_state(rid, reference_only, evidence)
        return self.active()

    def activate_reference(self, release_id: str | None = None) -> Active:
        """Serve the references only (the last line of defence), for ``release_id`` or the active one."""
        with self._locked():
            rid = self.resolve(release_id) if release_id else self._read_pointer()["release_id"]
            if rid is None:
                raise RegistryError("no release is active, so there are no operators to serve by reference",
                                    hint="name a release: `tileship activate --reference ID`")
            self._write_state(rid, True)
        return self.active()

    def rollback(self, *, force: bool = False) -> Active:
        """Return to the state active before the current one (pops the history stack).

        Raises RegistryError when there is no earlier state, or when the earlier release no
        longer passes its checks (unless ``force``).
        """
        with self._locked():
            state = self._read_pointer()
            if not state["history"]:
                raise RegistryError("nothing to roll back to: no earlier active release is recorded",
                                    hint="activate a release by id instead (`tileship releases` lists them)")
            prev, rest = state["history"][0], state["history"][1:]
            if not (force or prev["reference_only"]):
                self._check_activatable(prev["release_id"])
            self._write_pointer({"schema": POINTER_SCHEMA, **entry(prev["release_id"], prev["reference_only"],
                                                                    pin_of(prev)), "history": rest}, state)
        return self.active()

    # -- internals ----------------------------------------------------------------
    def _ids(self) -> list[str]:
        return sorted(self._versions())

    def _versions(self) -> dict[str, list[Path]]:
        return layout.versions(self.releases_dir)

    def _current(self, rid: str) -> Path:
        return (self._versions().get(rid) or [self.releases_dir / rid])[0]

    def collect(self) -> list[str]:
        """``gc`` under the registry lock (what ``tileship gc`` runs). Returns what was removed."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._locked() as removed:
            return removed

    def gc(self) -> list[str]:
        """Remove what killed writers left behind and copies superseded by a newer ``@n``. Returns their names.

        Called (under the lock) at the start of every change; ``tileship gc`` runs it alone.
        """
        return layout.collect_leftovers(self.root, self.releases_dir)

    def _check_activatable(self, rid: str, *, repin: bool = False) -> None:
        root = self._current(rid)
        hint = "fix or re-publish the release, or pass --force to activate it anyway"
        try:
            held = integrity.check(root).release_id  # load's checks, with load's key sources
        except BundleError as exc:
            raise RegistryError(f"refusing to activate {rid}: integrity check failed: {exc.message}",
                                hint=hint) from exc
        if held != rid:  # a copy replaced by (or renamed from) another release: a server would serve that one
            raise RegistryError(f"refusing to activate {rid}: integrity check failed: {root} holds release {held}, "
                                f"not {rid} (the registry's copy was replaced or renamed)", hint=hint)
        status, detail = verification_status(root)
        if status == "unreadable" or (status == "failed" and not repin):
            raise RegistryError(f"refusing to activate {rid}: verification {status}: {detail}", hint=hint)

    def _write_state(self, rid: str, reference_only: bool, expect: str | None = None) -> None:
        """Activate (``rid``, mode) with its evidence pinned now. The same release in the same mode again
        re-pins it in place when its evidence changed (``publish --replace``), else records nothing."""
        state = self._read_pointer()
        new = entry(rid, reference_only, pin := evidence_seal.pin(self._current(rid)))
        if evidence_seal.check_pin(pin, expect) is not None:
            raise RegistryError(f"refusing to activate {rid}: its evidence is now {pin}, not {expect} as loaded")
        history = state["history"]
        if state["release_id"] == rid and bool(state["reference_only"]) == reference_only:
            own = regid.read(self.root)
            own_id = own.registry_id if own else None
            if pin_of(state) == pin_of(new) and not pointer_seal.reseals(state, self._sealer(), own_id, self.valid_for):
                return  # unchanged (an activator key that did not seal it, an unbound seal, a validity: seals anew)
        elif state["release_id"] is not None:
            history = [entry(state["release_id"], state["reference_only"], pin_of(state)), *history]
        self._write_pointer({"schema": POINTER_SCHEMA, **new, "history": history[:HISTORY_LIMIT]}, state)

    def _read_pointer(self) -> dict[str, Any]:
        return read_pointer(self.pointer)

    def _sealer(self) -> Ed25519PrivateKey | None:
        return pointer_seal.signing_key(self.activator_key)

    def _write_pointer(self, state: dict[str, Any], old: dict[str, Any]) -> None:
        """``state`` as the pointer after ``old``: its next generation (and expiry), sealed when there is a key."""
        gen, key = pointer_seal.next_generation(self.root, old), self._sealer()
        expires = pointer_expiry.stamp(self.valid_for, key)  # refused before anything is written
        bound = regid.ensure(self.root, since=gen).registry_id  # written once, before the first pointer bound to it
        write_pointer(self.pointer, pointer_seal.seal(state, gen, key, bound, expires))
        pointer_seal.record_generation(self.root, gen)

    @contextmanager
    def _locked(self) -> Iterator[list[str]]:
        self.root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.root / ".lock"))
        try:
            lock.acquire(timeout=LOCK_TIMEOUT_S)
        except Timeout:
            raise RegistryError(f"{self.root}: another registry change has held the lock for {LOCK_TIMEOUT_S:g} s",
                                hint=f"wait for it to finish; a stuck process holding {self.root / '.lock'} must be "
                                     "stopped") from None
        try:
            removed = self.gc()
            make_reserve(self.root)
            yield removed
        finally:
            lock.release()
