"""``tileship verify`` over a release where one operator cannot be checked here: its reference module raises at
import, its reference callable is missing from its module, its sample hook does not import, or one of its artifacts
raises something other than ArtifactLoadError when loaded.

Before: the first such error (an ArtifactLoadError from ``import_reference``, the sample hook's ImportError, the
load's OSError) stopped ``verify`` for every operator and nothing was stored (exit 1, or a traceback). Now each
specialization of that operator is a failed verdict whose failure names the step and the error, the other operators
are verified and their evidence is stored, and the command exits 2 (some failed), not 1 (could not run).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tileship.cli import app
from tileship.release import described, evidence, integrity

BAD, GOOD = "add", "rmsnorm_cpu"
QUICK = ["--no-timing", "--seeds", "0", "--grid", "0", "--limit", "64"]


def _break(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str) -> None:
    """``BAD`` made uncheckable here, ``how``, as verify imports and loads it."""
    from tileship.runtime import loader, references

    real_ref, real_sample, real_load = references.import_reference, references.import_sample, loader.load_artifact
    (tmp_path / "tileship_boom_ref.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    moved = {"raises": "tileship_boom_ref.ref", "missing": "tileship.catalog.cpu.no_such_reference"}

    def import_reference(desc: Any, op: str) -> Any:
        return real_ref({**desc, "reference": moved[how]} if op == BAD and how in moved else desc, op)

    def import_sample(desc: Any, op: str) -> Any:
        if op == BAD and how == "sample":
            raise ImportError("cannot import name 'sample' from 'ops'")
        return real_sample(desc, op)

    def load_artifact(spec_dir: Path, sid: str) -> Any:
        if sid.startswith(BAD + ".") and how == "load":
            raise OSError(errno.EIO, "Input/output error", "lib.so")
        return real_load(spec_dir, sid)

    monkeypatch.setattr(references, "import_reference", import_reference)
    monkeypatch.setattr(references, "import_sample", import_sample)
    monkeypatch.setattr(loader, "load_artifact", load_artifact)


@pytest.mark.parametrize("how,words", [
    ("raises", "the operator did not import here (import_reference: ArtifactLoadError: add: cannot import the "
               "reference tileship_boom_ref.ref: RuntimeError: boom at import)"),
    ("missing", "the operator did not import here (import_reference: ArtifactLoadError: add: cannot import the "
                "reference tileship.catalog.cpu.no_such_reference: AttributeError: module 'tileship.catalog.cpu' "
                "has no attribute 'no_such_reference')"),
    ("sample", "the operator did not import here (import_sample: ImportError: cannot import name 'sample' from "
               "'ops')"),
    ("load", "artifact failed to load: {sid}: OSError: [Errno 5] Input/output error: 'lib.so'"),
], ids=["reference-module-raises", "reference-missing", "sample-hook-raises", "artifact-load-oserror"])
def test_an_operator_that_cannot_be_checked_fails_its_specializations_and_the_others_are_verified(
        cpu_release, monkeypatch, tmp_path, how, words):
    rel = described.read(cpu_release / "release.json")
    bad = sorted(s for s, i in rel["specializations"].items() if i["spec"]["op"] == BAD and i["status"] == "built")
    good = sorted(s for s, i in rel["specializations"].items() if i["spec"]["op"] == GOOD and i["status"] == "built")
    assert bad and good
    _break(monkeypatch, tmp_path, how)
    res = CliRunner().invoke(app, ["verify", str(cpu_release), "--only", BAD, "--only", GOOD, *QUICK])
    monkeypatch.undo()
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    for sid in good:
        assert ev["specializations"][sid]["passed"] and ev["specializations"][sid]["points"], sid
    text = " ".join(res.output.split())
    for sid in bad:
        entry = ev["specializations"][sid]
        assert not entry["passed"] and entry["points"] == [] and entry["route"] == "reference", entry
        assert entry["failure"] == words.format(sid=sid), entry["failure"]
        assert f"failed {sid}: {words.format(sid=sid)}" in text, res.output
    integrity.check(cpu_release, trusted_keys=[])
