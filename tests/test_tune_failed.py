"""``tileship tune`` over a release where one operator's reference breaks its declaration.

Before: ``_check_reference`` raised a DeclarationError out of ``tune_release`` and the whole run stopped: one bad
operator cost the tuning of every other group, and nothing was stored. Now that group is recorded as failed in the
tune evidence (``tuning.<gid>.failed``: the point and the reason), the reference keeps serving it (reason
``tuning_failed``; no kernel is routed there), the other groups are tuned and stored, and the command exits 2 with
a line naming the failed group (1 is for a tune that could not run: nothing to tune here, a broken release; before,
both exited 1). ``tileship explain`` says why the reference was kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from tileship.cli import app
from tileship.release import evidence, integrity, tuning

#: the cheapest CLI tune there is: static shapes, two rounds, ~1 ms a timing run
FAST = ["--seeds", "0", "--budget-ms", "1", "--rounds", "2", "--confirm-rounds", "0", "--prune", "0",
        "--limit", "4", "--no-flush"]
BAD = "add"
#: ``runtime.answer``'s words for ``add``'s reference answering one element short at N=4096
WORDS = "add.reference: output 'C' of the call is float32 [4095]; the operator declares it float32 [4096]"


def _static_groups(root: Path) -> dict[str, str]:
    """group id -> operator, of the release's static groups."""
    from tileship.release import described

    rel = described.read(root / "release.json")
    return {g: m[0][2].op for g, m in tuning.groups(rel).items() if m[0][2].dynamic_dim is None}


def _short_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """``add``'s reference answers one element short of its declaration (what tune imports)."""
    from tileship.runtime import references

    real = references.import_reference

    def import_reference(desc: Any, op: str) -> Any:
        ref = real(desc, op)
        return (lambda *a: ref(*a)[:-1]) if op == BAD else ref

    monkeypatch.setattr(references, "import_reference", import_reference)


@pytest.fixture
def failed_tune(cpu_release: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, str, Any]:
    """The CPU release tuned by the CLI over ``add``'s static group (its reference one element short) and one
    static group of another operator: (release, bad group, good group, the CLI's result)."""
    groups = _static_groups(cpu_release)
    bad = next(g for g, op in groups.items() if op == BAD)
    good = next(g for g, op in groups.items() if op != BAD)
    _short_reference(monkeypatch)
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", bad, "--only", good, *FAST])
    monkeypatch.undo()  # what loads and explains it below imports the real reference
    return cpu_release, bad, good, res


def test_a_reference_that_breaks_its_declaration_fails_its_group_and_the_others_are_still_tuned(failed_tune):
    root, bad, good, res = failed_tune
    assert res.exit_code == 2, res.output  # a group failed: not 1, which says tune could not run
    assert isinstance(res.exception, SystemExit), res.exception  # an exit code, not a traceback
    last = res.output.strip().splitlines()[-1]
    assert "tune could not check the reference of 1 group" in last and bad in last and good not in last, res.output
    assert WORDS in " ".join(res.output.split()), res.output
    ev = json.loads((root / evidence.EVIDENCE).read_text())
    measured = ev["tuning"][good]
    assert measured["points"] and "failed" not in measured, measured  # the good group is tuned as before
    assert measured["points"][0]["reference"]["median_us"] > 0
    failed = ev["tuning"][bad]
    assert failed["points"] == [] and failed["failed"]["dims"] == {"N": 4096}, failed
    assert failed["failed"]["reason"].startswith(WORDS), failed["failed"]
    assert not any(sid.startswith(bad + ".") for sid in ev["specializations"])  # nothing of it was verified
    integrity.check(root, trusted_keys=[])  # the evidence, failed field and all, is hashed into the manifest
    assert tuning.failures(evidence.read(root)["tuning"]) == {bad: failed["failed"]}  # type: ignore[index]


def test_nothing_to_tune_exits_1_apart_from_a_failed_group(cpu_release):
    """Before, ``tune`` exited 1 both when nothing could be tuned here and when a group failed; a script could not
    tell "run it on the serving GPU" from "the reference of a group is broken" (2, above)."""
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--device", "cuda", *FAST])  # a CPU release: none
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    assert "nothing to tune on this machine" in " ".join(res.output.split()), res.output
    assert not (cpu_release / evidence.EVIDENCE).exists()


def test_the_failed_group_is_served_by_the_reference_and_no_kernel(failed_tune):
    from tileship.runtime.loader import load

    root, bad, _, _ = failed_tune
    op = load(root).ops[BAD]
    (entry,) = [e for e in op.entries if e.decision.spec_id == bad]  # add has no candidates: the spec is the group
    assert (entry.decision.path, entry.decision.reason) == ("reference", tuning.TUNING_FAILED), entry.decision
    assert entry.kernel is None and WORDS in entry.detail, entry.detail
    a, b = torch.randn(4096), torch.randn(4096)
    y, d = op.call(a, b)
    assert (d.path, d.reason, d.spec_id) == ("reference", "tuning_failed", bad), d
    torch.testing.assert_close(y, a + b)


def test_explain_says_the_reference_was_kept_and_why(failed_tune):
    root, bad, _, _ = failed_tune
    res = CliRunner().invoke(app, ["explain", str(root), BAD, "N=4096"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert f"group {bad}" in text, text
    assert f"tune FAILED: tune could not check the reference at N=4096: {WORDS}" in text, text
    assert "decision: reference kept (tuning_failed): tune could not check this group's reference" in text, text


def test_the_registry_status_names_the_group_tune_could_not_check(failed_tune):
    from tileship.release.records import verification_status

    root, bad, _, _ = failed_tune
    status, detail = verification_status(root)
    assert status == "passed" and f"tune could not check the reference of 1 groups, which the reference serves: " \
        f"{bad}" in detail, detail


def test_promote_does_not_take_a_release_whose_tune_failed_a_group(tmp_path, monkeypatch):
    """``promote``'s tune step summarised and went on; a failed group now stops it (the evidence is stored)."""
    from tileship.errors import VerificationError
    from tileship.release import promote
    from tileship.verify import tune as tune_mod

    table = {"add.float32.N4096.c": {"op": "add", "candidates": ["default"], "points": [],
                                     "failed": {"dims": {"N": 4096}, "reason": WORDS}}}
    monkeypatch.setattr(tune_mod, "tune_release", lambda *a, **kw: {"tuning": table})
    with pytest.raises(VerificationError) as info:
        promote.tune(tmp_path)
    assert "add.float32.N4096.c: tune could not check the reference at N=4096: " + WORDS in info.value.message


@pytest.mark.parametrize("failed,field", [
    ("at N=1", "tuning.g.failed"),
    ({"dims": {"N": "1"}, "reason": "x"}, "tuning.g.failed"),
    ({"dims": {"N": 1}}, "tuning.g.failed"),
], ids=["a-string", "a-string-size", "no-reason"])
def test_a_malformed_failed_field_is_refused_naming_it(tmp_path, failed, field):
    from tileship.errors import BundleIntegrityError
    from tileship.release import evidence_shape

    data = {"schema": 1, "specializations": {},
            "tuning": {"g": {"target": "c", "dynamic_dim": None, "candidates": [], "points": [], "failed": failed}}}
    with pytest.raises(BundleIntegrityError, match=f"{field} must be null or an object"):
        evidence_shape.check(data, tmp_path / "verification.json")
    data["tuning"]["g"].pop("failed")  # evidence from before the field: accepted as it always was
    evidence_shape.check(data, tmp_path / "verification.json")


def _failing_step(monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """``add``'s reference module is gone (``import_reference``), or its sample hook does not import
    (``import_sample``): as tune imports them."""
    from tileship.runtime import references

    real = references.import_reference, references.import_sample

    def import_reference(desc: Any, op: str) -> Any:
        gone = op == BAD and step == "import_reference"
        return real[0]({**desc, "reference": "tileship_gone_module.ref"} if gone else desc, op)

    def import_sample(desc: Any, op: str) -> Any:
        if op == BAD and step == "import_sample":
            raise ImportError("cannot import name 'sample' from 'ops'")
        return real[1](desc, op)

    monkeypatch.setattr(references, "import_reference", import_reference)
    monkeypatch.setattr(references, "import_sample", import_sample)


@pytest.mark.parametrize("step,reason", [
    ("import_reference", "import_reference: ArtifactLoadError: add: cannot import the reference "
                         "tileship_gone_module.ref: module tileship_gone_module is neither shipped"),
    ("import_sample", "import_sample: ImportError: cannot import name 'sample' from 'ops'"),
])
def test_an_operator_whose_reference_or_sample_does_not_import_fails_its_groups_and_the_others_are_tuned(
        cpu_release, monkeypatch, step, reason):
    """Before: the ArtifactLoadError (or what the sample hook raised) of one operator's import stopped ``tune_release``
    for every group and nothing was stored. Now every group of that operator is recorded failed with the step and
    the error, the other operators' groups are tuned and stored, and the command exits 2 naming the failed ones."""
    from tileship.release import described

    rel = described.read(cpu_release / "release.json")
    bad = sorted(g for g, m in tuning.groups(rel).items() if m[0][2].op == BAD)
    good = next(g for g, op in _static_groups(cpu_release).items() if op != BAD)
    _failing_step(monkeypatch, step)
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", BAD, "--only", good, *FAST])
    monkeypatch.undo()
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    last = " ".join(res.output.strip().splitlines()[-1:])
    assert f"tune could not check the reference of {len(bad)} group" in res.output and good not in last, res.output
    assert all(g in res.output for g in bad), res.output
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    measured = ev["tuning"][good]
    assert measured["points"] and "failed" not in measured, measured
    assert measured["points"][0]["reference"]["median_us"] > 0
    failures = tuning.failures(ev["tuning"])
    assert sorted(failures) == bad, failures  # every group of the operator, and nothing else
    for g in bad:
        assert ev["tuning"][g]["points"] == [] and failures[g]["reason"].startswith(reason), ev["tuning"][g]
    assert not any(sid.startswith(BAD + ".") for sid in ev["specializations"])
    integrity.check(cpu_release, trusted_keys=[])


def test_prepare_names_the_step_that_failed_and_raises_a_sticky_cuda_error(monkeypatch):
    """``tune_checks.prepare``: a pins failure is the operator's (named ``pins.require``); a sticky CUDA error is
    not (every later group would fail with it), so it is raised as ``_check_reference`` raises it."""
    from tileship.build import pins
    from tileship.verify.tune_checks import prepare

    def drifted(lock: Any, ops: Any, **kw: Any) -> Any:
        raise ValueError(f"reference drift: operator {ops[0]!r}\nmore")

    monkeypatch.setattr(pins, "require", drifted)
    assert prepare({}, BAD, {}, lambda d, op: "ref", lambda d, op: None) == \
        "pins.require: ValueError: reference drift: operator 'add'"

    def poisoned(desc: Any, op: str) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        prepare({}, BAD, {}, poisoned, lambda d, op: None)
