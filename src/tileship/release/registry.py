"""The release registry: published releases by id and an atomic "active" pointer.

Layout (default ``$TILESHIP_HOME/registry``)::

    releases/<release id>/   a complete, integrity-checked copy of a release bundle
    active.json              {"schema", "release_id", "reference_only", "history": [...]}
    .lock                    serializes every change (filelock)

``active.json`` names the release a server should serve (or that release in reference-only
mode) and the states active before it, newest first: ``rollback`` pops that stack. It is
only ever replaced whole (temp file, fsync, ``os.replace``, fsync of the directory), so a
process killed at any instant leaves the old pointer or the new one, never a torn file.
Readers (``active()``) take no lock. Nothing here imports torch or TileLang.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from tileship import env
from tileship.errors import BundleError, RegistryError
from tileship.release import bundle
from tileship.release.records import Active, ReleaseInfo, verification_status  # noqa: F401 (re-exported)

POINTER = "active.json"
POINTER_SCHEMA = 1
HISTORY_LIMIT = 32
LOCK_TIMEOUT_S = 60.0
_TMP_PREFIX = ".active.tmp-"


def default_root() -> Path:
    """``$TILESHIP_HOME/registry`` (``./.tileship/registry`` by default)."""
    return env.home() / "registry"


class Registry:
    """A registry rooted at ``root`` (created on first write). Every method is safe to call
    from several processes at once: changes are serialized by a file lock."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.releases_dir = self.root / "releases"
        self.pointer = self.root / POINTER

    # -- reading ----------------------------------------------------------------
    def active(self) -> Active:
        """The active state. Takes no lock (the pointer is replaced whole).

        Raises RegistryError when the pointer exists but is not a valid pointer file.
        """
        state = self._read_pointer()
        rid = state["release_id"]
        history = state["history"]
        return Active(release_id=rid, path=self.releases_dir / rid if rid else None,
                      reference_only=bool(state["reference_only"]),
                      previous=history[0]["release_id"] if history else None)

    def history(self) -> list[dict[str, Any]]:
        """Earlier active states, newest first: ``{"release_id", "reference_only"}``."""
        return list(self._read_pointer()["history"])

    def path_of(self, release_id: str) -> Path:
        """The directory of a published release (``release_id`` may be a unique prefix)."""
        return self.releases_dir / self.resolve(release_id)

    def resolve(self, release_id: str) -> str:
        """The full id of a published release given its id or a unique prefix of it."""
        if not release_id or not re.fullmatch(r"[0-9A-Za-z_-]+", release_id):
            raise RegistryError(f"{release_id!r} is not a release id", hint="run `tileship releases` to list them")
        if (self.releases_dir / release_id).is_dir():
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
            root = self.releases_dir / rid
            try:
                bundle.check_integrity(root)
                ok, err = True, None
            except BundleError as exc:
                ok, err = False, exc.message
            status, detail = verification_status(root)
            try:
                rel = json.loads((root / "release.json").read_text())
                model = f"{rel['model']['name']}:{rel['model']['version']}"
                revision = str(rel.get("kernel_revision", "?"))
            except (OSError, ValueError, KeyError, TypeError):
                model, revision = "?", "?"
            is_active = rid == state["release_id"]
            out.append(ReleaseInfo(rid, root, model, revision, status, detail, ok, err, is_active,
                                   is_active and bool(state["reference_only"]), root.stat().st_mtime))
        return sorted(out, key=lambda r: (r.published_at, r.release_id))

    # -- changing ---------------------------------------------------------------
    def publish(self, source: Path | str, *, replace: bool = False) -> str:
        """Copy a release bundle (directory or ``tileship pack`` archive) into the registry. Returns its id.

        Integrity is checked before and after the copy; the copy appears whole or not at all.
        Publishing the identical release again is a no-op. A release with the same id but
        other non-identity files (newer evidence, build log) is refused unless ``replace``.
        Raises BundleIntegrityError (names the file) or RegistryError.
        """
        src = Path(source)
        with self._locked():
            if src.is_file():
                with tempfile.TemporaryDirectory(dir=self.root, prefix=".unpack-") as tmp:
                    try:
                        unpacked = bundle.unpack(src, Path(tmp))
                    except (tarfile.TarError, OSError) as exc:
                        raise RegistryError(f"{src}: not a release directory or a `tileship pack` archive ({exc})") from None
                    return self._publish_dir(unpacked, replace)
            return self._publish_dir(src, replace)

    def _publish_dir(self, src: Path, replace: bool) -> str:
        manifest = bundle.check_integrity(src)
        rid = manifest["release_id"]
        dest = self.releases_dir / rid
        self.releases_dir.mkdir(parents=True, exist_ok=True)
        if dest.is_dir():
            try:
                same = bundle.read_manifest(dest) == manifest and _read_or_none(dest / bundle.SIGNATURE) == _read_or_none(src / bundle.SIGNATURE)
            except BundleError:
                same = False
            if same:
                bundle.check_integrity(dest)
                return rid
            if not replace:
                raise RegistryError(f"release {rid} is already published with other evidence or build log ({dest})",
                                    hint="pass --replace to overwrite the published copy")
            staged = self.releases_dir / f".incoming-{uuid.uuid4().hex[:8]}"
            bundle.copy_release(src, staged)
            trash = self.releases_dir / f".trash-{uuid.uuid4().hex[:8]}"
            os.replace(dest, trash)
            os.replace(staged, dest)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            bundle.copy_release(src, dest)
        bundle.check_integrity(dest)
        os.utime(dest)  # the copy keeps the source's times; ``releases()`` sorts by publication
        _fsync_dir(self.releases_dir)
        return rid

    def activate(self, release_id: str, *, force: bool = False, reference_only: bool = False) -> Active:
        """Make ``release_id`` active (atomically). Returns the new state.

        Refused with RegistryError naming why, unless ``force``: the release fails its
        integrity check (or its signature, when trusted keys are configured), or its
        verification evidence records a failure. ``reference_only`` activates it with every
        operator on the PyTorch reference (no checks needed: no native code will run).
        """
        with self._locked():
            rid = self.resolve(release_id)
            if not (force or reference_only):
                self._check_activatable(rid)
            self._write_state(rid, reference_only)
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
            self._write_pointer({"schema": POINTER_SCHEMA, "release_id": prev["release_id"],
                                 "reference_only": prev["reference_only"], "history": rest})
        return self.active()

    # -- internals ----------------------------------------------------------------
    def _ids(self) -> list[str]:
        if not self.releases_dir.is_dir():
            return []
        return sorted(p.name for p in self.releases_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
                      and ".tmp" not in p.name)

    def _check_activatable(self, rid: str) -> None:
        root = self.releases_dir / rid
        hint = "fix or re-publish the release, or pass --force to activate it anyway"
        try:
            bundle.check_integrity(root)
            keys = env.trusted_key_paths()
            if keys:
                bundle.verify_signature(root, [bundle.load_public_key(k) for k in keys])
        except BundleError as exc:
            raise RegistryError(f"refusing to activate {rid}: integrity check failed: {exc.message}",
                                hint=hint) from exc
        status, detail = verification_status(root)
        if status in ("failed", "unreadable"):
            raise RegistryError(f"refusing to activate {rid}: verification {status}: {detail}", hint=hint)

    def _write_state(self, rid: str, reference_only: bool) -> None:
        state = self._read_pointer()
        if state["release_id"] == rid and bool(state["reference_only"]) == reference_only:
            return
        history = state["history"]
        if state["release_id"] is not None:
            history = [{"release_id": state["release_id"], "reference_only": bool(state["reference_only"])}, *history]
        self._write_pointer({"schema": POINTER_SCHEMA, "release_id": rid, "reference_only": reference_only,
                             "history": history[:HISTORY_LIMIT]})

    def _read_pointer(self) -> dict[str, Any]:
        try:
            raw = self.pointer.read_text()
        except FileNotFoundError:
            return {"schema": POINTER_SCHEMA, "release_id": None, "reference_only": False, "history": []}
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise RegistryError(f"{self.pointer}: not valid JSON ({exc})",
                                hint="it is only ever replaced whole; restore it with `tileship activate ID`") from None
        ok = (isinstance(data, dict) and data.get("schema") == POINTER_SCHEMA and isinstance(data.get("history"), list)
              and (data.get("release_id") is None or isinstance(data.get("release_id"), str))
              and all(isinstance(h, dict) and isinstance(h.get("release_id"), str) for h in data["history"]))
        if not ok:
            raise RegistryError(f"{self.pointer}: not a tileship active pointer (schema {POINTER_SCHEMA})",
                                hint="restore it with `tileship activate ID`")
        return data

    def _write_pointer(self, state: dict[str, Any]) -> None:
        """Atomic: write a temp file, fsync it, rename it over the pointer, fsync the directory."""
        for stale in self.root.glob(_TMP_PREFIX + "*"):  # left by a killed writer; we hold the lock
            stale.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=_TMP_PREFIX)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(state, indent=2, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.pointer)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.root)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.root / ".lock"))
        try:
            lock.acquire(timeout=LOCK_TIMEOUT_S)
        except Timeout:
            raise RegistryError(f"{self.root}: another registry change has held the lock for {LOCK_TIMEOUT_S:g} s",
                                hint=f"wait for it to finish; a stuck process holding {self.root / '.lock'} must be "
                                     "stopped") from None
        try:
            yield
        finally:
            lock.release()


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
