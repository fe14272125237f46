"""A build's output directory (``.tileship/builds``): releases appear whole, by one rename, or not at all.

A build writes everything into ``.staging-<pid>-<hex>`` (never read as a release), seals it there
(manifest, then the signature when a key was given) and only then renames it to ``<release id>``.
A release of the same id already there is swapped with the new one in one step (``renameat2``
with ``RENAME_EXCHANGE``), so a reader of ``<release id>`` sees the old release or the new one,
never nothing. Where the file system cannot swap, the old one is renamed aside (``.trash-*``)
first; a build killed between the two renames leaves no release under that id, and the next build
in that directory puts the old one back (``recover``). ``recover`` also removes what killed builds
left: staging directories of processes that are gone, and ``.trash-*`` directories.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from filelock import FileLock

from tileship.errors import TileshipError
from tileship.release import bundle, integrity, nofollow, swap

log = logging.getLogger(__name__)
STAGING = ".staging-"
TRASH = swap.TRASH


def staging_dir(out_root: Path) -> Path:
    """A new, empty staging directory in ``out_root`` (created), named for this process."""
    path = out_root / f"{STAGING}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def commit(staging: Path, out_root: Path, sign_key: Path | None) -> tuple[dict[str, Any], Path, str | None]:
    """Seal ``staging`` (manifest; signature with ``sign_key``) and move it to ``out_root/<release id>``
    in one step. Returns (manifest, the release's path, the signing key id or None)."""
    manifest = bundle.write_manifest(staging)
    key_id = bundle.sign(staging, sign_key) if sign_key else None  # signed before anyone can see it
    nofollow.fsync_dir(staging)
    final = out_root / manifest["release_id"]
    with _lock(out_root):
        swap.replace_dir(staging, final)
        nofollow.fsync_dir(out_root)
    return manifest, final, key_id


def _lock(out_root: Path) -> FileLock:
    """Serializes the renames of concurrent builds into one output directory (and ``recover``)."""
    return FileLock(str(out_root / ".lock"))


def recover(out_root: Path) -> list[str]:
    """Finish what killed builds left in ``out_root``: a release renamed aside whose replacement never
    arrived is put back; staging directories of processes that are gone and other ``.trash-*`` are
    removed. Returns what was done, one line each (also logged)."""
    done: list[str] = []
    if not out_root.is_dir():
        return done
    if not any(p.name.startswith((STAGING, TRASH)) for p in out_root.iterdir()):
        return done  # nothing a killed build left: no lock file either (a refused build leaves nothing)
    with _lock(out_root):
        _recover(out_root, sorted(out_root.iterdir()), done)
    for line in done:
        log.warning("%s: %s", out_root, line)
    return done


def _recover(out_root: Path, entries: list[Path], done: list[str]) -> None:
    from tileship.release.inplace import running

    for path in entries:
        if path.name.startswith(TRASH) and path.is_dir():
            rid = _release_id(path)
            if rid is not None and not (out_root / rid).exists():
                os.replace(path, out_root / rid)
                done.append(f"restored release {rid}, which an interrupted build had moved aside")
                continue
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path.name}, left by an interrupted build")
        elif path.name.startswith(STAGING) and path.is_dir():
            pid = path.name[len(STAGING):].partition("-")[0]
            if pid.isdigit() and not running(int(pid)):
                shutil.rmtree(path, ignore_errors=True)
                done.append(f"removed {path.name}, the unfinished output of an interrupted build")


def _release_id(path: Path) -> str | None:
    """The release id of a complete release at ``path`` (integrity checked), else None."""
    try:
        return integrity.check(path, trusted_keys=[]).release_id
    except (TileshipError, OSError):  # anything not a whole release is not one to restore
        return None


__all__ = ["STAGING", "TRASH", "commit", "recover", "staging_dir"]
