"""benchmarks/serve_malformed_burst.py at a tiny size (issue 15): a real `tileship serve` of the CPU
release takes a burst of malformed requests next to a valid client, and the script's accounting holds:
no 5xx and no time-out, no diagnostics written, live and ready after, /metrics counting what was sent.
Timing is the benchmark's business, not this test's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "serve_malformed_burst.py"


def test_a_small_burst_is_answered_4xx_and_accounted(cpu_release_build, tmp_path):
    out = tmp_path / "burst.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--release", str(cpu_release_build.path), "--burst", "64",
                           "--concurrency", "8", "--pattern", "AB", "--a-seconds", "0.3", "--pause", "0",
                           "--timeout", "20", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    assert r["ok"] and all(r["checks"].values()), r["checks"]
    assert r["release_id"] == cpu_release_build.release_id
    acc = r["accounting"]
    statuses = acc["malformed_by_status"]
    assert sum(statuses.values()) == 64 and not any(s.startswith("5") or s == "timeout" for s in statuses), statuses
    assert acc["diagnostics_new"] == 0 and acc["health_after"] == {"live": 200, "ready": 200}
    assert acc["inflight_after"] == 0 and acc["compile_attempts"] == 0
    # every inference request the clients sent is counted once, under the code they saw (or, unanswered, another)
    counted = acc["requests_total_by_code"]
    assert all(counted.get(c, 0) >= n for c, n in acc["expected_by_code"].items()), acc
    assert sum(counted.values()) == sum(acc["expected_by_code"].values()) + acc["unanswered_inference_requests"]
    oversized = acc["body_too_large_expected"]  # the lying Content-Length, refused before its body
    assert acc["rejected_by_reason"] == ({"body_too_large": oversized} if oversized else {})
    (b,) = [row for row in r["rounds"] if row["kind"] == "B"]
    assert len(b["burst"]["by_case"]) == min(64, r["config"]["corpus_cases"])  # each case sent at least once
    assert all(row["n"] > 0 and row["codes"] == {"200": row["n"]} and row["wrong"] == 0 for row in r["rounds"])
    assert out.with_suffix(".txt").read_text().startswith("serve_malformed_burst: release ")


# -- found by the benchmark (2026-12-02): a malformed JSON body was scanned for NaN/Infinity on the event loop ----
def test_malformed_json_is_refused_without_scanning_the_body():
    """orjson's error position decides whether the stdlib fallback (bare NaN/Infinity) is tried; a regex
    over the whole body took about 16 ns a byte on the event loop (0.53 s for a 32 MiB body, every request),
    about twenty times what orjson itself takes to refuse it."""
    import time

    import orjson
    import pytest

    from tileship.serve.validate import BadRequest, decode_json

    body = b'{"inputs": x' + b"[" * (16 << 20)

    def seconds(fn: Callable[[bytes], object], exc: type[Exception]) -> float:
        t0 = time.perf_counter()
        with pytest.raises(exc):
            fn(body)
        return time.perf_counter() - t0

    alone = min(seconds(orjson.loads, orjson.JSONDecodeError) for _ in range(3))
    ours = min(seconds(decode_json, BadRequest) for _ in range(3))
    assert ours < 2 * alone + 0.02, (ours, alone)
    assert decode_json(b'{"a": [1, -Infinity, NaN], "b": 1' + b"0" * 30 + b"}") == (
        {"a": [1, float("-inf"), pytest.approx(float("nan"), nan_ok=True)], "b": 1e30}, True)
    for bad in (b'{"a": 1x, "b": NaN}', b'{"a": -NaN}', b'{"a": Nan}', b'{"a": NaN'):
        with pytest.raises(BadRequest, match="malformed JSON"):
            decode_json(bad)
    assert decode_json('{"é€": [-Infinity]}'.encode())[1]  # orjson counts characters, not bytes
    with pytest.raises(BadRequest, match="malformed JSON"):
        decode_json(b"{\"\xff\": NaN}")
