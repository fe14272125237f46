"""A call's arguments as the dispatcher takes them: inputs by name bound to their places, unreadable ones named.

``OpRunner`` (``runtime.dispatch``) keys every call on its positional arguments. A caller may also
pass inputs by their declared names (the operator's ``TensorArg`` / ``ScalarArg`` names), positional
ones first as in Python: ``bind_named`` puts them in declaration order, once per call and only when
keywords were given, so a positional call never comes here. ``out=`` (and ``.call``'s ``span=``)
stay the call's own keywords: an input named ``out`` or ``span`` is passed by position.

``unreadable`` names the input whose device, dtype or shape cannot be read (``None``, a NumPy array, a
nested tensor whose sizes torch refuses) when the memo key could not be made of it; ``nested`` is the error
for a nested tensor whose shape can be read (a jagged one's holds a symbolic size), refused on the slow path;
``not_tensor`` names an array the compiled table took by DLPack with a tensor's key (``runtime.native``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tileship.errors import CallError

_MISSING = object()


def bind_named(inputs: Sequence[tuple[str, Any]], args: tuple[Any, ...], named: Mapping[str, Any], op: str,
         own: str = "out=") -> tuple[Any, ...]:
    """``args`` then ``named`` as one positional tuple in the order of ``inputs`` (each ``(name, dims)``).

    Raises CallError naming the argument for a keyword that names no input, an input given both by
    position and by name, more positional arguments than inputs, or an input given neither way
    (``own`` lists the call's own keywords, for the message)."""
    names = [n for n, _ in inputs]
    listed = f"{', '.join(names)}; and {own}"
    if len(args) > len(names):
        raise CallError(f"expected {len(names)} inputs ({', '.join(names)}), got {len(args)} positional and "
                        f"{len(named)} by name", operator=op)
    slots: list[Any] = [*args, *([_MISSING] * (len(names) - len(args)))]
    place = {n: i for i, n in enumerate(names)}
    for key, value in named.items():
        i = place.get(key)
        if i is None:
            raise CallError(f"unexpected keyword argument {key!r} (the operator takes {listed})", operator=op,
                            argument=key, hint="pass inputs by position or by their declared names")
        if i < len(args):
            raise CallError(f"given twice: as positional argument {i + 1} and by name", operator=op, argument=key)
        slots[i] = value
    missing = [n for n, v in zip(names, slots, strict=True) if v is _MISSING]
    if missing:
        raise CallError(f"missing input{'s' if len(missing) > 1 else ''} {', '.join(missing)} (the operator takes "
                        f"{', '.join(names)})", operator=op, argument=missing[0])
    return tuple(slots)


def unreadable(args: tuple[Any, ...], inputs: Sequence[tuple[str, Any]], scalars: Sequence[int],
               op: str) -> CallError:
    """The CallError naming the first tensor input of ``args`` whose device, dtype or shape cannot be read
    (None, a NumPy array, a Python list, a nested tensor); a generic one naming none when all can be."""
    for i, a in enumerate(args):
        if i in scalars:
            continue
        try:
            a.device, a.dtype, tuple(a.shape)  # noqa: B018 (what the memo key reads)
        except Exception as exc:  # AttributeError (not a tensor), RuntimeError (a nested tensor's sizes)
            name = inputs[i][0]
            if getattr(a, "is_nested", False):
                return nested(op, name)
            got = f"{type(a).__module__}.{type(a).__name__}" if type(a).__module__ != "builtins" else type(a).__name__
            if isinstance(exc, AttributeError):
                return CallError(f"expected a torch.Tensor, got {got}", operator=op, argument=name,
                                 hint="convert it with torch.as_tensor / torch.from_numpy")
            return CallError(f"its shape cannot be read ({got}: {str(exc).splitlines()[0][:200]})", operator=op,
                             argument=name, hint="pass a strided torch.Tensor")
    return CallError("the arguments' devices, dtypes or shapes cannot be read", operator=op)


def not_tensor(args: tuple[Any, ...], inputs: Sequence[tuple[str, Any]], scalars: Sequence[int],
               op: str) -> CallError | None:
    """The CallError naming the first tensor input of ``args`` that is not a torch.Tensor (a NumPy array, which the
    compiled table takes by DLPack with a tensor's key), None when all are."""
    import torch

    for i, a in enumerate(args):
        if i not in scalars and not isinstance(a, torch.Tensor):
            got = f"{type(a).__module__}.{type(a).__name__}" if type(a).__module__ != "builtins" else type(a).__name__
            return CallError(f"expected a torch.Tensor, got {got}", operator=op, argument=inputs[i][0],
                             hint="convert it with torch.as_tensor / torch.from_numpy")
    return None


def nested(op: str, argument: str) -> CallError:
    """The CallError for a nested tensor (strided or jagged): no declared shape describes it."""
    return CallError("is a nested tensor: its rows have sizes of their own, a kernel takes one shape", operator=op,
                     argument=argument, hint="pass a strided tensor (torch.nested.to_padded_tensor, or one call per "
                     "row of .unbind())")


__all__ = ["bind_named", "nested", "not_tensor", "unreadable"]
