"""``tileship verify`` and ``tileship tune`` over a release where one operator's reference changed since the build
(reference drift, ``build.pins``), the other operators' did not.

Before: the two disagreed. ``verify`` raised ReferenceDrift out of the run (exit 1): nothing of any operator was
verified or stored, while ``tune`` recorded the drift as the failure of that operator's groups and went on. Now both
follow one rule (docs/verification.md, "A pinned reference"): the drifted operator fails (each of its
specializations in verify, with ``its reference changed since the build (pins.require: ReferenceDrift: reference
drift: operator ..., module ...)``; each of its groups in tune), nothing of it is measured against a reference that
is not the pinned one, the reference stays its tested default (no kernel is routed there), the other operators are
verified or tuned and stored, and the command exits 2 naming the operator and the drift.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tileship.cli import app
from tileship.release import described, evidence, integrity, tuning

BAD, GOOD = "add", "rmsnorm_cpu"
DRIFT = f"reference drift: operator {BAD!r}, module tileship_drifted: the fallback changed since verification"
TUNE_FAST = ["--seeds", "0", "--budget-ms", "1", "--rounds", "2", "--confirm-rounds", "0", "--prune", "0",
             "--limit", "4", "--no-flush"]
VERIFY_FAST = ["--no-timing", "--seeds", "0", "--grid", "0", "--limit", "64"]


def _drift(monkeypatch: pytest.MonkeyPatch) -> None:
    """``BAD``'s pinned module differs from what was imported (as ``pins.require`` finds it); the others hold."""
    from tileship.build import pins
    from tileship.errors import ReferenceDrift

    real = pins.require

    def require(lock: Any, operators: Any, **kw: Any) -> Any:
        if BAD in operators:
            raise ReferenceDrift(DRIFT + "\nmore lines", operator=BAD, module="tileship_drifted", report=None)
        return real(lock, operators, **kw)

    monkeypatch.setattr(pins, "require", require)


def _specs(root: Path, op: str) -> list[str]:
    rel = described.read(root / "release.json")
    return sorted(s for s, i in rel["specializations"].items() if i["spec"]["op"] == op and i["status"] == "built")


def test_verify_fails_the_drifted_operator_and_verifies_the_others(cpu_release, monkeypatch):
    bad, good = _specs(cpu_release, BAD), _specs(cpu_release, GOOD)
    _drift(monkeypatch)
    res = CliRunner().invoke(app, ["verify", str(cpu_release), "--only", BAD, "--only", GOOD, *VERIFY_FAST])
    monkeypatch.undo()
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    for sid in good:
        assert ev["specializations"][sid]["passed"] and ev["specializations"][sid]["points"], sid
    words = f"its reference changed since the build (pins.require: ReferenceDrift: {DRIFT})"
    text = " ".join(res.output.split())
    for sid in bad:
        entry = ev["specializations"][sid]
        assert not entry["passed"] and entry["points"] == [] and entry["route"] == "reference", entry
        assert entry["failure"] == words, entry["failure"]
        assert f"failed {sid}: {words}" in text, res.output
    integrity.check(cpu_release, trusted_keys=[])


def test_tune_fails_the_drifted_operators_groups_and_tunes_the_others(cpu_release, monkeypatch):
    rel = described.read(cpu_release / "release.json")
    groups = tuning.groups(rel)
    bad = sorted(g for g, m in groups.items() if m[0][2].op == BAD)
    good = next(g for g, m in groups.items() if m[0][2].op == GOOD and m[0][2].dynamic_dim is None)
    _drift(monkeypatch)
    res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", BAD, "--only", good, *TUNE_FAST])
    monkeypatch.undo()
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    assert ev["tuning"][good]["points"] and "failed" not in ev["tuning"][good]
    for gid in bad:
        failed = tuning.failure(ev["tuning"][gid])
        assert failed is not None and failed["reason"] == f"pins.require: ReferenceDrift: {DRIFT}", ev["tuning"][gid]
        assert ev["tuning"][gid]["points"] == []
    last = " ".join(res.output.strip().splitlines()[-1].split())
    assert all(g in last for g in bad) and good not in last and DRIFT in last, res.output
    integrity.check(cpu_release, trusted_keys=[])
