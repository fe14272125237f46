"""What a declaration gives its outputs at one call: each output's shape and dtype for the call's base dims and
dtype. The one home of this rule: the dispatcher (``runtime.route.expected_outputs``: the fast launcher's
allocations, the ``out=`` check, the reference's answer), the torch custom ops' fake kernel
(``torchops.custom_ops``) and the server (``serve.validate.output_bytes``, ``serve.answer.check_declared``,
``serve.shm_requests.check_sizes``) all ask it, so none can size an output another one does not.

The rule, from the declaration's grammar (``declare.dims``):

- a dim is parsed as ``DimExpr`` does: a base name, ``<dim>{/,//,*}<k>`` or a positive literal (``"6"``, spaces
  allowed); a Python int stands for its literal text. Anything else (``"0"``, ``"-2"``, ``"K+1"``) is no dim the
  declaration can have: the output's shape cannot be told.
- a base dim the call does not bind (no input gives it) leaves the shape untold, never a guess.
- both divisions are exact: a base size that does not divide is not a shape the declaration covers (its
  ``checks`` refuse such a shape), so the shape is untold, never floored.
- a negative base size is no size of a tensor: untold. Zero is a size (a tensor with no elements).
- a symbolic base size (a torch SymInt, under tracing) is applied as it is; exactness is the tracer's to assume.
- a dtype is ``"same"`` (the call's dtype) or a literal name, whatever the operator's ``dtypes`` list.
- an operator with no outputs (one that only updates inputs in place) has none here: an empty tuple.

Where a shape cannot be told, ``why`` says why, in words a caller puts in its own error. Imports neither torch nor
TileLang; nothing here raises for bad dims or sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tileship.declare.dims import SAME, DimExpr


@dataclass(frozen=True)
class OutputAt:
    """One declared output at a call: ``shape`` None where it cannot be told (``why`` says why)."""

    name: str
    dims: tuple[Any, ...]          # as declared
    dtype: str                     # the dtype name at this call
    shape: tuple[Any, ...] | None
    why: str = ""


def shape_or_why(dims: Sequence[Any], sizes: Mapping[str, Any]) -> tuple[tuple[Any, ...] | None, str]:
    """(the shape of a tensor declared with ``dims`` at base ``sizes``, '') or (None, why it cannot be told)."""
    shape = []
    for d in dims:
        text = str(d) if type(d) is int else d
        try:
            e = DimExpr.parse(text)
        except ValueError as exc:
            return None, str(exc)
        if e.literal:
            shape.append(e.k)
            continue
        if e.base not in sizes:
            return None, f"no input gives dim {e.base} (dim {e})"
        v = sizes[e.base]
        if isinstance(v, int):
            if isinstance(v, bool) or v < 0:
                return None, f"{e.base}={v!r} is not a size (dim {e})"
            if not e.exact(v):
                return None, f"{e.base}={v} is not divisible by {e.k} (dim {e}): not a shape the declaration covers"
        shape.append(e.apply(v))
    return tuple(shape), ""


def output_shape(dims: Sequence[Any], sizes: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The shape of a tensor declared with ``dims`` at base ``sizes``; None when it cannot be told
    (``shape_or_why`` says why)."""
    return shape_or_why(dims, sizes)[0]


def outputs_at(outputs: Sequence[Sequence[Any]], dtypes: Mapping[str, str] | Sequence[str], sizes: Mapping[str, Any],
               same: str) -> tuple[OutputAt, ...]:
    """Each declared output (``outputs``: ``(name, dims, ...)`` rows, as a description or ``OpShape`` holds them)
    at a call of base ``sizes`` whose dtype is ``same`` (the dtype name a ``"same"`` tensor has at this call).
    ``dtypes``: each output's dtype expression, by name (a description's ``tensor_dtypes``; missing: ``"same"``)
    or in order (``OpShape.out_dtypes``; empty: all ``"same"``)."""
    out = []
    for i, (name, dims, *_) in enumerate(outputs):
        if isinstance(dtypes, Mapping):
            expr = dtypes.get(name, SAME)
        else:
            expr = dtypes[i] if i < len(dtypes) else SAME
        shape, why = shape_or_why(dims, sizes)
        out.append(OutputAt(str(name), tuple(dims), same if expr in (SAME, None) else expr, shape, why))
    return tuple(out)


def described_outputs_at(desc: Mapping[str, Any], sizes: Mapping[str, Any], same: str) -> tuple[OutputAt, ...]:
    """``outputs_at`` for a described operator (``release.json``'s ``operators.<name>``)."""
    return outputs_at(desc.get("outputs") or (), desc.get("tensor_dtypes") or {}, sizes, same)


__all__ = ["OutputAt", "described_outputs_at", "output_shape", "outputs_at", "shape_or_why"]
