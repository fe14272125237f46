"""The rule that decides one bucket of ``tileship tune``: rounds of timings in, a winner (or the
reference) out, with every number behind it.

``time_and_decide`` runs the rounds (who goes first rotates every round) through a caller's
``time_one(path) -> median us`` and applies the rule, **paired by round**: within a round the
paths run back to back, so a host that changes speed between rounds (clock, core, co-tenant: on
the H200 host whole rounds move by 3-4 us) moves them together. For each verified candidate the
gain of a round is (reference - candidate) of that round; the candidate's gain is the median of
its round gains, its noise band twice their median absolute deviation (``timing.round_spread``),
never less than ``NOISE_FLOOR`` of the faster median. The candidate with the largest gain wins
only when that gain is larger than its band; otherwise the reference keeps the bucket. When that
band alone kept the reference (the gain is a real margin, but not beyond the band: a disturbed
round widened it), confirmation rounds run and the rule is applied to all rounds. Each path's
median of round medians and its spread are recorded beside the paired numbers.

The band measures how much the rounds' gains differ, not whether the candidate is faster: host spikes
that hit the reference's heavier host path (cuBLAS through PyTorch) in some rounds widen it past a gain
that every round shows (H200, round 18: a candidate faster by 3.7-27.9 us in each of 10 rounds kept
the reference under an 11.3 us band, and then served 1.5x slower). So a candidate also wins when it
is faster in **every** round, by more than ``SIGN_MARGIN`` of that round's faster time, over at least
``SIGN_ROUNDS`` rounds: the sign test ``runtime_overhead`` uses for "resolved", with a margin.

``triage`` comes first, at each bucket: one call of every candidate next to one of the reference
(``verify.latency.probe``); a candidate more than ``factor`` times slower there is pruned at that
bucket, neither verified nor timed (a GEMV-style candidate at M=8192 re-reads the weight 8192
times: a quarter second a call, and it could only lose). Pure: no device, no files;
``tileship.verify.tune`` supplies the timings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tileship.verify.timing import NOISE_FLOOR, quantile, round_spread

#: a candidate faster than the reference in every one of at least SIGN_ROUNDS rounds, by more than
#: SIGN_MARGIN of that round's faster median each time, wins whatever the band (module doc)
SIGN_MARGIN = 0.02
SIGN_ROUNDS = 5


def time_and_decide(
    dims: dict[str, int],
    bucket: list[int],
    order: list[str],
    passed: Mapping[str, Mapping[str, str | None]],
    key: str,
    time_one: Callable[[str], float],
    rounds: int,
    confirm_rounds: int,
) -> dict[str, Any]:
    """Time the paths of ``order`` ("" is the reference) in ``rounds`` rotating rounds
    (``time_one(path)`` -> its median us) and decide the bucket (``_decide``). When the noise band
    alone kept the reference (a candidate's paired gain is more than ``NOISE_FLOOR`` of the
    reference, but not more than the band: a disturbed round widened it), ``confirm_rounds``
    more rounds run and the decision is taken again over all of them; ``rounds`` in the result
    says how many rounds stand behind it."""
    medians: dict[str, list[float]] = {c: [] for c in order}

    def run(first: int, n: int) -> None:
        for r in range(first, first + n):
            rot = order[r % len(order) :] + order[: r % len(order)]  # who goes first changes every round
            for c in rot:
                medians[c].append(time_one(c))

    run(0, rounds)
    point = _decide(dims, bucket, medians, passed, key)
    if confirm_rounds and _noise_kept_reference(point):
        run(rounds, confirm_rounds)
        point = _decide(dims, bucket, medians, passed, key)
    point["rounds"] = len(medians[""])
    return point


def _noise_kept_reference(point: Mapping[str, Any]) -> bool:
    """The reference kept the bucket although a candidate's paired gain is a real margin."""
    if point["winner"] is not None:
        return False
    ref_us = point["reference"]["median_us"]
    gains = [v["paired_gain_us"] for v in point["candidates"].values() if "paired_gain_us" in v]
    return bool(gains) and max(gains) > NOISE_FLOOR * ref_us


def _decide(
    dims: dict[str, int],
    bucket: list[int],
    medians: Mapping[str, list[float]],
    passed: Mapping[str, Mapping[str, str | None]],
    key: str,
) -> dict[str, Any]:
    def summary(xs: list[float]) -> dict[str, Any]:
        return {"median_us": quantile(xs, 0.5), "spread_us": round_spread(xs), "round_medians_us": list(xs)}

    ref = summary(medians[""])
    cands: dict[str, Any] = {}
    for cid, fails in passed.items():
        failure = fails.get(key)
        cands[cid] = {"passed": failure is None, "failure": failure}
        if cid in medians:
            gains = [r - c for r, c in zip(medians[""], medians[cid], strict=True)]  # > 0: the candidate is faster
            cands[cid].update(summary(medians[cid]), paired_gain_us=quantile(gains, 0.5),
                              paired_spread_us=round_spread(gains))
    # the largest gain first; a tie goes to the candidate declared first
    timed = sorted((-v["paired_gain_us"], i, c) for i, (c, v) in enumerate(cands.items()) if "paired_gain_us" in v)
    winner, why, noise = None, "no candidate passed verification here", 0.0
    if timed:
        best = timed[0][2]
        b = cands[best]
        gain = b["paired_gain_us"]
        noise = max(b["paired_spread_us"], NOISE_FLOOR * min(b["median_us"], ref["median_us"]))
        rounds = len(medians[""])
        margins = _sign_margins(medians[""], medians[best])
        if gain > noise:
            winner, why = (
                best,
                f"{best} faster than the reference by {gain:.2f} us (median of {rounds} paired rounds) "
                f"> noise {noise:.2f} us",
            )
        elif rounds >= SIGN_ROUNDS and min(margins) > SIGN_MARGIN:
            winner, why = (
                best,
                f"{best} faster than the reference in every one of {rounds} paired rounds, by at least "
                f"{100 * min(margins):.1f}% (> {100 * SIGN_MARGIN:g}%), though its median gain {gain:.2f} us "
                f"is within the rounds' noise {noise:.2f} us",
            )
        else:
            how = "slower than" if gain < -noise else "within the noise of"
            why = (
                f"the best candidate, {best}, is {how} the reference (paired gain {gain:.2f} us over {rounds} "
                f"rounds, noise {noise:.2f} us; medians {b['median_us']:.2f} vs {ref['median_us']:.2f} us): "
                "the reference keeps it"
            )
    return {
        "dims": dims,
        "bucket": bucket,
        "reference": ref,
        "candidates": cands,
        "noise_us": noise,
        "winner": winner,
        "why": why,
    }


def _sign_margins(ref: Sequence[float], cand: Sequence[float]) -> list[float]:
    """Per round, (reference - candidate) over the faster of the two: > 0 where the candidate was faster."""
    return [(r - c) / max(min(r, c), 1e-9) for r, c in zip(ref, cand, strict=True)]


#: the failure text of a candidate ``triage`` pruned at a bucket starts with this
PRUNED = "pruned"


def triage(candidates: Sequence[str], probe: Callable[[str, float], float], factor: float) -> dict[str, str]:
    """Candidates to prune at one bucket -> why. ``probe(path, limit_us)`` gives one call's wall time,
    us ("" is the reference; a probe repeats a first call over ``limit_us`` and keeps the second); a
    candidate whose call takes more than ``factor`` times the reference's is pruned. The reference
    always gets its second call (limit 0): its first may set up a library (cuBLAS: milliseconds).
    ``factor`` 0: nothing is pruned."""
    if not factor or not candidates:
        return {}
    ref_us = probe("", 0.0)
    limit = factor * ref_us
    out = {}
    for c in candidates:
        us = probe(c, limit)
        if us > limit:
            out[c] = (f"{PRUNED}: {us:.0f} us in a probe call, over {factor:g}x the reference's {ref_us:.0f} us: "
                      "not verified or timed at this bucket")
    return out


__all__ = ["PRUNED", "SIGN_MARGIN", "SIGN_ROUNDS", "time_and_decide", "triage"]
