"""The private directories ``integrity.snapshot`` copies a release into, and what killed processes left of them.

Each is ``<temp dir>/tileship-snapshot-<random>/``: the copy, and ``.held``, a file its process keeps locked
(``flock``) while it uses the copy; ``remove`` (a release closed, a failed load, the process's exit) deletes it.
A process killed (SIGKILL, the OOM killer, a worker's ``os._exit`` after a fatal device fault) runs no exit
handler: its lock goes with it, and ``make`` (the next snapshot, of any process) removes the directory. Before, such
copies stayed for good, one release each (hundreds of them on a host whose servers were killed and restarted).

Never removed: a directory whose lock is held (a live process; a lock holds across pid namespaces that share the
temp directory, where a pid would not), one without ``.held`` (being made: ``.held`` appears already locked; or
made by a tileship before this one), one of another user, a symlink.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "tileship-snapshot-"
HELD = ".held"
#: this process's snapshot directories -> the fd of their locked ``.held``
_held: dict[str, int] = {}


def make() -> Path:
    """A new empty 0700 snapshot directory held by this process (removed at its exit); what killed processes left
    is removed first (``reclaim``). Raises OSError when the temp directory cannot hold one."""
    reclaim()
    parent = Path(tempfile.mkdtemp(prefix=PREFIX))
    try:
        tmp = parent / (HELD + ".new")
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, parent / HELD)  # visible only once locked: a reclaimer never takes a directory being made
    except BaseException:
        shutil.rmtree(parent, ignore_errors=True)
        raise
    _held[str(parent)] = fd
    atexit.register(remove, parent)
    return parent


def remove(parent: Path) -> None:
    """Delete the snapshot directory ``parent`` and let its lock go. Idempotent."""
    shutil.rmtree(parent, ignore_errors=True)
    fd = _held.pop(str(parent), None)
    if fd is not None:
        os.close(fd)


def reclaim(where: Path | None = None) -> list[Path]:
    """Remove the snapshot directories under ``where`` (default: the temp directory) that no process holds any
    more (see the module docstring). Returns them. Never raises for what it cannot read."""
    base = Path(where) if where is not None else Path(tempfile.gettempdir())
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(PREFIX)]
    except OSError:
        return []
    removed = []
    for e in entries:
        if e.path in _held:
            continue
        try:
            if not e.is_dir(follow_symlinks=False) or e.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(e.path, HELD), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: its process is alive
        except OSError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(e.path, ignore_errors=True)  # under its lock: two reclaimers never race on one
        finally:
            os.close(fd)
        removed.append(Path(e.path))
    return removed
