"""``tileship tune`` over a release where one specialization's artifact fails to load with an error that is not an
ArtifactLoadError (an OSError reading it, a tvm-ffi RuntimeError, a ValueError of a corrupt file).

Before: only ArtifactLoadError was caught around ``load_artifact``; any other error stopped ``tune_release`` for
every group and nothing was stored (the CLI exited 1 on an OSError, with a traceback on the others). Now it is
that candidate's failure, as an ArtifactLoadError is (``tune_checks.load_member``: ``artifact failed to load:
<spec>: <Type>: <message>`` at each point of its group; it cannot win there), the other groups are tuned and
stored. A sticky CUDA error is still raised: every later group would fail with it.

The exit status: before, 0 (a candidate that did not load was only a yellow line among the tuned buckets, and a
script saw success); now 2, as ``build`` exits 2 for a specialization that failed and ``verify`` for an artifact that
does not load, with a last line naming the group, the candidate and the loader's message, even when the reference
(or another candidate) still decided every bucket of that group.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tileship.cli import app
from tileship.release import described, evidence, integrity, tuning

FAST = ["--seeds", "0", "--budget-ms", "1", "--rounds", "2", "--confirm-rounds", "0", "--prune", "0",
        "--limit", "4", "--no-flush"]
BAD = "add"


def _static(root: Path) -> dict[str, list[str]]:
    """group id -> its specialization ids, of the release's static groups."""
    rel = described.read(root / "release.json")
    return {g: [m[0] for m in ms] for g, ms in tuning.groups(rel).items() if ms[0][2].dynamic_dim is None}


@pytest.mark.parametrize("error,words", [
    (OSError(errno.EIO, "Input/output error", "lib.so"), "OSError: [Errno 5] Input/output error: 'lib.so'"),
    (RuntimeError("tvm_ffi: cannot load module lib.so\ntraceback"), "RuntimeError: tvm_ffi: cannot load module lib.so"),
    (ValueError("corrupt artifact.json"), "ValueError: corrupt artifact.json"),
], ids=["oserror", "runtimeerror", "valueerror"])
def test_an_artifact_whose_load_raises_another_error_fails_its_candidate_and_the_run_goes_on(
        cpu_release, monkeypatch, error, words):
    from tileship.runtime import loader

    groups = _static(cpu_release)
    bad = next(g for g in groups if g.startswith(BAD + "."))
    good = next(g for g in groups if not g.startswith(BAD + "."))
    real = loader.load_artifact

    def load_artifact(spec_dir: Path, sid: str) -> Any:
        if sid in groups[bad]:
            raise error
        return real(spec_dir, sid)

    monkeypatch.setattr(loader, "load_artifact", load_artifact)
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", bad, "--only", good, *FAST])
    monkeypatch.undo()
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    last = " ".join(res.output.strip().splitlines()[-1].split())
    assert "1 candidate did not load" in last and f"{bad}/default" in last and good not in last, res.output
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    measured = ev["tuning"][good]
    assert measured["points"] and "failed" not in measured, measured  # the other group is tuned as before
    assert measured["points"][0]["reference"]["median_us"] > 0
    group = ev["tuning"][bad]
    assert "failed" not in group and group["points"], group  # its reference was checked and timed
    (sid,) = groups[bad]
    for point in group["points"]:
        cand = point["candidates"]["default"]
        assert point["winner"] is None and cand["passed"] is False, point
        assert cand["failure"] == f"artifact failed to load: {sid}: {words}", cand
    assert f"{bad}: default artifact failed to load: {sid}: {words}" in " ".join(res.output.split()), res.output
    integrity.check(cpu_release, trusted_keys=[])
    from tileship.release.records import verification_status

    status, detail = verification_status(cpu_release)  # what the registry lists and checks before activating
    assert status == "failed" and f"tune could not load 1 candidates: {bad}/default (artifact failed to load: {sid}: " \
        f"{words})" in detail, (status, detail)


def test_load_member_raises_a_sticky_cuda_error_and_keeps_the_artifact_load_error_words():
    from tileship.errors import ArtifactLoadError
    from tileship.verify.tune_checks import load_member

    def sticky(spec_dir: Path, sid: str) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        load_member(sticky, Path("x"), "s")

    def refused(spec_dir: Path, sid: str) -> Any:
        raise ArtifactLoadError("execution backend 'x' cannot be loaded", spec_id=sid)

    assert load_member(refused, Path("x"), "s") == "artifact failed to load: s: execution backend 'x' cannot be loaded"
    assert load_member(lambda d, s: ("kernel", d, s), Path("x"), "s") == ("kernel", Path("x"), "s")


def test_promote_does_not_take_a_release_with_a_candidate_that_did_not_load(tmp_path, monkeypatch):
    """Before, ``promote``'s tune step went on (with ``--no-verify`` nothing else looked); now it stops, as tune
    exits 2, naming the group, the candidate and the loader's message."""
    from tileship.errors import VerificationError
    from tileship.release import promote
    from tileship.verify import tune as tune_mod

    why = "artifact failed to load: add.float32.N4096.c: OSError: [Errno 5] Input/output error: 'lib.so'"
    table = {"add.float32.N4096.c": {"op": "add", "candidates": ["default"], "points": [
        {"dims": {"N": 4096}, "winner": None, "candidates": {"default": {"passed": False, "failure": why}}}]}}
    monkeypatch.setattr(tune_mod, "tune_release", lambda *a, **kw: {"tuning": table})
    with pytest.raises(VerificationError) as info:
        promote.tune(tmp_path)
    assert f"1 candidates did not load (add.float32.N4096.c/default: {why})" in info.value.message


@pytest.mark.parametrize("verified", [True, False], ids=["verified_passed", "verified_failed"])
def test_the_registry_status_names_a_candidate_whose_artifact_did_not_load(tmp_path, verified):
    """Before: ``passed`` (a candidate verify failed too, which then won no bucket, was even excused as one that never
    serves); now ``failed``, naming the group, the candidate and the loader's message, as tune exits 2 and promote
    stops, so the registry refuses to activate the release without --force."""
    from tileship.release.records import verification_status

    gid, why = "add.float32.N4096.c", "artifact failed to load: add.float32.N4096.c.fast: OSError: [Errno 5] I/O error"
    points = [{"dims": {"N": 4096}, "winner": "default", "candidates": {
        "default": {"passed": True}, "fast": {"passed": False, "failure": why}}}]
    table = {gid: {"op": "add", "candidates": ["default", "fast"], "points": points}}
    ev = {"device": {"name": "cpu"}, "tuning": table,
          "specializations": {f"{gid}.default": {"passed": True}, f"{gid}.fast": {"passed": verified}}}
    (tmp_path / "evidence").mkdir()
    (tmp_path / evidence.EVIDENCE).write_text(json.dumps(ev))
    note = f"tune could not load 1 candidates: {gid}/fast ({why})"
    want = note if verified else f"1 of 2 specializations failed verification: {gid}.fast; {note}"
    assert verification_status(tmp_path) == ("failed", want)
    ev["specializations"]["other.c"] = {"passed": False}
    (tmp_path / evidence.EVIDENCE).write_text(json.dumps(ev))
    shown = "other.c" if verified else f"{gid}.fast, other.c"
    assert verification_status(tmp_path) == (
        "failed", f"{1 if verified else 2} of 3 specializations failed verification: {shown}; {note}")
