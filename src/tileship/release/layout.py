"""The registry's directory layout: which release directories exist, and what a killed writer left.

``releases/<id>`` is the first published copy of a release and ``releases/<id>@<n>`` a later one
(``publish --replace``); the highest ``n`` is current. A writer killed at any instant leaves at
most temporaries (``.tmp*``, ``.incoming-*``, ``.trash-*``, ``.unpack-*``, ``.active.tmp-*``) and
superseded copies; ``collect_leftovers`` removes them (the registry calls it under its lock at the
start of every change). Directories are removed by renaming them aside first, so a kill during
removal leaves a ``.trash-`` directory, never a half-deleted release under its own name.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from tileship.digits import parse_uint
from tileship.release import integrity
from tileship.release.records import POINTER_TMP_PREFIX

_LEFTOVER = re.compile(r"\.tmp|^\.incoming-|^\.trash-|^\.unpack-")


def versions(releases_dir: Path) -> dict[str, list[Path]]:
    """Published copies per release id, current (highest ``@n``) first."""
    out: dict[str, list[Path]] = {}
    if not releases_dir.is_dir():
        return out
    for p in releases_dir.iterdir():
        m = integrity.RELEASE_DIR_RE.fullmatch(p.name) or re.fullmatch(r"([0-9A-Za-z_-]+)(@[0-9]+)?", p.name)
        if m and p.is_dir() and not _LEFTOVER.search(p.name):
            out.setdefault(m.group(1), []).append(p)
    return {rid: sorted(ps, key=version, reverse=True) for rid, ps in out.items()}


def version(path: Path) -> int:
    """``n`` of ``<id>@<n>``; 0 for the first copy ``<id>``."""
    _, _, n = path.name.partition("@")
    return parse_uint(n) or 0


def drop(path: Path) -> None:
    """Remove a directory: renamed aside first (atomic), then deleted (a kill leaves a ``.trash-``)."""
    trash = path.parent / f".trash-{uuid.uuid4().hex[:8]}"
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def collect_leftovers(root: Path, releases_dir: Path) -> list[str]:
    """Remove killed writers' temporaries and superseded copies under ``root``. Returns their names, sorted."""
    removed = []
    for d in (root, releases_dir):
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if _LEFTOVER.search(p.name) or p.name.startswith(POINTER_TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                removed.append(p.name)
    for copies in versions(releases_dir).values():
        for old in copies[1:]:
            drop(old)
            removed.append(old.name)
    return sorted(removed)
