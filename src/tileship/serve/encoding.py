"""KServe v2 encoding: the datatype tables, the response writer and the tensor metadata of a declaration.

The reading side (request parsing and checking against the declaration) is ``serve.protocol``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tileship.declare.dims import SAME, DimExpr, resolve_dtype
from tileship.serve.validate import BadRequest

#: KServe datatype -> torch dtype name (the declaration's spelling). FP8_E4M3 and FP8_E5M2 are tileship's
#: (the protocol has no 8-bit float): raw bytes, or JSON numbers rounded to the format
DATATYPES: Mapping[str, str] = {
    "BOOL": "bool", "UINT8": "uint8", "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "BF16": "bfloat16", "FP32": "float32", "FP64": "float64",
    "FP8_E4M3": "float8_e4m3fn", "FP8_E5M2": "float8_e5m2",
}
KSERVE: Mapping[str, str] = {v: k for k, v in DATATYPES.items()}
ITEMSIZE: Mapping[str, int] = {"BOOL": 1, "UINT8": 1, "INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8, "FP16": 2,
                               "BF16": 2, "FP32": 4, "FP64": 8, "FP8_E4M3": 1, "FP8_E5M2": 1}


def numpy_view(t: Any) -> Any:
    """``t`` as a numpy array of its bytes' own width: numpy has no bfloat16 or 8-bit floats, so those
    are viewed as int16 / uint8 (the bytes unchanged)."""
    import torch

    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        t = t.view(torch.uint8)
    return t.contiguous().numpy()


@dataclass
class Encoded:
    """A response body: JSON header then raw parts; ``header_length`` is None when JSON only."""

    parts: list[Any]
    header_length: int | None

    @property
    def size(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in self.parts)


def encode_response(*, model: str, version: str, request_id: str | None, parameters: Mapping[str, Any],
                    outputs: Sequence[tuple[str, Any, bool]], allow_nonfinite: bool = False,
                    shm: Mapping[str, Mapping[str, Any]] | None = None) -> Encoded:
    """Encode ``(name, cpu tensor, binary)`` outputs as an inference response. An output named
    in ``shm`` was written to shared memory (``serve.shm``): its entry carries those parameters, no data.

    JSON cannot carry NaN/Infinity: a JSON output holding them raises ``BadRequest(422)`` unless
    the request set ``parameters.allow_nonfinite`` (then they are written as bare tokens)."""
    import torch

    tokens = False

    head_outputs: list[dict[str, Any]] = []
    raw: list[memoryview] = []
    for name, t, binary in outputs:
        dt = KSERVE.get(str(t.dtype).removeprefix("torch."))
        if dt is None:
            raise TypeError(f"output {name} has dtype {t.dtype}, which the protocol cannot carry")
        entry: dict[str, Any] = {"name": name, "datatype": dt, "shape": list(t.shape)}
        if shm and name in shm:
            entry["parameters"] = dict(shm[name])
        elif binary:
            arr = numpy_view(t)
            mv = memoryview(arr).cast("B")
            entry["parameters"] = {"binary_data_size": mv.nbytes}
            raw.append(mv)
        else:
            # numbers as ``tolist`` gives them (floats through float64: the same text), written by orjson
            flat = t.detach().reshape(-1).to(torch.float64 if t.is_floating_point() else t.dtype)
            if t.is_floating_point() and not bool(torch.isfinite(flat).all()):  # float64: the 8-bit floats have none
                if not allow_nonfinite:
                    raise BadRequest(422, f"output {name} holds NaN or Infinity, which JSON cannot carry; ask for "
                                          "binary output or set parameters.allow_nonfinite to true")
                tokens = True
            entry["data"] = flat.numpy()
        head_outputs.append(entry)
    head: dict[str, Any] = {"model_name": model, "model_version": version}
    if request_id is not None:
        head["id"] = request_id
    head["parameters"] = dict(parameters)
    head["outputs"] = head_outputs
    if tokens:  # orjson writes null for NaN; the client asked for the bare tokens
        import json

        for entry in head_outputs:
            if "data" in entry:
                entry["data"] = entry["data"].tolist()
        text = json.dumps(head, separators=(",", ":")).encode()
    else:
        text = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    return Encoded([text, *raw], len(text) if raw else None)


# -- metadata ------------------------------------------------------------------------

def tensor_metadata(decl: Mapping[str, Any], which: str) -> list[dict[str, Any]]:
    """Inputs or outputs as KServe metadata (outputs: the declared ones, then the inputs the operator updates in
    place, which every answer carries back: ``serve.in_place``): a dim fixed across every declared shape and
    range keeps its size (a derived dim such as ``K/8`` its computed size), every other dim is -1.
    ``datatype`` is the tensor's own: a literal declared dtype, else (``"same"``) the first
    operator dtype; the model's ``parameters.datatypes`` lists all operator dtypes."""
    fixed: dict[str, int | None] = {}

    def see(d: str, v: int | None) -> None:
        if d not in fixed:
            fixed[d] = v
        elif fixed[d] != v:
            fixed[d] = None

    for s in decl.get("shapes", ()):
        for d, v in s.items():
            see(d, v)
    for r in decl.get("ranges", ()):
        see(r["dim"], None)
        for d, v in r["fixed"].items():
            see(d, v)
    exprs = decl.get("tensor_dtypes") or {}

    def size(d: str) -> int:
        e = DimExpr.parse(d)
        v = e.size({b: n for b, n in fixed.items() if n})
        return -1 if v is None else int(v)

    from tileship.serve.in_place import answered

    rows = answered(decl) if which == "outputs" else decl[which]  # outputs: the inputs updated in place too
    return [{"name": n, "datatype": KSERVE[resolve_dtype(exprs.get(n, SAME), decl["dtypes"][0])],
             "shape": [size(d) for d in ds]}
            for n, ds, *_ in rows]
