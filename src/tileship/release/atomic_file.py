"""Replace a file a user owns (a project file, a lock, a report) whole, the way a careful editor saves it.

``write_file(path, body)`` (``replacing(path)`` for a body written piece by piece, e.g. an archive) writes
``<name>.tmp<pid>-<random>`` beside the file, fsyncs it, renames it over the file and fsyncs the directory: killed
at any instant, ``path`` holds the old bytes or the new ones, never part of either (a killed writer's temporary is
removed by the next write of the same file; writers in threads of one process never share a temporary). Unlike
``inplace.write_atomic`` (files inside a release, which tileship alone writes), it treats the file as the user's:

- a symlink is written through: its final target is replaced, the link stays a link (``sed -i --follow-symlinks``,
  vim's default). Replacing the link by a regular file would silently fork a file kept elsewhere (a dotfiles
  repository, a shared project file), and refusing would make a common layout unusable;
- the file keeps its permission bits (a ``0600`` file is never readable by others, not even while the temporary
  exists) and, where this process may set them, its owner and group. A new file gets ``0666`` less the umask,
  as ``open`` gives it;
- what is not a regular file (a directory, a FIFO, a device) is refused with an OSError, nothing written.

The rename gives the file a new inode: other hard links to it keep the old bytes.

Every tileship writer names its temporaries here (``temporary``): the pid says whose it is, so a killed writer's
is recognised (``abandoned``) and removed, never a live one's; the random part keeps writers in threads of one
process apart, so none truncates, removes or renames another's.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from tileship.release import nofollow

#: what follows the name a temporary replaces: ``.tmp<pid>-<8 hex>`` (``.tmp<pid>``: one written before writers
#: were told apart); group 1 is the writer's pid
TEMPORARY = r"\.tmp([0-9]+)(?:-[0-9a-f]{8})?"
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def target_of(path: Path) -> Path:
    """The file ``write_file(path, ...)`` replaces: ``path``, or the final target of the symlink it is."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)


def write_file(path: Path | str, body: bytes | str) -> Path:
    """Replace the file at ``path`` (through a symlink) by ``body`` (str: UTF-8), atomically, keeping its mode;
    see the module docstring. Returns the path written (the symlink's target where ``path`` is one). Raises
    OSError when it cannot be written or is not a regular file; the file is then as it was."""
    data = body.encode() if isinstance(body, str) else body
    with replacing(path) as (f, target):
        f.write(data)
    return target


@contextmanager
def replacing(path: Path | str) -> Iterator[tuple[BinaryIO, Path]]:
    """``write_file`` for a body too large to hold in memory (``tileship pack``'s archive): yields (a binary file
    to write the new content to, the path it will replace: ``path`` or its symlink's final target). When the
    block ends the file is fsynced and renamed onto the target, as ``write_file`` does; an exception in the block
    removes the temporary and leaves the file as it was. Raises OSError, before the block runs, when ``path`` is
    not a regular file."""
    target = target_of(Path(path))
    try:
        old: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    _remove_leftovers(target)
    tmp = temporary(target)  # threads of one process writing the same file at once each rename a whole one
    fd = os.open(tmp, _FLAGS, 0o600 if old is not None else 0o666)
    try:
        if old is not None:
            _keep_owner(fd, old)
            os.fchmod(fd, stat.S_IMODE(old.st_mode))  # after chown, which may clear set-id bits
        with os.fdopen(fd, "wb", closefd=False) as f:
            yield f, target
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with suppress(OSError):  # some file systems refuse a directory fsync; the rename itself is done
        nofollow.fsync_dir(target.parent)


def temporary(path: Path, *, hidden: bool = False, pid: int | None = None) -> Path:
    """A name beside ``path`` for one writer's temporary that no other writer uses: ``<name>.tmp<pid>-<8 hex>``
    (``.<name>.tmp...`` when ``hidden``; ``pid``: this process's unless given). Creates nothing."""
    who = os.getpid() if pid is None else pid
    return path.with_name(f"{'.' if hidden else ''}{path.name}.tmp{who}-{secrets.token_hex(4)}")


def abandoned(name: str, stem: str) -> bool:
    """Whether ``name`` is a temporary of ``stem`` (``<stem>`` + ``TEMPORARY``) whose writer is gone: never one of
    this process or of another running one."""
    m = re.fullmatch(re.escape(stem) + TEMPORARY, name)
    return m is not None and not running(int(m.group(1)))


def running(pid: int) -> bool:
    """Whether process ``pid`` is this one or still alive (a temporary's writer)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _keep_owner(fd: int, old: os.stat_result) -> None:
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) == (old.st_uid, old.st_gid):
        return
    for uid in (old.st_uid, -1):  # root may give the file back to its owner; anyone may keep a group they are in
        try:
            os.fchown(fd, uid, old.st_gid)
            return
        except PermissionError:
            continue


def _remove_leftovers(target: Path) -> None:
    for left in target.parent.glob(glob.escape(target.name) + ".tmp*"):
        if abandoned(left.name, target.name) and not left.is_dir():
            left.unlink(missing_ok=True)


__all__ = ["TEMPORARY", "abandoned", "replacing", "running", "target_of", "temporary", "write_file"]
