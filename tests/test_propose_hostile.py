"""``tileship propose`` on hostile input files (found by the crash and hostile-file hunt, 2026-12): a telemetry
dump or a ``--release`` build log that is not what tileship writes is a DeclarationError naming the file and the
field, never a traceback or a hang. Before: a FIFO blocked ``propose`` forever, a symlink to ``/dev/zero`` read
without end, 100k nested brackets escaped as RecursionError, and a field of the wrong type (``ops.add: 5``,
``calls: "x"``, ``calls: Infinity``) as a TypeError / OverflowError from the middle of ``propose``; a build log
with ``seconds: "x"`` as a ValueError."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from threads import within
from typer.testing import CliRunner

from tileship.cli import app
from tileship.declare.propose import compile_seconds, read_telemetry
from tileship.errors import DeclarationError

PROJECT = 'model = "m"\noperators = ["tileship.catalog.cpu"]\ntargets = ["c"]\n'
ROW = {"dtype": "float32", "dtypes": ["float32", "float32"], "dims": {"N": 5}, "shapes": [[5], [5]],
       "reason": "undeclared_shape", "calls": 3, "seconds": 0.001}


def _tele(**row: Any) -> dict[str, Any]:
    return {"schema": 1, "ops": {"add": {"rows": [{**ROW, **row}], "kernel_calls": 0,
                                         "other": {"calls": 0, "seconds": 0.0, "reasons": {}}}}}




BODIES: dict[str, tuple[bytes, str]] = {
    "deep-nesting": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "huge-number": (b'{"schema": 1, "ops": ' + b"9" * 5000 + b"}", "digit"),
    "not-json": (b"{", "not valid JSON"),
    "ops-not-object": (json.dumps({"schema": 1, "ops": {"add": 5}}).encode(), "ops.add must be an object"),
    "rows-not-list": (json.dumps({"schema": 1, "ops": {"add": {"rows": 5}}}).encode(), "ops.add.rows must be a list"),
    "calls-string": (json.dumps(_tele(calls="x")).encode(), "ops.add.rows[0].calls must be an integer"),
    "calls-infinite": (json.dumps(_tele(calls=float("inf"))).encode(), "ops.add.rows[0].calls must be an integer"),
    "calls-huge": (json.dumps(_tele(calls=10 ** 4000)).encode(), "ops.add.rows[0].calls must be an integer"),
    "seconds-nan": (json.dumps(_tele(seconds=float("nan"))).encode(), "ops.add.rows[0].seconds must be a number"),
    "dims-string": (json.dumps(_tele(dims={"N": "a"})).encode(), "ops.add.rows[0].dims.N must be an integer"),
    "reason-number": (json.dumps(_tele(reason=1)).encode(), "ops.add.rows[0].reason must be a string"),
    "shapes-wrong": (json.dumps(_tele(shapes=[5])).encode(), "ops.add.rows[0].shapes[0] must be a list"),
    "other-missing": (json.dumps({"schema": 1, "ops": {"add": {"rows": []}}}).encode(),
                      "ops.add.other must be an object"),
}


def _special(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b" " * ((64 << 20) + 1))


@pytest.mark.parametrize("case", BODIES, ids=list(BODIES))
def test_a_hostile_telemetry_dump_is_refused_naming_the_file_and_field(tmp_path: Path, case: str) -> None:
    body, words = BODIES[case]
    path = tmp_path / "t.json"
    path.write_bytes(body)
    exc = within(lambda: read_telemetry(path))
    assert isinstance(exc, DeclarationError), repr(exc)
    assert exc.message.startswith(f"{path}: ") and words in exc.message, exc.message


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "oversized"])
def test_a_telemetry_path_that_is_no_small_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "t.json"
    _special(path, kind)
    exc = within(lambda: read_telemetry(path))
    assert isinstance(exc, DeclarationError) and exc.message.startswith(f"{path}: cannot read"), repr(exc)


@pytest.mark.parametrize(("log", "words"), [
    (b"{", "not valid JSON"),
    (json.dumps({"specializations": []}).encode(), "specializations must be an object"),
    (json.dumps({"specializations": {"add.x": 5}}).encode(), "specializations.add.x must be an object"),
    (json.dumps({"specializations": {"add.x": {"ok": True, "seconds": "x"}}}).encode(),
     "specializations.add.x.seconds must be a number"),
    (json.dumps({"specializations": {"add.x": {"ok": True}}}).encode(), "specializations.add.x.seconds"),
    (json.dumps({"specializations": {"add.x": {"ok": "yes", "seconds": 1}}}).encode(), "specializations.add.x.ok"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
], ids=["not-json", "list", "entry", "seconds-string", "seconds-missing", "ok-string", "deep"])
def test_a_hostile_build_log_is_refused_naming_the_file_and_field(tmp_path: Path, log: bytes, words: str) -> None:
    (tmp_path / "build-log.json").write_bytes(log)
    exc = within(lambda: compile_seconds(tmp_path))
    assert isinstance(exc, DeclarationError), repr(exc)
    assert exc.message.startswith(f"{tmp_path / 'build-log.json'}: ") and words in exc.message, exc.message


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_build_log_that_is_no_small_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    _special(tmp_path / "build-log.json", kind)
    exc = within(lambda: compile_seconds(tmp_path))
    assert isinstance(exc, DeclarationError) and "build-log.json: cannot read" in exc.message, repr(exc)


def test_the_cli_prints_the_error_and_exits_1(tmp_path: Path) -> None:
    (tmp_path / "tileship.toml").write_text(PROJECT)
    tele = tmp_path / "t.json"
    tele.write_text(json.dumps(_tele(calls="x")))
    res = within(lambda: CliRunner().invoke(app, ["propose", str(tele), "--project", str(tmp_path / "tileship.toml")]))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), repr(res.exception)
    flat = "".join(res.output.split())
    assert "t.json:ops.add.rows[0].callsmustbeaninteger" in flat, res.output
    tele.write_text(json.dumps(_tele()))
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / "build-log.json").write_text('{"specializations": {"add.x": {"ok": true, "seconds": "x"}}}')
    res = within(lambda: CliRunner().invoke(app, ["propose", str(tele), "--project", str(tmp_path / "tileship.toml"),
                                                   "--release", str(tmp_path / "rel")]))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), repr(res.exception)
    assert "build-log.json:specializations.add.x.secondsmustbeanumber" in "".join(res.output.split()), res.output
