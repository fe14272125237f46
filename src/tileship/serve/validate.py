"""Request limits and the JSON decoder of the inference protocol: bounds checked before anything
is allocated for a request, so that no input can raise anything but ``BadRequest`` (a 4xx).

    decode_json   orjson (strict: no NaN/Infinity tokens, 1024 levels at most); the bare tokens
                  only through a guarded stdlib parse, and only when the request allows them
    short         a value for an error message, cut to a few dozen characters
    RequestLimits ranks, dims, elements, nesting of ``data``, output bytes (``--max-output-mib``)
    output_bytes  the bytes a planned call will produce, from the declaration's outputs (``declare.outputs_at``)
    in_declared_set, declared_shapes_text  whether dims are in the declared shapes and ranges; their text

Contract: every function here raises only ``BadRequest``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from tileship.declare.outputs_at import described_outputs_at


class BadRequest(Exception):
    """A request this server will not run; ``status`` is the HTTP status (4xx, or 503/504)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on one inference request (``ServeConfig.limits``)."""

    max_dims: int = 8                   # rank of one input
    max_dim: int = 1 << 40              # one dim
    max_elements: int = 1 << 32         # elements of one input
    max_depth: int = 16                 # nesting of an input's JSON ``data`` (at most its rank is needed)
    max_output_bytes: int = 1 << 30     # bytes of all outputs of one call (413 above; --max-output-mib)


_NONFINITE = re.compile(r"NaN|Infinity")


def short(v: Any, limit: int = 60) -> str:
    """``repr(v)`` cut to ``limit`` characters; never raises (ints past the int-str limit included)."""
    try:
        text = repr(v)
    except Exception:  # e.g. ValueError: an int with more digits than sys.get_int_max_str_digits()
        return f"<a {type(v).__name__} too large to print>"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def clip(text: str, limit: int = 200) -> str:
    """``text`` itself (no quotes) when at most ``limit`` characters, else its start and its length."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def _long_int(text: str) -> Any:
    # the stdlib fallback: an integer literal with many digits is a float (as orjson reads it), never an
    # int past the int-str limit that would raise in int() or when an error message formats it
    return int(text) if len(text) <= 20 else float(text)


def decode_json(raw: bytes | bytearray | memoryview, what: str = "the inference request") -> tuple[Any, bool]:
    """The parsed document and whether it held bare NaN/Infinity tokens (then the caller checks the
    request allows them). Malformed JSON, invalid UTF-8, nesting past 1024 levels: ``BadRequest(400)``.

    The stdlib fallback runs only when orjson stopped at such a token: where it stopped is looked at,
    never the whole body (a scan of a large malformed body would hold the event loop)."""
    try:
        return orjson.loads(raw), False
    except orjson.JSONDecodeError as exc:
        first, doc, pos = str(exc), exc.doc, exc.pos  # ``pos`` counts characters of ``doc``, the decoded text
    if not (isinstance(doc, str) and _NONFINITE.match(doc, pos)):  # it stops past a -Infinity's sign
        raise BadRequest(400, f"malformed JSON in {what}: {short(first, 200)}")
    try:
        doc = json.loads(bytes(raw), parse_int=_long_int)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BadRequest(400, f"malformed JSON in {what}: {short(str(exc), 200)}") from None
    return doc, True


def check_shape(name: str, shape: Any, limits: RequestLimits) -> tuple[int, ...]:
    """A list of non-negative integer dims within the limits, as a tuple."""
    if not isinstance(shape, list):
        raise BadRequest(400, f"input {name}: 'shape' must be a list of integers, got {type(shape).__name__}")
    if len(shape) > limits.max_dims:
        raise BadRequest(400, f"input {name}: 'shape' has {len(shape)} dims; the limit is {limits.max_dims}")
    for i, d in enumerate(shape):
        if not isinstance(d, int) or isinstance(d, bool):
            raise BadRequest(400, f"input {name}: 'shape' must be a list of integers; shape[{i}] is {short(d)}")
        if d < 0:
            raise BadRequest(400, f"input {name}: shape {short(shape)} has a negative dimension")
        if d > limits.max_dim:
            raise BadRequest(413, f"input {name}: shape[{i}] is {short(d)}; the limit is {limits.max_dim}")
    count = math.prod(shape)
    if count > limits.max_elements:
        raise BadRequest(413, f"input {name}: shape {short(shape)} has {count} elements; the limit is "
                              f"{limits.max_elements}")
    return tuple(shape)


def flatten(data: Any, name: str, max_depth: int) -> list[Any]:
    """The leaves of a (possibly nested) JSON ``data`` list, nesting at most ``max_depth`` levels."""
    if not isinstance(data, list):
        raise BadRequest(400, f"input {name}: 'data' must be a list, got {type(data).__name__}")
    if not any(isinstance(x, list) for x in data):
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                if len(stack) >= max_depth:
                    raise BadRequest(400, f"input {name}: 'data' nests deeper than {max_depth} levels")
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def output_bytes(decl: Mapping[str, Any], dims: Mapping[str, int], dtype: str,
                 itemsize: Mapping[str, int]) -> dict[str, int]:
    """Bytes of each declared output of a call of ``dtype`` (the torch name a ``"same"`` tensor has) at ``dims``,
    as ``declare.outputs_at`` sizes it; an output whose shape cannot be told (a dim no input gives, a division that
    does not divide), or of a dtype ``itemsize`` (torch dtype name -> bytes per element) lacks, is left out."""
    sizes: dict[str, int] = {}
    for o in described_outputs_at(decl, dims, dtype):
        if o.shape is not None and (item := itemsize.get(o.dtype)) is not None:
            sizes[o.name] = math.prod(o.shape) * item
    return sizes


def check_outputs(model: str, sizes: Mapping[str, int], limits: RequestLimits) -> None:
    """``BadRequest(413)`` when the outputs of one call would pass ``limits.max_output_bytes``."""
    total = sum(sizes.values())
    if total > limits.max_output_bytes:
        each = ", ".join(f"{n}={b}" for n, b in sizes.items())
        raise BadRequest(413, f"model {model}: this call would produce {total} bytes of outputs ({each}); the limit "
                              f"is {limits.max_output_bytes} bytes (--max-output-mib)")


def check_message(model: str, sizes: Mapping[str, int], req: Any, limit: int) -> None:
    """``BadRequest(413)`` when the answer to ``req`` (a ``protocol.InferRequest``) cannot fit one gRPC message of
    ``limit`` bytes (protobuf's, at most 2 GiB, whatever ``--max-output-mib`` allows). Counted: the outputs it
    carries (requested, not in shared memory; ``sizes`` from the declaration, before anything runs), its echoed
    ``id`` and ``MESSAGE_HEADER`` bytes."""
    asked = {n for n, _ in req.outputs}
    carried = {n: b for n, b in sizes.items() if n not in req.shm_outputs and (not asked or n in asked)}
    total = sum(carried.values()) + len((req.id or "").encode()) + MESSAGE_HEADER
    if total > limit:
        each = ", ".join(f"{n}={b}" for n, b in carried.items())
        raise BadRequest(413, f"model {model}: the answer to this call would be about {total} bytes ({each} of "
                              f"outputs); a gRPC message carries at most {limit} bytes, whatever --max-output-mib "
                              "allows: ask for fewer or smaller outputs, have them written to shared memory, or use "
                              "REST")


#: room an answer's message keeps for all but its tensors and echoed id: names, datatypes, shapes, parameters
MESSAGE_HEADER = 64 << 10


def in_declared_set(decl: Mapping[str, Any], dims: Mapping[str, int]) -> bool:
    """True when ``dims`` match a declared static shape or lie in a declared dynamic range."""
    for s in decl.get("shapes", ()):
        if all(dims.get(d) == v for d, v in s.items()):
            return True
    for r in decl.get("ranges", ()):
        v = dims.get(r["dim"])
        if v is not None and r["min"] <= v <= r["max"] and all(dims.get(d) == x for d, x in r["fixed"].items()):
            return True
    return False


def declared_shapes_text(decl: Mapping[str, Any]) -> str:
    """The declared shapes and ranges, as an error message or the model config names them."""
    parts = [",".join(f"{d}={v}" for d, v in s.items()) for s in decl.get("shapes", ())]
    for r in decl.get("ranges", ()):
        fixed = "".join(f",{d}={v}" for d, v in r["fixed"].items())
        parts.append(f"{r['dim']}={r['min']}..{r['max']}{fixed}")
    return "; ".join(parts)
