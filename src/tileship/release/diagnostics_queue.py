"""Diagnostics bundles written off the caller's thread, rate-limited per reason, with retention.

A server answers a 500 at once with the id of a bundle still being written (``CaptureQueue.submit``);
a burst of failures with the same reason writes one bundle per ``per_reason_s`` (the rest are
counted in ``suppressed``), and after each write the oldest bundles go until at most ``keep``
remain, holding at most ``keep_bytes`` together. ``settle`` finishes what a killed writer left (a staging
folder, a half archive); ``bundle_parts`` lists the bundles of a folder.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tileship.release.atomic_file import TEMPORARY, running, temporary

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
        """Delete the oldest bundles past ``keep`` or ``keep_bytes``; returns the ids deleted. What killed writers
        left is settled first (``settle``)."""
        if not self.out_dir.is_dir():
            return []
        settle(self.out_dir)
        parts = bundle_parts(self.out_dir)
        ids = sorted(parts, key=lambda i: (_age(parts[i]), i))  # written one at a time: the last write orders them
        sizes = {i: sum(_size(p) for p in parts[i]) for i in ids}
        total = sum(sizes.values())
        gone: list[str] = []
        for i in ids:  # oldest first
            if len(ids) - len(gone) <= self.keep and total <= self.keep_bytes:
                break
            for p in parts[i]:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
            total -= sizes[i]
            gone.append(i)
        return gone

    def wait(self, timeout: float | None = None) -> None:
        """Until every queued bundle is written."""
        with self._lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending, timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


#: a bundle's names: its folder ``<id>``, its archive ``<id>.tar.gz``, a writer's temporary
#: ``<id>.tar.gz.tmp<pid>-<random>`` (``.tar.gz.tmp``: before tileship named the writer; ``.tar.gz.tmp<pid>``: before
#: it told writers apart); a bundle is written in ``.<id>.tmp<pid>`` (``staging``)
_PART = re.compile(r"(diag-[^/]+?)(\.tar\.gz(\.tmp|" + TEMPORARY + ")?)?")
_STAGING = re.compile(r"\.(diag-.+)\.tmp([0-9]+)")
_HALF = re.compile(r"(diag-.+)\.tar\.gz" + TEMPORARY)


def staging(base: Path, did: str) -> Path:
    """Where this process writes bundle ``did`` before it is renamed to ``base / did``, whole. One name a process:
    ``did`` is new for each bundle, and ``capture`` creates it exclusively (a second writer of one ``did`` is
    refused with FileExistsError, as the id is taken)."""
    return base / f".{did}.tmp{os.getpid()}"


def archive_tmp(archive: Path) -> Path:
    """A new temporary for ``archive``, renamed onto it once complete: one a writer, since several may archive one
    bundle at once (``capture`` and the ``settle`` of another thread's capture or prune)."""
    return temporary(archive)


def bundle_parts(base: Path) -> dict[str, list[Path]]:
    """The bundles in ``base``: id -> its folder, archive and archive temporaries that exist. A bundle being
    written (``staging``) is not one yet; other names are not tileship's and are never listed."""
    found: dict[str, list[Path]] = {}
    for p in base.iterdir():
        m = _PART.fullmatch(p.name)
        if m is not None:
            found.setdefault(m.group(1), []).append(p)
    return found


def settle(base: Path) -> None:
    """Finish what killed writers (``tileship diagnose`` killed, a server stopped mid-capture) left in ``base``:
    a staging folder (a bundle without its ``summary.json``) and a half archive are removed, and a whole bundle
    left without its archive gets one. A temporary of a writer still running (this process's included) is left
    alone. Never raises: a leftover it cannot remove stays for the next run."""
    from tileship.release.diagnostics_sections import _tar

    try:
        names = [p.name for p in base.iterdir()]
    except OSError:
        return
    for name in names:
        m = _STAGING.fullmatch(name) or _HALF.fullmatch(name)
        if m is None or running(int(m.group(2))):
            continue
        p = base / name
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        except OSError:
            _log.warning("could not remove %s, left by a killed diagnostics writer", p)
    for did, parts in bundle_parts(base).items():
        folder, archive = base / did, base / f"{did}.tar.gz"
        if folder in parts and archive not in parts and (folder / "summary.json").is_file():
            try:
                _tar(folder, archive)
            except OSError:
                _log.warning("could not archive %s", folder)


def _age(parts: list[Path]) -> int:
    times = []
    for p in parts:
        try:
            times.append(p.stat().st_mtime_ns)
        except OSError:  # removed meanwhile (another process's retention)
            continue
    return max(times, default=0)


def _size(p: Path) -> int:
    try:
        if p.is_file():
            return p.stat().st_size
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    except OSError:
        pass
    return 0
