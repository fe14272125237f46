"""Threads for tests: one worker per thread, all released at once (the dispatcher under concurrency), and a call
that must not block (hostile files: a FIFO opened for reading waits for a writer)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def together(n_threads: int, worker: Callable[[int], None]) -> None:
    """Call ``worker(tid)`` for tid 0..n-1, each in its own thread, released together by a barrier; wait for all."""
    start = threading.Barrier(n_threads)

    def run(tid: int) -> None:
        start.wait()
        worker(tid)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def within(fn: Callable[[], Any], seconds: float = 20.0) -> Any:
    """``fn()``'s result or exception, failing the test (not hanging it) when it blocks past ``seconds``."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"blocked for {seconds} s (a FIFO opened for reading waits for a writer?)"
    return out[0]
