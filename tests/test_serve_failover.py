"""benchmarks/serve_failover.py end to end on the CPU: the fault-injection release built for "c",
`--workers 0` and `--workers 1` servers, one kill -9 and one poisoned request under a closed loop.
On the CPU the poison is a SIGSEGV of the worker (a crash: a 503, not retried), not a sticky CUDA error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_the_failover_benchmark_runs(tmp_path):
    out = tmp_path / "failover.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_failover.py"), "--work",
                           str(tmp_path / "work"), "--rounds", "1", "--per-round", "20", "--kills", "1", "--faults",
                           "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["complete"] and r["device"] == "cpu" and r["metrics"]["compile_attempts"] == 0
    assert set(r["hop_us"]["paths"].values()) == {"kernel:kernel"}, r["hop_us"]
    fo = r["failover"]
    assert fo["kill9"][0]["to_next_success_ms"] is not None, fo["kill9"]
    fault = fo["sticky_fault"][0]
    assert fault["poison_status"] == 503 and fault["to_next_success_ms"] is not None, fault
    # the poison crashed one worker and was not retried: the standby took over and readiness stayed up
    assert "crashed (SIGSEGV)" in fault["poison_answer"] and "not retried" in fault["poison_answer"], fault
    assert fault["standby_promoted"] and fault["ready_right_after"] == 200, fault
    assert r["metrics"]["worker_failures"].get("crashed") == 1 and r["metrics"]["worker_retries"] <= 1, r["metrics"]
    assert r["summary"]["wrong_200"] == 0, r["summary"]
    # the loop's requests are answered (a worker killed under one has it retried on the next)
    assert fo["kill9_answers"]["correct"] > 0 and fo["fault_answers"]["correct"] > 0
    assert r["ready_at_end"] == 200
    assert any(e["event"] == "worker_failed" for e in r["worker_events"])
