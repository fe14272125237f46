"""The gate every gRPC RPC passes (``grpc_handlers.register``): the concurrency limit, applied before the request
message is received, and a count of every RPC that grpc ends before its answer.

grpcio's own refusals happen where no handler runs, so they counted nowhere: its ``maximum_concurrent_rpcs``
answers RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!" after method lookup (a server interceptor is called
for such an RPC; the handler it returns never is), and grpcio never invokes a unary handler whose request did not
arrive: refused past the receive limit (RESOURCE_EXHAUSTED "Received message larger than max"), or the client
cancelled or its deadline passed first. So every method is registered with a request-streaming handler, which
grpcio invokes before it reads anything (the wire is the same for a unary client): ``unary`` and ``streaming``
admit the RPC (at most ``limit`` at once, counted from before the request arrives to the answer; past it
RESOURCE_EXHAUSTED naming the limit and ``--max-connections``, counted as ``connection_limit``; the server sets no
grpcio limit of its own), read the request themselves, and count on ``tileship_rejected_total`` an RPC that grpc
ended before its answer, by ``Gate.ended``'s reasons:

    deadline_exceeded     the client's deadline passed (before its request arrived, or while it ran)
    cancelled             the client cancelled or closed its connection (or the server stopped) while it ran
    request_not_received  it ended, no deadline passed, while the server waited for its request message: grpc
                          refused a message past its receive limit (twice the request limit,
                          ``grpc_service.receive_limit``), or the client left while still sending it; grpc tells
                          the server nothing that sets these apart; or a client closed its side without sending
                          one (answered INVALID_ARGUMENT, where grpcio left it waiting for its deadline)

``unary`` waits for the request message at most ``--body-timeout`` (REST's body timeout: ``Gate.read``): an RPC
waiting for it holds a slot, so without that a few clients that open an RPC and send nothing (or trickle a large
message), with no deadline of their own, held every slot for good (slowloris). Past it the RPC is aborted
DEADLINE_EXCEEDED naming the timeout and the flag, counted as ``body_timeout`` (as REST's 408), and its slot
frees. A stream has no such limit, before its first request or between two: an open stream idle between requests
is how tritonclient's ``start_stream`` is used, and grpc hands over only whole messages, so an idle stream and
one trickling its next message look the same; a stream holds its slot until it closes.

A stream counts only an end while it handles a request (``cancelled`` or ``deadline_exceeded``): one that grpc
ends between two requests (its client cancelled an idle stream, or its next message was past the receive limit)
mostly shows the server just the end of the requests, as a client closing its side does, and is not counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from tileship.serve.middleware import new_request_id, valid_request_id

#: a client's own deadline fires up to one network hop before the server's (the server's is the header's
#: ``grpc-timeout`` from when it arrived), so its cancel may arrive with this much of the server's left
DEADLINE_SLACK_S = 0.1


def request_id(context: Any) -> str:
    """The client's ``x-request-id`` metadata when printable, else a fresh id."""
    sent = dict(context.invocation_metadata() or ()).get("x-request-id")
    return valid_request_id(sent if isinstance(sent, str) else None) or new_request_id()


class Gate:
    """At most ``limit`` RPCs at once (``--max-connections``), each unary one's request message within
    ``body_timeout_s`` (``--body-timeout``); ``rejected``: the server's ``tileship_rejected`` counter. One event loop
    runs every RPC: no lock."""

    def __init__(self, limit: int, rejected: Any, body_timeout_s: float = 30.0) -> None:
        self.limit = limit
        self.rejected = rejected
        self.body_timeout_s = body_timeout_s
        self.active = 0  # RPCs admitted and not yet ended

    async def enter(self, context: Any) -> None:
        """Admit one RPC, or abort it RESOURCE_EXHAUSTED (counted) when ``limit`` run already."""
        if self.active >= self.limit:
            self.rejected.labels("connection_limit").inc()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"the server is at its limit of {self.limit} concurrent RPCs (--max-connections): "
                                "retry later", (("x-request-id", request_id(context)),))
        self.active += 1

    def ended(self, context: Any, waiting: bool) -> str:
        """Count an RPC that grpc ended before its answer (``waiting``: while the server awaited its request);
        returns the reason counted."""
        left = context.time_remaining()
        reason = ("deadline_exceeded" if left is not None and left <= DEADLINE_SLACK_S
                  else "request_not_received" if waiting else "cancelled")
        self.rejected.labels(reason).inc()
        return reason

    async def read(self, context: Any) -> Any:
        """The RPC's request message (or ``grpc.aio.EOF``), awaited at most ``body_timeout_s``; past it the RPC is
        aborted DEADLINE_EXCEEDED naming the timeout and the flag, counted as ``body_timeout`` (as REST's 408).
        The pending read is cancelled (``asyncio.timeout``: a timer, no task of its own per RPC): grpcio drops the
        late completion of a cancelled read's future, and the abort ends the read in grpc's core. A cancel from
        grpc (the client left) stays a CancelledError."""
        try:
            async with asyncio.timeout(self.body_timeout_s):
                return await context.read()
        except TimeoutError:
            pass
        self.rejected.labels("body_timeout").inc()
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"timeout: the request message did not arrive within {self.body_timeout_s:g} s "
                            "(--body-timeout)", (("x-request-id", request_id(context)),))


def unary(gate: Gate, fn: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    """A stream-unary behaviour running the unary RPC ``fn(request, context)`` behind ``gate``."""

    async def behaviour(requests: Any, context: Any) -> Any:
        await gate.enter(context)
        waiting, counted = True, False
        try:
            request = await gate.read(context)
            if request is grpc.aio.EOF:  # grpc refused it, or the client left (or half-closed) before sending it
                gate.ended(context, True)
                counted = True
                try:  # reaches a client that closed its side without a message (grpcio had it wait for its deadline)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        "no request message: the client closed its side of the RPC without one")
                except grpc.aio.InternalError:  # the RPC is over: nothing to answer (grpcio would log a failed send)
                    raise asyncio.CancelledError from None
            waiting = False
            return await fn(request, context)
        except asyncio.CancelledError:
            if not counted:
                gate.ended(context, waiting)
            raise
        finally:
            gate.active -= 1

    return behaviour


class _Watched:
    """A request iterator that says whether the server is awaiting the next request."""

    def __init__(self, requests: Any) -> None:
        self._it = requests.__aiter__()
        self.waiting = False

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        self.waiting = True
        request = await self._it.__anext__()  # a cancel (or the end) while awaiting it leaves ``waiting`` set
        self.waiting = False
        return request


def streaming(gate: Gate, fn: Callable[[Any, Any], AsyncIterator[Any]]) -> Callable[[Any, Any], AsyncIterator[Any]]:
    """A stream-stream behaviour running ``fn(requests, context)`` behind ``gate``."""

    async def behaviour(requests: Any, context: Any) -> AsyncIterator[Any]:
        await gate.enter(context)
        watched = _Watched(requests)
        try:
            async for response in fn(watched, context):
                yield response
        except asyncio.CancelledError:
            if not watched.waiting:  # between two requests: not counted (the module's docstring says why)
                gate.ended(context, False)
            raise
        finally:
            gate.active -= 1

    return behaviour
