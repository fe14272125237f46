"""KServe v2 gRPC messages <-> the server's own types: pure functions, no server, no event loop.

    parse      ModelInferRequest -> protocol.InferRequest (raw_input_contents or typed contents),
               checked as the REST parser checks its JSON; raises only BadRequest
    encode     outputs -> ModelInferResponse with raw_output_contents (``calls.Encoder``)
    code_for   a BadRequest/HTTP status -> the gRPC status code
    message    a dict in Triton's JSON form (model config, statistics, index) -> its protobuf message

The messages are those tritonclient ships (``tritonclient.grpc.service_pb2``), generated from
the KServe v2 / Triton ``grpc_service.proto``; tileship generates no code of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2 as pb

from tileship.serve.encoding import DATATYPES, ITEMSIZE, KSERVE
from tileship.serve.protocol import InferRequest, InputTensor
from tileship.serve.validate import BadRequest, RequestLimits, check_shape, short

#: HTTP status of a BadRequest / HTTPException -> gRPC status code (500 and anything else: INTERNAL)
CODES: Mapping[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT, 503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

#: the typed ``InferTensorContents`` field of each datatype (FP16/BF16 have none: raw bytes only)
CONTENTS: Mapping[str, str] = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}


def code_for(status: int, error: BaseException | None = None) -> grpc.StatusCode:
    """The gRPC code of an answer. An unloaded model is ``UNAVAILABLE`` (REST keeps its 400)."""
    from tileship.serve.extensions import ModelUnloaded

    if isinstance(error, ModelUnloaded):
        return grpc.StatusCode.UNAVAILABLE
    return CODES.get(status, grpc.StatusCode.INTERNAL)


def parse(req: Any, limits: RequestLimits | None = None) -> InferRequest:
    """A ModelInferRequest as the server's InferRequest: every output comes back as raw bytes.

    Raises only ``BadRequest``: the message names the input and what was wrong."""
    limits = limits or RequestLimits()
    if not req.inputs:
        raise BadRequest(400, "'inputs' must be a non-empty list of tensors")
    raw = req.raw_input_contents
    if raw and len(raw) != len(req.inputs):
        raise BadRequest(400, f"raw_input_contents holds {len(raw)} entries but the request has {len(req.inputs)} "
                              "inputs; send one entry per input, in the order of the inputs")
    _no_shared_memory(req.parameters, "the request")
    inputs = []
    for i, t in enumerate(req.inputs):
        inputs.append(_input(t, i, raw[i] if raw else None, limits))
    outputs: list[tuple[str, bool | None]] = []
    for j, o in enumerate(req.outputs):
        if not o.name:
            raise BadRequest(400, f"outputs[{j}].name must be a non-empty string")
        if "classification" in o.parameters:
            raise BadRequest(400, f"output {short(o.name)}: the classification extension is not supported")
        _no_shared_memory(o.parameters, f"output {short(o.name)}")
        outputs.append((o.name, True))
    # raw bytes carry NaN/Infinity as they are: no JSON token rule applies
    return InferRequest(req.id or None, inputs, outputs, binary_output=True, allow_nonfinite=True)


def _no_shared_memory(params: Any, where: str) -> None:
    if "shared_memory_region" in params:
        raise BadRequest(400, f"{where}: the shared-memory extension is not supported: send tensor data in the request")


def _input(t: Any, i: int, raw: bytes | None, limits: RequestLimits) -> InputTensor:
    name = t.name
    if not name:
        raise BadRequest(400, f"inputs[{i}].name must be a non-empty string")
    if len(name) > 256:
        raise BadRequest(400, f"inputs[{i}].name is {len(name)} characters long; the limit is 256")
    dt = t.datatype
    if dt not in DATATYPES:
        raise BadRequest(400, f"input {name}: unsupported datatype {short(dt)} (supported: {', '.join(DATATYPES)})")
    _no_shared_memory(t.parameters, f"input {name}")
    shape = check_shape(name, list(t.shape), limits)
    count = math.prod(shape)
    inp = InputTensor(name, dt, shape)
    if raw is not None:
        if t.HasField("contents"):
            raise BadRequest(400, f"input {name}: has 'contents' while the request uses raw_input_contents; send "
                                  "every input one way")
        want = count * ITEMSIZE[dt]
        if len(raw) != want:
            raise BadRequest(400, f"byte size mismatch: input {name} has {len(raw)} bytes in raw_input_contents but "
                                  f"shape {list(shape)} x {dt} needs {want} bytes")
        inp.raw = memoryview(bytearray(raw))  # a writable copy: torch.frombuffer warns on read-only buffers
        return inp
    field = CONTENTS.get(dt)
    if field is None:
        raise BadRequest(400, f"input {name}: {dt} has no typed 'contents' field; send it in raw_input_contents")
    data = list(getattr(t.contents, field))
    if len(data) != count:
        raise BadRequest(400, f"byte size mismatch: input {name} has shape {list(shape)} ({count} elements) but "
                              f"contents.{field} holds {len(data)}")
    inp.data = data
    return inp


def _parameter(p: Any, v: Any) -> None:
    if isinstance(v, bool):
        p.bool_param = v
    elif isinstance(v, int):
        p.int64_param = v
    elif isinstance(v, float):
        p.double_param = v
    else:
        p.string_param = str(v)


def encode(*, model: str, version: str, request_id: str | None, parameters: Mapping[str, Any],
           outputs: Sequence[tuple[str, Any, bool]], allow_nonfinite: bool = False) -> Any:
    """``(name, cpu tensor, binary)`` outputs as a ModelInferResponse; every tensor as raw bytes
    (``binary`` and ``allow_nonfinite`` do not apply). Same signature as ``protocol.encode_response``."""
    import torch

    resp = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id or "")
    for k, v in parameters.items():
        _parameter(resp.parameters[k], v)
    for name, t, _binary in outputs:
        dt = KSERVE.get(str(t.dtype).removeprefix("torch."))
        if dt is None:
            raise TypeError(f"output {name} has dtype {t.dtype}, which the protocol cannot carry")
        resp.outputs.add(name=name, datatype=dt, shape=list(t.shape))
        resp.raw_output_contents.append(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return resp


def output_bytes(resp: Any) -> int:
    """The tensor bytes of a response (for the log line)."""
    return sum(len(b) for b in resp.raw_output_contents)


def message(doc: Mapping[str, Any], into: Message) -> Any:
    """Fill ``into`` from Triton's JSON form of it (the REST body); fields gRPC lacks are dropped."""
    return json_format.ParseDict(doc, into, ignore_unknown_fields=True)
