"""The sizes a kernel can index: every dim, and every tensor's element count, within int32.

TileLang's generated code indexes a buffer with int32 arithmetic (a ``T.dynamic`` dim is an int32 too):
a static shape with a dim past 2**31 - 1, or a tensor whose dims multiply past it, would build a kernel
that reads and writes at wrapped offsets. ``check_sizes`` refuses such a shape when it is declared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tileship.declare.dims import DimExpr, shape_at
from tileship.errors import DeclarationError

if TYPE_CHECKING:
    from tileship.declare.spec import Operator

#: the largest dim, and the most elements of one tensor, a kernel indexes (an int32 in the generated code)
INT32_MAX = 2**31 - 1
_HINT = ("a kernel indexes its tensors with int32 (2**31 - 1 elements at most): declare smaller shapes, "
         "and let the reference serve larger ones")


def check_sizes(decl: Operator, op: str, sizes: Mapping[str, int], where: str) -> None:
    """Raises DeclarationError (field ``where``, or ``where.<dim>``) when a size in ``sizes`` (base dims, a range
    at its max) is past ``INT32_MAX``, or a declared tensor of ``decl`` has more elements than that there."""
    for d, v in sizes.items():
        if isinstance(v, int) and v > INT32_MAX:
            raise DeclarationError(f"{d}={v} is over {INT32_MAX} (2**31 - 1), the largest size a kernel indexes",
                                   operator=op, field=f"{where}.{d}", hint=_HINT)
    for a in decl.inputs + decl.outputs:
        if not all(DimExpr.parse(d).literal or DimExpr.parse(d).base in sizes for d in a.dims):
            continue  # a dim this shape does not give (checked where the shape is)
        try:
            shape = shape_at(a.dims, sizes)
        except ValueError:  # an inexact division: ``_check_exact`` names it
            continue
        if (n := math.prod(shape)) > INT32_MAX:
            at = ", ".join(f"{d}={v}" for d, v in sizes.items())
            raise DeclarationError(f"{a.name} {a.dims} is {list(shape)} at {at}: {n} elements, over {INT32_MAX} "
                                   "(2**31 - 1), the most a kernel indexes", operator=op, field=where, hint=_HINT)


__all__ = ["INT32_MAX", "check_sizes"]
