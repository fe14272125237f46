"""Admission to the inference worker pool (``Slots``): at most ``max_inflight`` calls admitted
(on the thread pool, ``submit``; as tasks on the event loop, ``admit``; or on the loop itself,
``run``); a slot is freed when its call ends, not when its request gives up waiting (a 504).

A request takes a slot only once its body is read and checked, so slow clients hold their own
connection (bounded by the body timeout and the connection limit), never an inference slot.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from tileship.serve.validate import BadRequest


class Slots:
    """Inference slots over a thread pool, counted on ``metrics.inflight`` and ``metrics.rejected``."""

    def __init__(self, pool: concurrent.futures.Executor, max_inflight: int, workers: int, metrics: Any) -> None:
        self.pool = pool
        self.max_inflight = max_inflight
        self.workers = max(1, workers)
        self.metrics = metrics
        self.inflight = 0
        #: calls whose request got a 504 and that still run (each keeps its slot and its worker)
        self.overdue: set[Any] = set()

    def _take(self) -> None:
        if self.inflight >= self.max_inflight:
            self.metrics.rejected.labels("overloaded").inc()
            raise BadRequest(503, f"overloaded: {self.inflight} requests in flight (limit {self.max_inflight}); "
                                  "retry later")
        self.inflight += 1
        self.metrics.inflight.inc()

    def admit(self, start: Callable[[], Coroutine[Any, Any, Any]]) -> asyncio.Task[Any]:
        """Take a slot (``BadRequest(503)`` when none is free), then call ``start`` and run the coroutine it
        returns as a task on this loop; the slot is freed when the task ends, or at once when ``start`` raises
        (what it raised). Call on the loop."""
        self._take()
        try:
            coro = start()
        except BaseException:
            self._done(None)
            raise
        task = asyncio.ensure_future(coro)
        task.add_done_callback(self._done)
        return task

    def run(self, job: Callable[[], Any]) -> Any:
        """Take a slot (``BadRequest(503)`` when none is free), run ``job`` right here (on the loop:
        ``serve.handoff``'s inline calls), free the slot; what ``job`` returns or raises."""
        self._take()
        try:
            return job()
        finally:
            self._done(None)

    def submit(self, job: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Take a slot (``BadRequest(503)`` when none is free) and run ``job`` on the pool. Call on the loop."""
        self._take()
        loop = asyncio.get_running_loop()
        try:
            fut = self.pool.submit(job)
        except BaseException:
            self._done(None)
            raise

        def done_any_thread(f: concurrent.futures.Future[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed (shutdown): nothing left to count
                loop.call_soon_threadsafe(self._done, f)

        fut.add_done_callback(done_any_thread)
        return fut

    def _done(self, f: Any) -> None:
        self.inflight -= 1
        self.metrics.inflight.dec()
        if f is not None:
            self.overdue.discard(f)

    def timed_out(self, fut: Any) -> None:
        """The request of ``fut`` was answered 504; a call still running stays counted until it ends."""
        if not fut.done():
            self.overdue.add(fut)

    def wedged(self) -> str | None:
        """Why the server cannot run a call now (every worker runs an overdue call), else None."""
        if len(self.overdue) >= self.workers:
            return f"wedged: all {self.workers} worker threads run calls past their deadline"
        return None
