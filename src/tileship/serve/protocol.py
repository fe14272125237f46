"""Open Inference Protocol (KServe v2) REST: parse requests into ``InferRequest`` and make tensors of their
inputs (checked against a declaration by ``serve.call_plan``, responses encoded by ``serve.encoding``).
Pure functions over bytes; no HTTP framework and no event loop here.

Binary tensor data extension: when the ``Inference-Header-Content-Length`` header is present,
the body is that many bytes of JSON followed by the inputs' raw bytes, in the order of the
inputs that carry ``parameters.binary_data_size``. BF16 travels only as raw bytes in
practice (clients refuse it in JSON); this server accepts JSON numbers for it too.

Every problem raises ``BadRequest(status, message)``; the message names the input, the
field and what was expected, and is what the client sees.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tileship.digits import parse_uint
from tileship.serve import json_data, request_params, shm
from tileship.serve.encoding import DATATYPES, ITEMSIZE, KSERVE, Encoded, encode_response, tensor_metadata  # noqa: F401 (re-exported)
from tileship.serve.validate import BadRequest, RequestLimits, check_shape, decode_json, short

HEADER_LENGTH = "inference-header-content-length"
#: request parameter that lets JSON carry bare NaN/Infinity tokens (in and out)
ALLOW_NONFINITE = "allow_nonfinite"


@dataclass
class InputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any = None            # JSON data: its leaves (``json_data.values``: a typed array or a list)
    raw: memoryview | None = None  # binary extension: this input's bytes inside the body
    shm: shm.Ref | None = None     # shared-memory extension: where its bytes are (``shm_requests.attach`` sets ``raw``)
    #: CUDA shared memory: () -> its bytes in place, a uint8 device view (``shm_requests.attach``; run at call)
    fetch: Callable[[], Any] | None = None


@dataclass
class InferRequest:
    id: str | None
    inputs: list[InputTensor]
    outputs: list[tuple[str, bool | None]]  # requested (name, binary); binary None -> request default
    binary_output: bool
    allow_nonfinite: bool = False
    #: outputs requested into shared memory (their names are in ``outputs`` too)
    shm_outputs: dict[str, shm.Ref] = field(default_factory=dict)
    #: the pooled block the body was read into (``serve.staging.Lease``), given back when the call has ended
    lease: Any = None
    #: Triton's request parameters (``serve.request_params``): us it may wait for a worker (0: none); priority
    timeout_us: int = 0
    priority: int = 0


# -- parsing -----------------------------------------------------------------------

def check_content_type(content_type: str | None, header_length: str | None) -> None:
    """A body typed at all must be ``application/json`` or ``application/octet-stream``, JSON-only or
    binary: tritonclient.http.aio posts a JSON-only body as bytes, which aiohttp types octet-stream, and
    Triton reads it. 415 otherwise (a form, text/plain: not an inference request)."""
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in ("application/json", "application/octet-stream"):
        raise BadRequest(415, f"Content-Type {short(media)} is not accepted for this body; send application/json"
                              + (" or application/octet-stream" if header_length is not None else
                                 " (or the binary extension's headers)"))


def parse_infer(body: bytearray, header_length: str | None, limits: RequestLimits | None = None) -> InferRequest:
    """Split the body into the JSON header and binary tensor data; validate the header's shape.
    Raises only ``BadRequest``."""
    limits = limits or RequestLimits()
    n = len(body)
    if header_length is not None:
        hl = parse_uint(header_length, strip=True)
        if hl is None:
            raise BadRequest(400, f"Inference-Header-Content-Length must be an integer >= 0, got "
                                  f"{short(header_length)}")
        if hl > n:
            raise BadRequest(400, f"Inference-Header-Content-Length is {hl} but the body has {n} bytes")
    else:
        hl = n
    head, nonfinite = decode_json(memoryview(body)[:hl])
    if not isinstance(head, dict):
        raise BadRequest(400, f"the inference request must be a JSON object, got {type(head).__name__}")
    params = _object(head.get("parameters", {}), "parameters")
    if shm.REGION in params:
        raise BadRequest(400, f"parameters.{shm.REGION} belongs to an input or an output, not to the request "
                              "(the shared-memory extension)")
    binary_output = _bool(params.get("binary_data_output", False), "parameters.binary_data_output")
    allow_nonfinite = _bool(params.get(ALLOW_NONFINITE, False), f"parameters.{ALLOW_NONFINITE}")
    if nonfinite and not allow_nonfinite:
        raise BadRequest(400, "the request holds bare NaN/Infinity tokens, which JSON does not allow; send the "
                              f"tensor as binary data or set parameters.{ALLOW_NONFINITE} to true")
    raw_inputs = head.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest(400, "'inputs' must be a non-empty list of tensors")
    blob = memoryview(body)[hl:]
    offset = 0
    inputs: list[InputTensor] = []
    for i, t in enumerate(raw_inputs):
        inp, size = _parse_input(t, i, limits)
        if size is not None:
            if header_length is None:
                raise BadRequest(400, f"input {inp.name}: binary_data_size is set but the request has no "
                                      "Inference-Header-Content-Length header")
            if offset + size > len(blob):
                raise BadRequest(400, f"byte size mismatch: input {inp.name} needs bytes {offset}..{offset + size} of "
                                      f"the binary data, but the body carries {len(blob)} bytes after the {hl}-byte "
                                      "JSON header")
            inp.raw = blob[offset:offset + size]
            offset += size
        inputs.append(inp)
    if offset != len(blob):
        raise BadRequest(400, f"byte size mismatch: the inputs declare {offset} bytes of binary data but the body "
                              f"carries {len(blob)} after the JSON header")
    outputs: list[tuple[str, bool | None]] = []
    shm_outputs: dict[str, shm.Ref] = {}
    raw_outputs = head.get("outputs", [])
    if not isinstance(raw_outputs, list):
        raise BadRequest(400, "'outputs' must be a list")
    for j, o in enumerate(raw_outputs):
        o = _object(o, f"outputs[{j}]")
        name = o.get("name")
        if not isinstance(name, str):
            raise BadRequest(400, f"outputs[{j}].name must be a string")
        op = _object(o.get("parameters", {}), f"outputs[{j}].parameters")
        if "classification" in op:
            raise BadRequest(400, f"output {short(name)}: the classification extension is not supported")
        ref = shm.ref_of(op, f"output {short(name)}")
        if ref is not None:
            shm_outputs[name] = ref
        outputs.append((name,
                        _bool(op["binary_data"], f"outputs[{j}].parameters.binary_data")
                        if "binary_data" in op else None))
    rid = head.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest(400, "'id' must be a string")
    timeout_us, priority = request_params.read(params)
    return InferRequest(rid, inputs, outputs, binary_output, allow_nonfinite, shm_outputs, timeout_us=timeout_us,
                        priority=priority)


def _object(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BadRequest(400, f"{where} must be a JSON object, got {type(v).__name__}")
    return v


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise BadRequest(400, f"{where} must be true or false, got {short(v)}")
    return v


def _parse_input(t: Any, i: int, limits: RequestLimits) -> tuple[InputTensor, int | None]:
    t = _object(t, f"inputs[{i}]")
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(400, f"inputs[{i}].name must be a non-empty string")
    if len(name) > 256:
        raise BadRequest(400, f"inputs[{i}].name is {len(name)} characters long; the limit is 256")
    dt = t.get("datatype")
    if not isinstance(dt, str):
        raise BadRequest(400, f"input {name}: 'datatype' must be a string such as \"FP32\"")
    if dt not in DATATYPES:
        raise BadRequest(400, f"input {name}: unsupported datatype {short(dt)} (supported: {', '.join(DATATYPES)})")
    shape = list(check_shape(name, t.get("shape"), limits))
    params = _object(t.get("parameters", {}), f"input {name}: parameters")
    inp = InputTensor(name, dt, tuple(shape))
    count = math.prod(shape)
    inp.shm = shm.ref_of(params, f"input {name}")
    if inp.shm is not None:
        check_shm_size(inp, count)
        if "data" in t or "binary_data_size" in params:
            raise BadRequest(400, f"input {name}: has {shm.REGION} and also "
                                  f"{'data' if 'data' in t else 'binary_data_size'}; send one")
        return inp, None
    if "binary_data_size" in params:
        size = params["binary_data_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadRequest(400, f"input {name}: binary_data_size must be a non-negative integer, got {short(size)}")
        if "data" in t:
            raise BadRequest(400, f"input {name}: has both 'data' and binary_data_size; send one")
        want = count * ITEMSIZE[dt]
        if size != want:
            raise BadRequest(400,
                             f"byte size mismatch: input {name} has binary_data_size {size} but shape {shape} x {dt} "
                             f"needs {want} bytes")
        return inp, size
    if "data" not in t:
        raise BadRequest(400, f"input {name}: no 'data' and no binary_data_size parameter")
    inp.data = json_data.values(t["data"], name, dt, shape, limits.max_depth)
    return inp, None


def check_shm_size(inp: InputTensor, count: int) -> None:
    """BadRequest 400 when a shared-memory input's byte size is not its shape x datatype."""
    assert inp.shm is not None
    want = count * ITEMSIZE[inp.datatype]
    if inp.shm.byte_size != want:
        raise BadRequest(400, f"byte size mismatch: input {inp.name} has {shm.BYTE_SIZE} {inp.shm.byte_size} but "
                              f"shape {list(inp.shape)} x {inp.datatype} needs {want} bytes")


# -- tensors -------------------------------------------------------------------------

def to_tensor(inp: InputTensor, device: str, own: bool = False) -> Any:
    """The input as a torch tensor on ``device``. A binary input is a view of the request body
    (no copy) until it is copied to the device, or, on the CPU, copied when misaligned. Raw bytes of a BOOL input
    are checked (``raw_bytes``, ``check_bool_bytes``). A CUDA shared-memory input is a view of the client's window,
    unless ``own`` (an input the call updates in place: the server never writes a client's input region) or it
    lies on another device: then a copy."""
    import torch

    dt = getattr(torch, DATATYPES[inp.datatype])
    if inp.fetch is not None:  # CUDA shared memory: the window itself, on its device
        t = inp.fetch()
        if inp.datatype == "BOOL":
            check_bool_bytes(inp.name, t)
        if own or t.storage_offset() % dt.itemsize:  # updated in place, or an offset no view of dtype can start at
            t = t.clone()
        return t.view(dt).reshape(inp.shape).to(device)
    if inp.raw is not None:
        t = torch.frombuffer(raw_bytes(inp), dtype=dt).reshape(inp.shape)
        if device == "cpu" and t.data_ptr() % 16:
            t = t.clone()  # the JSON header's length leaves the data anywhere; CPU kernels get aligned memory
    else:
        try:
            t = json_data.to_torch(inp.data, dt).reshape(inp.shape)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise BadRequest(400,
                             f"wrong dtype: input {inp.name}: 'data' does not hold {inp.datatype} values "
                             f"({str(exc).splitlines()[0]})") from None
    return t.to(device) if device != "cpu" else t


def raw_bytes(inp: InputTensor) -> memoryview:
    """The raw bytes of ``inp`` (the binary extension's part of the body, gRPC's ``raw_input_contents``, or what
    a system shared-memory region held: each sets ``raw``), as every consumer takes them: ``to_tensor`` in process,
    ``serve.remote`` for a worker. Raises BadRequest 400 when those of a BOOL input hold a byte other than 0 or 1
    (torch would read 2 as true: an answer computed from another value than the client sent), as JSON data does."""
    assert inp.raw is not None
    if inp.datatype == "BOOL" and len(inp.raw):
        import torch

        check_bool_bytes(inp.name, torch.frombuffer(inp.raw, dtype=torch.uint8))
    return inp.raw


def check_bool_bytes(name: str, u8: Any) -> None:
    """BadRequest 400 naming input ``name`` when its bytes ``u8`` (a uint8 tensor, on any device) hold anything but
    0 (false) or 1 (true); the words are the JSON check's (``json_data``)."""
    if u8.numel() and int(u8.max()) > 1:
        i = int((u8 > 1).nonzero()[0, 0])
        raise BadRequest(400, f"wrong dtype: input {name}: its raw bytes do not hold BOOL values (byte {i} is "
                              f"{int(u8[i])}, neither true (1) nor false (0))")
