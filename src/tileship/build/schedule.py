"""The order a build starts its compiles in: longest first, from the last builds' own timings.

With N workers and jobs of unequal length, the build's wall time is decided by its tail: a long
compile started last keeps one worker busy while the others idle. Starting the longest jobs first
(LPT, the classic list-scheduling rule) shortens that tail. A build cannot know how long a compile
takes, but the builds before it can: ``build-log.json`` records every specialization's seconds.

``longest_first(specs, out_root)`` reads the build logs of the newest releases under ``out_root``
(``HISTORY`` of them; a spec id's newest time wins) and orders the specializations:

1. those no log has timed, in declaration order (a new candidate may be long: it goes early);
2. then the timed ones, the longest first (ties in declaration order).

A first build, or one into an empty folder, keeps declaration order. The order changes nothing
in the release: each specialization compiles alone, and the bundle lists them sorted by id.
An unreadable log is skipped, never an error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

#: how many of the newest build logs under the output folder are read
HISTORY = 3
LOG = "build-log.json"

T = TypeVar("T")


def past_seconds(out_root: Path) -> dict[str, float]:
    """spec id -> compile seconds in the newest build logs under ``out_root`` (newest wins)."""
    try:
        logs = sorted((p for p in out_root.glob(f"*/{LOG}") if p.is_file()), key=lambda p: p.stat().st_mtime)
    except OSError:
        return {}
    seconds: dict[str, float] = {}
    for path in logs[-HISTORY:]:  # oldest first, so a newer log overwrites
        try:
            specs = json.loads(path.read_text()).get("specializations") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for spec_id, rec in specs.items() if isinstance(specs, dict) else ():
            s = rec.get("seconds") if isinstance(rec, dict) else None
            if isinstance(s, (int, float)) and rec.get("ok"):
                seconds[spec_id] = float(s)
    return seconds


def longest_first(jobs: Sequence[T], out_root: Path) -> list[T]:
    """``jobs`` (tuples whose second item is the Specialization) in the order to start them."""
    seconds = past_seconds(out_root)

    def key(item: tuple[int, Any]) -> tuple[int, float, int]:
        i, job = item
        s = seconds.get(job[1].id)
        return (0, 0.0, i) if s is None else (1, -s, i)

    return [job for _, job in sorted(enumerate(jobs), key=key)]


__all__ = ["HISTORY", "longest_first", "past_seconds"]
