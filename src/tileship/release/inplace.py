"""Writes inside an existing release (``sign``, ``evidence.write``), safe against a kill at any instant.

Each such file (``IN_PLACE``) is written to a temporary ``<name>.tmp<pid>-<random>`` beside it (each writer
its own: ``atomic_file.temporary``), fsynced, then renamed onto it (``stage`` + ``os.replace``). A writer killed
before its rename leaves that temporary: a ``leftover``, which ``integrity.check`` ignores (it is never part of
the release, never loaded) and the next writer removes (``settle``: its pid is gone). A writer that moves
several files (``evidence.write``: the evidence, its seal and the manifest) writes the new manifest first: killed
between its renames, the files match that pending manifest, which ``integrity.check`` accepts and
``settle`` makes the manifest. Writers of one release are serialized (``writing``: a file lock), so two
of them at once (``tileship verify`` and ``tileship tune``, or ``sign``) never mix their files. A reader
whose release directory is retired under it (a registry's ``publish --replace``) is told so
(``raise_if_replaced``), not that a file is missing.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from tileship.errors import BundleError
from tileship.release.atomic_file import TEMPORARY, abandoned, running, temporary

MANIFEST = "manifest.json"
#: the files tileship rewrites inside an existing release
IN_PLACE = frozenset({MANIFEST, "manifest.sig", "evidence/verification.json", "evidence/verification.sig"})
_LEFTOVER = re.compile(r"(.+)" + TEMPORARY)
#: how long an in-place writer waits for another one writing the same release
LOCK_TIMEOUT_S = 120.0


@contextmanager
def writing(root: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the lock of ``root``'s in-place writers for the block. The lock file lives outside the
    release (under the temp directory, named by the release's resolved path), so the release's
    files stay exactly its manifest's; a killed holder's lock is released by the kernel. Raises
    BundleError naming the release when another writer holds it longer than ``timeout_s``, and as
    ``lock_dir`` when no folder for the lock is safe."""
    key = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:16]
    lock = FileLock(str(lock_dir() / f"{key}.lock"))
    try:
        lock.acquire(timeout=timeout_s)
    except Timeout:
        raise BundleError(f"{root}: another writer (sign, verify, tune) has held this release for {timeout_s:g} s",
                          path=str(root), hint=f"wait for it to finish; a stuck one holds {lock.lock_file}") from None
    try:
        yield
    finally:
        lock.release()


def lock_dir(base: Path | None = None) -> Path:
    """The folder of the writers' lock files: ``<base>/tileship-release-locks`` (``base``: the temp directory,
    ``tempfile.gettempdir()``, ``$TMPDIR`` first), else ``tileship-release-locks-<uid>`` when the shared one is
    not safe: a symlink (someone else's choice of where locks go), not a directory, not this user's or not
    writable. Each is created with mode 0o700 when absent. Raises BundleError naming both folders and what is
    wrong with each when neither is safe."""
    base = Path(tempfile.gettempdir()) if base is None else base
    uid = os.getuid()
    problems = []
    for where in (base / "tileship-release-locks", base / f"tileship-release-locks-{uid}"):
        problem = _unsafe(where, uid)
        if problem is None:
            return where
        problems.append(f"{where} {problem}")
    raise BundleError(f"no safe folder for the release writers' lock files: {'; '.join(problems)}",
                      path=str(base), hint="remove those folders (or make them yours, mode 0o700), or set TMPDIR "
                                           "to a directory of your own")


def _unsafe(where: Path, uid: int) -> str | None:
    """What makes ``where`` unsafe to hold this user's lock files (creating it, mode 0o700, when absent), or None."""
    try:
        where.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot be created ({exc.strerror or exc})"
    try:
        st = where.lstat()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid:
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if not os.access(where, os.W_OK | os.X_OK):
        return "is not writable"
    return None


def leftover(rel: str) -> bool:
    """True for the temporary of an in-place write (``IN_PLACE``) that a killed writer left."""
    m = _LEFTOVER.fullmatch(rel)
    return m is not None and m.group(1) in IN_PLACE


def stage(path: Path, body: bytes, *, pid: int | None = None) -> Path:
    """Write ``body`` to a new temporary of ``path``, ``<name>.tmp<pid>-<random>`` (``pid``: this process's unless
    given), and fsync it; returns the temporary (``os.replace`` it onto ``path`` to commit). Writers in threads of
    one process each get their own. Raises OSError, the temporary removed, when it cannot be written."""
    tmp = temporary(path, pid=pid)
    try:
        with open(tmp, "xb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_atomic(path: Path, body: bytes) -> None:
    """Replace ``path`` by ``body`` whole (``stage`` + ``os.replace``): killed at any instant, ``path``
    holds the old bytes or the new ones. Temporaries of ``path`` that killed writers left are removed."""
    for tmp in path.parent.glob(glob.escape(path.name) + ".tmp*"):
        if abandoned(tmp.name, path.name):
            tmp.unlink(missing_ok=True)
    os.replace(stage(path, body), path)


def pending_manifests(root: Path) -> list[str]:
    """``manifest.json.tmp<pid>[-<random>]`` files directly in ``root``, newest first."""
    try:
        found = [(e.stat(follow_symlinks=False).st_mtime_ns, e.name) for e in os.scandir(root)
                 if e.name.startswith(MANIFEST + ".tmp") and leftover(e.name) and e.is_file(follow_symlinks=False)]
    except OSError:
        return []
    return [name for _, name in sorted(found, reverse=True)]


def settle(root: Path, manifest_bytes: bytes) -> None:
    """Before an in-place write: finish what a killed writer left in ``root``. A pending manifest
    whose bytes are ``manifest_bytes`` (the one ``integrity.check`` just accepted) becomes the
    manifest; the temporaries of writers no longer running are removed."""
    current = (root / MANIFEST).read_bytes() if (root / MANIFEST).is_file() else None
    for name in pending_manifests(root):
        if current != manifest_bytes and (root / name).read_bytes() == manifest_bytes:
            os.replace(root / name, root / MANIFEST)
            break
    for rel in IN_PLACE:
        target = root / rel
        if not target.parent.is_dir():
            continue
        for tmp in target.parent.glob(target.name + ".tmp*"):
            m = _LEFTOVER.fullmatch(tmp.relative_to(root).as_posix())
            if m is not None and m.group(1) in IN_PLACE and not running(int(m.group(2))):
                tmp.unlink(missing_ok=True)


def raise_if_replaced(root: Path, before: os.stat_result | None, exc: Exception) -> None:
    """A release directory removed or swapped while it was read (a registry's ``publish --replace``
    retiring the copy being read) is not a damaged one: say so, rather than name a missing file."""
    try:
        now = os.stat(root)
    except OSError:
        now = None
    if before is not None and (now is None or (now.st_ino, now.st_dev) != (before.st_ino, before.st_dev)):
        raise BundleError(f"{root}: the release was removed or replaced while it was read (a concurrent "
                          f"`publish --replace`?); read it again", path=str(root),
                          hint="resolve the release again (the registry's active pointer) and retry") from exc


__all__ = ["IN_PLACE", "LOCK_TIMEOUT_S", "leftover", "pending_manifests", "raise_if_replaced", "running", "settle",
           "stage", "write_atomic",
           "writing"]
