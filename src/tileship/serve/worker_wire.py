"""The wire between the front-end and a worker process (``tileship serve --workers N``).

Transport: one Unix stream socket per worker (a ``socketpair``; the worker gets its end as an
inherited fd). Each message is a frame: 4 bytes little-endian length, then that many bytes of
JSON (orjson). Tensors never travel in frames: they sit in one shared-memory buffer per worker
(an anonymous ``memfd``, mapped by both processes; its fd goes over the socket with
``SCM_RIGHTS`` right after a ``map`` frame), and frames carry only where they are.

Front-end -> worker:

    {"op": "start", "path", "reference_only", "options": {...}}   then {"op": "map", "size"} + fd
    {"op": "map", "size": n} + fd         replace the buffer (it grew); the old mapping is dropped
    {"op": "call", "id": k, "name": op, "args": [Arg...], "out": [offset, capacity]}
    {"op": "stop"}                        exit 0 (so does end-of-file on the socket)

    Arg: {"off": o, "shape": [...], "dtype": "float32"} (a tensor at buffer offset o, 64-aligned)
         or {"value": 1.5} (a ScalarArg, passed as a Python number)

Worker -> front-end:

    {"op": "ready", "release", "pid", "load_s", "warm_s", "warm_calls", "warm_failures"}
    {"op": "failed", "stage", "error"}    it could not load or warm the release; it exits 1
    {"id": k, "ok": true, "outs": [Arg...], "decision": [path, reason, spec_id]}  outputs written
                                          at offset..offset+capacity of the same buffer
    {"id": k, "status": 400, "error": msg}          the call is wrong (CallError)
    {"id": k, "status": 500, "error": msg, "traceback": tb}   a bug in an operator or in tileship
    {"id": k, "status": 503, "error": msg, "fatal": true}    a sticky device fault: it exits 3
    {"id": k, "need": n}                  outputs did not fit: grow the buffer and send again

One call at a time per worker: the front-end hands a worker to one request thread at a time,
so the buffer needs no locking.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
from typing import Any

import orjson

ALIGN = 64
_LEN = struct.Struct("<I")


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class PeerGone(ConnectionError):
    """The other end closed the socket (it exited, or was killed)."""


def send(sock: socket.socket, msg: dict[str, Any], fd: int | None = None) -> None:
    """One frame; with ``fd``, the descriptor follows in a 1-byte SCM_RIGHTS message."""
    data = orjson.dumps(msg)
    sock.sendall(_LEN.pack(len(data)) + data)
    if fd is not None:
        socket.send_fds(sock, [b"F"], [fd])


def _exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerGone("the peer closed the socket")
        got += k
    return buf


def recv(sock: socket.socket) -> dict[str, Any]:
    """The next frame. Raises PeerGone on end-of-file, TimeoutError past the socket's timeout."""
    (n,) = _LEN.unpack(_exact(sock, 4))
    msg: dict[str, Any] = orjson.loads(_exact(sock, n))
    return msg


def recv_fd(sock: socket.socket) -> int:
    """The descriptor sent after a ``map`` frame."""
    data, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if not data or not fds:
        raise PeerGone("the peer closed the socket before sending the buffer")
    return fds[0]


class Buffer:
    """A shared-memory buffer: a memfd mapped read-write, seen as a flat uint8 tensor ``u8``."""

    def __init__(self, fd: int, size: int) -> None:
        import torch

        self.fd, self.size = fd, size
        self.mm = mmap.mmap(fd, size)
        self.u8 = torch.frombuffer(self.mm, dtype=torch.uint8)

    @classmethod
    def create(cls, size: int) -> Buffer:
        fd = os.memfd_create("tileship-worker", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return cls(fd, size)

    def close(self) -> None:
        del self.u8  # the tensor holds an export of the mapping: drop it before closing
        try:
            self.mm.close()
        except BufferError:  # a tensor still views it: the mapping goes when that tensor does
            pass
        os.close(self.fd)

    def put(self, off: int, t: Any) -> dict[str, Any]:
        """Copy tensor ``t`` (any device) to ``off``; its descriptor."""
        import torch

        t = t.detach()
        flat = t.contiguous().reshape(-1)
        n = flat.numel() * flat.element_size()
        if n:
            self.u8[off:off + n].copy_(flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat)
        return {"off": off, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}

    def view(self, d: dict[str, Any]) -> Any:
        """The tensor a descriptor names: a view of the buffer (no copy)."""
        import torch

        dt = getattr(torch, d["dtype"])
        n = nbytes(d["shape"], dt)
        return self.u8[d["off"]:d["off"] + n].view(dt).reshape(d["shape"])


def nbytes(shape: list[int], dtype: Any) -> int:
    n = dtype.itemsize
    for s in shape:
        n *= s
    return int(n)
