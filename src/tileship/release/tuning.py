"""Tuning evidence (Option B): the winner per shape bucket, and the routing rule that reads it.

``tileship tune`` (``tileship.verify.tune``) stores a ``tuning`` table in the release's
evidence file, beside verification, so it is hashed, bound to the lock digest and to the device
fingerprint exactly like verification evidence (``tileship.release.evidence``)::

    "tuning": {group_id: {"op", "dtype", "target", "dynamic_dim", "candidates": [ids in declaration order],
                          "points": [{"dims", "bucket": [lo, hi], "reference": {"median_us", "spread_us"},
                                      "candidates": {id: {"passed", "failure", "median_us", "spread_us",
                                                          "paired_gain_us", "paired_spread_us"}},
                                      "noise_us", "winner": id | null, "why"}],
                          "failed": {"dims", "reason"}  (only where tune could not check the reference)}}

A group is one (operator, dtype, shape or T.dynamic range, target); its candidates are the
specializations sharing its ``group_id``. A static group has one point. A dynamic group has one
point per bucket: the powers of two in the range plus its edges; a size belongs to the bucket of
the nearest point on a log scale (ties to the smaller), so ``[lo, hi]`` of each point is exact.

The winner rule (``verify.tune_rule``; applied by tune, recorded, never re-derived at load): the
candidate that passed verification at that point with the largest gain over the reference, paired
round by round (the median of reference - candidate per round; ``paired_gain_us``), wins only when
that gain is larger than its noise band (twice the median absolute deviation of the round gains,
``timing.round_spread``, at least ``NOISE_FLOOR`` of the faster median), or when it is faster in every
one of at least ``tune_rule.SIGN_ROUNDS`` rounds by more than ``tune_rule.SIGN_MARGIN`` each; otherwise
``winner`` is null and the reference serves: the reference is the tested default.
``choice`` turns a concrete size into that decision; the dispatcher asks once per new key.

A group whose reference tune could not check (its answer unlike its declaration, or it raised, at the point
``dims``) has no points and ``failed`` (``failure``): nothing of it was verified or timed, so the reference
keeps every shape of it (reason ``tuning_failed``) and no kernel is routed there until a tune checks it.
Evidence written before ``failed`` existed has none: every group of it was measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tileship.declare.specialization import Specialization
from tileship.release import evidence as ev_mod

NOT_SELECTED = "not_selected"
#: the failure text of a candidate whose artifact did not load starts with this (``verify.tune_checks.load_member``)
LOAD_FAILED = "artifact failed to load"
#: the reason the reference serves a group whose reference tune could not check (``failure``)
TUNING_FAILED = "tuning_failed"


def groups(rel: Mapping[str, Any]) -> dict[str, list[tuple[str, Mapping[str, Any], Specialization]]]:
    """group id -> [(spec id, release.json entry, spec)] of a release, sorted by group id, each group's
    candidates in the operator's declaration order (what tune measures and the loader serves first)."""
    out: dict[str, list[tuple[str, Mapping[str, Any], Specialization]]] = {}
    for sid, info in sorted(rel["specializations"].items()):
        spec = Specialization.from_json(info["spec"])
        out.setdefault(spec.group_id, []).append((sid, info, spec))
    for members in out.values():
        order = [c["id"] for c in rel["operators"][members[0][2].op].get("candidates") or []]
        members.sort(key=lambda m: order.index(m[2].candidate) if m[2].candidate in order else -1)
    return dict(sorted(out.items()))


def table(ev: Mapping[str, Any] | None, *, lock_digest: str, release_id: str | None = None) -> dict[str, Any]:
    """The tuning table when it applies here (same lock, same release, this device); else {}."""
    if not ev or not isinstance(ev.get("tuning"), dict):
        return {}
    if ev.get("lock_digest") != lock_digest or (
        release_id is not None and ev.get("release_id") not in (None, release_id)
    ):
        return {}
    out = {}
    for gid, group in ev["tuning"].items():
        device_type = "cpu" if group.get("target") == "c" else "cuda"
        if ev_mod.applies_here(ev, {"device_type": device_type}):  # type: ignore[arg-type]
            out[gid] = group
    return out


def buckets(lo: int, hi: int, extra: Sequence[int] = ()) -> list[tuple[int, int, int]]:
    """``[(point, first, last)]`` covering ``[lo, hi]``: the points are the powers of two in the range, its
    edges and ``extra`` sizes; each size goes to the nearest point on a log scale (ties to the smaller)."""
    pts = {lo, hi, *(s for s in extra if lo <= s <= hi)}
    v = 1
    while v <= hi:
        if v >= lo:
            pts.add(v)
        v *= 2
    ordered = sorted(pts)
    out = []
    for i, p in enumerate(ordered):
        first = lo if i == 0 else _boundary(ordered[i - 1], p)
        last = hi if i == len(ordered) - 1 else _boundary(p, ordered[i + 1]) - 1
        out.append((p, first, last))
    return out


def _boundary(a: int, b: int) -> int:
    """The smallest size nearer (log scale) to ``b`` than to ``a``; the geometric mean goes to ``a``."""
    x = math.isqrt(a * b)
    while x * x <= a * b:  # x^2 > a*b  <=>  log(x) - log(a) > log(b) - log(x)
        x += 1
    return x


def point_for(group: Mapping[str, Any], dims: Mapping[str, int]) -> Mapping[str, Any] | None:
    """The recorded point whose bucket holds ``dims`` (the only point of a static group)."""
    points = group.get("points") or []
    dyn = group.get("dynamic_dim")
    if dyn is None:
        return points[0] if points else None
    size = int(dims.get(dyn, 0))
    for p in points:
        first, last = p["bucket"]
        if first <= size <= last:
            return p
    return None


def choice(group: Mapping[str, Any], dims: Mapping[str, int]) -> tuple[str | None, str]:
    """(winning candidate id or None for the reference, why) at ``dims``."""
    p = point_for(group, dims)
    if p is None:
        return None, "no tuned bucket holds this size"
    return p.get("winner"), str(p.get("why", ""))


def failure(group: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``{"dims", "reason"}`` of a group whose reference tune could not check; None for a measured group."""
    failed = group.get("failed")
    return failed if isinstance(failed, Mapping) else None


def failures(table: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """group id -> ``failure`` of every failed group of a tuning table (None or not a table: none)."""
    if not isinstance(table, Mapping):
        return {}
    return {gid: f for gid, g in table.items() if isinstance(g, Mapping) and (f := failure(g)) is not None}


def unloaded(group: Mapping[str, Any]) -> dict[str, str]:
    """candidate id -> the loader's message (``artifact failed to load: ...``), of every candidate of ``group``
    whose artifact did not load: it cannot win, and ``tileship tune`` counts the group as failed (exit 2), as
    ``build`` counts a specialization that did not build, even where the reference or another candidate decided
    each bucket. Empty for a group whose candidates all loaded, and for a failed group (``failure``)."""
    out: dict[str, str] = {}
    for p in group.get("points") or []:
        for cid, c in (p.get("candidates") or {}).items():
            why = c.get("failure") if isinstance(c, Mapping) else None
            if isinstance(why, str) and why.startswith(LOAD_FAILED):
                out.setdefault(cid, why)
    return out


def describe_failure(failed: Mapping[str, Any]) -> str:
    """One line: where tune could not check the reference and why."""
    at = ",".join(f"{k}={v}" for k, v in (failed.get("dims") or {}).items())
    return f"tune could not check the reference at {at or 'its shape'}: {failed.get('reason', '?')}"


def winners(group: Mapping[str, Any]) -> list[str]:
    """The candidates that win at least one bucket, in declaration order."""
    won = {p.get("winner") for p in group.get("points") or []}
    return [c for c in group.get("candidates") or [] if c in won]


class TunedRule:
    """``rule(bound_dims) -> reason | None`` for one candidate of a dynamic group: None in the buckets
    it won; ``slower_than_reference`` where the reference won; ``not_selected`` where another did.
    Evaluated by the dispatcher once per new key, never per call."""

    def __init__(self, group: Mapping[str, Any], candidate: str) -> None:
        self.group = group
        self.candidate = candidate
        dyn = group["dynamic_dim"]
        runs: list[list[int]] = []
        for p in group.get("points") or []:
            if p.get("winner") == candidate:
                first, last = p["bucket"]
                if runs and runs[-1][1] + 1 == first:
                    runs[-1][1] = last
                else:
                    runs.append([first, last])
        spans = [f"{a}..{b}" if a != b else f"{a}" for a, b in runs]
        self.summary = f"tuned: {candidate} serves {dyn} in " + (", ".join(spans) or "no bucket")

    def __call__(self, dims: Mapping[str, int]) -> str | None:
        winner, _ = choice(self.group, dims)
        if winner == self.candidate:
            return None
        return "slower_than_reference" if winner is None else NOT_SELECTED


def describe_point(group: Mapping[str, Any], point: Mapping[str, Any]) -> list[str]:
    """Lines explaining one recorded decision: every candidate's time (or failure) against the reference."""
    ref = point.get("reference") or {}
    ref_us = ref.get("median_us")
    lines = [f"  reference  {_us(ref_us)}  (spread {_us(ref.get('spread_us'))})"]
    for cid in group.get("candidates") or []:
        c = (point.get("candidates") or {}).get(cid)
        if c is None:
            lines.append(f"  {cid}  not measured (not built or not loadable here)")
        elif not c.get("passed"):
            lines.append(f"  {cid}  FAILED verification: {c.get('failure')}")
        else:
            m = c.get("median_us")
            ratio = f"  reference/candidate {ref_us / m:.2f}x" if ref_us and m else ""
            paired = (f"; paired gain {_us(c['paired_gain_us'])} (spread {_us(c.get('paired_spread_us'))})"
                      if "paired_gain_us" in c else "")
            lines.append(f"  {cid}  {_us(m)}  (spread {_us(c.get('spread_us'))}){ratio}{paired}")
    winner = point.get("winner")
    lines.append(
        f"  noise band {_us(point.get('noise_us'))}; decision: "
        + (f"kernel {winner}" if winner else "reference")
        + f" ({point.get('why', '')})"
    )
    return lines


def _us(v: Any) -> str:
    return f"{v:.2f} us" if isinstance(v, (int, float)) else "-"
