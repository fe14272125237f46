"""Dim expressions and per-tensor dtypes: the one home of how a declared tensor's shape and dtype
follow from the base dims and the operator dtype of a specialization.

A dim is a base name (``"K"``), a simple expression of one: ``"K/8"``, ``"K//128"``, ``"K*2"``
(``<dim>{/,//,*}<positive int>``), or a size the kernel fixes, ``"6"`` (a top-k's k columns: a
``literal``, the same at every shape). Both divisions are exact: a size that does not divide
is not a shape the declaration covers. Only base dims are factory parameters and appear in
specialization ids; derived sizes are computed here, by build, dispatch, serve and verify alike.

A tensor's dtype is ``"same"`` (the operator dtype of the specialization) or a literal name.
Nothing here imports torch (``apply``/``inverse`` work on ints and on torch SymInts).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SAME = "same"
_EXPR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:(//|/|\*)\s*([0-9]+))?\s*$")
_LITERAL = re.compile(r"^\s*([0-9]+)\s*$")


@dataclass(frozen=True)
class DimExpr:
    """``base`` alone (``op`` None), ``base op k``, or the literal size ``k`` (``base`` "")."""

    base: str
    op: str | None = None
    k: int = 1

    @classmethod
    def parse(cls, text: str) -> DimExpr:
        """Raise ValueError saying what to write instead for anything but ``<dim>[{/,//,*}<int>]``.
        Parsed once per text (the server plans every request with it)."""
        return _parse(text) if isinstance(text, str) else cls._parse_uncached(text)  # the latter raises

    @classmethod
    def _parse_uncached(cls, text: str) -> DimExpr:
        lit = _LITERAL.match(text) if isinstance(text, str) else None
        if lit is not None:
            if int(lit.group(1)) < 1:
                raise ValueError(f"dim {text!r}: a fixed size must be a positive int")
            return cls("", None, int(lit.group(1)))
        m = _EXPR.match(text) if isinstance(text, str) else None
        if m is None:
            raise ValueError(f"dim {text!r} is not a dim name, <dim>/<int>, <dim>//<int>, <dim>*<int> (e.g. \"K/8\") "
                             "or a fixed size (\"6\")")
        base, op, k = m.group(1), m.group(2), m.group(3)
        if op is None:
            return cls(base)
        if int(k) < 1:
            raise ValueError(f"dim {text!r}: the constant must be a positive int")
        return cls(base, op, int(k))

    @property
    def derived(self) -> bool:
        return self.op is not None

    @property
    def literal(self) -> bool:
        """A size the declaration fixes (``"6"``): no base dim, the same at every shape."""
        return not self.base

    def size(self, sizes: Mapping[str, Any]) -> Any:
        """This dim's size given the base ``sizes``; None when its base is not there or does not divide."""
        if self.literal:
            return self.k
        v = sizes.get(self.base)
        return None if v is None or (isinstance(v, int) and not self.exact(v)) else self.apply(v)

    def exact(self, base_size: int) -> bool:
        """Whether ``base_size`` gives a whole size (divisions must divide)."""
        return self.op in (None, "*") or base_size % self.k == 0

    def apply(self, base_size: Any) -> Any:
        """The size of this dim given its base's size (int or SymInt); check ``exact`` first."""
        if self.literal:
            return self.k
        if self.op is None:
            return base_size
        return base_size * self.k if self.op == "*" else base_size // self.k

    def inverse(self, size: Any) -> Any:
        """The base size giving ``size`` (exact expressions are invertible); None when none does."""
        if self.op is None:
            return size
        if self.op == "*":
            if isinstance(size, int) and size % self.k:
                return None
            return size // self.k
        return size * self.k

    def __str__(self) -> str:
        if self.literal:
            return str(self.k)
        return self.base if self.op is None else f"{self.base}{self.op}{self.k}"


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> DimExpr:
    """``DimExpr.parse`` of a str, memoized (a DimExpr is immutable; a ValueError is not cached)."""
    return DimExpr._parse_uncached(text)


def parse_all(dims: Sequence[str]) -> tuple[DimExpr, ...]:
    return tuple(DimExpr.parse(d) for d in dims)


def shape_at(dims: Sequence[str], sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The concrete shape of a tensor declared with ``dims`` at base ``sizes``.
    Raises ValueError when a division is not exact."""
    out = []
    for d in dims:
        e = DimExpr.parse(d)
        if e.literal:
            out.append(e.k)
            continue
        v = int(sizes[e.base])
        if not e.exact(v):
            raise ValueError(f"{e.base}={v} is not divisible by {e.k} (dim {d})")
        out.append(e.apply(v))
    return tuple(out)


def resolve_dtype(expr: str, op_dtype: str) -> str:
    """The dtype name of a tensor declared with ``expr`` in a specialization of ``op_dtype``."""
    return op_dtype if expr in (SAME, None) else expr


@dataclass(frozen=True)
class Binding:
    """Base dims bound from concrete shapes, or why they could not be.

    ``problem`` kinds: ``rank`` (wrong number of dims), ``disagree`` (a base dim given two sizes
    directly), ``derived`` (a derived dim does not match its base, or a division is not exact).
    """

    dims: dict[str, int]
    problem: str | None = None
    argument: str | None = None
    message: str = ""


def bind(declared: Sequence[tuple[str, Sequence[str]]], shapes: Sequence[Sequence[int]]) -> Binding:
    """Bind base dims from the shapes of the declared tensors (plain dims first, then derived ones,
    inverting a derived dim when its base appears nowhere plain)."""
    parsed = [(name, parse_all(ds)) for name, ds in declared]
    for (name, exprs), shape in zip(parsed, shapes, strict=True):
        if len(shape) != len(exprs):
            return Binding({}, "rank", name,
                           f"has rank {len(shape)} (shape {tuple(shape)}), declared ({', '.join(map(str, exprs))})")
    dims: dict[str, int] = {}
    for (name, exprs), shape in zip(parsed, shapes, strict=True):
        for e, size in zip(exprs, shape, strict=True):
            if e.literal and int(size) != e.k:
                return Binding(dims, "derived", name, f"has {int(size)} where the declaration fixes {e.k}")
            if e.derived or e.literal:
                continue
            if dims.setdefault(e.base, int(size)) != int(size):
                return Binding(dims, "disagree", name,
                               f"dim {e.base}={int(size)} disagrees with {e.base}={dims[e.base]} of an earlier input")
    for (name, exprs), shape in zip(parsed, shapes, strict=True):
        for e, size in zip(exprs, shape, strict=True):
            if not e.derived:
                continue
            if e.base not in dims:
                base = e.inverse(int(size))
                if base is None:
                    return Binding(dims, "derived", name, f"dim {e}={int(size)} gives no whole {e.base}")
                dims[e.base] = base
            v = dims[e.base]
            if not e.exact(v) or e.apply(v) != int(size):
                want = e.apply(v) if e.exact(v) else f"none ({e.base}={v} is not divisible by {e.k})"
                return Binding(dims, "derived", name, f"dim {e}={int(size)} but {e.base}={v} gives {want}")
    return Binding(dims)
