"""Kernel development sweep (GPU host): catalog/gemv.py's block shapes vs cuBLAS, fp16/bf16.

usage: python3 benchmarks/dev/gemv_sweep.py OUT.json [--ms 1,4,8] [--jobs 15] [--dtypes float16]

Not the product path (no release, no dispatcher): it times ``gemv_kernel`` itself at every
(rows, threads along K) in the grid, so that ``gemv.plan`` can be set from measurements.
Method (as ``w4a16_sweep.py``): CUDA events around one call, a 512 MiB buffer zeroed before
each call (L2 flushed), median of 60 calls after 5 warm-ups, p10/p90 kept. Correctness: max
relative error against float32 ``x @ W^T``; above 2e-2 a variant is reported, never picked.
Baseline: ``F.linear`` (cuBLAS). Speedup = cuBLAS us / kernel us (> 1: the kernel is faster).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

TARGET = {"kind": "cuda", "arch": "sm_90a"}
SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}


def variants(M: int, K: int) -> list[tuple[int, int]]:
    return [
        (r, t)
        for r, t in itertools.product((1, 2, 4), (64, 128, 256))
        if K % (t * 8) == 0 and r * K // (t * 8) <= 32 and M * r <= 16
    ]


def build(job: tuple) -> tuple[tuple, str | None]:
    try:
        import tilelang

        from tileship.catalog.gemv import gemv_kernel

        tilelang.compile(gemv_kernel(*job), out_idx=[2], target=TARGET)
        return job, None
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return job, f"{type(e).__name__}: {e}"[-300:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ms", default="1,4,8")
    ap.add_argument("--jobs", type=int, default=15)
    ap.add_argument("--dtypes", default="float16")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    jobs = [
        (m, n, k, dt, r, t)
        for dt in args.dtypes.split(",")
        for m in ms
        for n, k in SHAPES.values()
        for r, t in variants(m, k)
    ]
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        errors = {j: e for j, e in ex.map(build, jobs) if e}
    print(f"compiled {len(jobs)} variants in {time.time() - t0:.1f}s, {len(errors)} failed", flush=True)
    import tilelang
    import torch
    from w4a16_sweep import timer  # same method: L2 flushed, median of 60 after 5 warm-ups

    from tileship.catalog.gemv import gemv_kernel, plan

    timeit = timer(torch)

    rows: list[dict[str, Any]] = []
    for dt in args.dtypes.split(","):
        for m in ms:
            for name, (n, k) in SHAPES.items():
                x = torch.randn(m, k, device="cuda").to(getattr(torch, dt))
                w = (torch.randn(n, k, device="cuda") / k**0.5).to(getattr(torch, dt))
                want = x.float() @ w.float().t()
                cublas = timeit(lambda: torch.nn.functional.linear(x, w))
                gbytes = n * k * 2 / 1e9
                print(
                    f"{dt} M={m} {name} N={n} K={k}: cuBLAS {cublas[0]:.1f} us ({gbytes / cublas[0] * 1e3:.2f} TB/s);"
                    f" plan {plan(m, n, k)}",
                    flush=True,
                )
                for r, t in variants(m, k):
                    row: dict[str, Any] = {
                        "dtype": dt,
                        "M": m,
                        "op": name,
                        "N": n,
                        "K": k,
                        "rows": r,
                        "k_threads": t,
                        "cublas_us": cublas,
                        "plan": list(plan(m, n, k)) == [r, t],
                    }
                    if (m, n, k, dt, r, t) in errors:
                        rows.append({**row, "error": errors[(m, n, k, dt, r, t)]})
                        continue
                    kern = tilelang.compile(gemv_kernel(m, n, k, dt, r, t), out_idx=[2], target=TARGET)
                    err = ((kern(x, w).float() - want).norm() / want.norm()).item()
                    us = timeit(lambda: kern(x, w))
                    row.update(
                        us=us,
                        rel_err=err,
                        speedup_vs_cublas=cublas[0] / us[0],
                        tb_s=gbytes / us[0] * 1e3,
                        ok=err < 2e-2,
                    )
                    rows.append(row)
                    print(
                        f"  rows {r} threads {t:3d}: {us[0]:7.1f} us ({us[1]:.1f}-{us[2]:.1f}) "
                        f"x{cublas[0] / us[0]:.2f} "
                        f"{gbytes / us[0] * 1e3:.2f} TB/s err {err:.1e}{' (plan)' if row['plan'] else ''}",
                        flush=True,
                    )
    json.dump(
        {
            "script": "benchmarks/dev/gemv_sweep.py",
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "ratio": "speedup = cuBLAS us / kernel us (> 1: kernel faster)",
            "rows": rows,
        },
        open(args.out, "w"),
        indent=1,
    )


if __name__ == "__main__":
    main()
