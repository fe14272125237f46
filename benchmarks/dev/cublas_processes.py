"""Does cuBLAS's time for one small GEMM change from one process to the next? (development, issue 13)

    python benchmarks/dev/cublas_processes.py OUT.json [--procs 8] [--ms 1,8,16] [--dtype bfloat16]

Round 14's served_vs_best measured ``torch.matmul`` at bf16 N=K=4096, M=1-16 at 26.5-28.0 us where round 9
measured 16.6-17.1 us, and tune (its own process) had kept the reference where a kernel was faster in the
next one. This starts ``--procs`` fresh Python processes; each times ``x @ w`` (x (M, 4096), w (4096, 4096)
as the reference gets it: W given K-major, i.e. (K, N) contiguous) with CUDA events around one call and a
256 MiB L2 flush before it, 200 reps after 50 of warm-up, for each M and for both layouts of w, and names
the GEMM kernel ``torch.profiler`` saw. Prints one line per process; the JSON keeps every median.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, statistics, torch
ms, dtype = json.loads(sys.argv[1]), getattr(torch, sys.argv[2])
torch.manual_seed(0)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
res = {}
for layout in ("kn", "nk_t"):
    w = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    if layout == "nk_t":
        w = w.t()  # a transposed view: cuBLAS gets the other transpose flag
    for m in ms:
        x = torch.randn(m, 4096, device="cuda", dtype=dtype)
        for _ in range(50):
            x @ w
        times = []
        for _ in range(200):
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); x @ w; b.record(); b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            x @ w; torch.cuda.synchronize()
        names = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
        res[f"{layout} M={m}"] = {"median_us": statistics.median(times), "kernels": names}
print(json.dumps(res))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--ms", default="1,8,16")
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    ms = [int(m) for m in a.ms.split(",")]
    runs = []
    for p in range(a.procs):
        r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(ms), a.dtype], capture_output=True, text=True,
                           timeout=120)
        if r.returncode:
            runs.append({"error": r.stderr[-500:]})
            print(f"process {p}: failed: {r.stderr[-300:]}")
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        runs.append(res)
        print(f"process {p}: " + "  ".join(f"{k} {v['median_us']:.1f}" for k, v in res.items()))
    kernels = {}
    for res in runs:
        for k, v in res.items():
            if isinstance(v, dict):
                kernels.setdefault(k, set()).update(v["kernels"])
    for k, names in kernels.items():
        print(f"{k}: {len(names)} kernel name(s): " + " | ".join(n[:90] for n in sorted(names)))
    with open(a.out, "w") as f:
        json.dump({"script": "benchmarks/dev/cublas_processes.py", "command": " ".join(sys.argv), "dtype": a.dtype,
                   "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
