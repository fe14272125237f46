"""On the GPU host: load a CPU-built release with nvcc hidden, call every CUDA specialization
at its sample shapes (edges of dynamic ranges included), compare with the reference in
float64 (float32 for attention), and record what ran. Writes JSON to --out.

    PATH=/usr/bin:/bin python3 benchmarks/gpu_smoke.py --release DIR --out result.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--release", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    import torch

    t_torch = time.perf_counter() - t0
    from tileship.runtime import nojit
    from tileship.runtime.loader import load
    from tileship.verify.demo import exercise

    t = time.perf_counter()
    release = load(args.release, allow_unverified=True)
    t_load = time.perf_counter() - t
    rows = exercise(release, limit=8192)
    torch.cuda.synchronize()
    cuda_rows = [r for r in rows if ".cuda-" in r["spec_id"]]
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "nvcc_on_path": shutil.which("nvcc"),
        "torch_import_s": round(t_torch, 2),
        "release_load_s": round(t_load, 3),
        "release": release.release_id,
        "load_seconds": {k: round(v * 1e3, 2) for k, v in release.load_seconds.items()},
        "load_errors": release.load_errors,
        "drift": release.drift.to_json(),
        "compile_attempts": nojit.attempts(),
        "rows": rows,
        "summary": {"cuda_calls": len(cuda_rows), "kernel_path": sum(r["path"] == "kernel" for r in cuda_rows),
                    "mismatches": sum(r["ok"] is False for r in rows)},
        "counters": release.counters(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result["summary"]), "compile_attempts", result["compile_attempts"], "nvcc", result["nvcc_on_path"])
    for r in rows:
        print(f"{r['spec_id']:55s} {r['dims']:28s} {r['path']:9s} {r['reason']:20s} {r['err']:>10s} {r['ok']}")
    return 0 if result["summary"]["mismatches"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
