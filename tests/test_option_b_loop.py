"""Option B's whole loop on the CPU (issue 13), through ``benchmarks/option_b_loop.py``'s main():
a "c"-target operator with two candidates and one static shape is built, tuned, published and
served; a load at mostly undeclared sizes fills the shape telemetry; propose -> apply -> build ->
tune -> canary promotes release B; the same load then has a smaller reference share; and a copy
of B whose evidence routes every bucket to the 64x-work candidate is rolled back by the canary
while B keeps serving."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "option_b_loop.py"


def _script():
    spec = importlib.util.spec_from_file_location("option_b_loop", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_loop_lowers_the_reference_share_and_a_slow_canary_rolls_back(tmp_path):
    pytest.importorskip("tileship.verify.tune")
    out = tmp_path / "loop.json"
    rc = _script().main(["--device", "cpu", "--workdir", str(tmp_path / "work"), "--out", str(out), "--requests", "80",
                         "--window", "12", "--budget-ms", "5", "--jobs", "2", "--rollback"])
    log = json.loads(out.read_text())
    assert rc == 0 and log["ok"], log.get("error") or out.with_suffix(".txt").read_text()
    # the proposal: one new range over N covering the undeclared spread 1000..60000 (the declared N=4096 aside)
    (p,) = log["proposals"]
    assert (p["operator"], p["kind"], p["range"]["dim"], p["range"]["fixed"]) == ("loop_poly", "range", "N", {})
    assert p["range"]["min"] <= 1000 and p["range"]["max"] >= 60000 and p["calls"] > 0
    assert "[shapes.loop_poly]" in (tmp_path / "work" / "tileship.toml").read_text()
    # the canary promoted B, with its numbers, in the server and in the registry
    can = log["canary"]
    assert can["state"] == "promoted" and can["outcome"]["release"] == log["release_B"] != log["release_A"]
    assert (
        can["decisions"][-1]["action"] == "promote"
        and can["decisions"][-1]["numbers"]["models"]["loop_poly"]["compared"]
    )
    # the chosen candidate at a large size is rounds1 (the tune table), and the large requests ran it
    buckets = {q["dims"]["N"]: q for q in log["tuning_B"]["loop_poly.float32.N512-65536.c"]}
    assert buckets[65536]["winner"] == "rounds1", buckets[65536]["why"]
    assert set(log["steps"]["load_after"]["largest_sizes_served_by"]) == {"loop_poly.float32.N512-65536.c.rounds1"}
    assert set(log["steps"]["load_before"]["largest_sizes_served_by"]) == {"reference"}
    # the reference share of served calls went down
    before, after = log["reference_share"]["before"], log["reference_share"]["after"]
    assert before > 0.5 and after < before, (before, after)
    assert log["steps"]["load_before"]["reasons"] == {
        "undeclared_shape": log["steps"]["load_before"]["reference_calls"]
    }
    # the copy routing everything to the 64x-work candidate is rolled back; B keeps serving
    rb = log["rollback"]
    assert rb["forced_candidate"] == "rounds64" and rb["state"] == "rolled_back", rb["outcome"]
    assert rb["decisions"][-1]["action"] == "rollback" and "latency: loop_poly" in rb["outcome"]["reason"]
    assert rb["active_after"] == rb["registry_active_after"] == log["release_B"]
    assert any(k.endswith(".rounds64") for k in rb["traffic"]), rb["traffic"]  # the canary really ran it
    assert not [k for k in {**can["traffic"], **rb["traffic"]} if k.startswith("error")]
    assert "reference share of served calls" in out.with_suffix(".txt").read_text()
