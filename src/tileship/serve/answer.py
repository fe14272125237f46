"""What a call answered, checked before it is sent: one torch tensor per declared output, as declared.

The kernel path always answers so; an operator's reference may not (a NumPy array, a list of the wrong length,
float64 where float32 is declared, a tensor on another device than the call's inputs). The dispatcher already
refuses such an answer in process (``runtime.answer``, per memo key); the server checks again with the same helpers
and words, per call plan, since a worker's answer crosses a process boundary: ``outputs_of`` (the count and type;
in a worker, touching a non-tensor while copying it out would kill the process), ``check_device`` (the device, in
the worker, before its answer is copied out: past the shared buffer every output is a CPU copy) and
``check_declared`` (dtypes and shapes, and in process the device), each a ``DeclarationError`` naming the
reference, which the server answers as a 500 with that message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tileship.declare.outputs_at import described_outputs_at
from tileship.runtime.answer import Declared, check_device, check_outputs, outputs_of


def check_declared(name: str, outs: Sequence[Any], decl: Mapping[str, Any], dtype: str,
                   dims: Mapping[str, int], device: Any = None) -> None:
    """Raises DeclarationError (field ``reference``) when an output of operator ``name``'s call is not of the dtype
    and shape its declaration ``decl`` gives it for the call's ``dtype`` (the operator dtype, torch name) and ``dims``:
    the response would otherwise carry a tensor unlike the model's metadata; or not on ``device``, the torch device of
    the call's tensor inputs (``inputs_device``; None: not checked), with the words of ``runtime.answer``: the
    output, its device and the inputs'. A dim the call cannot tell (an expression of a dim that no input sets) is not
    checked, nor is one the declaration does not cover (a division that does not divide: ``declare.outputs_at``). The
    kernel path allocates outputs as declared, so what this finds is a reference's answer. What is
    declared is worked out once per (declaration, dtype, dims)."""
    key = (id(decl), dtype, *dims.items())
    kept = _DECLARED.get(key)
    if kept is None or kept[0] is not decl:  # not yet, or another declaration at a reused address
        if len(_DECLARED) >= 1024:
            _DECLARED.clear()
        kept = _DECLARED[key] = (decl, _declared(decl, dtype, dims))
    check_outputs(name, outs, kept[1], device)


def inputs_device(args: Sequence[Any]) -> Any:
    """The torch device of a call's tensor inputs (``args``: tensors and Python scalars), the one its outputs must
    be on (the server puts every tensor input of a call on one device); None for a call with no tensor input."""
    import torch

    return next((a.device for a in args if isinstance(a, torch.Tensor)), None)


#: (id(declaration), dtype, *dims) -> (the declaration, ``_declared``'s answer), for ``check_declared``
_DECLARED: dict[tuple[Any, ...], tuple[Mapping[str, Any], Declared]] = {}


def _declared(decl: Mapping[str, Any], dtype: str, dims: Mapping[str, int]) -> Declared:
    """(name, torch dtype, shape or None where it cannot be told, declared dims) of each declared output: the
    declaration's rule, ``declare.outputs_at``."""
    import torch

    return tuple((o.name, getattr(torch, o.dtype), o.shape, o.dims) for o in described_outputs_at(decl, dims, dtype))


__all__ = ["check_declared", "check_device", "inputs_device", "outputs_of"]
