"""KServe v2 gRPC messages <-> the server's own types: pure functions, no server, no event loop.

    parse      ModelInferRequest -> protocol.InferRequest (raw_input_contents or typed contents),
               checked as the REST parser checks its JSON; raises only BadRequest
    encode     outputs -> ModelInferResponse with raw_output_contents (``calls.Encoder``), within one
               message's bound (``MAX_MESSAGE``: 413 past it, never a response that cannot be serialized)
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

from tileship.serve import request_params, shm
from tileship.serve.encoding import DATATYPES, ITEMSIZE, KSERVE
from tileship.serve.protocol import InferRequest, InputTensor, check_shm_size
from tileship.serve.validate import MESSAGE_HEADER, BadRequest, RequestLimits, check_shape, short

#: the largest gRPC message either way: protobuf's limit (2 GiB - 1), whatever --max-body-mib or --max-output-mib
#: allow (``ServeConfig.grpc_max_message_bytes`` lowers it)
MAX_MESSAGE = (1 << 31) - 1

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
    """The gRPC code of an answer: ``CODES``; a shared-memory region registered twice ``ALREADY_EXISTS``, one past
    the registry's limit ``RESOURCE_EXHAUSTED``."""
    if isinstance(error, shm.RegionExists):
        return grpc.StatusCode.ALREADY_EXISTS
    if isinstance(error, shm.RegionLimit):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return CODES.get(status, grpc.StatusCode.INTERNAL)


def parse(req: Any, limits: RequestLimits | None = None) -> InferRequest:
    """A ModelInferRequest as the server's InferRequest: every output comes back as raw bytes.

    Raises only ``BadRequest``: the message names the input and what was wrong."""
    limits = limits or RequestLimits()
    if not req.inputs:
        raise BadRequest(400, "'inputs' must be a non-empty list of tensors")
    raw = req.raw_input_contents
    # raw_input_contents holds one entry per input that is not in shared memory, in order (as Triton)
    refs = [shm.ref_of(_params(t.parameters), f"input {t.name}" if len(t.name) <= 256 else f"inputs[{i}]")
            for i, t in enumerate(req.inputs)]
    carried = sum(r is None for r in refs)
    if raw and len(raw) != carried:
        raise BadRequest(400, f"raw_input_contents holds {len(raw)} entries but the request has {carried} "
                              "inputs not in shared memory; send one entry per such input, in the order of the inputs")
    if shm.REGION in req.parameters:
        raise BadRequest(400, f"parameters.{shm.REGION} belongs to an input or an output, not to the request "
                              "(the shared-memory extension)")
    inputs = []
    k = 0
    for i, t in enumerate(req.inputs):
        one = None
        if raw and refs[i] is None:
            one, k = raw[k], k + 1
        inputs.append(_input(t, i, one, limits, refs[i]))
    outputs: list[tuple[str, bool | None]] = []
    shm_outputs: dict[str, shm.Ref] = {}
    for j, o in enumerate(req.outputs):
        if not o.name:
            raise BadRequest(400, f"outputs[{j}].name must be a non-empty string")
        if "classification" in o.parameters:
            raise BadRequest(400, f"output {short(o.name)}: the classification extension is not supported")
        ref = shm.ref_of(_params(o.parameters), f"output {short(o.name)}")
        if ref is not None:
            shm_outputs[o.name] = ref
        outputs.append((o.name, True))
    timeout_us, priority = request_params.read(_params(req.parameters))
    # raw bytes carry NaN/Infinity as they are: no JSON token rule applies
    return InferRequest(req.id or None, inputs, outputs, binary_output=True, allow_nonfinite=True,
                        shm_outputs=shm_outputs, timeout_us=timeout_us, priority=priority)


def _params(m: Any) -> dict[str, Any]:
    """An ``InferParameter`` map as plain values (the REST form)."""
    return {k: getattr(v, which) for k, v in m.items() if (which := v.WhichOneof("parameter_choice"))}


def _input(t: Any, i: int, raw: bytes | None, limits: RequestLimits, ref: shm.Ref | None = None) -> InputTensor:
    name = t.name
    if not name:
        raise BadRequest(400, f"inputs[{i}].name must be a non-empty string")
    if len(name) > 256:
        raise BadRequest(400, f"inputs[{i}].name is {len(name)} characters long; the limit is 256")
    dt = t.datatype
    if dt not in DATATYPES:
        raise BadRequest(400, f"input {name}: unsupported datatype {short(dt)} (supported: {', '.join(DATATYPES)})")
    shape = check_shape(name, list(t.shape), limits)
    count = math.prod(shape)
    inp = InputTensor(name, dt, shape, shm=ref)
    if ref is not None:
        if t.HasField("contents"):
            raise BadRequest(400, f"input {name}: has {shm.REGION} and also 'contents'; send one")
        check_shm_size(inp, count)
        return inp
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
           outputs: Sequence[tuple[str, Any, bool]], allow_nonfinite: bool = False,
           shm: Mapping[str, Mapping[str, Any]] | None = None, max_bytes: int = MAX_MESSAGE) -> Any:
    """``(name, cpu tensor, binary)`` outputs as a ModelInferResponse; every tensor as raw bytes
    (``binary`` and ``allow_nonfinite`` do not apply). Same signature as ``protocol.encode_response``.
    Outputs named in ``shm`` (written to shared memory) come last, with those parameters and no
    raw contents, so the i-th raw entry stays the i-th output's (tritonclient reads them by position).
    Raises ``BadRequest(413)`` naming the sizes when the response could not be sent as one message of
    ``max_bytes`` (an output whose size the declaration could not tell before the call, so the server's
    ``validate.check_message`` did not refuse it), never a response that fails in serialization."""
    import torch

    resp = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id or "")
    for k, v in parameters.items():
        _parameter(resp.parameters[k], v)
    shm = shm or {}
    for name, t, _binary in sorted(outputs, key=lambda o: o[0] in shm):
        dt = KSERVE.get(str(t.dtype).removeprefix("torch."))
        if dt is None:
            raise TypeError(f"output {name} has dtype {t.dtype}, which the protocol cannot carry")
        out = resp.outputs.add(name=name, datatype=dt, shape=list(t.shape))
        if name in shm:
            for k, v in shm[name].items():
                _parameter(out.parameters[k], v)
        else:
            if (size := output_bytes(resp) + t.nbytes + len(resp.id.encode()) + MESSAGE_HEADER) > max_bytes:
                raise BadRequest(413, f"model {model}: the answer would be over {size} bytes (output {name} alone "
                                      f"{t.nbytes}); a gRPC message carries at most {max_bytes} bytes, whatever "
                                      "--max-output-mib allows: ask for fewer or smaller outputs, have them written "
                                      "to shared memory, or use REST")
            resp.raw_output_contents.append(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return resp


def output_bytes(resp: Any) -> int:
    """The tensor bytes of a response (for the log line)."""
    return sum(len(b) for b in resp.raw_output_contents)


def message(doc: Mapping[str, Any], into: Message) -> Any:
    """Fill ``into`` from Triton's JSON form of it (the REST body); fields gRPC lacks are dropped."""
    return json_format.ParseDict(doc, into, ignore_unknown_fields=True)
