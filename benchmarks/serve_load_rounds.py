#!/usr/bin/env python3
"""Throughput over HTTP against the in-process loop, in interleaved rounds (issue 16: 64 clients at least 0.8x).

``serve_load.py`` times the in-process loop once, before the HTTP phases; on the H200 host that loop ran at
21.4-30.4 calls/s across four runs of the same release (round 22), so its one number moved the ratio from 0.69 to
1.01. Here each round times both, back to back: ``--calls`` in-process parse + call + encode (``serve_load``'s
``in_process``, the server's own functions), then ``--clients`` keep-alive clients for ``--seconds``; the
ratio of a round is its HTTP throughput over its in-process throughput. The result is the median over
``--rounds`` with its range; against ``--target`` it is "met" when every round is at or above it, "missed"
when every round is below, else "not resolved".

    python3 benchmarks/serve_load_rounds.py --release REL --op gemm --dims M=4096,N=4096,K=4096 --dtype float16 \\
        --max-body-mib 256 --allow-unverified --clients 64 --rounds 5 --seconds 6 --calls 12 --out rounds.json
    python3 benchmarks/serve_load_rounds.py --dims N=2097152 --clients 8 --rounds 3 --seconds 3   # CPU catalog
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import serve_load as sl  # noqa: E402  (the benchmark next to this one: its server, clients and in-process loop)


def verdict(ratios: list[float], target: float) -> str:
    """``met`` (every round at or above ``target``), ``missed`` (every round below), else ``not resolved``."""
    if all(r >= target for r in ratios):
        return "met"
    if all(r < target for r in ratios):
        return "missed"
    return "not resolved"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", type=Path, help="release directory (default: build the CPU catalog into a temp dir)")
    ap.add_argument("--op", default="add")
    ap.add_argument("--dims", default="N=2097152", help="comma-separated dim=size")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=6.0, help="the HTTP load of one round")
    ap.add_argument("--calls", type=int, default=12, help="in-process calls of one round")
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--max-body-mib", type=float, default=64.0)
    ap.add_argument("--threads", type=int, default=1, help="server worker threads")
    ap.add_argument("--allow-unverified", action="store_true")
    ap.add_argument("--server-arg", action="append", default=[], help="one more argument for `tileship serve`")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.rounds < 1 or a.calls < 1 or a.seconds <= 0 or a.clients < 1:
        raise SystemExit("--rounds, --calls and --clients must be >= 1 and --seconds > 0")
    os.environ.setdefault("TILELANG_CACHE_DIR", tempfile.mkdtemp(prefix="serve-rounds-tl-"))
    dims = {k: int(v) for k, v in (p.split("=") for p in a.dims.split(","))}
    release_dir = a.release or sl.build_cpu_release(Path(tempfile.mkdtemp(prefix="serve-rounds-rel-")))
    port = sl.free_port()
    args = ["--max-body-mib", str(a.max_body_mib), "--max-inflight", str(max(64, a.clients * 2)), "--threads",
            str(a.threads), *(["--allow-unverified"] if a.allow_unverified else []), *a.server_arg]
    proc, log_path = sl.start_server(release_dir, port, args, "serve-rounds-log-")
    rounds: list[dict[str, Any]] = []
    try:
        _, _, release, device = sl.ready_release(f"http://127.0.0.1:{port}", proc, time.perf_counter(), release_dir,
                                                 a.op, a.allow_unverified)
        body, headers, tensors = sl.make_request(release, a.op, dims, a.dtype, True)
        path = f"/v2/models/{a.op}/infer"
        asyncio.run(sl.http_phase("127.0.0.1", port, path, body, headers, a.clients, 60.0, 2 * a.clients))  # warm
        for i in range(a.rounds):
            inproc = sl.in_process(release, a.op, body, headers, tensors, device, a.calls)
            in_rps = 1e6 / inproc["full"]["mean_us"]
            load = asyncio.run(sl.http_phase("127.0.0.1", port, path, body, headers, a.clients, a.seconds, 1 << 30))
            rounds.append({"round": i, "in_process_rps": round(in_rps, 2),
                           "in_process_p50_us": inproc["full"]["p50_us"], "http_rps": load["throughput_rps"],
                           "errors": load["errors"], "codes": load["codes"],
                           "ratio": round(load["throughput_rps"] / in_rps, 3)})
            print(f"round {i}: in-process {in_rps:.2f} calls/s, HTTP {a.clients} clients {load['throughput_rps']} "
                  f"req/s, ratio {rounds[-1]['ratio']}, errors {load['errors']}", flush=True)
    finally:
        sl.stop_server(proc)
    ratios = [r["ratio"] for r in rounds]
    result = {
        "benchmark": "serve_load_rounds", "ratio": "HTTP / in-process throughput (above 1: HTTP faster)",
        "config": {"op": a.op, "dims": dims, "dtype": a.dtype, "clients": a.clients, "rounds": a.rounds,
                   "seconds": a.seconds, "calls": a.calls, "server_args": args, "device": device,
                   "request_bytes": len(body)},
        "release_id": release.release_id, "rounds": rounds,
        "ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
        "target": a.target, "verdict": verdict(ratios, a.target),
        "errors": sum(r["errors"] for r in rounds), "server_log": str(log_path),
    }
    print(f"HTTP / in-process throughput over {a.rounds} rounds: median {result['ratio_median']:.3f} "
          f"[{min(ratios):.3f}, {max(ratios):.3f}]; target {a.target}: {result['verdict']}; errors {result['errors']}")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
