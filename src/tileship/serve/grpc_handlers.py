"""The gRPC endpoint's handlers: every RPC of ``GRPCInferenceService`` wrapped the same way.

``register`` builds the method handlers from the service descriptor, each parsing its request with a
deserializer that cannot raise (a message over ``max_body_bytes``, or over gRPC's message limit when that is
lower, is a ``TooLarge``, bytes that are no
message of its type a ``Malformed``: the RPC answers them, never grpc with UNKNOWN), behind the concurrency gate
(``serve.grpc_gate``: at most ``--max-connections`` RPCs, and the count of RPCs grpc ends before their answer).
``rpc`` wraps each RPC of ``grpc_service.Servicer``: a request id (the client's ``x-request-id`` metadata when
printable, echoed as trailing metadata), and every exception turned into a status with a message.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass
from starlette.exceptions import HTTPException
from tritonclient.grpc import service_pb2 as pb

from tileship.serve import grpc_codec, grpc_gate
from tileship.serve.validate import BadRequest

if TYPE_CHECKING:
    from tileship.serve.grpc_service import Servicer

#: an RPC of ``Servicer`` as ``rpc`` takes it: (servicer, request, context, request id) -> its reply
Handler = Callable[[Any, Any, Any, str], Awaitable[Any]]


@dataclass(frozen=True)
class Malformed:
    """A request whose bytes are not a message of its type (answered INVALID_ARGUMENT, never UNKNOWN)."""

    type: str
    error: str


@dataclass(frozen=True)
class TooLarge:
    """A request message over ``limit`` (answered RESOURCE_EXHAUSTED and counted, never parsed): ``max_body_bytes``,
    or gRPC's message limit (``grpc_cap``) where that is the lower one."""

    type: str
    size: int
    limit: int
    grpc_cap: bool = False

    @property
    def reason(self) -> str:
        """Its ``tileship_rejected_total`` label: ``body_too_large`` (as REST's 413) or ``grpc_message_too_large``."""
        return "grpc_message_too_large" if self.grpc_cap else "body_too_large"

    def message(self) -> str:
        """What the client is told: its size, the limit, and which one it is."""
        if self.grpc_cap:
            return (f"{self.type} of {self.size} bytes is over gRPC's message limit of {self.limit} bytes, whatever "
                    "--max-body-mib allows: pass the inputs in shared memory, or use REST")
        return f"{self.type} of {self.size} bytes is over the server's limit of {self.limit} bytes (--max-body-mib)"


def _deserializer(cls: Any, limit: int, grpc_cap: bool) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        if len(data) > limit:
            return TooLarge(cls.DESCRIPTOR.full_name, len(data), limit, grpc_cap)
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            return Malformed(cls.DESCRIPTOR.full_name, str(exc)[:200])

    return parse


def register(servicer: Servicer, server: grpc.aio.Server, limit: int, grpc_cap: bool = False) -> None:
    """``add_GRPCInferenceServiceServicer_to_server`` with request parsing that cannot raise: the
    handlers are built from the service descriptor, each with a ``_deserializer`` refusing messages
    over ``limit`` bytes (``grpc_cap``: that limit is gRPC's message limit, not ``--max-body-mib``), and each
    behind ``servicer.gate`` (a unary RPC as a stream-unary handler, which reads its request itself)."""
    desc = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for m in desc.methods:
        kw = {"request_deserializer": _deserializer(GetMessageClass(m.input_type), limit, grpc_cap),
              "response_serializer": GetMessageClass(m.output_type).SerializeToString}
        fn = getattr(servicer, m.name)
        if m.client_streaming or m.server_streaming:
            handlers[m.name] = grpc.stream_stream_rpc_method_handler(grpc_gate.streaming(servicer.gate, fn), **kw)
        else:
            handlers[m.name] = grpc.stream_unary_rpc_method_handler(grpc_gate.unary(servicer.gate, fn), **kw)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(desc.full_name, handlers),))
    server.add_registered_method_handlers(desc.full_name, handlers)


def rpc(fn: Handler) -> Callable[[Any, Any, Any], Awaitable[Any]]:
    """One RPC (admitted by ``grpc_gate``): a request id, and every exception turned into a status with a message
    (never UNKNOWN)."""

    @functools.wraps(fn)
    async def handler(self: Servicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        rid = grpc_gate.request_id(context)
        trailer = (("x-request-id", rid),)
        if isinstance(request, TooLarge):  # counted as REST's 413 is (``serve.body``)
            self.service.metrics.rejected.labels(request.reason).inc()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, request.message(), trailer)
        if isinstance(request, Malformed):
            if request.type == "inference.ModelInferRequest":  # an inference request naming no model: counted as REST's
                self.service.metrics.requests.labels("_unknown", "", "none", "400").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {request.type}: {request.error}", trailer)
        try:
            reply = await fn(self, request, context, rid)
        except grpc.aio.AbortError:
            raise
        except HTTPException as exc:
            await context.abort(grpc_codec.code_for(exc.status_code), str(exc.detail), trailer)
        except BadRequest as exc:
            await context.abort(grpc_codec.code_for(exc.status, exc), exc.message, trailer)
        except Exception as exc:  # a bug: INTERNAL naming the request id, logged with its traceback
            msg, _ = self.service.log_internal(rid, exc)
            await context.abort(grpc.StatusCode.INTERNAL, msg, trailer)
        context.set_trailing_metadata(trailer)
        return reply

    return handler
