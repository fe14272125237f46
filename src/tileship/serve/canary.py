"""The canary decision rule: a pure function over two windows of samples.

``decide(active, canary, policy, elapsed_s)`` compares what the canary release served with
what the active release served over the same period and returns a ``Verdict``:

- **rollback** (at any time, even before the window is full) when the canary has more errors
  than the active release's error rate predicts for its share of requests, by more than
  ``max_extra_errors``: ``canary.errors - active.errors * canary.requests / active.requests``.
  An error is a 5xx answer, a kernel fault (the circuit breaker served the reference,
  reason ``circuit_open``) or a non-finite kernel output (also ``circuit_open``); a 4xx caused
  by a bad request is not the release's fault and is not counted.
- **rollback** (once the window is full) when, for some model with at least ``min_samples``
  latency samples on both sides, the canary's median latency is worse than
  ``max_p50_ratio`` times the active median by more than the noise:
  ``p50_c - max_p50_ratio * p50_a > z * se``, where ``se`` is the standard error of the
  difference of two medians estimated from each side's interquartile range,
  ``se_side = 1.253 * (IQR / 1.349) / sqrt(n)`` (the normal-theory standard error of a
  median, with the IQR as a robust estimate of the spread), ``se = sqrt(se_a² + se_c²)``.
  Equal distributions give a ratio near 1 and never trip; a 2x slower canary trips as soon as
  the samples are not wider than the slowdown itself.
- **promote** once the window is full (at least ``window_requests`` canary requests and
  ``window_seconds`` elapsed), neither rule trips, and every model both sides served has
  ``min_samples`` latency samples a side. A model short of them keeps the canary waiting (a GPU
  server leaves out calls whose device time it could not measure, ``serve.canary_stats``), and
  after ``BLIND_WINDOWS`` windows of canary requests (and ``BLIND_WINDOWS * min_samples`` active
  ones, so that a canary taking most of the traffic is not blamed for the active side's few) rolls
  it back: nothing is promoted unseen
  (round 22 on the H200: every span stalled and the slow canary was promoted on errors alone).
- **wait** otherwise.

``ratio`` in the numbers is always canary / active (above 1: the canary is slower).
Nothing here does I/O; the server (``serve.rollout``) feeds it and acts on the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tileship.errors import TileshipError
from tileship.verify.timing import quantile  # noqa: F401 (re-exported: the canary rule uses timing's quantile)

Action = Literal["promote", "rollback", "wait"]
#: windows of canary requests without enough latency samples of a model both sides serve before a rollback
BLIND_WINDOWS = 4


@dataclass(frozen=True)
class CanaryPolicy:
    """How a canary runs and is judged. ``fraction``: the share of requests it serves."""

    fraction: float = 0.1
    window_requests: int = 100      # canary requests needed before it can be promoted
    window_seconds: float = 0.0     # and at least this long since it started
    max_p50_ratio: float = 1.10     # canary p50 may be at most this many times the active p50 (beyond noise)
    max_extra_errors: float = 0.0   # canary errors allowed beyond what the active error rate predicts
    min_samples: int = 10           # latency samples per side before a model's latency is compared
    noise_z: float = 2.0            # how many standard errors of the median difference count as noise

    def check(self) -> CanaryPolicy:
        """Itself; TileshipError naming the field when a value is out of range."""
        problems = [(name, why) for name, ok, why in (
            ("fraction", 0.0 < self.fraction <= 1.0, "must be in (0, 1]"),
            ("window_requests", self.window_requests >= 1, "must be >= 1"),
            ("window_seconds", self.window_seconds >= 0.0, "must be >= 0"),
            ("max_p50_ratio", self.max_p50_ratio >= 1.0, "must be >= 1.0"),
            ("max_extra_errors", self.max_extra_errors >= 0.0, "must be >= 0"),
            ("min_samples", self.min_samples >= 2, "must be >= 2"),
            ("noise_z", self.noise_z >= 0.0, "must be >= 0"),
        ) if not ok]
        if problems:
            name, why = problems[0]
            raise TileshipError(f"canary policy: {name} = {getattr(self, name)!r} {why}",
                                hint="e.g. {\"fraction\": 0.1, \"window_requests\": 100, \"max_p50_ratio\": 1.1}")
        return self


@dataclass(frozen=True)
class Side:
    """What one release served in the window: per model the latency samples (seconds), and
    the request and error counts over every model."""

    latencies: Mapping[str, Sequence[float]] = field(default_factory=dict)
    requests: int = 0
    errors: int = 0
    served: frozenset[str] = frozenset()  # models with answered requests (latency samples or not)


@dataclass(frozen=True)
class Verdict:
    """A decision with the reasons and the numbers it was made from (JSON-ready)."""

    action: Action
    reasons: tuple[str, ...]
    numbers: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "reasons": list(self.reasons), "numbers": self.numbers}


def median_se(xs: Sequence[float]) -> float:
    """Standard error of the median of ``xs`` from its IQR (robust to a few outliers)."""
    iqr = quantile(xs, 0.75) - quantile(xs, 0.25)
    return 1.253 * (iqr / 1.349) / math.sqrt(len(xs))


def _model_numbers(a: Sequence[float], c: Sequence[float], policy: CanaryPolicy) -> dict[str, Any]:
    row: dict[str, Any] = {"n_active": len(a), "n_canary": len(c)}
    if len(a) < policy.min_samples or len(c) < policy.min_samples:
        row["compared"] = False
        return row
    pa, pc = quantile(a, 0.5), quantile(c, 0.5)
    se = math.hypot(median_se(a), median_se(c))
    excess = pc - policy.max_p50_ratio * pa
    row.update(compared=True, p50_active_ms=pa * 1e3, p95_active_ms=quantile(a, 0.95) * 1e3, p50_canary_ms=pc * 1e3,
               p95_canary_ms=quantile(c, 0.95) * 1e3, ratio=pc / pa if pa > 0 else math.inf,
               noise_ms=policy.noise_z * se * 1e3, excess_ms=excess * 1e3,
               slower=excess > policy.noise_z * se)
    return {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in row.items()}


def decide(active: Side, canary: Side, policy: CanaryPolicy, elapsed_s: float) -> Verdict:
    """The verdict on the canary now (see the module docstring for the rules). Pure."""
    expected = active.errors * canary.requests / active.requests if active.requests else 0.0
    extra = canary.errors - expected
    models = {m: _model_numbers(active.latencies.get(m, ()), canary.latencies.get(m, ()), policy)
              for m in sorted({*active.latencies, *canary.latencies})}
    full = canary.requests >= policy.window_requests and elapsed_s >= policy.window_seconds
    numbers: dict[str, Any] = {
        "requests": {"active": active.requests, "canary": canary.requests},
        "errors": {"active": active.errors, "canary": canary.errors, "canary_expected": round(expected, 4),
                   "canary_extra": round(extra, 4), "max_extra": policy.max_extra_errors},
        "models": models, "ratio": "canary/active p50 (above 1: canary slower)",
        "max_p50_ratio": policy.max_p50_ratio, "elapsed_s": round(elapsed_s, 3),
        "window": {"requests": policy.window_requests, "seconds": policy.window_seconds, "full": full},
    }
    if extra > policy.max_extra_errors:
        why = (f"errors: the canary had {canary.errors} in {canary.requests} requests; the active release's rate "
               f"predicts {expected:.2f} (allowed extra {policy.max_extra_errors:g})")
        return Verdict("rollback", (why,), numbers)
    if not full:
        return Verdict("wait", (f"window not full: {canary.requests}/{policy.window_requests} canary requests, "
                                f"{elapsed_s:.1f}/{policy.window_seconds:g} s",), numbers)
    slow = [f"latency: {m}: canary p50 {r['p50_canary_ms']:.3f} ms vs active {r['p50_active_ms']:.3f} ms "
            f"(ratio {r['ratio']:.2f} > {policy.max_p50_ratio:g} beyond noise {r['noise_ms']:.3f} ms)"
            for m, r in models.items() if r.get("slower")]
    if slow:
        return Verdict("rollback", tuple(slow), numbers)
    blind = sorted(m for m in active.served & canary.served if not models.get(m, {}).get("compared"))
    if blind:  # served on both sides, but too few latency samples to compare: never promoted unseen
        counts = ", ".join(f"{m} {len(active.latencies.get(m, ()))}/{len(canary.latencies.get(m, ()))}" for m in blind)
        why = f"no latency evidence yet: samples active/canary {counts} (at least {policy.min_samples} a side)"
        if canary.requests >= BLIND_WINDOWS * policy.window_requests and \
                active.requests >= BLIND_WINDOWS * policy.min_samples:  # samples should have come: they do not
            return Verdict("rollback", (f"{why} after {canary.requests} canary and {active.requests} active "
                                        "requests",), numbers)
        return Verdict("wait", (why,), numbers)
    compared = [m for m, r in models.items() if r["compared"]]
    return Verdict("promote", (f"window full; no error excess; p50 within {policy.max_p50_ratio:g}x beyond noise for "
                               f"{', '.join(compared) or 'no model with enough samples on both sides'}",), numbers)
