"""Option B: candidates in the declaration, build of every candidate, ``tileship tune`` on the CPU
("c" target, CPU timing), routing per bucket from the evidence, and ``tileship explain``."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import sys
from pathlib import Path

import pytest

from tileship.declare.candidates import Space, candidate_id, resolve_candidates
from tileship.declare.project import Project, load_operators
from tileship.declare.spec import expand
from tileship.errors import DeclarationError
from tileship.release import tuning

TESTS = Path(__file__).parent
PROJECT = Project(
    model="tuned", model_version="1", operator_modules=("tuned_ops",), targets=("c",), routing="evidence", root=TESTS
)


def _ops():
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    return load_operators(PROJECT)


# -- declaration ---------------------------------------------------------------------------


def test_space_expands_in_order_and_filters():
    s = Space(block_M=[64, 128], num_stages=[2, 3], valid=lambda c: not (c["block_M"] == 128 and c["num_stages"] == 3))
    assert s.configs() == [
        {"block_M": 64, "num_stages": 2},
        {"block_M": 64, "num_stages": 3},
        {"block_M": 128, "num_stages": 2},
    ]


@pytest.mark.parametrize(
    "config, cid",
    [
        ({}, "default"),
        ({"block_M": 64, "split_k": 4}, "block_M64-split_k4"),
        ({"eps": 0.5, "flag": True}, "eps0p5-flag1"),
        ({"x": -1}, "xm1"),
    ],
)
def test_candidate_ids_are_readable_and_path_safe(config, cid):
    assert candidate_id(config) == cid


def test_candidates_multiply_specializations_and_ids_name_the_config():
    op = _ops()["poly"]
    specs = expand(op)
    assert len(specs) == 2 * 3  # (range, static shape) x 3 candidates
    ids = {s.id for s in specs}
    assert "poly.float32.N65536.c.rounds1" in ids and "poly.float32.N65536.c.rounds1-bias0p5" in ids
    assert {s.group_id for s in specs} == {"poly.float32.N1-65536.c", "poly.float32.N65536.c"}
    s = next(s for s in specs if s.candidate == "rounds64")
    assert dict(s.config) == {"rounds": 64}


def test_operator_without_candidates_keeps_its_ids():
    from tileship.catalog.cpu import add

    assert all(s.candidate == "" and s.id == s.group_id for s in expand(add))


@pytest.mark.parametrize(
    "candidates, field, words",
    [
        ([{"rounds": 1}, {"rounds": 1}], "candidates[1]", "same config"),
        (Space(rounds=[1, 2], valid=lambda c: False), "candidates", "empty"),
        ([{"rounds": [1, 2]}], "candidates[0].rounds", "int/float/str/bool"),
        ("autotune", "candidates", "Space"),
        ([{"no_such_param": 1}], "candidates.no_such_param1.no_such_param", "no parameter"),
    ],
)
def test_bad_candidates_name_the_field(candidates, field, words):
    op = dataclasses.replace(_ops()["poly"], candidates=candidates)
    with pytest.raises(DeclarationError) as exc:
        op.check()
    assert exc.value.field == field and words in str(exc.value)


def test_candidates_from_the_factorys_autotune_configs():
    import forms_ops

    op = dataclasses.replace(forms_ops.tuned, candidates="factory") if hasattr(forms_ops, "tuned") else None
    if op is None:
        op = next(v for v in vars(forms_ops).values() if getattr(v, "factory", None) is forms_ops.add_tuned)
        op = dataclasses.replace(op, candidates="factory")
    assert [c for c, _ in resolve_candidates(op)] == ["block64", "block128"]
    plain = dataclasses.replace(_ops()["poly"], candidates="factory")
    with pytest.raises(DeclarationError, match="autotune"):
        plain.check()


# -- buckets -------------------------------------------------------------------------------


@pytest.mark.parametrize("lo, hi", [(1, 1), (1, 8192), (3, 1000), (1, 65536), (100, 100_000)])
def test_buckets_partition_the_range_by_nearest_point_on_a_log_scale(lo, hi):
    bs = tuning.buckets(lo, hi)
    assert bs[0][1] == lo and bs[-1][2] == hi
    for (p, first, last), nxt in zip(bs, bs[1:] + [None], strict=True):
        assert first <= p <= last
        if nxt is not None:
            assert nxt[1] == last + 1
    points = [p for p, _, _ in bs]
    rng = random.Random(0)
    for x in [lo, hi, *(rng.randint(lo, hi) for _ in range(300))]:
        owner = next(p for p, first, last in bs if first <= x <= last)
        best = min(abs(math.log(q) - math.log(x)) for q in points)
        assert abs(math.log(owner) - math.log(x)) <= best + 1e-12, (x, owner)


# -- build -> tune -> route -> explain --------------------------------------------------------


@pytest.fixture(scope="module")
def tuned_release(tmp_path_factory):
    """The tuned_ops release, built for "c" and tuned on this CPU (read-only)."""
    from tileship.build.builder import BuildOptions, build
    from tileship.verify.tune import TuneOptions, tune_release

    result = build(PROJECT, _ops(), tmp_path_factory.mktemp("tuned"), BuildOptions(jobs=2))
    assert result.ok, [f.error for f in result.failed]
    untuned = tmp_path_factory.mktemp("untuned") / result.release_id
    shutil.copytree(result.path, untuned)
    data = tune_release(result.path, TuneOptions(budget_ms=10.0))
    return result.path, untuned, data


def test_tune_records_a_table_bound_to_the_lock_and_host(tuned_release):
    from tileship.build.lock import lock_digest, read_lock

    path, _, data = tuned_release
    ev = json.loads((path / "evidence" / "verification.json").read_text())
    assert ev["lock_digest"] == lock_digest(read_lock(path / "tileship.lock"))
    assert ev["host"]["cpu_model"] is not None
    static = ev["tuning"]["poly.float32.N65536.c"]
    assert static["candidates"] == ["rounds1", "rounds64", "rounds1-bias0p5"]
    (p,) = static["points"]
    assert p["winner"] == "rounds1", p["why"]  # the chunked reference is ~10x slower there
    assert not p["candidates"]["rounds1-bias0p5"]["passed"]  # wrong: verified out, never timed
    assert "median_us" not in p["candidates"]["rounds1-bias0p5"]
    slow = p["candidates"]["rounds64"]  # 64x the work: pruned by the probe, or timed and slower
    if slow["passed"]:
        assert slow["median_us"] > p["candidates"]["rounds1"]["median_us"]
    else:
        assert slow["failure"].startswith("pruned: ") and "median_us" not in slow, slow
    dyn = ev["tuning"]["poly.float32.N1-65536.c"]
    assert [q["dims"]["N"] for q in dyn["points"]] == [2**k for k in range(17)]
    for q in dyn["points"]:
        assert q["winner"] != "rounds1-bias0p5", q  # the wrong candidate never wins
        if q["dims"]["N"] >= 1024:  # 64x the arithmetic shows once the work outweighs the call
            assert q["winner"] in (None, "rounds1"), q
        if q["winner"] is None:
            assert (
                q["reference"]["median_us"] - min(c.get("median_us", math.inf) for c in q["candidates"].values())
                <= q["noise_us"]
            )
    assert dyn["points"][-1]["winner"] == "rounds1"
    # every verified candidate's correctness is stored as verification evidence too
    assert ev["specializations"]["poly.float32.N65536.c.rounds1-bias0p5"]["passed"] is False
    # a pruned bucket is neither verified nor timed; every other one is verified. Which buckets the probe
    # prunes depends on this machine's timing (64x the work of rounds1 is ~6x the chunked reference at the top
    # of the range, near the 3x of the probe on a busy host): each decision is checked against the probe times
    # it recorded, never assumed (``test_tune_prunes_where_the_probe_says_and_never_verifies_or_times_there``
    # forces a prune)
    cut = {q["dims"]["N"] for q in dyn["points"] if not q["candidates"]["rounds64"]["passed"]}
    checked = {p["dims"]["N"] for p in ev["specializations"]["poly.float32.N1-65536.c.rounds64"]["points"]}
    assert checked.isdisjoint(cut) and checked | cut == {2**k for k in range(17)}
    for q in dyn["points"]:
        slow = q["candidates"]["rounds64"]
        if q["dims"]["N"] in cut:
            _assert_pruned_over(slow, ev["tuning_options"]["prune"])
        else:
            assert slow["passed"] and slow["median_us"] > 0, q
    assert ev["tuning_options"]["prune"] == 3.0


def _assert_pruned_over(cand: dict, factor: float) -> None:
    """``cand`` (a bucket's candidate record) was pruned, and the probe times it records are over ``factor``."""
    import re

    got = re.fullmatch(r"pruned: (\d+) us in a probe call, over (\S+)x the reference's (\d+) us: "
                       r"not verified or timed at this bucket", cand["failure"])
    assert got is not None and "median_us" not in cand and not cand["passed"], cand
    us, ref = float(got[1]), float(got[3])
    assert float(got[2]) == factor and us + 0.5 > factor * max(ref - 0.5, 0.0), cand  # the numbers are rounded


def test_tune_prunes_where_the_probe_says_and_never_verifies_or_times_there(tuned_release, tmp_path, monkeypatch):
    """Deterministic: the probe says rounds64 takes 1 s at every bucket, so it is pruned at each, recorded with
    those numbers, never verified (no verification point) nor timed; the others are tuned as usual."""
    from tileship.verify import tune, tune_rule
    from tileship.verify.tune import TuneOptions, tune_release

    _, untuned, _ = tuned_release
    root = tmp_path / untuned.name
    shutil.copytree(untuned, root)
    real = tune_rule.triage

    def triage(candidates, probe, factor):
        return real(candidates, lambda c, limit: 1e6 if c == "rounds64" else probe(c, limit), factor)

    monkeypatch.setattr(tune, "triage", triage)
    ev = tune_release(root, TuneOptions(seeds=(0,), budget_ms=1.0, rounds=2, confirm_rounds=0, flush=False,
                                        limit=4, only=("poly",)))
    for gid in ("poly.float32.N65536.c", "poly.float32.N1-65536.c"):
        for q in ev["tuning"][gid]["points"]:
            slow = q["candidates"]["rounds64"]
            _assert_pruned_over(slow, 3.0)
            assert slow["failure"].startswith("pruned: 1000000 us") and q["winner"] != "rounds64", q
            assert q["candidates"]["rounds1"]["passed"], q  # the others are verified and timed there
    # never verified: no verification evidence of it (the release had none before this tune)
    assert not {"poly.float32.N65536.c.rounds64", "poly.float32.N1-65536.c.rounds64"} & set(ev["specializations"])
    assert "poly.float32.N65536.c.rounds1" in ev["specializations"]


def test_each_round_records_what_its_latency_was_made_of(tuned_release):
    """The latency clock keeps, per path and round, the host issue cost and the device time behind
    the number the decision used (on the CPU the two are one: ``timing.measure``'s median)."""
    path, _, _ = tuned_release
    ev = json.loads((path / "evidence" / "verification.json").read_text())
    assert ev["tuning_options"]["clock"] == "latency"
    (p,) = ev["tuning"]["poly.float32.N65536.c"]["points"]
    parts = p["clock_parts_us"]
    timed = {c for c, v in p["candidates"].items() if v["passed"]}
    assert set(parts) == {"reference", *timed} and "rounds1" in timed  # the wrong candidate is never timed
    for cid, part in parts.items():
        rounds = p["reference"] if cid == "reference" else p["candidates"][cid]
        assert rounds["round_medians_us"] == [max(h, d) for h, d in zip(part["host"], part["device"], strict=True)]
        assert part["host_raw"] == part["host"] and set(part["slowdown"]) == {1.0}  # no host gauge on the CPU
    assert ev["tuning_options"]["host_gauge"] is None


def test_triage_prunes_a_candidate_slower_than_the_factor_and_asks_the_reference_once():
    from tileship.verify.tune_rule import PRUNED, triage

    times = {"": 10.0, "fast": 9.0, "close": 29.0, "slow": 31.0, "hopeless": 900.0}
    asked: list[tuple[str, float]] = []

    def probe(path: str, limit_us: float) -> float:
        asked.append((path, limit_us))
        return times[path]

    out = triage(["fast", "close", "slow", "hopeless"], probe, 3.0)
    assert set(out) == {"slow", "hopeless"}
    assert all(why.startswith(PRUNED + ": ") and "3x the reference's 10 us" in why for why in out.values()), out
    assert asked[0] == ("", 0.0) and [p for p, _ in asked].count("") == 1  # 0: its second call counts
    assert all(limit == 30.0 for p, limit in asked[1:])
    assert triage(["hopeless"], probe, 0.0) == {} and triage([], probe, 3.0) == {}


def test_a_probe_repeats_a_slow_first_call_and_keeps_the_second():
    import time

    from tileship.verify.latency import probe

    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.05 if len(calls) == 1 else 0.0)  # a first call that pays a one-time cost

    assert probe(fn, [], device="cpu", limit_us=20_000) < 20_000 and len(calls) == 2
    calls.clear()
    assert probe(fn, [], device="cpu") >= 50_000 and len(calls) == 1  # no limit: one call


def test_host_costs_are_stated_for_the_host_at_its_fastest():
    """A sample taken while the host ran at half speed (its probe took twice the fastest) counts at
    half its host time: a slow stretch longer than a timing run no longer decides."""
    from tileship.verify.latency import HostGauge, scaled_host

    host, slowdown = scaled_host([40.0, 40.0, 44.0, 40.0], [2.0, 2.0, 2.0, 2.0], 1.0)
    assert host == pytest.approx(20.0) and slowdown == 2.0
    host, slowdown = scaled_host([20.0, 40.0, 21.0, 38.0, 20.0], [1.0, 2.0, 1.0, 2.0, 1.0], 1.0)
    assert host == pytest.approx(19.0, abs=1.01) and slowdown == 1.0
    gauge = HostGauge("cpu")
    best = gauge.calibrate(0.05)
    assert 0 < best < math.inf and gauge.probe() >= best


def test_the_latency_clock_on_cpu_is_the_median_of_the_events_clock():
    import torch

    from tileship.verify.latency import latency

    a = torch.randn(4096)
    lat = latency(torch.sin, [[a]], device="cpu", budget_ms=5.0)
    assert lat.latency_us == lat.host_us == lat.device_us > 0 and lat.repeats >= 5


def test_routing_follows_the_tuned_table_bucket_by_bucket(tuned_release):
    import torch

    from tileship.runtime.loader import load

    path, _, data = tuned_release
    release = load(path)
    runner = release.ops["poly"]
    by_id = {e.decision.spec_id: e for e in runner.entries}
    assert by_id["poly.float32.N65536.c.rounds64"].decision.reason == "not_selected"
    group = data["tuning"]["poly.float32.N1-65536.c"]
    rng = random.Random(1)
    sizes = [q["dims"]["N"] for q in group["points"]] + [rng.randint(1, 65535) for _ in range(20)]
    for n in sizes:
        if n == 65536:
            continue  # the static group N=65536 serves that exact shape (checked below)
        x = torch.randn(n)
        y, d = runner.call(x)
        winner, _ = tuning.choice(group, {"N": n})
        if winner is None:
            assert (d.path, d.reason) == ("reference", "slower_than_reference"), n
        else:
            assert (d.path, d.spec_id) == ("kernel", f"poly.float32.N1-65536.c.{winner}"), n
        torch.testing.assert_close(y, ((((x * 0.5 + 1) * x - 2) * x + 0.25) * x + 3), atol=1e-4, rtol=1e-4)
    y, d = runner.call(torch.randn(65536))
    assert d.spec_id == "poly.float32.N65536.c.rounds1" and d.path == "kernel"


def test_untuned_release_serves_the_first_declared_candidate(tuned_release):
    import torch

    from tileship.runtime.loader import load

    _, untuned, _ = tuned_release
    runner = load(untuned).ops["poly"]
    _, d = runner.call(torch.randn(65536))
    assert d.spec_id == "poly.float32.N65536.c.rounds1"
    reasons = {e.decision.spec_id: e.decision.reason for e in runner.entries}
    assert reasons["poly.float32.N65536.c.rounds64"] == "not_selected"
    assert reasons["poly.float32.N65536.c.rounds1-bias0p5"] == "not_selected"
    from tileship.release.explain import explain

    lines, found = explain(untuned, "poly", {"N": 65536})
    assert found and "not tuned: poly.float32.N65536.c.rounds1 serves" in "\n".join(lines)


def test_explain_reproduces_the_decision_from_the_files_alone(tuned_release):
    from tileship.release.explain import explain

    path, _, data = tuned_release
    lines, found = explain(path, "poly", {"N": 65536})
    text = "\n".join(lines)
    assert found and "decision: kernel rounds1" in text and "FAILED verification" in text
    group = data["tuning"]["poly.float32.N1-65536.c"]
    q = group["points"][3]
    lines, _ = explain(path, "poly", {"N": q["bucket"][1]})
    assert f"bucket N={q['bucket'][0]}..{q['bucket'][1]}" in "\n".join(lines)
    assert ("decision: reference" if q["winner"] is None else f"decision: kernel {q['winner']}") in "\n".join(lines)
    lines, found = explain(path, "poly", {"N": 70000})
    assert not found and "undeclared_shape" in lines[-1]


def test_explain_cli_and_tuning_survives_integrity(tuned_release, tmp_path):
    from typer.testing import CliRunner

    from tileship.cli import app
    from tileship.release import bundle

    path, _, _ = tuned_release
    res = CliRunner().invoke(app, ["explain", str(path), "poly", "N=65536"])
    assert res.exit_code == 0 and "rounds1" in res.output
    bundle.check_integrity(path)  # the evidence was re-hashed into the manifest
    copy = tmp_path / path.name
    shutil.copytree(path, copy)
    ev = copy / "evidence" / "verification.json"
    ev.write_text(ev.read_text().replace('"winner": "rounds1"', '"winner": "rounds64"', 1))
    from tileship.errors import BundleIntegrityError
    from tileship.runtime.loader import load

    with pytest.raises(BundleIntegrityError):
        load(copy)  # an edited winner is a tampered release


def _point_after(times: dict[str, list[float]], confirm: int) -> tuple[dict, dict[str, int]]:
    """time_and_decide over scripted per-round medians (path -> one value per call, in call order)."""
    from tileship.verify.tune_rule import time_and_decide

    calls = {c: 0 for c in times}

    def time_one(c: str) -> float:
        calls[c] += 1
        return times[c][calls[c] - 1]

    passed = {"k": {"{}": None}}
    point = time_and_decide({}, [1], ["", "k"], passed, "{}", time_one, 5, confirm)
    return point, calls


def test_a_disturbed_round_does_not_hand_the_bucket_to_the_reference():
    # the kernel is 10 us every round; the reference 12.9 us, but three of the first five rounds
    # were disturbed, so their band (2 x MAD: 3.8 us) swallows the 2.9 us gap: the reference keeps it
    ref = [12.9, 16.5, 11.0, 9.6, 14.5] + [12.9, 12.8, 13.0, 12.9, 12.9]
    kern = [10.0] * 10
    kept, calls = _point_after({"": ref, "k": kern}, confirm=0)
    assert kept["winner"] is None and kept["rounds"] == 5 and calls == {"": 5, "k": 5}
    assert "reference keeps it" in kept["why"]
    won, calls = _point_after({"": ref, "k": kern}, confirm=5)  # five more rounds: the band narrows
    assert won["winner"] == "k" and won["rounds"] == 10 and calls == {"": 10, "k": 10}
    assert len(won["reference"]["round_medians_us"]) == 10  # the decision stands on all ten rounds


def test_confirmation_rounds_run_only_where_the_noise_decided():
    from tileship.verify.timing import NOISE_FLOOR

    clear, calls = _point_after({"": [13.0] * 10, "k": [10.0] * 10}, confirm=5)  # a clear win: no more rounds
    assert clear["winner"] == "k" and calls == {"": 5, "k": 5}
    tie = [10.0 * (1 - NOISE_FLOOR / 2)] * 10  # within the noise floor: a tie is the reference's, no more rounds
    same, calls = _point_after({"": [10.0] * 10, "k": tie}, confirm=5)
    assert same["winner"] is None and calls == {"": 5, "k": 5}
    slower, calls = _point_after({"": [10.0] * 10, "k": [12.0] * 10}, confirm=5)
    assert slower["winner"] is None and calls == {"": 5, "k": 5}
    still, calls = _point_after({"": [12.9, 16.5, 11.0, 9.6, 14.5] * 2, "k": [10.0] * 10}, confirm=5)
    assert still["winner"] is None and still["rounds"] == 10  # the noise did not go away: the reference keeps it


def test_a_host_that_changes_speed_between_rounds_is_compared_round_by_round():
    # round medians tune recorded on the H200 (release 76e4e830, RMSNorm fp16 M=8): the host ran
    # 3-4 us slower from round 3 on, the kernel's round 3 slow and the reference's still fast. Medians
    # alone (12.02 vs 11.10 us) said the kernel is slower; it is faster in 4 of 5 rounds by 2.2-3.0 us
    kern = [8.74, 8.88, 12.02, 12.08, 12.33]
    ref = [10.91, 11.10, 11.06, 15.09, 15.12]
    point, _ = _point_after({"": ref, "k": kern}, confirm=0)
    k = point["candidates"]["k"]
    assert k["median_us"] > point["reference"]["median_us"]  # what the unpaired rule saw
    assert point["winner"] == "k", point["why"]
    assert k["paired_gain_us"] == pytest.approx(2.22) and k["paired_gain_us"] > point["noise_us"]
    assert "paired rounds" in point["why"]


def test_a_candidate_faster_in_every_round_wins_even_when_host_spikes_widen_the_band():
    # round medians tune recorded on the H200 (round 18, fp16 4096x4096, bucket M=23-45): the reference's
    # rounds swing by 25 us, so the band (11.3 us) exceeded the median gain (10.0 us) although the
    # candidate was faster in all ten rounds by 3.7 us or more
    kern = [12.8, 12.7, 12.9, 12.8, 12.8, 12.9, 12.8, 12.7, 12.8, 12.9]
    ref = [k + g for k, g in zip(kern, [27.9, 4.7, 19.9, 18.5, 4.5, 5.0, 6.0, 15.8, 3.7, 14.0], strict=True)]
    point, calls = _point_after({"": ref, "k": kern}, confirm=5)
    assert point["winner"] == "k", point["why"]
    assert point["candidates"]["k"]["paired_gain_us"] < point["noise_us"]  # the band alone would keep the reference
    assert "in every one of" in point["why"]
    assert calls == {"": 5, "k": 5}  # decided on the first five rounds: no confirmation needed


def test_the_every_round_rule_needs_a_margin_in_every_round_and_enough_rounds():
    from tileship.verify.tune_rule import SIGN_MARGIN

    kern = [10.0] * 10
    ref = [10.0 * (1 + SIGN_MARGIN / 2)] + [25.0, 11.0, 30.0, 11.0] * 2 + [12.0]  # one round within the margin
    point, _ = _point_after({"": ref, "k": kern}, confirm=0)
    assert point["winner"] is None, point["why"]
    ref_ok = [10.5] + ref[1:]  # 5% in that round too: now every round carries the margin
    point, _ = _point_after({"": ref_ok, "k": kern}, confirm=0)
    assert point["winner"] == "k" and "in every one of 5" in point["why"]
    from tileship.verify.tune_rule import time_and_decide

    few = iter([10.5, 10.0, 25.0, 10.0, 11.0, 10.0])  # three rounds only: never enough for the sign rule
    point = time_and_decide({}, [1], ["", "k"], {"k": {"{}": None}}, "{}", lambda c: next(few), 3, 0)
    assert point["winner"] is None


def test_a_candidate_slower_in_every_round_never_wins_whatever_the_host_does():
    ref = [10.0, 14.0, 10.0, 14.0, 10.0, 14.0, 10.0, 14.0, 10.0, 14.0]
    kern = [r + 1.0 for r in ref]
    point, calls = _point_after({"": ref, "k": kern}, confirm=5)
    assert point["winner"] is None and "slower than" in point["why"]
    assert calls == {"": 5, "k": 5}  # a loss is no reason for confirmation rounds


def test_the_largest_paired_gain_wins_among_candidates_and_a_tie_goes_to_the_first_declared():
    from tileship.verify.tune_rule import time_and_decide

    times = {"": [20.0] * 5, "a": [15.0] * 5, "b": [12.0] * 5, "c": [12.0] * 5}
    calls = {c: 0 for c in times}

    def time_one(c: str) -> float:
        calls[c] += 1
        return times[c][calls[c] - 1]

    passed = {c: {"{}": None} for c in ("a", "b", "c")}
    point = time_and_decide({}, [1], ["", "a", "b", "c"], passed, "{}", time_one, 5, 0)
    assert point["winner"] == "b"
    assert point["candidates"]["c"]["paired_gain_us"] == point["candidates"]["b"]["paired_gain_us"] == 8.0
