"""Runtime overhead, measured side by side in one run.

1. Per-call host time: the dispatcher (``release.op(name)(*args)``) vs calling the loaded
   TileLang kernel object directly, vs ``torch.add(out=)`` as a floor; interleaved rounds of
   back-to-back calls, medians of rounds. Target: dispatcher adds <= 2 us per call.
2. Load time per specialization: from the bundle (no JIT, no re-trace) vs ``tilelang.compile``
   of the same kernel from an empty TileLang cache and from TileLang's own warm disk cache
   (fresh child process). Target: <= 5 ms per specialization from the bundle.

    python benchmarks/runtime_overhead.py --release PATH [--device cpu|cuda] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r'''
import json, sys, time
import tilelang
from tilelang.cache import kernel_cache
from tileship.build.worker import find_operator
from tileship.declare.factory import trace
from tileship.declare.spec import Specialization, Target
out = {}
for job in json.loads(sys.argv[1]):
    op = find_operator(job["module"], job["op"])
    spec = Specialization.from_json(job["spec"])
    def trace_and_compile():  # tracing is part of TileLang's JIT path, even on a cache hit
        return tilelang.compile(trace(op, spec), out_idx=op.out_idx, target=Target(spec.target).tilelang(), pass_configs=op.compile_pass_configs() or None)
    t = time.perf_counter(); trace_and_compile(); cold = time.perf_counter() - t
    kernel_cache.KernelCache()._memory_cache.clear()
    t = time.perf_counter(); trace_and_compile(); warm = time.perf_counter() - t
    out[job["spec_id"]] = {"jit_empty_cache_s": cold, "jit_warm_disk_cache_s": warm}
print(json.dumps(out))
'''


def per_call(release, device: str, rounds: int, n: int) -> list[dict]:
    import torch


    results = []
    for _name, runner in release.ops.items():
        for entry in runner.entries:
            if entry.kernel is None:
                continue
            spec = entry.spec
            dims = {d: (v[0] if isinstance(v, tuple) else v) for d, v in spec.dims}  # smallest size: host cost dominates
            if spec.dynamic_dim is None and any(v > 4096 for v in dims.values()):
                continue
            args = runner.sample_inputs(dims, spec.dtype, device, 0)
            kernel = entry.artifact if entry.artifact is not None else entry.kernel  # TileLang's JITKernel, as a user calls it
            out, d = runner.call(*args)
            if d.path != "kernel":
                continue
            a = torch.randn(1024, device=device)
            b = torch.randn(1024, device=device)
            c = torch.empty(1024, device=device)
            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

            def loop(fn):
                sync()
                t = time.perf_counter()
                for _ in range(n):
                    fn()
                sync()
                return (time.perf_counter() - t) / n * 1e6

            raw_l, disp_l, add_l = [], [], []
            for _ in range(rounds):
                raw_l.append(loop(lambda: kernel(*args)))
                disp_l.append(loop(lambda: runner(*args)))
                add_l.append(loop(lambda: torch.add(a, b, out=c)))
            raw, disp, add = statistics.median(raw_l), statistics.median(disp_l), statistics.median(add_l)
            results.append({"spec_id": spec.id, "dims": dims, "raw_kernel_us": round(raw, 3), "dispatcher_us": round(disp, 3),
                            "added_us": round(disp - raw, 3), "ratio": round(disp / raw, 4), "torch_add_out_us": round(add, 3),
                            "spread_raw_us": round(max(raw_l) - min(raw_l), 3), "spread_dispatch_us": round(max(disp_l) - min(disp_l), 3)})
            break  # one shape per operator
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--release", required=True, type=Path)
    ap.add_argument("--device", default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--jit-specs", type=int, default=4, help="how many specializations to compare against tilelang.compile")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    from tileship.runtime.loader import load, load_artifact

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    t = time.perf_counter()
    release = load(args.release, allow_unverified=True)
    total_load = time.perf_counter() - t
    calls = per_call(release, device, args.rounds, args.calls)

    # load from the bundle, per specialization (each loaded again, fresh objects)
    target_kind = "c" if device == "cpu" else "cuda"
    rel = json.loads((args.release / "release.json").read_text())
    chosen = []
    seen_ops = set()
    for sid, info in sorted(rel["specializations"].items()):
        if info["status"] != "built" or (info["spec"]["target"] == "c") != (target_kind == "c"):
            continue
        if info["spec"]["op"] in seen_ops:
            continue
        seen_ops.add(info["spec"]["op"])
        chosen.append((sid, info))
    chosen = chosen[: args.jit_specs]
    loads = {}
    for sid, _ in chosen:
        samples = []
        for _ in range(5):
            t = time.perf_counter()
            load_artifact(args.release / "specs" / sid, sid)
            samples.append(time.perf_counter() - t)
        loads[sid] = statistics.median(samples)
    jobs = [{"spec_id": sid, "module": rel["operators"][info["spec"]["op"]]["module"], "op": info["spec"]["op"], "spec": info["spec"]}
            for sid, info in chosen]
    env = dict(os.environ, TILELANG_CACHE_DIR=tempfile.mkdtemp(prefix="tl-bench-"))
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(jobs)], capture_output=True, text=True, env=env, timeout=900)
    jit = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else {}
    if child.returncode != 0:
        print(child.stderr[-3000:], file=sys.stderr)
    load_rows = []
    for sid, _ in chosen:
        row = {"spec_id": sid, "bundle_load_ms": round(loads[sid] * 1e3, 2)}
        if sid in jit:
            row["jit_empty_cache_ms"] = round(jit[sid]["jit_empty_cache_s"] * 1e3, 1)
            row["jit_warm_disk_cache_ms"] = round(jit[sid]["jit_warm_disk_cache_s"] * 1e3, 1)
            row["speedup_vs_warm_cache"] = round(jit[sid]["jit_warm_disk_cache_s"] / loads[sid], 1)
            row["speedup_vs_empty_cache"] = round(jit[sid]["jit_empty_cache_s"] / loads[sid], 1)
        load_rows.append(row)

    result = {"device": device, "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None, "release": release.release_id,
              "release_load_total_s": round(total_load, 3), "per_call": calls, "load": load_rows,
              "targets": {"dispatcher_added_us_max": 2.0, "bundle_load_ms_max": 5.0}}
    print(f"{'specialization':55s} {'raw us':>8s} {'dispatch us':>12s} {'added us':>9s} {'torch.add(out=) us':>18s}")
    for r in calls:
        print(f"{r['spec_id']:55s} {r['raw_kernel_us']:8.2f} {r['dispatcher_us']:12.2f} {r['added_us']:9.2f} {r['torch_add_out_us']:18.2f}")
    print(f"\n{'specialization':55s} {'bundle ms':>10s} {'JIT empty ms':>13s} {'JIT warm-cache ms':>18s} {'x vs warm':>10s}")
    for r in load_rows:
        print(f"{r['spec_id']:55s} {r['bundle_load_ms']:10.2f} {r.get('jit_empty_cache_ms', float('nan')):13.1f} "
              f"{r.get('jit_warm_disk_cache_ms', float('nan')):18.1f} {r.get('speedup_vs_warm_cache', float('nan')):10.1f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
