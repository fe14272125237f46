"""Diagnostics bundles written off the caller's thread, rate-limited per reason, with retention.

A server answers a 500 at once with the id of a bundle still being written (``CaptureQueue.submit``);
a burst of failures with the same reason writes one bundle per ``per_reason_s`` (the rest are
counted in ``suppressed``), and after each write the oldest bundles go until at most ``keep``
remain, holding at most ``keep_bytes`` together.
"""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_log = logging.getLogger("tileship.release.diagnostics")


class CaptureQueue:
    """One writer thread for ``diagnostics.capture``; see the module docstring."""

    def __init__(self, out_dir: Path | str | None, *, per_reason_s: float = 60.0, keep: int = 50,
                 keep_bytes: int = 512 << 20, clock: Callable[[], float] = time.monotonic) -> None:
        from tileship.release import diagnostics

        self.out_dir = Path(out_dir) if out_dir is not None else diagnostics.default_dir()
        self.per_reason_s = per_reason_s
        self.keep = keep
        self.keep_bytes = keep_bytes
        self.clock = clock
        self.suppressed: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tileship-diagnostics")
        self._pending: list[concurrent.futures.Future[Any]] = []

    def submit(self, reason: str, release: Any = None, **capture_kw: Any) -> str | None:
        """Queue a bundle for ``reason`` and return its id, or None when one for the same reason was
        queued less than ``per_reason_s`` ago (or the queue is closed). Never raises."""
        from tileship.release import diagnostics

        now = self.clock()
        with self._lock:
            last = self._last.get(reason)
            if last is not None and now - last < self.per_reason_s:
                self.suppressed[reason] = self.suppressed.get(reason, 0) + 1
                return None
            self._last[reason] = now
        did = diagnostics.new_id()
        try:
            fut = self._pool.submit(self._write, did, reason, release, capture_kw)
        except RuntimeError:  # shut down
            return None
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [fut]
        return did

    def _write(self, did: str, reason: str, release: Any, capture_kw: dict[str, Any]) -> None:
        from tileship.release import diagnostics

        try:
            diagnostics.capture(release, out_dir=self.out_dir, reason=reason, diag_id=did, **capture_kw)
        except Exception:
            _log.exception("could not write diagnostics %s", did)
        try:
            self.prune()
        except OSError:
            _log.exception("could not prune %s", self.out_dir)

    def prune(self) -> list[str]:
        """Delete the oldest bundles past ``keep`` or ``keep_bytes``; returns the ids deleted."""
        if not self.out_dir.is_dir():
            return []
        # a bundle is its folder, its archive and the half archive a killed writer left (``<id>.tar.gz.tmp``)
        ids = sorted({_id(p.name) for p in self.out_dir.iterdir() if p.name.startswith("diag-")}, key=self._age)
        sizes = {i: sum(_size(self.out_dir / f"{i}{s}") for s in _PARTS) for i in ids}
        total = sum(sizes.values())
        gone: list[str] = []
        for i in ids:  # oldest first
            if len(ids) - len(gone) <= self.keep and total <= self.keep_bytes:
                break
            shutil.rmtree(self.out_dir / i, ignore_errors=True)
            for suffix in _PARTS[1:]:
                (self.out_dir / f"{i}{suffix}").unlink(missing_ok=True)
            total -= sizes[i]
            gone.append(i)
        return gone

    def _age(self, did: str) -> tuple[int, str]:
        # written one at a time by one thread: the last write time orders them (ids only to the second)
        times = [p.stat().st_mtime_ns for p in (self.out_dir / f"{did}{s}" for s in _PARTS) if p.exists()]
        return (max(times) if times else 0, did)

    def wait(self, timeout: float | None = None) -> None:
        """Until every queued bundle is written."""
        with self._lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending, timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


#: the names of one bundle, after its id: its folder, its archive, a killed writer's half archive
_PARTS = ("", ".tar.gz", ".tar.gz.tmp")


def _id(name: str) -> str:
    return name.removesuffix(".tmp").removesuffix(".tar.gz")


def _size(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return 0
