"""Request bodies: read one whole, under a size limit and a deadline (the server's body reader), into a
bytearray or a pooled block (``serve.staging``)."""

from __future__ import annotations

import asyncio
import ctypes
from typing import Any

from starlette.requests import Request

from tileship.digits import parse_uint
from tileship.serve import body_pull, content_coding
from tileship.serve.validate import BadRequest, short

#: the alignment ``read_pooled`` gives a body's tensors (what CPU kernels and vector loads want)
ALIGN = 16


async def read_body(request: Any, *, limit: int, timeout_s: float, rejected: Any,
                    limit_name: str = "--max-body-mib", into: Any = None, align_at: int | None = None,
                    pulls: Any = None) -> Any:
    """The whole body, at most ``limit`` bytes, arriving within ``timeout_s``; BadRequest (413, 408,
    400) otherwise, each rejection counted on ``rejected.labels(reason)``. The buffer is allocated once
    the first body bytes arrive, never on the word of the Content-Length header alone; ``into``
    (a writable memoryview of exactly Content-Length bytes, ``serve.staging``) is used instead when
    given, and returned. Otherwise the result is a bytearray, or with ``align_at`` (and a
    Content-Length) a memoryview of one placing that body offset on a 16-byte boundary.
    ``limit_name`` is what a 413 names as the limit. ``request``: a Starlette ``Request``, or anything
    with its ``headers.get`` and ``receive`` (``serve.middleware.Incoming``). ``pulls``
    (``serve.body_pull.Pulls``): a large body going into ``into`` is read there, on a thread."""
    cl = request.headers.get("content-length")
    size = None
    if cl is not None:
        size = parse_uint(cl, strip=True)
        if size is None:
            raise BadRequest(400, f"Content-Length is not a non-negative integer: {short(cl)}")
        if size > limit:
            rejected.labels("body_too_large").inc()
            raise BadRequest(413, f"request body is {size} bytes; the limit is {limit} bytes ({limit_name})")
    buf: Any = bytearray()
    pos = 0
    receive = request.receive
    sink = Sink.install(receive, into) if size is not None and into is not None and len(into) == size else None
    if sink is not None:
        buf = into
    more = True
    # the deadline as ``asyncio.timeout`` keeps it (a timer cancels this task; only that cancellation becomes a
    # 408), without its context manager's bookkeeping: about half its cost, on every request
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    cancelling = task.cancelling()
    timer = loop.call_at(loop.time() + timeout_s, expire)
    try:
        if sink is not None and pulls is not None and size is not None and pulls.takes(sink, size):
            why = await pulls.pull(sink, size, timeout_s)
            if why is not None and why != body_pull.ON_LOOP:
                raise _Disconnected(why)
            more = why is not None
        while more:  # the ASGI messages themselves (Starlette's ``Request.stream`` is a generator around them)
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                raise _Disconnected
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            n = len(chunk)
            if not n:
                continue
            if sink is not None:  # bytes that came the ASGI way (e.g. before the sink): into the block as well
                sink.write(chunk)
                continue
            if size is None:
                if pos + n > limit:
                    rejected.labels("body_too_large").inc()
                    raise BadRequest(413, f"request body exceeds the limit of {limit} bytes ({limit_name})")
                buf += chunk
            else:
                if not buf and n:
                    buf = (into if into is not None and len(into) == size
                           else bytearray(size) if align_at is None
                           else _aligned(memoryview(bytearray(size + ALIGN - 1)), size, align_at))
                buf[pos:pos + n] = chunk
            pos += n
    except asyncio.CancelledError:
        if not expired or task.uncancel() > cancelling:  # cancelled by someone else (the client went away...)
            raise
        rejected.labels("body_timeout").inc()
        raise BadRequest(408, f"timeout: the request body did not arrive within {timeout_s:g} s "
                              f"({pos + (sink.pos if sink else 0)} of {size if size is not None else '?'} bytes "
                              "received)") from None
    except _Disconnected as exc:
        why = f" ({exc})" if str(exc) and str(exc) != "eof" else ""
        raise BadRequest(400, f"the client disconnected after {pos + (sink.pos if sink else 0)} bytes of the body"
                              f"{why}") from None
    finally:
        timer.cancel()
        if sink is not None:  # before the caller may give ``into`` back: no later byte lands there
            sink.remove()
    if sink is not None:
        pos = sink.pos
    if size is not None and pos != size:
        raise BadRequest(400, f"the body has {pos} bytes but Content-Length says {size}")
    return buf


class Sink:
    """The body of one request written straight into its block by the connection's protocol
    (``serve.connections``: ``on_body`` hands each chunk here), instead of uvicorn's path: each chunk
    appended to a bytearray, copied again into a ``bytes`` per ASGI message, and then into the block by
    ``read_body``. One copy instead of three, on the event loop that every connection shares (on the H200
    host a 64 MiB body took 40 ms through uvicorn's path where a bare ``recv_into`` took 23 ms, round 20).
    Installed only on a request cycle of tileship's protocol (marked ``tileship_sinkable``: stock uvicorn,
    h11 or another embedder never calls the sink), removed before the block can go back."""

    __slots__ = ("cycle", "into", "pos")

    def __init__(self, cycle: Any, into: memoryview) -> None:
        self.cycle, self.into, self.pos = cycle, into, 0

    @classmethod
    def install(cls, receive: Any, into: memoryview) -> Sink | None:
        """A sink on the request cycle behind ``receive`` (the bound ``RequestResponseCycle.receive`` of a
        connection of ``serve.connections``' protocol), with the body bytes that already arrived moved in;
        None for any other ``receive`` (stock uvicorn, h11, tests, gRPC)."""
        cycle: Any = getattr(receive, "__self__", None)
        if not getattr(cycle, "tileship_sinkable", False) or not isinstance(getattr(cycle, "body", None), bytearray):
            return None  # not a cycle of tileship's protocol: nothing would hand it the chunks
        sink = cls(cycle, into)
        early, cycle.body = cycle.body, bytearray()
        sink.write(early)
        cycle.tileship_sink = sink
        return sink

    def write(self, chunk: bytes | bytearray) -> None:
        """Copy ``chunk`` in; bytes past the block's end are counted, not written (``read_body`` then answers
        400: Content-Length and the body disagree)."""
        end = self.pos + len(chunk)
        if end <= len(self.into):
            self.into[self.pos:end] = chunk
        self.pos = end

    def remove(self) -> None:
        if getattr(self.cycle, "tileship_sink", None) is self:
            self.cycle.tileship_sink = None


class _Disconnected(Exception):
    """The client went away before its body ended (an ``http.disconnect`` message)."""


async def read_pooled(request: Any, pool: Any, *, limit: int, timeout_s: float, rejected: Any,
                      align_at: int | None = None, pulls: Any = None, encoding: str | None = None) -> tuple[Any, Any]:
    """``read_body`` into a block of ``pool`` (``serve.staging.Pool``) when Content-Length names a body
    the pool takes: (body, the lease or None). While the pool is at its bound the body waits for a block,
    up to ``timeout_s``, before it is read (then into a plain buffer if none came back). The caller gives
    the lease back once nothing reads the body; on an error here it is given back already.

    ``align_at``: a body offset that should land on a 16-byte boundary (the binary extension's header
    length: where the first tensor's bytes start), so that tensors viewed in place are aligned and a
    CPU kernel takes them without a copy. The body is then a memoryview into a buffer 15 bytes longer.
    ``pulls``: as ``read_body``'s. ``encoding``: the request's Content-Encoding header; a body compressed
    with gzip or deflate is returned inflated (``serve.content_coding``; its lease then None), any other
    coding is a 415 before a byte is read."""
    name = content_coding.coding(encoding)
    size = parse_uint(request.headers.get("content-length"), strip=True)
    if size is not None and size > limit:
        size = None
    if size is None:
        lease = into = None
    elif align_at is not None and size:
        lease = await pool.lease(size + ALIGN - 1, timeout_s)
        into = None if lease is None else _aligned(lease.view, size, align_at)
    else:
        lease = await pool.lease(size, timeout_s)
        into = None if lease is None else lease.view
    try:
        data = await read_body(request, limit=limit, timeout_s=timeout_s, rejected=rejected, into=into,
                               align_at=align_at, pulls=pulls)
        data, lease = await content_coding.inflated(data, lease, name, limit)
    except BaseException:
        if lease is not None:
            lease.give_back()
        raise
    return data, lease


#: the most a control request's body may carry (repository load/unload, the canary, shared-memory
#: registration, logging settings): a few hundred bytes of JSON in practice
CONTROL_BODY = 64 << 10


async def control_body(request: Request) -> bytes:
    """A control route's body, read as an inference body is (``read_body``): at most ``CONTROL_BODY``
    bytes, within the server's body timeout. Raises BadRequest (413, 408, 400; a client that
    disconnects mid-body is a 400), never anything a route would turn into a 500."""
    service = request.app.state.service
    return bytes(await read_body(request, limit=CONTROL_BODY, timeout_s=service.config.body_timeout_s,
                                 rejected=service.metrics.rejected, limit_name="a control request's limit"))


def tensors_start(header_length: str | None) -> int | None:
    """Where a binary request's tensor bytes start in its body (the JSON header's length, from
    ``Inference-Header-Content-Length``), or None (no binary extension, or a value the parser refuses)."""
    return parse_uint(header_length, strip=True)


def _aligned(view: memoryview, size: int, align_at: int) -> memoryview:
    """The ``size`` bytes of ``view`` (at least ``size + ALIGN - 1`` long, writable) whose offset
    ``align_at`` falls on an ``ALIGN``-byte address."""
    start = -(ctypes.addressof(ctypes.c_char.from_buffer(view)) + align_at) % ALIGN
    return view[start:start + size]
