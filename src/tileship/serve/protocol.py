"""Open Inference Protocol (KServe v2) REST: parse requests, check them against a declaration,
encode responses. Pure functions over bytes and the release's operator declarations; no HTTP
framework and no event loop here.

Binary tensor data extension: when the ``Inference-Header-Content-Length`` header is present,
the body is that many bytes of JSON followed by the inputs' raw bytes, in the order of the
inputs that carry ``parameters.binary_data_size``. BF16 travels only as raw bytes in
practice (clients refuse it in JSON); this server accepts JSON numbers for it too.

Every problem raises ``BadRequest(status, message)``; the message names the input, the
field and what was expected, and is what the client sees.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tileship.declare.dims import SAME, DimExpr, bind
from tileship.digits import parse_uint
from tileship.serve import json_data, request_params, shm
from tileship.serve.encoding import DATATYPES, ITEMSIZE, KSERVE, Encoded, encode_response, tensor_metadata  # noqa: F401 (re-exported)
from tileship.serve.validate import BadRequest, RequestLimits, check_shape, decode_json, in_declared_set, short
from tileship.serve.validate import output_bytes as _output_bytes

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


@dataclass
class CallPlan:
    """A request checked against a declaration: inputs in declaration order, ready to run."""

    inputs: list[InputTensor]
    dtype: str                   # torch dtype name
    dims: dict[str, int]
    declared: bool               # the shape lies in the declared set
    outputs: list[tuple[str, bool]]  # (name, binary) in response order
    #: positions of ScalarArg inputs (sent as one-element tensors, passed as Python numbers)
    scalars: tuple[int, ...] = ()
    allow_nonfinite: bool = False
    #: where the call's time went, in ms (``calls.execute`` fills it; the ``infer`` log line carries it)
    spans: dict[str, float] = field(default_factory=dict)

    def arguments(self, device: str) -> list[Any]:
        """The call's arguments: tensors on ``device``, scalars as Python numbers."""
        return [to_tensor(inp, "cpu").item() if i in self.scalars else to_tensor(inp, device)
                for i, inp in enumerate(self.inputs)]


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


# -- checking against the declaration ----------------------------------------------

def plan_call(req: InferRequest, model: str, decl: Mapping[str, Any]) -> CallPlan:
    """Order the inputs as declared and check names, datatypes, ranks and dims.

    ``CallPlan.declared`` says whether the shape is in the declared set; what to do when it
    is not (reference or 400) is the caller's policy.
    """
    declared_inputs: list[tuple[str, list[str]]] = [(n, list(d)) for n, d, *_ in decl["inputs"]]
    names = [n for n, _ in declared_inputs]
    by_name: dict[str, InputTensor] = {}
    for inp in req.inputs:
        if inp.name in by_name:
            raise BadRequest(400, f"input {inp.name} is given twice")
        if inp.name not in names:
            raise BadRequest(400, f"unknown input {short(inp.name)}: model {model} takes {', '.join(names)}")
        by_name[inp.name] = inp
    missing = [n for n in names if n not in by_name]
    if missing:
        raise BadRequest(400, f"missing input {', '.join(missing)}: model {model} takes {', '.join(names)}")
    ordered = [by_name[n] for n in names]
    exprs = decl.get("tensor_dtypes") or {}
    accepted = [KSERVE[d] for d in decl["dtypes"]]
    same = [inp for inp in ordered if exprs.get(inp.name, SAME) == SAME]
    for inp in ordered:
        want = exprs.get(inp.name, SAME)
        if want != SAME and DATATYPES[inp.datatype] != want:
            raise BadRequest(400,
                             f"wrong datatype: input {inp.name} is {inp.datatype}; model {model} declares it "
                             f"{KSERVE[want]}")
        if want == SAME and DATATYPES[inp.datatype] not in decl["dtypes"]:
            raise BadRequest(400,
                             f"wrong datatype: input {inp.name} is {inp.datatype}; model {model} accepts "
                             f"{', '.join(accepted)}")
    kinds = {inp.datatype for inp in same}
    if len(kinds) > 1:
        raise BadRequest(400,
                         f"wrong datatype: inputs disagree ({', '.join(f'{i.name}={i.datatype}' for i in same)}); send "
                         "one datatype")
    scalar_names = set(decl.get("scalars") or ())
    for inp in ordered:
        if inp.name in scalar_names and list(inp.shape) not in ([], [1]):
            raise BadRequest(400,
                             f"wrong shape: input {inp.name} is a scalar; send shape [1] (or []), got "
                             f"{list(inp.shape)}")
    tensors = [(inp, d) for inp, d in zip(ordered, declared_inputs, strict=True) if inp.name not in scalar_names]
    b = bind([d for _, d in tensors], [inp.shape for inp, _ in tensors])
    if b.problem == "rank":
        ds = dict(declared_inputs)[b.argument]  # type: ignore[index]
        shape = list(by_name[b.argument].shape)  # type: ignore[index]
        raise BadRequest(400, f"wrong rank: input {b.argument} has shape {shape} (rank {len(shape)}); "
                              f"model {model} declares {b.argument} as ({', '.join(ds)}) (rank {len(ds)})")
    seen: dict[str, tuple[int, str]] = {}
    for inp, (name, ds) in tensors:
        for d, size in zip(ds, inp.shape, strict=True):
            if size == 0:
                raise BadRequest(400,
                                 f"shape outside the declared set: input {name} has {d}=0; every declared dim is at "
                                 "least 1")
            if DimExpr.parse(d).derived or DimExpr.parse(d).literal:  # bind checks these
                continue
            first, where = seen.setdefault(d, (size, name))
            if first != size:
                raise BadRequest(400, f"wrong shape: dim {d} is {first} in input {where} but {size} in input {name}")
    if b.problem == "derived":
        raise BadRequest(400, f"wrong shape: input {b.argument}: {b.message}")
    dims = b.dims
    out_names = [n for n, *_ in decl["outputs"]]
    if req.outputs:
        outputs, asked = [], set()
        for name, binary in req.outputs:
            if name not in out_names:
                raise BadRequest(400, f"unknown output {short(name)}: model {model} produces {', '.join(out_names)}")
            if name in asked:  # as Triton: one answer per output, and one shared-memory place for it
                raise BadRequest(400, f"output {name} is requested twice")
            asked.add(name)
            outputs.append((name, req.binary_output if binary is None else binary))
    else:
        outputs = [(n, req.binary_output) for n in out_names]
    return CallPlan(ordered, DATATYPES[same[0].datatype] if same else decl["dtypes"][0], dims,
                    in_declared_set(decl, dims), outputs,
                    tuple(i for i, inp in enumerate(ordered) if inp.name in scalar_names), req.allow_nonfinite)


def output_bytes(decl: Mapping[str, Any], plan: CallPlan) -> dict[str, int]:
    """Bytes of each output of ``plan``'s call (``validate.output_bytes`` with this call's dtypes)."""
    itemsize = {d: ITEMSIZE[KSERVE[d]] for d in decl["dtypes"] if d in KSERVE}
    itemsize[SAME] = ITEMSIZE[KSERVE[plan.dtype]]
    return _output_bytes(decl, plan.dims, itemsize)


# -- tensors -------------------------------------------------------------------------

def to_tensor(inp: InputTensor, device: str) -> Any:
    """The input as a torch tensor on ``device``. A binary input is a view of the request body
    (no copy) until it is copied to the device, or, on the CPU, copied when misaligned."""
    import torch

    dt = getattr(torch, DATATYPES[inp.datatype])
    if inp.fetch is not None:  # CUDA shared memory: the window itself, on its device
        t = inp.fetch()
        if t.storage_offset() % dt.itemsize:  # an offset no view of this dtype can start at
            t = t.clone()
        return t.view(dt).reshape(inp.shape).to(device)
    if inp.raw is not None:
        t = torch.frombuffer(inp.raw, dtype=dt).reshape(inp.shape)
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

