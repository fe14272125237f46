"""The wire between the front-end and a worker process (``tileship serve --workers N``).

Transport: one Unix stream socket per worker (a ``socketpair``; the worker gets its end as an
inherited fd). Each message is a frame: 4 bytes little-endian length, then that many bytes of
JSON (orjson). Tensors never travel in frames: they sit in one shared-memory buffer per worker
(an anonymous ``memfd``, mapped by both processes; its fd goes over the socket with
``SCM_RIGHTS`` on a ``map`` frame), and frames carry only where they are. Both ends read with
one receive per frame when it fits (``Reader``); a call's receive timeout is the kernel's
``SO_RCVTIMEO``, so waiting costs no extra ``poll``.

Front-end -> worker:

    {"op": "start", "path", "reference_only", "evidence", "options": {...}}   then {"op": "map", "size"} + fd
    {"op": "map", "size": n} + fd         replace the buffer (it grew); the old mapping is dropped
                                          (the fd rides as SCM_RIGHTS on the frame's own bytes)
    {"op": "call", "id": k, "name": op, "args": [Arg...], "out": [offset, capacity]}
    {"op": "stop"}                        exit 0 (so does end-of-file on the socket)

    Arg: {"off": o, "shape": [...], "dtype": "float32"} (a tensor at buffer offset o, 64-aligned)
         or {"value": 1.5} (a ScalarArg, passed as a Python number; a NaN or +-Infinity, which JSON
         cannot carry, as {"float": "nan"}: ``scalar`` / ``scalar_value``)

Worker -> front-end:

    {"op": "ready", "release", "pid", "load_s", "warm_s", "warm_calls", "warm_failures"}
    {"op": "failed", "stage", "error"}    it could not load or warm the release; it exits 1
    {"id": k, "ok": true, "outs": [Arg...], "decision": [path, reason, spec_id]}  outputs written
                                          at offset..offset+capacity of the same buffer
    {"id": k, "status": 400, "error": msg}          the call is wrong (CallError)
    {"id": k, "status": 500, "error": msg, "traceback": tb}   a bug in an operator or in tileship
    {"id": k, "status": 503, "error": msg, "fatal": true}    a sticky device fault: it exits 3
    {"id": k, "need": n}                  outputs did not fit: grow the buffer and send again

One call at a time per worker: the front-end hands a worker to one caller at a time (a request
thread, or the event loop for small calls: ``Reader.poll``), so the buffer needs no locking.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

import orjson

ALIGN = 64
#: input views a buffer keeps (``Buffer.view``)
VIEWS = 64
_LEN = struct.Struct("<I")
#: the ancillary space a receive leaves for the fds of a ``map`` frame (one rides on each)
_ANCILLARY = socket.CMSG_SPACE(4 * _LEN.size)


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class PeerGone(ConnectionError):
    """The other end closed the socket (it exited, or was killed)."""


def send(sock: socket.socket, msg: dict[str, Any], fd: int | None = None) -> None:
    """One frame; with ``fd``, the descriptor rides on the frame (SCM_RIGHTS)."""
    data = orjson.dumps(msg)
    frame = _LEN.pack(len(data)) + data
    if fd is None:
        sock.sendall(frame)
    elif socket.send_fds(sock, [frame], [fd]) != len(frame):
        raise PeerGone("a map frame went out in part")


def scalar(value: Any) -> dict[str, Any]:
    """A ScalarArg's descriptor: ``{"value": v}``, or ``{"float": repr(v)}`` for a NaN or +-Infinity (orjson writes
    those as null, which reached the operator as None)."""
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    return {"value": value}


def scalar_value(desc: dict[str, Any]) -> Any:
    """The number a ``scalar`` descriptor carries."""
    return float(desc["float"]) if "float" in desc else desc["value"]


def set_timeout(sock: socket.socket, seconds: float | None) -> None:
    """The kernel's receive timeout (None: wait for ever); past it ``Reader.frame`` raises TimeoutError."""
    s = seconds or 0.0
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(s), int((s % 1) * 1e6)))


class Reader:
    """Frames (and the fds that ride on them) from a blocking socket, one receive per frame when it
    fits. ``frame`` raises PeerGone on end-of-file, TimeoutError past ``set_timeout``. ``fds=False``
    (the front-end's end: no frame to it carries one) receives with ``recv``, without the ancillary buffer."""

    def __init__(self, sock: socket.socket, *, fds: bool = True) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.fds: list[int] = []
        self._with_fds = fds

    def _recv(self, flags: int) -> bytes:
        """What the socket holds (b"" at end-of-file); BlockingIOError when nothing is there yet (past
        SO_RCVTIMEO, or at once with MSG_DONTWAIT)."""
        if not self._with_fds:
            return self.sock.recv(1 << 16, flags)
        data, anc, _, _ = self.sock.recvmsg(1 << 16, _ANCILLARY, flags)
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                self.fds.extend(struct.unpack(f"{len(payload) // 4}i", payload[:len(payload) // 4 * 4]))
        return data

    def _more(self, flags: int = 0) -> None:
        try:
            data = self._recv(flags)
        except BlockingIOError:  # SO_RCVTIMEO passed
            raise TimeoutError("no answer within the receive timeout") from None
        if not data:
            raise PeerGone("the peer closed the socket")
        self.buf += data

    def frame(self) -> dict[str, Any]:
        while len(self.buf) < 4:
            self._more()
        (n,) = _LEN.unpack_from(self.buf)
        while len(self.buf) < 4 + n:
            self._more()
        msg: dict[str, Any] = orjson.loads(memoryview(self.buf)[4:4 + n])
        del self.buf[:4 + n]
        return msg

    def poll(self) -> dict[str, Any] | None:
        """A whole frame if one has arrived, else None, never waiting (the event loop's read: it
        waits for the socket to be readable, then polls). Raises PeerGone on end-of-file."""
        while True:
            if len(self.buf) >= 4 and len(self.buf) >= 4 + _LEN.unpack_from(self.buf)[0]:
                return self.frame()
            try:
                data = self._recv(socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            if not data:
                raise PeerGone("the peer closed the socket")
            if not self.buf and len(data) >= 4 and len(data) == 4 + _LEN.unpack_from(data)[0]:
                return orjson.loads(memoryview(data)[4:])  # the usual case: exactly one whole frame, no copy
            self.buf += data

    def frame_after(self, spin_s: float) -> dict[str, Any]:
        """``frame``, polling without sleeping for up to ``spin_s`` first: a caller that expects the next
        frame soon skips the kernel's wake-up of a sleeping thread (tens of microseconds on an idle core)."""
        if spin_s > 0:
            end = time.perf_counter() + spin_s
            while True:
                if (msg := self.poll()) is not None:
                    return msg
                if time.perf_counter() >= end:
                    break
        return self.frame()

    def fd(self) -> int:
        """The descriptor of the ``map`` frame just read."""
        if not self.fds:
            raise PeerGone("a map frame came without its descriptor")
        return self.fds.pop(0)


class Buffer:
    """A shared-memory buffer: a memfd mapped read-write, seen as a flat uint8 tensor ``u8``."""

    def __init__(self, fd: int, size: int) -> None:
        import torch

        self.fd, self.size = fd, size
        self.mm = mmap.mmap(fd, size)
        self.u8 = torch.frombuffer(self.mm, dtype=torch.uint8)
        #: per (offset, shape, dtype): the tensor ``view`` hands out (no copy) and the numpy array under it (None
        #: for the dtypes numpy has no type for), built once: a worker serving one shape again and again builds its
        #: input tensors once, the front-end copies its outputs out of the same array (at most ``VIEWS`` kept)
        self.views: dict[tuple[int, tuple[int, ...], str], tuple[Any, Any]] = {}
        #: per (offset, shape, torch dtype) that ``put`` wrote: the numpy array there (None: copied by torch) and
        #: the descriptor (at most ``VIEWS`` kept)
        self.slots: dict[tuple[int, Any, Any], tuple[Any, dict[str, Any]]] = {}

    @classmethod
    def create(cls, size: int) -> Buffer:
        fd = os.memfd_create("tileship-worker", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return cls(fd, size)

    def close(self) -> None:
        del self.u8  # the tensors and arrays hold exports of the mapping: drop them before closing
        self.views.clear()
        self.slots.clear()
        try:
            self.mm.close()
        except BufferError:  # a tensor still views it: the mapping goes when that tensor does
            pass
        os.close(self.fd)

    def put_raw(self, off: int, raw: memoryview, shape: Sequence[int], dtype: str) -> dict[str, Any]:
        """Copy bytes (a binary input's slice of the request body) to ``off``; their descriptor."""
        self.mm[off:off + len(raw)] = raw
        return {"off": off, "shape": shape, "dtype": dtype}

    def put(self, off: int, t: Any) -> dict[str, Any]:
        """Copy tensor ``t`` (any device) to ``off``; its descriptor (the same dict for the same offset, shape and
        dtype: do not change it). A CPU tensor goes through numpy, into an array kept per offset, shape and dtype
        (one memcpy, no torch op per call: those cost microseconds each). Raises ValueError past the buffer's end."""
        t = t.detach()
        key = (off, t.shape, t.dtype)
        if (slot := self.slots.get(key)) is None:
            if len(self.slots) >= VIEWS:
                self.slots.clear()
            slot = self.slots[key] = self._slot(off, t)
        dst, desc = slot
        if dst is not None and t.is_cpu:
            dst[...] = t.numpy()
        elif n := t.numel() * t.element_size():
            import torch

            flat = t.contiguous().reshape(-1)
            self.u8[off:off + n].copy_(flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat)
        return desc

    def _slot(self, off: int, t: Any) -> tuple[Any, dict[str, Any]]:
        import numpy as np

        desc = {"off": off, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        n = t.numel()
        if off < 0 or off + n * t.element_size() > self.size:
            raise ValueError(f"{n} elements of {t.dtype} at offset {off} run past the buffer's {self.size} bytes")
        if not n or str(t.dtype) in _NO_NUMPY:
            return None, desc
        return np.frombuffer(self.mm, dtype=_numpy_dtype(t.dtype), count=n, offset=off).reshape(t.shape), desc

    def view(self, d: dict[str, Any], *, copy: bool = False) -> Any:
        """The tensor a descriptor names: a view of the buffer (no copy; the same tensor for the same
        descriptor), or a copy of it."""
        key = (d["off"], tuple(d["shape"]), d["dtype"])
        if (v := self.views.get(key)) is None:
            if len(self.views) >= VIEWS:
                self.views.clear()
            v = self.views[key] = self._view(d)
        t, a = v
        if not copy:
            return t
        if a is None:
            return t.clone()
        import torch

        return torch.from_numpy(a.copy())

    def _view(self, d: dict[str, Any]) -> tuple[Any, Any]:
        import numpy as np
        import torch

        dt = getattr(torch, d["dtype"])
        count = nbytes(d["shape"], dt) // dt.itemsize
        if str(dt) in _NO_NUMPY:  # numpy has no bfloat16 or 8-bit floats
            if d["off"] < 0 or d["off"] + count * dt.itemsize > self.size:
                raise ValueError(f"{count} elements of {dt} at offset {d['off']} run past the buffer's end")
            return self.u8[d["off"]:d["off"] + count * dt.itemsize].view(dt).reshape(d["shape"]), None
        a = np.frombuffer(self.mm, dtype=_numpy_dtype(dt), count=count, offset=d["off"]).reshape(d["shape"])
        return torch.from_numpy(a), a


#: torch dtypes (as str) numpy has no type for: moved as their bytes
_NO_NUMPY = frozenset(("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"))


@functools.cache
def _numpy_dtype(dtype: Any) -> Any:
    import numpy as np

    return np.dtype(str(dtype).removeprefix("torch."))


def nbytes(shape: list[int], dtype: Any) -> int:
    n = dtype.itemsize
    for s in shape:
        n *= s
    return int(n)
