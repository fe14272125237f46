"""Replace a directory by another in one step, so a reader sees the old one or the new one, never none.

``exchange`` swaps two paths with Linux ``renameat2(RENAME_EXCHANGE)``; ``replace_dir`` moves a
complete staged directory onto a destination with it (or a plain rename where there is nothing to
replace) and removes the old one afterwards, renamed aside first so a kill during the removal leaves
a ``.trash-`` directory, never a half-deleted one under the destination's name.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import uuid
from pathlib import Path

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
    could not swap and the old ``dest`` was renamed aside (``.trash-*`` beside it) just before."""
    if not dest.exists():
        os.replace(staged, dest)
        return True
    if exchange(staged, dest):
        shutil.rmtree(staged, ignore_errors=True)  # now the old one
        return True
    trash = dest.parent / f"{TRASH}{uuid.uuid4().hex[:8]}"
    os.replace(dest, trash)
    os.replace(staged, dest)
    shutil.rmtree(trash, ignore_errors=True)
    return False


__all__ = ["TRASH", "exchange", "replace_dir"]
