"""A diagnostics bundle of a hostile release (``tileship diagnose`` on a release that does not load is its very use):
the bundle is written, what could not be read is a note naming the file, and nothing is written outside it. Before:
a FIFO in place of ``release.json``, ``manifest.json`` or ``build-log.json`` blocked ``diagnose`` forever, a symlink
to ``/dev/zero`` read without end, a ``specializations`` of the wrong type escaped as a TypeError / AttributeError,
and a specialization id such as ``../../x`` or ``/abs`` made ``diagnose`` create folders and write ``build.json``
wherever it pointed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from threads import within

from tileship.release import diagnostics


def _release(root: Path, specs: Any = None) -> Path:
    rel = root / "rel"
    rel.mkdir()
    (rel / "manifest.json").write_text(json.dumps({"release_id": "r", "files": {}}))
    specs = specs or {"add.float32.N8.c": {"status": "built"}}
    (rel / "release.json").write_text(json.dumps({"specializations": specs}))
    (rel / "build-log.json").write_text(json.dumps({"specializations": {}}))
    (rel / "tileship.lock").write_text("schema: 1\n")
    return rel


def _summary(ref: Any) -> dict[str, Any]:
    assert isinstance(ref, diagnostics.DiagnosticsRef), repr(ref)
    assert ref.archive.is_file()
    return json.loads((ref.path / "summary.json").read_text())


@pytest.mark.parametrize("name", ["release.json", "manifest.json", "build-log.json", "tileship.lock"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "deep"])
def test_a_release_file_that_cannot_be_read_is_a_note(tmp_path: Path, name: str, kind: str) -> None:
    rel = _release(tmp_path)
    (rel / name).unlink()
    if kind == "fifo":
        os.mkfifo(rel / name)
    elif kind == "dev-zero":
        (rel / name).symlink_to("/dev/zero")
    else:
        (rel / name).write_bytes(b"[" * 100_000 + b"]" * 100_000)
    summary = _summary(within(lambda: diagnostics.capture(rel, out_dir=tmp_path / "out")))
    assert any(name in n for n in summary["notes"]), summary["notes"]


@pytest.mark.parametrize("specs", [5, [1], {"add.x": 5}, {"add.x": {"status": 1}}], ids=["int", "list", "entry",
                                                                                        "status"])
def test_specializations_of_the_wrong_type_are_a_note(tmp_path: Path, specs: Any) -> None:
    rel = _release(tmp_path, specs)
    summary = _summary(within(lambda: diagnostics.capture(rel, out_dir=tmp_path / "out")))
    assert summary["notes"], summary


@pytest.mark.parametrize("sid", ["../../../escaped", "/ABS/escaped", "..", "a/../../escaped"])
def test_a_specialization_id_that_is_a_path_writes_nothing_outside_the_bundle(tmp_path: Path, sid: str) -> None:
    sid = sid.replace("/ABS", str(tmp_path / "abs"))
    rel = _release(tmp_path, {sid: {"status": "failed"}})
    out = tmp_path / "out"
    before = {p for p in tmp_path.rglob("*")}
    ref = within(lambda: diagnostics.capture(rel, out_dir=out))
    summary = _summary(ref)
    made = {p for p in tmp_path.rglob("*")} - before
    inside = {p for p in made if p == out or out in p.parents}
    assert made == inside, sorted(str(p) for p in made - inside)
    assert any("not a specialization id" in n for n in summary["notes"]), summary["notes"]
    ref = within(lambda: diagnostics.capture(rel, spec_id=sid, out_dir=out))
    assert all(p == out or out in p.parents for p in {p for p in tmp_path.rglob("*")} - before)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_check_on_a_lock_that_is_no_small_file_names_it(tmp_path: Path, kind: str) -> None:
    """``tileship check LOCK`` (and every reader of a lock: report, diagnose, load) read the lock whole: a FIFO
    blocked for good, a link to /dev/zero read without end."""
    from typer.testing import CliRunner

    from tileship.cli import app

    lock = tmp_path / "tileship.lock"
    if kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.symlink_to("/dev/zero")
    res = within(lambda: CliRunner().invoke(app, ["check", str(lock)]))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), repr(res.exception)
    assert "tileship.lock:cannotreadthelock:notaregularfile" in "".join(res.output.split()), res.output
