"""What a call answered, checked before it is sent: one torch tensor per declared output.

The kernel path always answers so; an operator's reference may not (a NumPy array, a list of the
wrong length). ``outputs_of`` turns such an answer into a ``DeclarationError`` naming the reference,
which the server answers as a 500 with that message, in the front-end and in a worker process alike
(in a worker, touching a non-tensor while copying it out would kill the process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tileship.declare.specialization import tensor_dtypes
from tileship.errors import DeclarationError
from tileship.serve.validate import output_shape


def outputs_of(name: str, out: Any, n_outputs: int) -> tuple[Any, ...]:
    """The outputs of operator ``name``'s call result ``out`` (None: no outputs, an operator that only
    updates inputs in place; a tuple or list: several; else one). Raises DeclarationError (field
    ``reference``) when they are not ``n_outputs`` torch tensors."""
    import torch

    outs = () if out is None else tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != n_outputs or not all(isinstance(o, torch.Tensor) for o in outs):
        got = ", ".join(type(o).__name__ for o in outs) or "nothing"
        raise DeclarationError(f"the call answered {got}; the operator declares {n_outputs} output tensor(s)",
                               operator=name, field="reference",
                               hint=f"make the reference return {n_outputs} torch tensor(s), as the kernel does")
    return outs


def check_declared(name: str, outs: Sequence[Any], decl: Mapping[str, Any], dtype: str,
                   dims: Mapping[str, int]) -> None:
    """Raises DeclarationError (field ``reference``) when an output of operator ``name``'s call is not of the dtype
    and shape its declaration ``decl`` gives it for the call's ``dtype`` (the operator dtype, torch name) and ``dims``:
    the response would otherwise carry a tensor unlike the model's metadata. A dim the call cannot tell (an
    expression of a dim that no input sets) is not checked. The kernel path allocates outputs as declared, so what
    this finds is a reference's answer. What is declared is worked out once per (declaration, dtype, dims)."""
    key = (id(decl), dtype, *dims.items())
    kept = _DECLARED.get(key)
    if kept is None or kept[0] is not decl:  # not yet, or another declaration at a reused address
        if len(_DECLARED) >= 1024:
            _DECLARED.clear()
        kept = _DECLARED[key] = (decl, _declared(decl, dtype, dims))
    for (out_name, want, shape, ds), o in zip(kept[1], outs, strict=True):
        if o.dtype is not want or (shape is not None and o.shape != shape):
            got = str(o.dtype).removeprefix("torch.")
            raise DeclarationError(
                f"output {out_name!r} of the call is {got} {list(o.shape)}; the operator declares it "
                f"{str(want).removeprefix('torch.')} {list(shape) if shape is not None else list(ds)} for this call",
                operator=name, field="reference",
                hint="make the reference return its outputs in the declared dtypes and shapes, as the kernel does")


#: (id(declaration), dtype, *dims) -> (the declaration, ``_declared``'s answer), for ``check_declared``
_DECLARED: dict[tuple[Any, ...], tuple[Mapping[str, Any], list[tuple[str, Any, tuple[int, ...] | None, Any]]]] = {}


def _declared(decl: Mapping[str, Any], dtype: str,
              dims: Mapping[str, int]) -> list[tuple[str, Any, tuple[int, ...] | None, Any]]:
    """(name, torch dtype, shape or None where a dim cannot be told, declared dims) of each declared output."""
    import torch

    out = []
    for (out_name, ds, *_), want in zip(decl.get("outputs", ()), tensor_dtypes(decl, "outputs", dtype), strict=True):
        shape = output_shape(ds, dims)
        out.append((out_name, getattr(torch, want), tuple(shape) if shape is not None else None, ds))
    return out


__all__ = ["check_declared", "outputs_of"]
