"""benchmarks/serve_shm.py on the CPU (issue 16): the three transports of large tensors through
`tileship serve` (binary tensors, system shared memory, CUDA shared memory: skipped without a GPU),
and its shared-memory mode against an in-process server: a wrong output fails the check, and the
regions are unregistered and destroyed whatever happened."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "serve_shm.py"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("serve_shm_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _status(port: int) -> list[dict[str, Any]]:
    import httpx

    return httpx.get(f"http://127.0.0.1:{port}/v2/systemsharedmemory/status").json()  # type: ignore[no-any-return]


def _shm_files() -> set[str]:
    """The /dev/shm objects serve_shm.py names (tileship_bench_<tag>_<tensor>)."""
    return {f for f in os.listdir("/dev/shm") if f.startswith("tileship_bench_")}


def test_the_benchmark_runs_the_three_modes_on_the_cpu(cpu_release_build, tmp_path):
    out = tmp_path / "serve_shm.json"
    before = _shm_files()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--release", str(cpu_release_build.path), "--modes",
                           "binary,system_shm,cuda_shm", "--seq", "5", "--op", "add", "--dims", "N=4096", "--dtype",
                           "float32", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    assert r["ok"] and r["compile_attempts"] == 0 and r["release_id"] == cpu_release_build.release_id
    assert r["in_process"]["call"]["p50_us"] > 0 and r["in_process"]["full"]["p50_us"] > 0
    for mode in ("binary", "system_shm"):
        m = r["modes"][mode]
        assert m["p50_us"] > 0 and m["p99_us"] >= m["p50_us"] and m["n"] == 5 and m["errors"] == 0, m
        assert m["check"]["passed"] and m["check"]["max_abs_diff"] == 0.0 and m["passed"], m
    assert r["modes"]["system_shm"]["check"]["response_names_the_region"]
    assert r["modes"]["system_shm"]["request_bytes"] < 2000 < r["modes"]["binary"]["request_bytes"]
    assert r["regions_left_on_server"] == {"system_shm": []}
    assert _shm_files() <= before  # every /dev/shm object it created is gone
    if not torch.cuda.is_available():
        assert set(r["modes"]["cuda_shm"]) == {"skipped"} and "GPU" in r["modes"]["cuda_shm"]["skipped"]
    ratios = r["ratios"]
    assert set(ratios) == {"binary_p50_over_full_p50", "cuda_shm_p50_over_1.1_call_p50_plus_1ms",
                           "system_shm_p50_over_full_p50"}
    assert ratios["binary_p50_over_full_p50"]["value"] > 0 and ratios["binary_p50_over_full_p50"]["target"] == "<= 1.3"
    assert ratios["system_shm_p50_over_full_p50"]["value"] > 0
    assert ratios["cuda_shm_p50_over_1.1_call_p50_plus_1ms"]["target"] == "<= 1.0"
    assert all(q["direction"] == "lower is better" for q in ratios.values())
    assert r["environment"]["torch"] == torch.__version__ and r["environment"]["argv"][0].endswith("serve_shm.py")
    for line in ("HTTP binary", "HTTP system_shm", "HTTP cuda_shm", "skipped", "ratio binary HTTP p50"):
        assert line in proc.stdout


def test_a_wrong_output_fails_the_check_and_the_regions_are_released(grpc_server):
    bench = _bench()
    port = grpc_server.port
    url = f"http://127.0.0.1:{port}"
    before = _shm_files()
    a, b = torch.arange(256, dtype=torch.float32), torch.ones(256, dtype=torch.float32)
    r = bench.shm_mode(bench.SystemShm(), url, port, "add", [("A", a), ("B", b)], "C", a + b + 1, 2)
    assert r["check"]["response_names_the_region"] and not r["check"]["passed"]
    assert r["check"]["max_abs_diff"] == 1.0 and r["errors"] == 0 and r["cleanup_errors"] == []
    assert _status(port) == [] and _shm_files() <= before

    # a request the server refuses: the mode is an error, and its regions are released all the same
    class Release:
        ops = {"nope": type("Op", (), {"shape": type("Shape", (), {"inputs": [("A", None), ("B", None)]})})}
        declarations = {"nope": {"outputs": [("C", None)]}}

    r = bench.run_mode("system_shm", url, port, Release(), "nope", (b"", {}, [a, b]), a + b, 2, 0)
    assert r["passed"] is False and "404" in r["error"], r
    assert _status(port) == [] and _shm_files() <= before
