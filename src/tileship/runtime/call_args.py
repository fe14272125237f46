"""A call's arguments as the dispatcher takes them: inputs by name, bound to their places.

``OpRunner`` (``runtime.dispatch``) keys every call on its positional arguments. A caller may also
pass inputs by their declared names (the operator's ``TensorArg`` / ``ScalarArg`` names), positional
ones first as in Python: ``bind_named`` puts them in declaration order, once per call and only when
keywords were given, so a positional call never comes here. ``out=`` (and ``.call``'s ``span=``)
stay the call's own keywords: an input named ``out`` or ``span`` is passed by position.
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


__all__ = ["bind_named"]
