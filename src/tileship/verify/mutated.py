"""Operators that update inputs in place (``Operator.mutates``): kernel and reference on clones of them.

Verification, the serve warm-up and the demo must not let one path see what the other wrote, nor
leave the sample inputs changed for the next run: ``OnClones`` calls a path with each mutated input
replaced by a fresh clone, and hands those clones back as extra results after the path's own
outputs. Comparing them with the reference's clones compares the WHOLE tensors, so a kernel that
writes nothing (the sample pre-fills with values that differ from the new ones), the wrong rows, or
anywhere outside the rows it should write, fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def mutated_positions(desc: Mapping[str, Any]) -> tuple[int, ...]:
    """Positions of the described operator's inputs that it updates in place (none: ``()``)."""
    names = set(desc.get("mutates") or ())
    return tuple(i for i, (n, *_) in enumerate(desc["inputs"]) if n in names)


def as_list(result: Any) -> list[Any]:
    """A path's result as a list of outputs: None (no outputs) is ``[]``."""
    if result is None:
        return []
    return list(result) if isinstance(result, (list, tuple)) else [result]


class OnClones:
    """``fn`` called with the inputs at ``positions`` replaced by clones; returns the outputs of ``fn``
    followed by those clones, as updated by ``fn`` (a list). With no positions: ``as_list(fn(...))``."""

    def __init__(self, fn: Callable[..., Any], positions: Sequence[int]) -> None:
        self.fn = fn
        self.positions = tuple(positions)

    def __call__(self, *args: Any) -> list[Any]:
        call = list(args)
        for i in self.positions:
            call[i] = args[i].clone()
        own = as_list(self.fn(*call))
        return own + [call[i] for i in self.positions]


__all__ = ["OnClones", "as_list", "mutated_positions"]
