"""``tileship tune`` and ``tileship verify`` where an operator's sample hook, or its reference, fails only when
timing asks for more input sets (the later, rotated sets: ``timing.rotation_sets``), after the checks passed.

Before: the error escaped ``tune_release`` / ``verify`` from inside the timing of one group or specialization: the
whole run stopped with a traceback (exit 1), nothing of any operator was stored and the previous evidence stayed
as it was, so one broken hook cost every other operator's measurements. Now it is that group's failure (tune:
``tuning.<gid>.failed``, ``making inputs failed: ...`` or ``the reference raised ... while timed``; the reference
serves it) or that specialization's (verify: a failed point, the kernel is not routed), the others are measured
and stored, and the command exits 2 naming it. A sticky CUDA error is still raised (every later call would fail).
Likewise in tune, a reference that raises on a candidate's verification inputs (after its check passed) fails the
group, where every candidate failed with its error and the broken reference was recorded as each bucket's winner.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from tileship.cli import app
from tileship.release import described, evidence, integrity, tuning

BAD, GOOD = "add", "rmsnorm_cpu"
TUNE_FAST = ["--seeds", "0", "--budget-ms", "1", "--rounds", "2", "--confirm-rounds", "0", "--prune", "0",
             "--limit", "4", "--no-flush"]
VERIFY_FAST = ["--seeds", "0", "--grid", "0", "--limit", "64", "--budget-ms", "1", "--warmup-ms", "1"]


def _hook_fails_after(monkeypatch: pytest.MonkeyPatch, calls: int, what: str) -> None:
    """``BAD`` gets a sample hook whose first ``calls`` calls answer as declared and every later one raises
    (``what="sample"``), or whose later inputs make the reference raise (``what="reference"``: one input too
    short for ``add``'s reference, which broadcasts nothing; the kernel is never given those)."""
    from tileship.runtime import loader, references  # noqa: F401  (loader first: see below)

    # ``runtime.loader`` binds ``import_sample`` when it is first imported: imported while the patch is on, it
    # kept this test's failing hook for the rest of the session (a later server's warm-up ran out of samples)
    real = references.import_sample, references.import_reference
    count = {"n": 0}

    def sample(dims: dict[str, int], dtype: str, device: str) -> Any:
        count["n"] += 1
        n = dims["N"]
        if count["n"] > calls and what == "sample":
            raise RuntimeError(f"sample ran out at call {count['n']}")
        return [torch.randn(n, dtype=getattr(torch, dtype), device=device) for _ in range(2)]

    def import_sample(desc: Any, op: str) -> Any:
        return sample if op == BAD else real[0](desc, op)

    def import_reference(desc: Any, op: str) -> Any:
        ref = real[1](desc, op)
        if op != BAD or what != "reference":
            return ref

        def reference(*args: Any) -> Any:
            if count["n"] > calls:
                raise RuntimeError(f"reference broke after call {calls}")
            return ref(*args)

        return reference

    monkeypatch.setattr(references, "import_sample", import_sample)
    monkeypatch.setattr(references, "import_reference", import_reference)


@pytest.mark.parametrize("what,words", [
    ("sample", "making inputs failed: RuntimeError: sample ran out at call 4"),
    ("reference", "the reference raised RuntimeError: reference broke after call 3"),
])
def test_tune_fails_the_group_whose_timing_inputs_or_reference_fail_and_tunes_the_others(
        cpu_release, monkeypatch, what, words):
    rel = described.read(cpu_release / "release.json")
    groups = tuning.groups(rel)
    bad = next(g for g, m in groups.items() if m[0][2].op == BAD and m[0][2].dynamic_dim is None)
    good = next(g for g, m in groups.items() if m[0][2].op == GOOD and m[0][2].dynamic_dim is None)
    # calls 1-3: the reference check, the one seed's verification, the first timing set; later sets fail
    _hook_fails_after(monkeypatch, 3, what)
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", bad, "--only", good, *TUNE_FAST])
    monkeypatch.undo()
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    assert ev["tuning"][good]["points"] and "failed" not in ev["tuning"][good]
    failed = tuning.failure(ev["tuning"][bad])
    assert failed is not None and words in failed["reason"], ev["tuning"][bad]
    last = " ".join(res.output.strip().splitlines()[-1].split())
    assert bad in last and words in last and good not in last, res.output
    integrity.check(cpu_release, trusted_keys=[])


@pytest.mark.parametrize("what,words", [
    ("sample", "making timing inputs failed: RuntimeError: sample ran out at call 2"),
    ("reference", "timing failed: RuntimeError: reference broke after call 1"),
])
def test_verify_fails_the_specialization_whose_timing_inputs_or_reference_fail_and_verifies_the_others(
        cpu_release, monkeypatch, what, words):
    rel = described.read(cpu_release / "release.json")
    specs = rel["specializations"]
    bad = next(s for s, i in sorted(specs.items()) if i["spec"]["op"] == BAD and "N4096" in s)
    good = next(s for s, i in sorted(specs.items()) if i["spec"]["op"] == GOOD and i["status"] == "built")
    _hook_fails_after(monkeypatch, 1, what)  # call 1: the one seed's check; the timing sets fail
    res = CliRunner().invoke(app, ["verify", str(cpu_release), "--only", bad, "--only", good, *VERIFY_FAST])
    monkeypatch.undo()
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    assert ev["specializations"][good]["passed"], ev["specializations"][good]
    entry = ev["specializations"][bad]
    assert not entry["passed"] and entry["route"] == "reference" and words in entry["failure"], entry
    assert f"failed {bad}:" in res.output and words in " ".join(res.output.split()), res.output
    integrity.check(cpu_release, trusted_keys=[])


def test_tune_fails_the_group_whose_reference_fails_in_the_candidates_verification(cpu_release, monkeypatch):
    """Before: the reference check passed (the declared dtype), then the reference raised on the verification's
    float64 inputs: every candidate failed verification with the reference's error, so the reference "won" every
    bucket and tune exited 0, recorded as the tested default. Now the group fails naming the reference's error."""
    from tileship.runtime import references

    rel = described.read(cpu_release / "release.json")
    groups = tuning.groups(rel)
    bad = next(g for g, m in groups.items() if m[0][2].op == BAD and m[0][2].dynamic_dim is None)
    good = next(g for g, m in groups.items() if m[0][2].op == GOOD and m[0][2].dynamic_dim is None)
    real = references.import_reference

    def import_reference(desc: Any, op: str) -> Any:
        ref = real(desc, op)
        if op != BAD:
            return ref

        def reference(*args: Any) -> Any:
            if any(getattr(a, "dtype", None) == torch.float64 for a in args):
                raise ValueError("no float64 path")
            return ref(*args)

        return reference

    monkeypatch.setattr(references, "import_reference", import_reference)
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", bad, "--only", good, *TUNE_FAST])
    monkeypatch.undo()
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    assert ev["tuning"][good]["points"] and "failed" not in ev["tuning"][good]
    failed = tuning.failure(ev["tuning"][bad])
    assert failed is not None and failed["reason"].endswith("reference raised ValueError: no float64 path"), \
        ev["tuning"][bad]
    assert ev["tuning"][bad]["points"] == [] and bad in res.output.strip().splitlines()[-1], res.output


def test_an_interrupted_tune_leaves_the_previous_evidence_whole(cpu_release, monkeypatch):
    """Ctrl-C (or any crash) while a group is measured: nothing is written, the evidence stored before stays
    byte for byte and the release checks (tune writes once, at its end, through ``evidence_write.update``)."""
    rel = described.read(cpu_release / "release.json")
    groups = tuning.groups(rel)
    bad = next(g for g, m in groups.items() if m[0][2].op == BAD and m[0][2].dynamic_dim is None)
    good = next(g for g, m in groups.items() if m[0][2].op == GOOD and m[0][2].dynamic_dim is None)
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", good, *TUNE_FAST])
    assert res.exit_code == 0, res.output
    before = (cpu_release / evidence.EVIDENCE).read_bytes(), (cpu_release / "manifest.json").read_bytes()
    from tileship.runtime import references

    real = references.import_sample

    def interrupted(dims: dict[str, int], dtype: str, device: str) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(references, "import_sample", lambda desc, op: interrupted if op == BAD else real(desc, op))
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", good, "--only", bad, *TUNE_FAST])
    monkeypatch.undo()
    assert res.exit_code != 0 and not res.output.strip().endswith("unsigned)"), res.output  # no success claimed
    assert ((cpu_release / evidence.EVIDENCE).read_bytes(), (cpu_release / "manifest.json").read_bytes()) == before
    integrity.check(cpu_release, trusted_keys=[])
    assert not list(cpu_release.rglob("*.tmp*")), "a temporary was left"


def test_a_candidate_that_raises_while_timed_is_recorded_failed_not_timed_as_the_reference(cpu_release, monkeypatch):
    """Before: a kernel that passed verification and then raised on the rotated timing sets tripped its
    dispatcher's breaker, which served the reference from then on: the candidate was recorded as passed, with the
    reference's time as its own (it could even have won on noise). Now it is failed at that bucket and the later
    ones (``the kernel failed while timed: ...``), never the winner, and the rest of the group is tuned."""
    from tileship.runtime import loader

    rel = described.read(cpu_release / "release.json")
    groups = tuning.groups(rel)
    bad = next(g for g, m in groups.items() if m[0][2].op == BAD and m[0][2].dynamic_dim is None)
    real = loader.load_artifact
    calls = {"n": 0}

    def load_artifact(spec_dir: Any, sid: str) -> Any:
        kernel = real(spec_dir, sid)
        if not sid.startswith(BAD + "."):
            return kernel

        def flaky(*args: Any) -> Any:  # not the compiled table's: timed through the Python path
            calls["n"] += 1
            if calls["n"] > 1:  # call 1: the one seed's verification
                raise RuntimeError("kernel broke while timed")
            return kernel(*args)

        return flaky

    monkeypatch.setattr(loader, "load_artifact", load_artifact)
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", bad, *TUNE_FAST])
    monkeypatch.undo()
    assert res.exit_code == 0, res.output  # a candidate that cannot win, as one failing verification: not a group
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    (point,) = ev["tuning"][bad]["points"]
    cand = point["candidates"]["default"]
    assert point["winner"] is None and cand["passed"] is False and "median_us" not in cand, point
    assert cand["failure"].startswith("the kernel failed while timed: "), cand
    assert point["reference"]["median_us"] > 0
