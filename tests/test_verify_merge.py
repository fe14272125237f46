"""``tileship verify`` merges what it verified into the release's stored evidence.

Before: verify replaced ``evidence/verification.json`` as a whole. ``verify --only X`` dropped every other
operator's verification entries, and ``verify`` after ``tune`` dropped the tune table (``tuning``): the routing tune
chose silently disappeared. Now the specializations it re-verified are replaced and everything else is kept while it
describes this release here (same lock digest, release and device); a tune group whose bucket winner verify now fails
is dropped with a line naming the group and why; evidence for another lock is replaced, with a line saying so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tileship.cli import app
from tileship.release import described, evidence, evidence_write, integrity, tuning

BAD, GOOD = "add", "rmsnorm_cpu"
QUICK = ["--no-timing", "--seeds", "0", "--grid", "0", "--limit", "64"]
TUNE = ["--seeds", "0", "--budget-ms", "1", "--rounds", "2", "--confirm-rounds", "0", "--prune", "0",
        "--limit", "4", "--no-flush"]


def _ev(root: Path) -> dict[str, Any]:
    return json.loads((root / evidence.EVIDENCE).read_text())


def _verify(root: Path, *args: str) -> Any:
    res = CliRunner().invoke(app, ["verify", str(root), *QUICK, *args])
    assert res.exit_code in (0, 2) and (res.exception is None or isinstance(res.exception, SystemExit)), (
        res.output, res.exception)
    integrity.check(root, trusted_keys=[])  # the merged evidence is what the manifest hashes
    return res


def _static(root: Path, op: str) -> tuple[str, list[str]]:
    """(group id, its spec ids) of the first static group of ``op``."""
    rel = described.read(root / "release.json")
    return next((g, [m[0] for m in ms]) for g, ms in tuning.groups(rel).items()
                if ms[0][2].op == op and ms[0][2].dynamic_dim is None)


def _dims(root: Path, gid: str) -> dict[str, int]:
    rel = described.read(root / "release.json")
    return {d: int(v) for d, v in tuning.groups(rel)[gid][0][2].dims}  # type: ignore[arg-type]


def _explain(root: Path, op: str, dims: dict[str, int], gid: str) -> list[str]:
    """What ``tileship explain`` says of group ``gid`` at ``dims``: its lines, from the one naming it to the next."""
    from tileship.release.explain import explain

    lines, found = explain(root, op, dims)
    assert found, lines
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"group {gid} "))
    end = next((i for i, ln in enumerate(lines) if i > start and ln.startswith("group ")), len(lines))
    return lines[start:end]


def test_verify_only_keeps_the_other_operators_evidence(cpu_release):
    _verify(cpu_release)
    before = _ev(cpu_release)["specializations"]
    others = {sid: e for sid, e in before.items() if e["op"] != GOOD}
    assert others and any(e["op"] == BAD for e in others.values())
    _verify(cpu_release, "--only", GOOD)
    after = _ev(cpu_release)
    assert {sid: e for sid, e in after["specializations"].items() if e["op"] != GOOD} == others
    assert set(after["specializations"]) == set(before)  # GOOD's entries re-verified, none lost
    assert not set(after["skipped"]) & set(after["specializations"])  # "not selected" only where nothing is stored


def test_verify_replaces_evidence_of_another_lock_and_says_so(cpu_release):
    _verify(cpu_release)
    evidence_write.update(cpu_release, lambda old: {**(old or {}), "lock_digest": "sha256:" + "0" * 64})
    res = _verify(cpu_release, "--only", GOOD)
    text = " ".join(res.output.split())
    assert "the stored evidence was for another lock (sha256:" in text and "replaced by this run's" in text, text
    assert {e["op"] for e in _ev(cpu_release)["specializations"].values()} == {GOOD}


def test_verify_after_tune_keeps_the_tune_table_and_its_routing(cpu_release):
    gid, _ = _static(cpu_release, BAD)
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", gid, *TUNE])
    assert res.exit_code == 0, res.output
    tuned = _ev(cpu_release)
    assert gid in tuned["tuning"]
    routing = _explain(cpu_release, BAD, _dims(cpu_release, gid), gid)
    assert routing[1].startswith("  tuned (this shape)") and "decision: " in routing[-1], routing
    _verify(cpu_release)
    after = _ev(cpu_release)
    assert after["tuning"] == tuned["tuning"] and after["tuning_options"] == tuned["tuning_options"]
    assert _explain(cpu_release, BAD, _dims(cpu_release, gid), gid) == routing  # the tuned decision, unchanged


def test_verify_that_fails_a_tuned_winner_drops_that_group_and_says_why(cpu_release, monkeypatch):
    from tileship.runtime import loader

    gid, (sid,) = _static(cpu_release, BAD)
    kept, _ = _static(cpu_release, GOOD)
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", gid, "--only", kept, *TUNE])
    assert res.exit_code == 0, res.output

    def kernel_won(old: dict[str, Any] | None) -> dict[str, Any]:  # the table as a tune that chose the kernel
        assert old is not None
        group = old["tuning"][gid]
        points = [{**p, "winner": "default", "why": "kernel faster"} for p in group["points"]]
        return {**old, "tuning": {**old["tuning"], gid: {**group, "points": points}}}

    evidence_write.update(cpu_release, kernel_won)
    assert "decision: kernel default" in "\n".join(_explain(cpu_release, BAD, _dims(cpu_release, gid), gid))
    other = _ev(cpu_release)["tuning"][kept]
    real = loader.load_artifact

    def load_artifact(spec_dir: Path, spec_id: str) -> Any:
        if spec_id == sid:
            raise OSError(5, "Input/output error", "lib.so")
        return real(spec_dir, spec_id)

    monkeypatch.setattr(loader, "load_artifact", load_artifact)
    res = _verify(cpu_release)
    monkeypatch.undo()
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert f"tune table of {gid} dropped: verify failed default ({sid})" in text and "Input/output error" in text, text
    after = _ev(cpu_release)
    assert gid not in after["tuning"] and after["tuning"][kept] == other
    assert after["specializations"][sid]["passed"] is False
    routing = _explain(cpu_release, BAD, _dims(cpu_release, gid), gid)
    assert routing[1] == f"  not tuned: {sid}" and "FAILED" in "\n".join(routing), routing  # verification routes it


def test_merged_evidence_is_what_the_seal_covers(cpu_release, tmp_path):
    """Signed runs: the signature covers the merged file (both runs' entries); a run signing with another key
    cannot vouch for entries it did not measure: the old evidence is replaced, and the output says so."""
    from tileship.release import bundle, evidence_seal

    keys = {name: (tmp_path / name, bundle.generate_key(tmp_path / name)) for name in ("verifier", "stranger")}
    _verify(cpu_release, "--only", BAD, "--verifier-key", str(keys["verifier"][0]))
    _verify(cpu_release, "--only", GOOD, "--verifier-key", str(keys["verifier"][0]))
    assert evidence_seal.check_dir(cpu_release, [keys["verifier"][1]]).state == evidence_seal.VERIFIED
    assert {BAD, GOOD} <= {e["op"] for e in _ev(cpu_release)["specializations"].values()}
    res = _verify(cpu_release, "--only", GOOD, "--verifier-key", str(keys["stranger"][0]))
    assert "cannot vouch for" in " ".join(res.output.split()), res.output
    assert evidence_seal.check_dir(cpu_release, [keys["stranger"][1]]).state == evidence_seal.VERIFIED
    assert {e["op"] for e in _ev(cpu_release)["specializations"].values()} == {GOOD}
