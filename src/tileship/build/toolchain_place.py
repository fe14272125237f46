"""Putting a newly built toolchain venv in place of the old one, so that a failed or killed
``tileship toolchain create`` never leaves less than the toolchain that was there.

The new venv is built in ``.<name>.new-<pid>-<hex>`` beside the toolchain's directory
(``staging``). A venv records its own absolute path (``pyvenv.cfg``, the scripts' ``#!`` lines in
``bin/``, the activate scripts), so before it moves, ``relocate`` rewrites the staged path there to
the toolchain's; the interpreter itself finds its prefix from where it runs. ``install`` then swaps
the two directories in one step (``renameat2`` exchange, ``release.swap``; where the file system
cannot, the old one is renamed ``.<name>.old-<pid>-<hex>`` just before), checks that the toolchain's
python runs as that venv (swapping back when it does not) and removes the old one. What a killed
create left (a staged venv, an old one renamed aside whose replacement never arrived: put back) is
settled by the next create of that directory (``staging``). Steps that move directories take a
file lock beside the toolchain (``.<name>.lock``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

from filelock import FileLock

from tileship.errors import ToolchainError

_LEFT = re.compile(r"\.(.+)\.(new|old)-([0-9]+)-[0-9a-f]+")


def staging(root: Path) -> Path:
    """A new, absent path beside ``root`` to build its next venv in (``root``'s parent is created).
    First settles what killed creates of ``root`` left: an old toolchain renamed aside while ``root``
    is missing is put back; staged venvs and old ones of processes that are gone are removed."""
    from tileship.release.inplace import running

    root = Path(os.path.abspath(root))
    root.parent.mkdir(parents=True, exist_ok=True)
    with _lock(root):
        for entry in sorted(root.parent.iterdir()):
            m = _LEFT.fullmatch(entry.name)
            if m is None or m.group(1) != root.name or running(int(m.group(3))):
                continue
            if m.group(2) == "old" and not os.path.lexists(root):
                os.replace(entry, root)
            else:
                shutil.rmtree(entry, ignore_errors=True)
    return root.parent / f".{root.name}.new-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def relocate(staged: Path, root: Path) -> None:
    """Rewrite the absolute path ``staged`` to ``root`` wherever the venv at ``staged`` recorded it:
    ``pyvenv.cfg`` and the text files of ``bin/`` (scripts' ``#!`` lines, activate scripts)."""
    old, new = os.fsencode(os.path.abspath(staged)), os.fsencode(os.path.abspath(root))
    files = [staged / "pyvenv.cfg", *(staged / "bin").iterdir()]
    for f in files:
        if f.is_symlink() or not f.is_file():
            continue
        body = f.read_bytes()
        if old not in body or b"\0" in body:  # binaries are left alone
            continue
        tmp = f.with_name(f.name + ".relocating")
        tmp.write_bytes(body.replace(old, new))
        shutil.copymode(f, tmp)
        os.replace(tmp, f)


def install(staged: Path, root: Path) -> None:
    """Put the complete venv ``staged`` (``relocate``d to ``root``) at ``root`` and remove the toolchain
    that was there. Raises ToolchainError, with the old toolchain back at ``root`` and ``staged``
    removed, when the venv's python does not run as the venv at ``root``."""
    root = Path(os.path.abspath(root))
    with _lock(root):
        old = _swap_in(staged, root)
        why = _runs_as(root)
        if why is not None:
            if old is None:
                os.replace(root, staged)
            elif not _exchange_or_rename(old, root):
                raise ToolchainError(f"the new toolchain at {root} does not run ({why}) and the old one could not be "
                                     f"put back from {old}", hint=f"move {old} to {root} by hand")
            shutil.rmtree(staged, ignore_errors=True)
            raise ToolchainError(f"the new toolchain venv does not run at {root} ({why}); the old one is kept",
                                 hint="check the python the venv was made from (--python)")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)  # killed here: a dead process's leftover, removed next time


def _swap_in(staged: Path, root: Path) -> Path | None:
    """Move ``staged`` to ``root``; returns where the old toolchain now is (None: there was none)."""
    from tileship.release import swap

    if not os.path.lexists(root):
        os.rename(staged, root)
        return None
    if swap.exchange(staged, root):
        return staged
    aside = root.parent / f".{root.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.replace(root, aside)  # killed before the next rename: the next create puts it back
    os.replace(staged, root)
    return aside


def _exchange_or_rename(old: Path, root: Path) -> bool:
    """Put the old toolchain at ``old`` back at ``root`` (the new one moves to ``old``)."""
    from tileship.release import swap

    if swap.exchange(old, root):
        return True
    try:
        shutil.rmtree(root)
        os.replace(old, root)
    except OSError:
        return False
    return True


def _runs_as(root: Path) -> str | None:
    """Why the python of the venv at ``root`` does not run as that venv (None: it does)."""
    try:
        proc = subprocess.run([str(root / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode != 0:
        return f"exit status {proc.returncode}: {proc.stderr.strip()[-300:]}"
    prefix = proc.stdout.strip()
    if Path(prefix).resolve() != root.resolve():
        return f"its sys.prefix is {prefix}"
    return None


def _lock(root: Path) -> FileLock:
    """Serializes the moves of concurrent creates of one toolchain (and the settling of leftovers)."""
    return FileLock(str(root.parent / f".{root.name}.lock"))


__all__ = ["install", "relocate", "staging"]
