"""``tileship propose``: shape telemetry -> shapes to declare, and the ``[shapes.<operator>]``
project tables that apply them."""

from __future__ import annotations

import dataclasses
import json
import tomllib

import pytest
import torch
from typer.testing import CliRunner

import tileship
from tileship.cli import app
from tileship.declare.parts import DynamicRange
from tileship.declare.project import find_project, load_operators, parse_project, specializations
from tileship.declare.propose import DEFAULT_COMPILE_SECONDS, propose, to_toml
from tileship.errors import DeclarationError

PROJECT = 'model = "m"\noperators = ["tileship.catalog.cpu", "tileship.catalog.cpu_decode"]\ntargets = ["c"]\n'


@pytest.fixture(scope="module")
def ops():
    return load_operators(parse_project(tomllib.loads(PROJECT)))


def _row(dims: dict[str, int], shapes: list[list[int]], calls: int, seconds: float, reason: str = "undeclared_shape"):
    return {"dtype": "float32", "dtypes": ["float32"] * len(shapes), "dims": dims, "shapes": shapes,
            "reason": reason, "calls": calls, "seconds": seconds}


def _tele(ops_rows: dict[str, tuple[list[dict], int]], other: int = 0) -> dict:
    return {"schema": 1, "release_id": "r", "since": "2026-11-30T00:00:00+00:00",
            "ops": {op: {"rows": rows, "kernel_calls": kernel,
                         "other": {"calls": other, "seconds": other * 0.01,
                                   "reasons": ({"undeclared_shape": {"calls": other, "seconds": other * 0.01}}
                                               if other else {})}}
                    for op, (rows, kernel) in ops_rows.items()}}


def _norm(m: int, n: int, calls: int, seconds: float, reason: str = "undeclared_shape") -> dict:
    return _row({"M": m, "N": n}, [[m, n], [n]], calls, seconds, reason)


def test_synthetic_telemetry_gives_a_range_a_widened_range_and_static_shapes(ops):
    rows = ([_norm(m, 100, 10, 0.01) for m in (3, 5, 9, 17, 30)]        # M varies at N=100: a new range
            + [_norm(m, 1024, 5, 0.05) for m in (5000, 6000, 7000, 8000)]  # just past the declared M 1..4096
            + [_norm(8, 2048, 50, 0.2)]                                   # one hot shape: static
            + [_norm(2, 1024, 7, 0.05, "slower_than_reference")])         # declared: not fixable by shapes
    tele = _tele({"rmsnorm_cpu": (rows, 93)}, other=3)
    rep = propose(tele, ops, targets=("c",))
    got = [(p.kind, p.static, p.range) for p in rep.proposals]
    assert got == [("range", None, DynamicRange("M", 2, 32, {"N": 100})),
                   ("widen", None, DynamicRange("M", 4097, 8192, {"N": 1024})),
                   ("static", {"M": 8, "N": 2048}, None)]
    rng, widen, static = rep.proposals
    ref_calls, all_calls, ref_secs = 50 + 20 + 50 + 7 + 3, 50 + 20 + 50 + 7 + 3 + 93, 0.05 + 0.2 + 0.2 + 0.05 + 0.03
    assert (rng.calls, widen.calls, static.calls) == (50, 20, 50)
    assert rng.reference_share == pytest.approx(50 / ref_calls) and rng.calls_share == pytest.approx(50 / all_calls)
    assert static.seconds_share == pytest.approx(0.2 / ref_secs)
    assert widen.note == "widens ranges[0] M 1..4096 to 1..8192"
    assert all(p.specializations == 1 and p.build_seconds == DEFAULT_COMPILE_SECONDS for p in rep.proposals)
    assert rep.not_fixable[("rmsnorm_cpu", "slower_than_reference")] == (7, 0.05)
    assert any(reason.startswith("undeclared_shape (other") for _, reason in rep.not_fixable)
    assert propose(tele, ops, targets=("c",)) == rep  # deterministic


def test_invalid_proposals_are_dropped_and_a_refused_range_falls_back_to_static_shapes(ops):
    # w4a16_cpu: qweight is N x K/8, scales N x K/128; K varying cannot be a T.dynamic range
    def w4(k: int, calls: int) -> dict:
        return _row({"M": 1, "N": 64, "K": k}, [[1, k], [64, k // 8], [64, k // 128]], calls, 0.001 * calls)

    tele = _tele({"w4a16_cpu": ([w4(384, 9), w4(640, 8), w4(768, 7), w4(1000, 6), w4(256, 1)], 0),
                  "add": ([_row({"N": 7}, [[7], [7]], 4, 0.01)], 0)})  # add covers N=7 already
    rep = propose(tele, ops, targets=("c",))
    assert [(p.operator, p.kind, p.static) for p in rep.proposals] == [
        ("w4a16_cpu", "static", {"M": 1, "N": 64, "K": 384}), ("w4a16_cpu", "static", {"M": 1, "N": 64, "K": 640}),
        ("w4a16_cpu", "static", {"M": 1, "N": 64, "K": 768})]
    dropped = {(op, what): why for op, what, why in rep.dropped}
    assert "not every K there divides by 8" in dropped[("w4a16_cpu",
                                                        '{dim = "K", min = 256, max = 1024, fixed = {M = 1, N = 64}}')]
    # dims in op.dims order
    assert "K=1000 is not divisible by 128" in dropped[("w4a16_cpu", "{M = 1, K = 1000, N = 64}")]
    assert dropped[("w4a16_cpu", "{M = 1, K = 256, N = 64}")].startswith("already declared")
    assert dropped[("add", "{N = 7}")].startswith("already declared")


def test_project_shapes_table_adds_specializations_and_bad_tables_name_the_key(ops, tmp_path):
    base = {s.id for s in specializations(parse_project(tomllib.loads(PROJECT)), ops)}
    rep = propose(_tele({"rmsnorm_cpu": ([_norm(m, 100, 1, 0.001) for m in (3, 5, 9, 17)] + [_norm(8, 2048, 5, 0.01)],
                                         0)}),
                  ops, targets=("c",))
    text = PROJECT + "\n" + to_toml(rep.proposals, ops)
    (tmp_path / "tileship.toml").write_text(text)
    project = find_project(tmp_path)
    new_ops = load_operators(project)
    added = {s.id for s in specializations(project, new_ops)} - base
    assert added == {"rmsnorm_cpu.float32.M2-32_N100.c", "rmsnorm_cpu.float32.M8_N2048.c"}
    assert new_ops["rmsnorm_cpu"].shapes[-1] == {"M": 8, "N": 2048}
    assert propose(_tele({"rmsnorm_cpu": ([_norm(5, 100, 1, 0.001)], 0)}), new_ops).proposals == []  # now covered
    for shapes, field in (('[shapes.nope]\nstatic = [{N = 1}]', "shapes.nope"),
                          ('[shapes.add]\nstatic = [{N = 0}]', "shapes.add.static[0].N"),
                          ('[shapes.add]\nranges = [{dim = "N", min = 1}]', "shapes.add.ranges[0]"),
                          ('[shapes.w4a16_cpu]\nstatic = [{M = 1, N = 64, K = 100}]', "shapes.w4a16_cpu"),
                          ('[shapes.add]\nsizes = []', "shapes.add")):
        (tmp_path / "tileship.toml").write_text(PROJECT + shapes)
        with pytest.raises(DeclarationError) as e:
            load_operators(find_project(tmp_path))
        assert field in e.value.message, e.value.message


def test_real_telemetry_proposes_applies_and_estimates_from_the_build_log(cpu_release_build, ops, tmp_path):
    release = tileship.load(cpu_release_build.path)
    norm = release.op("rmsnorm_cpu")
    for m in (3, 5, 9, 17, 3, 3):
        assert norm.call(torch.randn(m, 100), torch.randn(100))[1].reason == "undeclared_shape"
    norm(torch.randn(2, 1024), torch.randn(1024))  # declared: the kernel
    tele_path = tmp_path / "telemetry.json"
    tele_path.write_text(json.dumps(release.telemetry()))
    (tmp_path / "tileship.toml").write_text(PROJECT + "# kept\n")
    res = CliRunner().invoke(app, ["propose", str(tele_path), "--project", str(tmp_path / "tileship.toml"),
                                   "--release", str(cpu_release_build.path), "--out", str(tmp_path / "p.toml"),
                                   "--apply"])
    assert res.exit_code == 0, res.output
    assert "100.0% of reference calls" in res.output and "build-log.json" in res.output
    assert tomllib.loads((tmp_path / "p.toml").read_text()) == {
        "shapes": {"rmsnorm_cpu": {"ranges": [{"dim": "M", "min": 2, "max": 32, "fixed": {"N": 100}}]}}}
    applied = (tmp_path / "tileship.toml").read_text()
    assert applied.startswith(PROJECT + "# kept\n") and "[shapes.rmsnorm_cpu]" in applied
    log = json.loads((cpu_release_build.path / "build-log.json").read_text())
    secs = [v["seconds"] for k, v in log["specializations"].items() if k.startswith("rmsnorm_cpu.") and v["ok"]]
    (p,) = propose(json.loads(tele_path.read_text()), ops, targets=("c",), release=cpu_release_build.path).proposals
    assert (p.calls, p.specializations) == (6, 1) and p.build_seconds == pytest.approx(sum(secs) / len(secs), abs=0.05)
    # applying again merges into the existing table instead of writing a second one
    project = find_project(tmp_path / "tileship.toml")
    more = propose(_tele({"add": ([_row({"N": 1 << 25}, [[1 << 25]] * 2, 2, 0.1)], 0)}), load_operators(project))
    from tileship.declare.propose_apply import apply_to_project

    apply_to_project(project, more.proposals, load_operators(project))
    again = find_project(tmp_path / "tileship.toml")
    assert set(again.shapes) == {"add", "rmsnorm_cpu"} and again.shapes["add"].static == ({"N": 1 << 25},)
    assert dataclasses.asdict(again.shapes["rmsnorm_cpu"]) == dataclasses.asdict(project.shapes["rmsnorm_cpu"])


def test_a_new_range_does_not_overlap_a_declared_one(ops):
    # declared: M 1..4096 at N=1024; sizes seen past 4x that range are a new range, not a widening,
    # and its min, rounded down to a power of two, stops above the declared max (4096 -> 4097)
    rows = [_norm(m, 1024, 1, 0.001) for m in (20000, 25000, 30000, 40000)]
    (p,) = propose(_tele({"rmsnorm_cpu": (rows, 0)}), ops, targets=("c",)).proposals
    assert (p.kind, p.range) == ("range", DynamicRange("M", 16384, 65536, {"N": 1024}))
    rows = [_norm(m, 1024, 1, 0.001) for m in (5000, 9000, 15000, 20000)]
    (p,) = propose(_tele({"rmsnorm_cpu": (rows, 0)}), ops, targets=("c",)).proposals
    assert (p.kind, p.range) == ("range", DynamicRange("M", 4097, 32768, {"N": 1024}))
