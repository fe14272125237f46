"""Host buffers for large request bodies, reused per size class (issue 16, item 2).

    Pool     ``take(n)`` -> a ``Lease`` over a reused block of at least ``n`` bytes, or None
    Lease    ``view`` (a writable memoryview of exactly ``n`` bytes) and ``give_back()``

Why: a fresh 64 MiB buffer per request costs its page faults on first touch (about 70 ms on the
CPU machine against 18 ms to fill a reused one), and a device copy from pageable memory goes
through the driver's own staging. The blocks are page-locked (``pin_memory``) where torch sees a
GPU, so a binary input copied to the device is one DMA from the body itself.

Bounds: bodies under ``MIN_BYTES`` are not pooled (a bytearray is cheaper there); blocks are powers
of two; at most ``keep_bytes`` of free blocks are kept, and at most ``max_bytes`` are out at once,
so many concurrent large bodies fall back to plain bytearrays instead of pinning without limit.
A lease is given back exactly once, after nothing reads the body any more (``calls.run``, when
the call has ended); a block is reused only after that.
"""

from __future__ import annotations

import threading
from typing import Any

#: bodies smaller than this are read into a plain bytearray
MIN_BYTES = 1 << 20


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

    def __init__(self, *, keep_bytes: int = 1 << 30, max_bytes: int = 2 << 30, pinned: bool | None = None) -> None:
        self.keep_bytes, self.max_bytes = keep_bytes, max_bytes
        self._pinned = pinned  # None: decided at the first take (torch.cuda.is_available())
        self._lock = threading.Lock()
        self._free: dict[int, list[Any]] = {}
        self._free_bytes = 0
        self._out_bytes = 0

    def take(self, n: int) -> Lease | None:
        """A lease of ``n`` bytes, or None when ``n`` is under ``MIN_BYTES`` or ``max_bytes`` are out."""
        if n < MIN_BYTES:
            return None
        size = 1 << (n - 1).bit_length()
        with self._lock:
            blocks = self._free.get(size)
            if blocks:
                block = blocks.pop()
                self._free_bytes -= size
            elif self._out_bytes + size > self.max_bytes:
                return None
            else:
                block = None
            self._out_bytes += size
        if block is None:
            try:
                block = self._new(size)
            except (RuntimeError, MemoryError):  # pinning refused: fall back to the caller's bytearray
                with self._lock:
                    self._out_bytes -= size
                return None
        return Lease(self, block, n)

    def _new(self, size: int) -> Any:
        import torch

        if self._pinned is None:
            self._pinned = torch.cuda.is_available()
        return torch.empty(size, dtype=torch.uint8, pin_memory=self._pinned)

    def _put(self, block: Any) -> None:
        size = block.numel()
        with self._lock:
            self._out_bytes -= size
            if self._free_bytes + size <= self.keep_bytes and len(self._free.get(size, ())) < 4:
                self._free.setdefault(size, []).append(block)
                self._free_bytes += size

    def stats(self) -> dict[str, Any]:
        """Bytes out on lease and kept free, and whether blocks are pinned."""
        with self._lock:
            return {"out_bytes": self._out_bytes, "free_bytes": self._free_bytes, "pinned": bool(self._pinned)}
