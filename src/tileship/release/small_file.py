"""Reading a small registry or server file (the pointer, its generation state, the generation hint) as hostile input.

``Path.read_bytes`` on a path someone else can write blocks forever on a FIFO (``open`` waits for a writer) and reads
without end from a symlink to ``/dev/zero``; a gigabyte file is read whole into memory. ``read`` opens without
blocking, reads only a regular file and at most ``limit`` bytes of it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (a symlink to one is followed). Raises FileNotFoundError when
    there is none, else OSError whose ``strerror`` says what is wrong: unreadable, not a regular file (a
    directory, a FIFO, a device), or larger than ``limit`` bytes. Never blocks on what it opens."""
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file ({_kind(st.st_mode)})", str(path))
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"
