#!/usr/bin/env python3
"""Where a gated device span's host time goes (issue 13, round 22): the canary's ``DeviceSpan`` found every
call's queuing longer than its 200 us gate on the H200 (``gpu_round22a.sh``), on the kernel and the cuBLAS path
alike. This times each host step of the span around ``torch.matmul`` (M=64, N=K=4096, fp16) with the device
idle between calls (``--idle-ms``, as between a served client's requests) and busy (back to back), on the main
thread and on a worker thread, with fresh events per call (as ``DeviceSpan``) and reused ones.

    PYTHONPATH=src python3 benchmarks/dev/span_probe.py --out span_probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor


def once(torch, a, b, cycles: int, gate: bool, fresh: bool, ev: list) -> dict[str, float]:
    e0, e1 = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if fresh else ev
    t = [time.perf_counter()]
    if gate:
        torch.cuda._sleep(cycles)
    t.append(time.perf_counter())
    e0.record()
    t.append(time.perf_counter())
    c = torch.matmul(a, b)
    t.append(time.perf_counter())
    e1.record()
    t.append(time.perf_counter())
    torch.cuda.current_stream().synchronize()
    t.append(time.perf_counter())
    del c
    names = ("sleep_us", "record0_us", "matmul_us", "record1_us", "sync_us")
    out = {n: (t[i + 1] - t[i]) * 1e6 for i, n in enumerate(names)}
    out["queued_us"] = (t[4] - t[0]) * 1e6
    out["device_us"] = e0.elapsed_time(e1) * 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--idle-ms", type=float, default=20.0)
    a_ = ap.parse_args()
    import torch

    from tileship.verify.latency import spin_rate as _spin_rate

    GATE_US = 200.0  # noqa: N806 (serve.canary_stats.GATE_US's lower bound: that package needs the server's modules)
    a = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    for _ in range(10):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    rate = _spin_rate(torch)
    cycles = int(GATE_US * rate)
    ev = [torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)]
    res: dict[str, object] = {"spin_cycles_per_us": rate, "gate_us": GATE_US, "cycles": cycles, "variants": {}}

    def run(gate: bool, fresh: bool, idle: bool) -> dict[str, float]:
        rows = []
        for _ in range(a_.n):
            if idle:
                time.sleep(a_.idle_ms / 1e3)
            rows.append(once(torch, a, b, cycles, gate, fresh, ev))
        return {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]} | {
            "queued_min_us": round(min(r["queued_us"] for r in rows), 2)}

    pool = ThreadPoolExecutor(1)
    for where in ("main", "thread"):
        for gate in (False, True):
            for fresh in (True, False):
                for idle in (True, False):
                    name = f"{where} gate={int(gate)} fresh={int(fresh)} idle={int(idle)}"
                    r = run(gate, fresh, idle) if where == "main" else pool.submit(run, gate, fresh, idle).result()
                    res["variants"][name] = r
                    print(name, json.dumps(r), flush=True)
    json.dump(res, open(a_.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
