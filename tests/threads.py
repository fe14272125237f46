"""Run one worker per thread, all released at once, for tests of the dispatcher under concurrency."""

from __future__ import annotations

import threading
from collections.abc import Callable


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
