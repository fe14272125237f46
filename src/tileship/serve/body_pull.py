"""A large request body read on a thread, straight from the socket into its block (issue 16, item 2).

The event loop every connection shares read each body chunk (uvloop's ``recv``, a ``bytes`` per chunk, the
copy into the block by ``serve.body.Sink``): on the H200 host a 64 MiB body took 20.8 ms of the loop's time,
and under 64 clients sending such bodies the loop was busy all the time and set the server's pace
(``benchmarks/README.md``, round 21). Here, once a request's headers are parsed and its ``Sink`` is in place,
a body with at least ``PULL_BYTES`` still to come is read by a thread of a small pool: the connection stops
reading (``pause_reading``), the thread ``recv_into``s the block on a duplicate of the socket's descriptor
(the kernel's one copy, the GIL released), then the protocol starts the connection's next request afresh
and reading resumes. Reads of several connections run on several cores.

Off by default (``ServeConfig.body_threads`` 0): on the H200 host, 64 clients sending 64 MiB GEMM bodies got
21.1 and 21.7 req/s with 8 threads against 23.8 and 23.2 with none, in two runs of both orders
(``benchmarks/dev/gpu_round22b.sh``, round 22): the event loop was not what set the pace there.

Only where the bytes on the socket are exactly the body: a connection of tileship's protocol
(``serve.connections``), plain TCP or a Unix socket (no TLS), a Content-Length and no Transfer-Encoding, no
``Expect: 100-continue`` still to answer. Anything else, and smaller bodies, keep the loop's path.

A read that fails (the deadline, the client closing, a socket error) leaves the connection's byte stream
mid-body: the request's answer is its 408 or 400 and the connection closes after it (``keep_alive`` off).
``pull`` returns only once the thread has stopped writing into the block, cancelled or not: the block can
go back to its pool right after (a cancelled read stops within ``POLL_S``).
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: bodies with at least this many bytes still to come are read on a thread
PULL_BYTES = 4 << 20
#: how often a waiting read looks at its stop flag and deadline
POLL_S = 0.02
#: ``Pulls.pull``'s answer when no thread took the body (the event loop reads it)
ON_LOOP = "on the loop"


class Pulls:
    """The threads that read bodies (at most ``threads`` at once); ``threads`` 0: none, bodies stay on the loop."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tileship-body") if threads > 0 else None
        self._stops: set[threading.Event] = set()  # the reads under way, stopped by ``close``
        self.bodies = 0  # bodies read whole on a thread

    def takes(self, sink: Any, size: int) -> bool:
        """Whether ``sink``'s body (``size`` bytes in all) is read on a thread."""
        return self._pool is not None and size - sink.pos >= PULL_BYTES and _plain_body(sink.cycle)

    async def pull(self, sink: Any, size: int, timeout_s: float) -> str | None:
        """Read the rest of ``sink``'s body into its block on a thread, within ``timeout_s``; None when it is
        all there, ``ON_LOOP`` when no thread took it (no descriptor to spare: the loop's path reads it, as if
        ``takes`` had said no), else why not (``timeout``, ``eof``, an error's text; ``sink.pos`` counts what
        came). On a cancellation the thread is stopped and waited for before the CancelledError propagates."""
        assert self._pool is not None
        cycle = sink.cycle
        # a duplicate taken here, on the loop: the loop may close its own descriptor (the client went away) and
        # its number be reused before the thread runs; the duplicate keeps this socket until ``_read`` closes it
        try:
            dup = socket.socket(fileno=socket.dup(cycle.transport.get_extra_info("socket").fileno()))
        except OSError:  # EMFILE and the like
            return ON_LOOP
        cycle.flow.pause_reading()
        start = sink.pos  # chunks the loop delivered before the pause are in already
        stop = threading.Event()
        self._stops.add(stop)
        # the thread's deadline a second past the reader's: ``read_body``'s own timer answers the 408
        fut: Future[tuple[int, str | None]] = self._pool.submit(
            _read, dup, sink.into[start:size], stop, time.monotonic() + timeout_s + 1.0)
        try:
            got, why = await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            stop.set()
            got, why = _settle(fut, dup)
            sink.pos = start + got
            cycle.keep_alive = False
            raise
        finally:
            self._stops.discard(stop)
        sink.pos = start + got
        if why is None:
            self.bodies += 1
            cycle.tileship_conn.body_pulled(cycle)
        else:
            cycle.keep_alive = False
        return why

    def close(self) -> None:
        """Stop the reads under way (each within ``POLL_S``) and the threads (server shutdown)."""
        for stop in list(self._stops):
            stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _plain_body(cycle: Any) -> bool:
    """Whether the bytes on ``cycle``'s socket after its headers are exactly its body (see the module doc)."""
    if getattr(cycle, "tileship_conn", None) is None or cycle.waiting_for_100_continue:
        return False
    if any(name == b"transfer-encoding" for name, _ in cycle.scope["headers"]):
        return False
    transport = cycle.transport
    sock = transport.get_extra_info("socket")
    return sock is not None and transport.get_extra_info("sslcontext") is None and \
        sock.family in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX) and sock.type == socket.SOCK_STREAM


def _read(sock: socket.socket, view: memoryview, stop: threading.Event, deadline: float) -> tuple[int, str | None]:
    """Fill ``view`` from ``sock`` (a duplicate descriptor, non-blocking like the loop's, closed here);
    (bytes read, None or why it stopped short)."""
    got, n = 0, len(view)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    try:
        while got < n:
            if stop.is_set():
                return got, "stopped"
            try:
                k = sock.recv_into(view[got:], n - got)
            except (BlockingIOError, InterruptedError):
                left = deadline - time.monotonic()
                if left <= 0:
                    return got, "timeout"
                poller.poll(min(left, POLL_S) * 1e3)
                continue
            except OSError as exc:
                return got, f"{type(exc).__name__}: {exc}"
            if k == 0:
                return got, "eof"
            got += k
        return got, None
    finally:
        sock.close()


def _settle(fut: Future[tuple[int, str | None]], dup: socket.socket) -> tuple[int, str | None]:
    """The result of a read told to stop (it does within ``POLL_S``); (0, "cancelled") if it never started
    (its duplicate descriptor closed here instead)."""
    if fut.cancel():
        dup.close()
        return 0, "cancelled"
    return fut.result()
