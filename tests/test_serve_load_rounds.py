"""``benchmarks/serve_load_rounds.py``: the verdict over rounds, and one real run against the CPU catalog
(a server on 127.0.0.1, binary requests, the in-process loop between HTTP phases)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from serve_load_rounds import verdict  # noqa: E402


def test_the_verdict_needs_every_round_on_one_side():
    assert verdict([0.81, 0.95, 0.8], 0.8) == "met"
    assert verdict([0.5, 0.79], 0.8) == "missed"
    assert verdict([0.77, 0.9], 0.8) == "not resolved"  # round 22's two runs of one mode: 0.774 and 0.895


def test_a_real_run_writes_every_round(cpu_release_build, tmp_path: Path):
    out = tmp_path / "rounds.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_load_rounds.py"), "--release",
                        str(cpu_release_build.path), "--dims", "N=262144", "--clients", "2", "--rounds", "2",
                        "--seconds", "1", "--calls", "3", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert [x["round"] for x in doc["rounds"]] == [0, 1] and doc["errors"] == 0
    assert all(x["http_rps"] > 0 and x["in_process_rps"] > 0 for x in doc["rounds"])
    ratios = [x["ratio"] for x in doc["rounds"]]
    assert doc["ratio_range"] == [min(ratios), max(ratios)] and doc["verdict"] == verdict(ratios, 0.8)
