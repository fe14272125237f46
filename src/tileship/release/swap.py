"""Replace a directory by another in one step, so a reader sees the old one or the new one, never none.

``exchange`` swaps two paths with Linux ``renameat2(RENAME_EXCHANGE)``; ``replace_dir`` moves a
complete staged directory onto a destination with it (or a plain rename where there is nothing to
replace) and removes the old one afterwards, renamed aside first so a kill during the removal leaves
a ``.trash-`` directory, never a half-deleted one under the destination's name.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tileship.release import nofollow

TRASH = ".trash-"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step; False where the kernel or file system cannot (nothing moved).
    Raises OSError for any other failure."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(staged: Path, dest: Path) -> bool:
    """Put the complete directory ``staged`` at ``dest`` (same file system), replacing what was there.
    Returns True when it was one step (no instant without ``dest``); False when the file system
    could not swap and the old ``dest`` was renamed aside (``.trash-*`` beside it) just before. Writers putting
    directories at one ``dest`` at once each put a whole one there, the last one stays."""
    if not dest.exists():
        try:
            os.replace(staged, dest)
            return True
        except OSError as exc:  # another writer's directory got there first: swap with it, as with any old one
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    if exchange(staged, dest):
        shutil.rmtree(staged, ignore_errors=True)  # now the old one
        return True
    trash = dest.parent / f"{TRASH}{uuid.uuid4().hex[:8]}"
    os.replace(dest, trash)
    os.replace(staged, dest)
    shutil.rmtree(trash, ignore_errors=True)
    return False


@contextmanager
def staged(out: Path, ours: Callable[[str], bool], *, last: str) -> Iterator[Path]:
    """A fresh directory beside ``out`` (``.<name>.tmp<pid>-<random>``, each writer its own, threads of one process
    included) to write the new ``out`` into, put in place when the block ends: where ``out`` is absent or holds
    only names ``ours`` accepts, the whole directory replaces it (``replace_dir``: killed at any instant, ``out``
    is the old one or the new one); where it holds other files too (never removed), each new file replaces its
    namesake, ``last`` after the others. An exception in the block
    removes the staged directory and leaves ``out`` as it was. Staged directories of killed writers are removed
    first. Durable: every file and folder staged is fsynced before the rename that puts it in place, and the
    directory renamed in after it (``nofollow.fsync_tree``, as ``atomic_file`` does for one file), so a power loss
    leaves the old ``out`` or the new one whole, as a kill does. Raises NotADirectoryError when ``out`` is
    something other than a directory (nothing is replaced)."""
    from tileship.release.atomic_file import abandoned, temporary

    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", str(out))
    out = out.resolve() if out.is_symlink() else out  # the folder it names is replaced, never the link
    out.parent.mkdir(parents=True, exist_ok=True)
    for left in out.parent.glob(glob.escape(f".{out.name}") + ".tmp*"):  # what killed writers left
        if abandoned(left.name, f".{out.name}"):
            shutil.rmtree(left, ignore_errors=True)
    tmp = temporary(out, hidden=True)
    tmp.mkdir()
    try:
        yield tmp
        nofollow.fsync_tree(tmp)  # the files and folders on the disk before a rename shows them (power loss)
        if not out.is_dir() or all(ours(p.name) for p in out.iterdir()):
            replace_dir(tmp, out)
            with suppress(OSError):  # the rename itself; some file systems refuse a directory fsync
                nofollow.fsync_dir(out.parent)
            return
        for p in sorted(tmp.iterdir(), key=lambda p: p.name == last):
            os.replace(p, out / p.name)
        with suppress(OSError):
            nofollow.fsync_dir(out)
        tmp.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


__all__ = ["TRASH", "exchange", "replace_dir", "staged"]
