"""The canary decision rule (``tileship.serve.canary.decide``) on synthetic samples."""

from __future__ import annotations

import random

import pytest

from tileship.errors import TileshipError
from tileship.serve.canary import CanaryPolicy, Side, decide, quantile

POLICY = CanaryPolicy(fraction=0.1, window_requests=100, max_p50_ratio=1.10)


def noisy(n: int, base_ms: float, seed: int, spread: float = 0.3) -> list[float]:
    """Lognormal-ish latencies with a heavy tail: what a busy CPU server records."""
    rng = random.Random(seed)
    return [base_ms * 1e-3 * rng.lognormvariate(0.0, spread) + (0.02 if rng.random() < 0.02 else 0.0) for _ in range(n)]


def sides(a: list[float], c: list[float], *, a_err: int = 0, c_err: int = 0, model: str = "add") -> tuple[Side, Side]:
    return Side({model: a}, len(a), a_err), Side({model: c}, len(c), c_err)


@pytest.mark.parametrize("seed", range(20))
def test_equal_distributions_promote(seed):
    v = decide(*sides(noisy(900, 1.0, seed), noisy(100, 1.0, seed + 1000)), POLICY, elapsed_s=5.0)
    assert v.action == "promote", v.to_json()
    assert 0.8 < v.numbers["models"]["add"]["ratio"] < 1.2


@pytest.mark.parametrize("seed", range(20))
def test_two_times_slower_rolls_back_with_its_numbers(seed):
    v = decide(*sides(noisy(900, 1.0, seed), noisy(100, 2.0, seed + 1000)), POLICY, elapsed_s=5.0)
    assert v.action == "rollback", v.to_json()
    row = v.numbers["models"]["add"]
    assert row["ratio"] > 1.6 and row["slower"] and "latency: add" in v.reasons[0]
    assert row["p50_canary_ms"] > row["p50_active_ms"] and row["p95_canary_ms"] > 0


def test_slightly_slower_within_tolerance_promotes():
    v = decide(*sides(noisy(900, 1.0, 1), noisy(100, 1.05, 2)), POLICY, elapsed_s=5.0)
    assert v.action == "promote", v.to_json()


def test_noise_protects_a_small_window_of_wide_samples():
    # a 1.3x median shift: not resolved by 12 wide samples per side, resolved by 12 tight ones
    pol = CanaryPolicy(window_requests=12, min_samples=10)
    wide = [0.5e-3, 1.5e-3] * 6
    v = decide(*sides(wide, [x * 1.3 for x in wide]), pol, elapsed_s=1.0)
    row = v.numbers["models"]["add"]
    assert v.action == "promote" and row["ratio"] == pytest.approx(1.3) and row["excess_ms"] < row["noise_ms"], (
        v.to_json()
    )
    tight = [0.99e-3, 1.01e-3] * 6
    v = decide(*sides(tight, [x * 1.3 for x in tight]), pol, elapsed_s=1.0)
    assert v.action == "rollback", v.to_json()


def test_errors_roll_back_before_the_window_is_full():
    v = decide(*sides(noisy(50, 1.0, 1), noisy(5, 1.0, 2), c_err=1), POLICY, elapsed_s=0.5)
    assert v.action == "rollback" and "errors" in v.reasons[0]
    assert v.numbers["errors"]["canary"] == 1 and v.numbers["window"]["full"] is False


def test_errors_are_compared_with_the_active_rate():
    # the active release fails 10%: a canary failing 10% of its share is not worse
    v = decide(*sides(noisy(900, 1.0, 1), noisy(100, 1.0, 2), a_err=90, c_err=10), POLICY, elapsed_s=5.0)
    assert v.action == "promote", v.to_json()
    assert v.numbers["errors"]["canary_expected"] == 10.0
    v = decide(*sides(noisy(900, 1.0, 1), noisy(100, 1.0, 2), a_err=90, c_err=12), POLICY, elapsed_s=5.0)
    assert v.action == "rollback"


def test_wait_until_the_window_is_full_in_requests_and_seconds():
    v = decide(*sides(noisy(900, 1.0, 1), noisy(99, 1.0, 2)), POLICY, elapsed_s=5.0)
    assert v.action == "wait" and "99/100" in v.reasons[0]
    pol = CanaryPolicy(window_requests=10, window_seconds=30.0)
    v = decide(*sides(noisy(900, 1.0, 1), noisy(100, 1.0, 2)), pol, elapsed_s=5.0)
    assert v.action == "wait" and "5.0/30 s" in v.reasons[0]


def test_a_model_with_too_few_samples_is_not_compared():
    a = Side({"add": noisy(900, 1.0, 1), "norm": noisy(3, 1.0, 2)}, 903, 0)
    c = Side({"add": noisy(100, 1.0, 3), "norm": noisy(3, 9.0, 4)}, 103, 0)
    v = decide(a, c, POLICY, elapsed_s=5.0)
    assert v.action == "promote" and v.numbers["models"]["norm"] == {"n_active": 3, "n_canary": 3, "compared": False}


@pytest.mark.parametrize("field,value", [("fraction", 0.0), ("fraction", 1.5), ("window_requests", 0),
                                         ("max_p50_ratio", 0.9)])
def test_bad_policy_names_the_field(field, value):
    with pytest.raises(TileshipError, match=field):
        CanaryPolicy(**{field: value}).check()


def test_quantile():
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5 and quantile([5.0], 0.95) == 5.0


def test_a_model_both_sides_served_without_latency_samples_is_never_promoted():
    """A full window whose model has too few latency samples on a side (a GPU server leaves out calls whose
    device time it could not measure) waits for them; after ``BLIND_WINDOWS`` windows of canary requests it
    rolls back. With the samples, the same counts promote."""
    from tileship.serve.canary import BLIND_WINDOWS

    served = frozenset({"gemm"})
    a, c = noisy(300, 1.0, 1), noisy(100, 1.0, 2)
    blind_a, blind_c = Side({}, 300, 0, served), Side({"gemm": c[:3]}, 100, 0, served)
    v = decide(blind_a, blind_c, POLICY, elapsed_s=5.0)
    assert v.action == "wait" and "no latency evidence" in v.reasons[0] and "gemm 0/3" in v.reasons[0], v.to_json()
    late = Side({"gemm": c[:3]}, BLIND_WINDOWS * POLICY.window_requests, 0, served)
    v = decide(blind_a, late, POLICY, elapsed_s=60.0)
    assert v.action == "rollback" and "after 400 canary and 300 active requests" in v.reasons[0], v.to_json()
    few = Side({}, 30, 0, served)  # a canary taking most of the traffic: the active side has had few requests
    assert decide(few, late, POLICY, elapsed_s=60.0).action == "wait"
    v = decide(Side({"gemm": a}, 300, 0, served), Side({"gemm": c}, 100, 0, served), POLICY, elapsed_s=5.0)
    assert v.action == "promote", v.to_json()
    # a model only one side served cannot be compared and does not hold the canary back
    v = decide(Side({"gemm": a}, 300, 0, served), Side({"gemm": c}, 100, 0, served | {"other"}), POLICY, elapsed_s=5.0)
    assert v.action == "promote", v.to_json()
