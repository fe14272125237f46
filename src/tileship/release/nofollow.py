"""A release's files opened without following a symlink, and the new files its copy is written as.

``open_regular`` opens a file relative to a release's directory fd, every directory on the way with
``O_NOFOLLOW``: a symlink anywhere, or anything that is not a regular file (FIFO, socket, device), is
refused naming the file (``refuse``: a BundleIntegrityError) without being opened; ``read_small`` reads the
manifest or signature that way, bounded. ``write_new`` and ``fsync_dir`` write the copy ``integrity.check``
makes (new files only, fsynced when durable); the registry's and the build's writers fsync directories with
``fsync_dir`` too, and ``swap.staged`` (``tileship report``, ``tileship image``) a staged tree with ``fsync_tree``.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from tileship.errors import BundleIntegrityError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def refuse(path: Path, why: str, hint: str | None = None) -> BundleIntegrityError:
    """The error (returned, not raised) that refuses the release file ``path`` for ``why``."""
    return BundleIntegrityError(f"{path}: {why}", path=str(path), hint=hint)


def kind(mode: int) -> str:
    """What a non-regular file is, in words ("a symlink", "a FIFO", ...), from its ``st_mode``."""
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(root_fd: int, rel: str, root: Path) -> int:
    """An fd of the regular file ``rel`` under ``root_fd``; no symlink is followed on the way."""
    shown = root / rel
    parts = rel.split("/")
    fd, opened = root_fd, []
    try:
        for part in parts[:-1]:
            fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            opened.append(fd)
        st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise refuse(shown, f"{kind(st.st_mode)}: only regular files are allowed in a release")
        out = os.open(parts[-1], FILE_FLAGS, dir_fd=fd)
        if not stat.S_ISREG(os.fstat(out).st_mode):  # swapped between the stat and the open
            os.close(out)
            raise refuse(shown, "changed into a non-regular file while being read")
        return out
    except FileNotFoundError:
        raise refuse(shown, "listed in the manifest but missing") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise refuse(shown, "a path component is a symlink or not a directory (paths must stay inside "
                                "the release)") from None
        raise refuse(shown, f"cannot be read ({exc.strerror})") from None
    finally:
        for d in opened:
            os.close(d)


def read_small(root_fd: int, rel: str, root: Path, limit: int = 64 << 20) -> bytes | None:
    """The bytes of the manifest or signature ``rel`` (None when missing); larger than ``limit``
    is refused from its size, before it is read into memory."""
    try:
        fd = open_regular(root_fd, rel, root)
    except BundleIntegrityError as exc:
        if "missing" in exc.message:
            return None
        raise
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise refuse(root / rel, f"larger than {limit} bytes: not a file tileship writes")
    return data


def write_all(fd: int, data: bytes, path: Path) -> None:
    """Write all of ``data`` to ``fd`` (short writes continued). Raises OSError."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_new(path: Path, data: bytes, durable: bool) -> None:
    """Write ``data`` as the new file ``path`` (0600; refused with OSError when it exists or is a symlink),
    fsynced when ``durable``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, data, path)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path`` (its entries made durable). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(top: Path) -> None:
    """fsync every regular file below ``top`` (a symlink or anything else is not followed or opened), then every
    directory, ``top`` last (``fsync_tree_dirs``): a tree written to be renamed into place whole is on the disk
    before the rename makes it visible, so that a power loss after it cannot leave empty or short files under the
    new name. Raises OSError."""
    for d, _, files in os.walk(top):
        for name in files:
            path = os.path.join(d, name)
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            fd = os.open(path, FILE_FLAGS)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_tree_dirs(top)


def fsync_tree_dirs(top: Path) -> None:
    """``fsync_dir`` every directory below ``top`` and ``top`` itself, deepest first."""
    for d, _, _ in os.walk(top, topdown=False):
        fsync_dir(Path(d))

