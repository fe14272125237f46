"""``[shapes.<operator>]`` in the project file: shapes added to an operator's declaration.

    [shapes.gemm]
    static = [{M = 1, N = 4096, K = 4096}, {M = 8, N = 4096, K = 4096}]
    ranges = [{dim = "M", min = 1, max = 64, fixed = {N = 4096, K = 4096}}]

``load_operators`` appends these, in file order, to the declared ``shapes`` and ``ranges`` of
the operator (a shape or range the declaration already lists is not added twice) and checks
the result with ``Operator.check()``, so a size that breaks a derived dim (``K/8``) or a range
over a divided dim is refused as in Python. ``tileship propose`` writes this table from shape
telemetry (``tileship.declare.propose``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tileship.declare.parts import DynamicRange
from tileship.declare.spec import Operator
from tileship.errors import DeclarationError

_TABLE_KEYS = {"static", "ranges"}
_RANGE_KEYS = {"dim", "min", "max", "fixed"}


@dataclass(frozen=True)
class ShapeAdditions:
    """What ``[shapes.<operator>]`` adds: static shapes and ``T.dynamic`` ranges."""

    static: tuple[Mapping[str, int], ...] = ()
    ranges: tuple[DynamicRange, ...] = ()


def _sizes(value: Any, field: str) -> dict[str, int]:
    if not isinstance(value, Mapping) or not value:
        raise DeclarationError("must be a non-empty table of dim = size", field=field,
                               hint="write {M = 1, N = 4096, K = 4096}")
    for d, v in value.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise DeclarationError(f"must be a positive int, got {v!r}", field=f"{field}.{d}")
    return dict(value)


def parse_shape_tables(data: Any, source: str = "project") -> dict[str, ShapeAdditions]:
    """The ``shapes`` table of a project file; raises DeclarationError naming the bad key."""
    where = f"{source}.shapes"
    if not isinstance(data, Mapping):
        raise DeclarationError("must be a table of [shapes.<operator>] tables", field=where)
    out: dict[str, ShapeAdditions] = {}
    for op, table in data.items():
        f = f"{where}.{op}"
        if not isinstance(table, Mapping):
            raise DeclarationError("must be a table with static = [...] and/or ranges = [...]", field=f)
        unknown = set(table) - _TABLE_KEYS
        if unknown:
            raise DeclarationError(f"unknown keys {sorted(unknown)} (known: {sorted(_TABLE_KEYS)})", field=f)
        static, ranges = table.get("static", []), table.get("ranges", [])
        if not isinstance(static, list) or not isinstance(ranges, list):
            raise DeclarationError("static and ranges must be lists of tables", field=f)
        shapes = tuple(_sizes(s, f"{f}.static[{i}]") for i, s in enumerate(static))
        rs = []
        for i, r in enumerate(ranges):
            rf = f"{f}.ranges[{i}]"
            if not isinstance(r, Mapping):
                raise DeclarationError('must be a table {dim = "M", min = 1, max = 64, fixed = {...}}', field=rf)
            unknown = set(r) - _RANGE_KEYS
            missing = {"dim", "min", "max"} - set(r)
            if unknown or missing:
                raise DeclarationError(f"unknown keys {sorted(unknown)}, missing keys {sorted(missing)} "
                                       f"(known: {sorted(_RANGE_KEYS)})", field=rf)
            if not isinstance(r["dim"], str):
                raise DeclarationError(f"must be a dim name, got {r['dim']!r}", field=f"{rf}.dim")
            for k in ("min", "max"):
                if not isinstance(r[k], int) or isinstance(r[k], bool):
                    raise DeclarationError(f"must be an int, got {r[k]!r}", field=f"{rf}.{k}")
            fixed = _sizes(r["fixed"], f"{rf}.fixed") if r.get("fixed") else {}
            rs.append(DynamicRange(r["dim"], r["min"], r["max"], fixed))
        out[str(op)] = ShapeAdditions(shapes, tuple(rs))
    return out


def apply_shapes(ops: dict[str, Operator], additions: Mapping[str, ShapeAdditions]) -> dict[str, Operator]:
    """``ops`` with each ``[shapes.<operator>]`` appended and checked. Raises DeclarationError
    naming the table for an unknown operator or an addition the declaration refuses."""
    out = dict(ops)
    for name, add in additions.items():
        if name not in out:
            raise DeclarationError(f"unknown operator (the project declares: {', '.join(sorted(out))})",
                                   field=f"shapes.{name}", hint="name an operator of the listed modules")
        op = out[name]
        shapes = [*op.shapes, *(s for s in add.static if s not in op.shapes)]
        ranges = [*op.ranges, *(r for r in add.ranges if r not in op.ranges)]
        new = dataclasses.replace(op, shapes=tuple(_dedupe(shapes)), ranges=tuple(_dedupe(ranges)))
        try:
            new.check()
        except DeclarationError as exc:
            raise DeclarationError(f"[shapes.{name}] of the project file: {exc.message}", field=f"shapes.{name}",
                                   hint=exc.hint) from None
        out[name] = new
    return out


def _dedupe(items: list[Any]) -> list[Any]:
    seen: list[Any] = []
    for x in items:
        if x not in seen:
            seen.append(x)
    return seen


__all__ = ["ShapeAdditions", "apply_shapes", "parse_shape_tables"]
