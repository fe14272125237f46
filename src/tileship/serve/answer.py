"""What a call answered, checked before it is sent: one torch tensor per declared output.

The kernel path always answers so; an operator's reference may not (a NumPy array, a list of the
wrong length). ``outputs_of`` turns such an answer into a ``DeclarationError`` naming the reference,
which the server answers as a 500 with that message, in the front-end and in a worker process alike
(in a worker, touching a non-tensor while copying it out would kill the process).
"""

from __future__ import annotations

from typing import Any

from tileship.errors import DeclarationError


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


__all__ = ["outputs_of"]
