"""Triton's streaming inference, ``ModelStreamInfer``: tritonclient.grpc's ``start_stream`` /
``async_stream_infer`` and tritonclient.grpc.aio's ``stream_infer``.

Every request on the stream goes through ``calls.run`` as a ``ModelInfer`` does (validation, routing,
admission, deadline, metrics, statistics, one log line each), one after another in the order they came, and
gets exactly one ``ModelStreamInferResponse``: its ``infer_response``, or its ``error_message`` (naming what
was wrong, as ``ModelInfer``'s status would) with the request's ``id`` in ``infer_response`` so a client can
tell which request failed. An error ends nothing: the stream stays open for the next request, as Triton's.
A request asking ``triton_enable_empty_final_response`` gets ``triton_final_response: true`` on its one
response (every model here answers once, as a non-decoupled Triton model does). The stream counts as one RPC
against ``--max-connections`` (``serve.grpc_gate``); a message over ``--max-body-mib`` (or gRPC's message limit,
when lower) or one that is not a ``ModelInferRequest`` is answered with an error message and the stream goes on
(one past twice that, grpc's own backstop, ends the stream: ``grpc_service.start``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from tileship.serve import calls, grpc_codec
from tileship.serve.middleware import new_request_id

if TYPE_CHECKING:
    from tileship.serve.grpc_service import Servicer

#: the request parameter asking for a final-response flag, and the response parameter carrying it (Triton's)
ASK_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"


async def stream_infer(servicer: Servicer, requests: AsyncIterator[Any],
                       context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    """One ``ModelStreamInferResponse`` per request, in order, until the client closes its side."""
    async for request in requests:
        yield await _one(servicer, request)


async def _one(servicer: Servicer, request: Any) -> Any:
    from tileship.serve.grpc_handlers import Malformed, TooLarge

    svc = servicer.service
    if isinstance(request, TooLarge):
        svc.metrics.rejected.labels(request.reason).inc()
        return pb.ModelStreamInferResponse(error_message=request.message())
    if isinstance(request, Malformed):
        svc.metrics.requests.labels("_unknown", "", "none", "400").inc()
        return pb.ModelStreamInferResponse(error_message=f"malformed {request.type}: {request.error}")

    async def read() -> tuple[Any, int]:
        return grpc_codec.parse(request, svc.config.limits), request.ByteSize()

    call = calls.Call(request.model_name, request.model_version or None, new_request_id(), read, servicer.encode,
                      grpc_codec.output_bytes, "grpc", max_message_bytes=servicer.max_message)
    answer = await calls.run(svc, call)
    if answer.status != 200:
        return pb.ModelStreamInferResponse(
            error_message=answer.message,
            infer_response=pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version,
                                                 id=request.id))
    resp = answer.encoded
    ask = request.parameters.get(ASK_FINAL)
    if ask is not None and ask.WhichOneof("parameter_choice") == "bool_param" and ask.bool_param:
        resp.parameters[FINAL].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=resp)
