"""Propose: turn shape telemetry into shapes to add to the project file (``tileship propose``).

Input: a telemetry dump (``release.telemetry()`` / ``GET /v2/tileship/telemetry``, format in
``tileship.runtime.telemetry``) and the project's operators. Only reference calls whose reason
is ``undeclared_shape`` can move onto kernels by declaring shapes; every other reason
(``slower_than_reference``, ``drift``, ``undeclared_dtype``, ``non_contiguous``, ...) and the
telemetry's ``other`` row are reported as not fixable by shapes.

Per operator, the undeclared points (base dims) not already covered by the declaration are
grouped:

* a **range** when one dim takes at least ``RANGE_MIN_SIZES`` distinct sizes with every other
  dim fixed. When a declared range over that dim with the same fixed dims ends within
  ``WIDEN_FACTOR`` of the observed sizes, the proposal **widens** it (a range adjacent to the
  declared one, up or down to a power of two); otherwise a new range from the power of two at or
  below the smallest size to the one at or above the largest;
* **static** shapes for the rest, most calls first, at most ``MAX_STATIC`` per operator and each
  with at least ``MIN_SHARE`` of the operator's undeclared calls (the rest is the reported tail).

Every proposal is checked with ``Operator.check()`` on the operator it would produce (a size that
breaks a derived dim such as ``K/8``, a range over a divided dim): an invalid range falls back to
static shapes, an invalid static shape is dropped and reported. Each proposal carries the share
of observed calls and of observed reference seconds it would move onto kernels, and a build
estimate: the specializations it adds (``expand``: dtypes x targets x candidates) times the mean
compile seconds of the release's ``build-log.json`` for that operator (else of the release, else
``DEFAULT_COMPILE_SECONDS``). The output is deterministic: same telemetry, same proposals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tileship.declare.parts import DynamicRange
from tileship.declare.propose_inputs import DEFAULT_COMPILE_SECONDS, compile_seconds, read_telemetry
from tileship.declare.spec import Operator, expand
from tileship.errors import DeclarationError

FIXABLE = ("undeclared_shape",)
RANGE_MIN_SIZES = 4
WIDEN_FACTOR = 4
MAX_STATIC = 16
MIN_SHARE = 0.01

Point = tuple[tuple[str, int], ...]  # base dims in declaration order


@dataclass(frozen=True)
class Proposal:
    """One change of an operator's shapes: ``kind`` static | range | widen."""

    operator: str
    kind: str
    static: Mapping[str, int] | None = None
    range: DynamicRange | None = None
    calls: int = 0
    seconds: float = 0.0
    calls_share: float = 0.0        # of every observed call of every operator (kernel + reference)
    reference_share: float = 0.0    # of observed reference calls
    seconds_share: float = 0.0      # of observed reference seconds
    specializations: int = 0
    build_seconds: float = 0.0
    note: str = ""


@dataclass
class Report:
    proposals: list[Proposal] = field(default_factory=list)
    #: (operator, what, why) of proposals op.check() refused, or rows no shape can cover
    dropped: list[tuple[str, str, str]] = field(default_factory=list)
    #: (operator, reason) -> (calls, seconds) that declaring shapes cannot move
    not_fixable: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    #: operator -> undeclared calls left out (below MIN_SHARE or past MAX_STATIC)
    tail: dict[str, int] = field(default_factory=dict)
    compile_seconds_source: str = ""


def covered(op: Operator, dims: Mapping[str, int]) -> bool:
    """Whether the declaration already covers base ``dims``."""
    if any(dict(s) == dict(dims) for s in op.shapes):
        return True
    return any(r.min <= dims[r.dim] <= r.max and all(dims.get(d) == v for d, v in r.fixed.items())
               for r in op.ranges if r.dim in dims)


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def _valid(op: Operator, *, shapes: Iterable[Mapping[str, int]] = (),
           ranges: Iterable[DynamicRange] = ()) -> str | None:
    """None when ``op`` with these additions passes ``check()``; else the error message."""
    try:
        dataclasses.replace(op, shapes=(*op.shapes, *shapes), ranges=(*op.ranges, *ranges)).check()
    except DeclarationError as exc:
        return exc.message
    return None


def _n_specs(op: Operator, targets: tuple[str, ...] | None, **add: Any) -> int:
    new = dataclasses.replace(op, shapes=(*op.shapes, *add.get("shapes", ())),
                              ranges=(*op.ranges, *add.get("ranges", ())))
    return len(expand(new, targets)) - len(expand(op, targets))


def _range_for(op: Operator, dim: str, fixed: dict[str, int], sizes: list[int]) -> tuple[str, DynamicRange, str]:
    lo, hi = min(sizes), max(sizes)
    for i, r in enumerate(op.ranges):
        if r.dim != dim or dict(r.fixed) != fixed:
            continue
        if r.max < lo and hi <= r.max * WIDEN_FACTOR:
            new = DynamicRange(dim, r.max + 1, max(_pow2_ceil(hi), r.max + 1), fixed)
            return "widen", new, f"widens ranges[{i}] {dim} {r.min}..{r.max} to {r.min}..{new.max}"
        if hi < r.min and lo * WIDEN_FACTOR >= r.min:
            new = DynamicRange(dim, min(_pow2_floor(lo), r.min - 1), r.min - 1, fixed)
            return "widen", new, f"widens ranges[{i}] {dim} {r.min}..{r.max} to {new.min}..{r.max}"
    new_lo, new_hi = _pow2_floor(lo), _pow2_ceil(hi)
    for r in op.ranges:  # rounding must not reach into a declared range of the same dims
        if r.dim == dim and dict(r.fixed) == fixed:
            if r.min <= new_lo <= r.max:
                new_lo = r.max + 1
            if r.min <= new_hi <= r.max:
                new_hi = r.min - 1
    return "range", DynamicRange(dim, new_lo, new_hi, fixed), ""


def propose(telemetry: Mapping[str, Any], ops: Mapping[str, Operator], *, targets: tuple[str, ...] | None = None,
            release: Path | None = None) -> Report:
    """Proposals for every operator of ``telemetry`` (see the module docstring). Never raises on
    odd rows: they are reported as dropped. An operator unknown to ``ops`` is reported too."""
    per_op, overall, source = compile_seconds(release)
    report = Report(compile_seconds_source=source)
    tele_ops = telemetry.get("ops", {})
    ref_calls = sum(r["calls"] for t in tele_ops.values() for r in t["rows"]) + \
        sum(t["other"]["calls"] for t in tele_ops.values())
    ref_secs = sum(r["seconds"] for t in tele_ops.values() for r in t["rows"]) + \
        sum(t["other"]["seconds"] for t in tele_ops.values())
    all_calls = ref_calls + sum(t.get("kernel_calls", 0) for t in tele_ops.values())

    def make(name: str, kind: str, points: list[Point], stats: dict[Point, list[float]], *,
             static: Mapping[str, int] | None = None, rng: DynamicRange | None = None, note: str = "") -> Proposal:
        calls = int(sum(stats[p][0] for p in points))
        secs = sum(stats[p][1] for p in points)
        op = ops[name]
        n = _n_specs(op, targets, shapes=[static] if static else [], ranges=[rng] if rng else [])
        mean = per_op.get(name, overall)
        return Proposal(name, kind, static, rng, calls, round(secs, 9), calls / all_calls if all_calls else 0.0,
                        calls / ref_calls if ref_calls else 0.0, secs / ref_secs if ref_secs else 0.0,
                        n, round(n * mean, 1), note)

    for name in sorted(tele_ops):
        t = tele_ops[name]
        for reason, o in sorted(t["other"].get("reasons", {}).items()):
            _add(report.not_fixable, (name, f"{reason} (other: shapes past the telemetry's row limit)"),
                 o["calls"], o["seconds"])
        fixable = []
        for r in t["rows"]:
            if r["reason"] in FIXABLE:
                fixable.append(r)
            else:
                _add(report.not_fixable, (name, r["reason"]), r["calls"], r["seconds"])
        if not fixable:
            continue
        op = ops.get(name)
        if op is None:
            report.dropped.append((name, "every undeclared shape", "no such operator in the project"))
            continue
        stats: dict[Point, list[float]] = {}
        for r in fixable:
            dims = r.get("dims", {})
            if set(dims) != set(op.dims):
                report.dropped.append((name, _shapes_text(r), f"dims {dims} do not bind every base dim "
                                       "(a derived dim does not match its base): no declaration covers it"))
                continue
            p = tuple((d, int(dims[d])) for d in op.dims)
            if covered(op, dims):
                report.dropped.append((name, _dims_text(dict(p)), "already declared (older telemetry)"))
                continue
            s = stats.setdefault(p, [0, 0.0])
            s[0] += r["calls"]
            s[1] += r["seconds"]
        left, forced = set(stats), set[Point]()  # forced: points whose range op.check() refused
        # ranges: one dim varying, the others fixed; the group with most calls first
        while True:
            groups: dict[tuple[str, Point], list[Point]] = {}
            for p in sorted(left - forced):
                for d in op.dims:
                    groups.setdefault((d, tuple(x for x in p if x[0] != d)), []).append(p)
            best = max((g for g in groups.items() if len({dict(q)[g[0][0]] for q in g[1]}) >= RANGE_MIN_SIZES),
                       key=lambda g: (sum(stats[q][0] for q in g[1]), g[0]), default=None)
            if best is None:
                break
            (dim, rest), pts = best
            kind, rng, note = _range_for(op, dim, dict(rest), [dict(q)[dim] for q in pts])
            why = _valid(op, ranges=[rng])
            if why is not None:
                report.dropped.append((name, _range_text(rng, op), f"{why} (its shapes are proposed as static ones)"))
                forced |= set(pts)
                continue
            left -= set(pts)
            report.proposals.append(make(name, kind, pts, stats, rng=rng, note=note))
        # static shapes: most calls first
        statics = sorted(left, key=lambda q: (-stats[q][0], q))
        total = sum(v[0] for v in stats.values())
        kept = 0
        for q in statics:
            shape = dict(q)
            if kept >= MAX_STATIC or (total and stats[q][0] / total < MIN_SHARE):
                report.tail[name] = report.tail.get(name, 0) + int(stats[q][0])
                continue
            why = _valid(op, shapes=[shape])
            if why is not None:
                report.dropped.append((name, _dims_text(shape), why))
                continue
            kept += 1
            report.proposals.append(make(name, "static", [q], stats, static=shape))
    return report


def _add(table: dict[tuple[str, str], tuple[int, float]], key: tuple[str, str], calls: int, secs: float) -> None:
    c, s = table.get(key, (0, 0.0))
    table[key] = (c + calls, s + secs)


def _dims_text(dims: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{d} = {v}" for d, v in dims.items()) + "}"


def _range_text(r: DynamicRange, op: Operator | None = None) -> str:
    fixed = {d: r.fixed[d] for d in (op.dims if op else r.fixed) if d in r.fixed}
    return f'{{dim = "{r.dim}", min = {r.min}, max = {r.max}, fixed = {_dims_text(fixed)}}}'


def _shapes_text(row: Mapping[str, Any]) -> str:
    return " ".join("x".join(map(str, s)) for s in row.get("shapes", []))


def to_toml(proposals: Iterable[Proposal], ops: Mapping[str, Operator], *, prefix: str = "",
            keep: Mapping[str, Any] | None = None) -> str:
    """The ``[shapes.<operator>]`` tables of ``proposals`` (after ``keep``'s existing additions,
    a project's ``shapes`` mapping, when given); ``prefix`` is ``tool.tileship.`` in pyproject.toml."""
    by_op: dict[str, tuple[list[str], list[str]]] = {}
    for name, add in sorted((keep or {}).items()):
        s, r = by_op.setdefault(name, ([], []))
        s += [_dims_text(dict(x)) for x in add.static]
        r += [_range_text(x, ops.get(name)) for x in add.ranges]
    for p in proposals:
        s, r = by_op.setdefault(p.operator, ([], []))
        if p.static is not None:
            s.append(_dims_text(p.static))
        if p.range is not None:
            r.append(_range_text(p.range, ops.get(p.operator)))
    out = []
    for name in sorted(by_op):
        s, r = by_op[name]
        out.append(f"[{prefix}shapes.{name}]")
        if s:
            out.append("static = [\n" + "".join(f"  {x},\n" for x in s) + "]")
        if r:
            out.append("ranges = [\n" + "".join(f"  {x},\n" for x in r) + "]")
        out.append("")
    return "\n".join(out)


__all__ = ["DEFAULT_COMPILE_SECONDS", "FIXABLE", "MAX_STATIC", "MIN_SHARE", "RANGE_MIN_SIZES", "WIDEN_FACTOR",
           "Proposal", "Report", "compile_seconds", "covered", "propose", "read_telemetry", "to_toml"]
