"""Host buffers for large request bodies, reused per size class (issue 16, item 2).

    Pool     ``take(n)`` -> a ``Lease`` over a reused block of at least ``n`` bytes, or None;
             ``await lease(n, timeout_s)``: the same, waiting while the pool is at its bound
    Lease    ``view`` (a writable memoryview of exactly ``n`` bytes), ``tensor()`` and ``give_back()``

Why: a fresh 64 MiB buffer per request costs its page faults on first touch (about 70 ms on the
CPU machine against 18 ms to fill a reused one), and a device copy from pageable memory goes
through the driver's own staging. The blocks are page-locked (``pin_memory``) where torch sees a
GPU, so a binary input copied to the device is one DMA from the body itself.

Bounds: bodies under ``MIN_BYTES`` are not pooled (a bytearray is cheaper there). Blocks come in size
classes of at most 1/16 spare and whole MiB (``size_class``; powers of two gave a 64 MiB body plus its
header a 128 MiB block, so a 2 GiB bound held 16 of them). At most ``keep_bytes`` of free blocks are
kept and at most ``max_bytes`` are out at once, 1 GiB each by default, so in a steady load of one size
every block given back is kept: freeing and pinning blocks anew costs as much as faulting in fresh
pages, and may synchronize the device. A body that finds the pool at its bound waits for a block
(``lease``: the server's body reader, within the body timeout) rather than going to a fresh buffer at
once: with 64 clients sending 64 MiB bodies to the H200 host, the bodies that found no block went to
fresh page-faulting buffers and the server took in 0.6 GB/s in all (round 20).
A lease is given back exactly once, after nothing reads the body any more (``calls.run``, when
the call has ended); a block is reused only after that.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

#: bodies smaller than this are read into a plain bytearray
MIN_BYTES = 1 << 20
#: ``Pool._reserve``'s answer when a block would pass ``max_bytes``
_FULL = object()


def size_class(n: int) -> int:
    """The block size for ``n`` bytes: ``n`` rounded up to whole MiB and to a thirty-second of the power of two
    above it (so at most a sixteenth of ``n`` spare)."""
    step = max(MIN_BYTES, 1 << max(0, (n - 1).bit_length() - 5))
    return -(-n // step) * step


class Lease:
    """A pooled block lent for one body: ``view`` is its first ``n`` bytes."""

    def __init__(self, pool: Pool, block: Any, n: int) -> None:
        self._pool, self._block, self.n = pool, block, n
        self.view = memoryview(block.numpy()).cast("B")[:n]
        self._given = False

    def tensor(self) -> Any:
        """The same ``n`` bytes as a uint8 torch tensor (page-locked where the pool pins): a device-to-host
        copy into it is one DMA."""
        return self._block[: self.n]

    def give_back(self) -> None:
        """Return the block to the pool (a second call does nothing)."""
        if not self._given:
            self._given = True
            self._pool._put(self._block)


class Pool:
    """Reused host blocks by size class. Thread-safe."""

    def __init__(self, *, keep_bytes: int = 1 << 30, max_bytes: int = 1 << 30, pinned: bool | None = None) -> None:
        self.keep_bytes, self.max_bytes = keep_bytes, max_bytes
        self._pinned = pinned  # None: decided at the first take (torch.cuda.is_available())
        self._lock = threading.Lock()
        self._free: dict[int, list[Any]] = {}
        self._free_bytes = 0
        self._out_bytes = 0
        #: bodies waiting in ``lease`` for blocks to come back: (their loop, a future to wake them)
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def take(self, n: int) -> Lease | None:
        """A lease of ``n`` bytes, or None when ``n`` is under ``MIN_BYTES``, ``max_bytes`` are out, or pinning
        was refused."""
        got = self._reserve(n)
        if got is None or got is _FULL:
            return None
        block, size = got
        return self._lease(block if block is not None else self._alloc(size), size, n)

    async def lease(self, n: int, timeout_s: float) -> Lease | None:
        """``take(n)``, but while ``max_bytes`` are out, wait (up to ``timeout_s``) for blocks to come back;
        None when ``n`` is under ``MIN_BYTES``, pinning was refused, or the wait ran out. A new block is
        allocated on a thread: pinning 64 MiB takes tens of milliseconds, which the event loop (every
        connection's) would otherwise stand still for (4.5% of its time under 64 clients on the H200, round 21)."""
        got = await self._lease_now(n)
        if got is not _FULL:
            return got  # type: ignore[return-value]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            waiter = (loop, fut)
            with self._lock:
                self._waiters.append(waiter)
            try:
                got = await self._lease_now(n)  # again once registered: a block given back in between wakes no one
                if got is not _FULL:
                    return got  # type: ignore[return-value]
                left = deadline - loop.time()
                if left <= 0:
                    return None
                try:
                    await asyncio.wait_for(fut, left)
                except TimeoutError:
                    return None
            finally:
                with self._lock:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)

    async def _lease_now(self, n: int) -> Any:
        """A lease, None (too small, or pinning refused) or ``_FULL``, allocating a new block on a thread. A
        cancellation while it is allocated leaves the block to the pool, not lost from its count."""
        got = self._reserve(n)
        if got is None or got is _FULL:
            return got
        block, size = got
        if block is None:
            fut = asyncio.get_running_loop().run_in_executor(None, self._alloc, size)
            try:
                block = await asyncio.shield(fut)
            except asyncio.CancelledError:
                fut.add_done_callback(self._keep_orphan)
                raise
        return self._lease(block, size, n)

    def _keep_orphan(self, fut: asyncio.Future[Any]) -> None:
        """A block allocated for a lease whose caller was cancelled: into the pool (or uncounted)."""
        if not fut.cancelled() and fut.exception() is None and fut.result() is not None:
            self._put(fut.result())

    def _reserve(self, n: int) -> Any:
        """None (under ``MIN_BYTES``), ``_FULL``, or (a free block or None: allocate one, its size class), the
        size counted out already."""
        if n < MIN_BYTES:
            return None
        size = size_class(n)
        with self._lock:
            blocks = self._free.get(size)
            if blocks:
                block = blocks.pop()
                self._free_bytes -= size
            elif self._out_bytes + size > self.max_bytes:
                return _FULL
            else:
                block = None
            self._out_bytes += size
        return block, size

    def _alloc(self, size: int) -> Any:
        """A new block of ``size`` bytes counted out already; None (and uncounted) when pinning is refused."""
        try:
            return self._new(size)
        except BaseException as exc:
            with self._lock:
                self._out_bytes -= size
            if isinstance(exc, (RuntimeError, MemoryError)):  # pinning refused: the caller's bytearray instead
                return None
            raise

    def _lease(self, block: Any, size: int, n: int) -> Lease | None:
        return None if block is None else Lease(self, block, n)

    def _new(self, size: int) -> Any:
        import torch

        if self._pinned is None:
            self._pinned = torch.cuda.is_available()
        return torch.empty(size, dtype=torch.uint8, pin_memory=self._pinned)

    def _put(self, block: Any) -> None:
        size = block.numel()
        with self._lock:
            self._out_bytes -= size
            if self._free_bytes + size <= self.keep_bytes:
                self._free.setdefault(size, []).append(block)
                self._free_bytes += size
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:  # every waiter tries again (from any thread: give_back runs on worker threads)
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:  # its loop has closed: the server stopped, nobody waits there any more
                pass

    def free_blocks(self) -> list[Any]:
        """The blocks kept for reuse now, not lent (a new list: what a check may read, never write)."""
        with self._lock:
            return [b for blocks in self._free.values() for b in blocks]

    def stats(self) -> dict[str, Any]:
        """Bytes out on lease and kept free, and whether blocks are pinned."""
        with self._lock:
            return {"out_bytes": self._out_bytes, "free_bytes": self._free_bytes, "pinned": bool(self._pinned)}


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
