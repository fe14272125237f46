"""Kernel development sweep (GPU host): ``catalog/gemv_kn.py``'s two kernels vs cuBLAS (``torch.matmul``).

usage: python3 benchmarks/dev/gemv_kn_sweep.py OUT.json [--ms 1,2,4,8] [--jobs 15] [--dtypes float16]
           [--families reg,pipe,tile,splitk,swap] [--shapes 4096x4096,N11008,K11008,qkv,gate_up,down,lm_head]

Not the product path (no release, no dispatcher): it compiles each family's kernel (``FAMILIES``:
the GEMVs of ``gemv_kn``, the tiled and split-K GEMMs of ``gemm``/``gemm_tuned``, the swapped-operand
GEMM of ``gemm_small_m``) with a dynamic M, as the tuned GEMM project builds it, at every point of its grid and
times the kernel itself, so that the candidates in ``catalog/gemm_tuned.py`` come from
measurements. Shapes: the tuned project's (N, K) pairs and Llama-3-8B's projections. Method
(``w4a16_sweep.timer``): CUDA events around one call, a 512 MiB buffer zeroed before each call (L2
flushed), median of 60 calls after 5 warm-ups, p10/p90 kept: device time, the host's issue cost hidden behind the
flush. Correctness: relative L2 error against float32 ``A @ B``; above 1e-2 a variant is
reported, never ranked. Speedup = cuBLAS us / kernel us (> 1: the kernel is faster), cuBLAS being
``torch.matmul(A, B)`` on B [K, N]; also timed: ``F.linear(A, W)`` on W = B^T contiguous [N, K] (how a
model's ``nn.Linear`` calls cuBLAS), and ``speedup_vs_best_torch`` takes the faster of the two.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

TARGET = {"kind": "cuda", "arch": "sm_90a"}
#: name: (N, K): the tuned project's pairs, then the Llama-3-8B projections (qkv fused, gate+up fused, down,
#: lm_head; o is 4096x4096)
SHAPES = {"4096x4096": (4096, 4096), "N11008": (11008, 4096), "K11008": (4096, 11008),
          "qkv": (6144, 4096), "gate_up": (28672, 4096), "down": (4096, 14336), "lm_head": (128256, 4096)}
#: family -> (module, factory, axes in the factory's positional order after dtype):
#: ``reg`` ``gemv_kn`` (loads into registers), ``pipe`` ``gemv_kn_pipe`` (TMA), ``tile`` the catalog's tiled
#: GEMM, ``splitk`` its split-K form (``gemm_tuned``), ``swap`` the swapped-operand GEMM (``gemm_small_m``)
FAMILIES = {
    "reg": ("tileship.catalog.gemv_kn", "gemv_kn",
            {"block_N": (32, 64), "threads": (512, 1024), "m_rows": (1, 2), "unroll": (8, 16)}),
    "pipe": ("tileship.catalog.gemv_kn", "gemv_kn_pipe",
             {"block_N": (32, 64, 128), "block_K": (64, 128), "threads": (128, 256), "m_rows": (1, 2, 4, 8),
              "num_stages": (4, 6)}),
    "tile": ("tileship.catalog.gemm", "matmul",
             {"block_M": (16, 64), "block_N": (32, 64), "block_K": (128, 256), "num_stages": (3, 4),
              "threads": (128,)}),
    "splitk": ("tileship.catalog.gemm_tuned", "matmul_split_k",
               {"block_M": (16, 64), "block_N": (32, 64), "block_K": (64, 128), "num_stages": (3,),
                "threads": (128,), "split_k": (2, 4)}),
    "swap": ("tileship.catalog.gemm_small_m", "matmul_swap",
             {"block_M": (8, 16), "block_N": (64, 128), "block_K": (128, 256), "num_stages": (3, 4, 6, 8),
              "threads": (128,), "split_k": (1, 2)}),
}


def _fits(family: str, n: int, k: int, v: tuple[Any, ...]) -> bool:
    """Whether variant ``v`` of ``family`` covers shape (n, k) and fits in shared memory."""
    if family == "reg":
        from tileship.catalog.gemv_kn import check

        try:
            check(n, k, *v)
        except ValueError:
            return False
        return True
    if family == "pipe":
        bn, bk, th, mr, st = v
        return not (n % bn or k % bk or st * bk * bn * 2 > 160 * 1024 or 16 * mr * bn < th)
    if family == "swap":
        from tileship.catalog.gemm_small_m import check as check_swap

        bm, bn, bk, st, _, sk = v
        try:
            check_swap(n, k, bm, bn, bk, st, sk)
        except ValueError:
            return False
        return True
    bm, bn, bk, st = v[:4]
    sk = v[5] if family == "splitk" else 1
    return not (n % bn or k % (bk * sk) or st * (bm + bn) * bk * 2 > 200 * 1024)


def variants(n: int, k: int, families: tuple[str, ...] = ("reg", "pipe")) -> list[tuple[Any, ...]]:
    """(family, *config) of every variant of ``families`` that fits shape (n, k)."""
    return [(fam, *v) for fam in families for v in itertools.product(*FAMILIES[fam][2].values())
            if _fits(fam, n, k, v)]


def factory(family: str) -> Any:
    import importlib

    module, fn, _ = FAMILIES[family]
    return getattr(importlib.import_module(module), fn)


def build(job: tuple) -> tuple[tuple, str | None]:
    try:
        import tilelang
        import tilelang.language as T

        n, k, dt, fam, *v = job
        tilelang.compile(factory(fam)(T.dynamic("m"), n, k, dt, *v), out_idx=[2], target=TARGET)
        return job, None
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return job, f"{type(e).__name__}: {e}"[-300:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ms", default="1,2,4,8")
    ap.add_argument("--jobs", type=int, default=15)
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--families", default="reg,pipe", help=f"of {', '.join(FAMILIES)}")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    args = ap.parse_args()
    fams = tuple(args.families.split(","))
    shapes = {s: SHAPES[s] for s in args.shapes.split(",")}
    ms = [int(m) for m in args.ms.split(",")]
    dts = args.dtypes.split(",")
    jobs = [(n, k, dt, *v) for dt in dts for n, k in shapes.values() for v in variants(n, k, fams)]
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:  # fills TileLang's disk cache for the loop below
        errors = {j: e for j, e in ex.map(build, jobs) if e}
    print(f"compiled {len(jobs)} variants in {time.time() - t0:.1f}s, {len(errors)} failed", flush=True)
    for j, e in errors.items():
        print("  failed", j, e, flush=True)
    import tilelang
    import tilelang.language as T
    import torch
    from w4a16_sweep import timer

    timeit = timer(torch)
    kernels = {j: tilelang.compile(factory(j[3])(T.dynamic("m"), *j[:3], *j[4:]), out_idx=[2], target=TARGET)
               for j in jobs if j not in errors}
    rows: list[dict[str, Any]] = []
    for dt in dts:
        for name, (n, k) in shapes.items():
            b = (torch.randn(k, n, device="cuda") / k**0.5).to(getattr(torch, dt))
            w = b.t().contiguous()  # [N, K]: nn.Linear's weight
            gbytes = n * k * 2 / 1e9
            for m in ms:
                a = torch.randn(m, k, device="cuda").to(getattr(torch, dt))
                want = a.float() @ b.float()
                cublas = timeit(lambda: torch.matmul(a, b))
                linear = timeit(lambda: torch.nn.functional.linear(a, w))
                torch_best = min(cublas[0], linear[0])
                print(f"{dt} M={m} {name}: cuBLAS {cublas[0]:.1f} us ({gbytes / cublas[0] * 1e3:.2f} TB/s), "
                      f"F.linear {linear[0]:.1f} us", flush=True)
                best = None
                for j, kern in kernels.items():
                    if j[:3] != (n, k, dt):
                        continue
                    got = kern(a, b)
                    err = ((got.float() - want).norm() / want.norm()).item()
                    us = timeit(lambda: kern(a, b))
                    row = {"dtype": dt, "shape": name, "M": m, "N": n, "K": k, "family": j[3],
                           **dict(zip(FAMILIES[j[3]][2], j[4:], strict=True)), "cublas_us": cublas, "linear_us": linear,
                           "us": us, "rel_err": err, "speedup_vs_cublas": cublas[0] / us[0],
                           "speedup_vs_best_torch": torch_best / us[0],
                           "tb_s": gbytes / us[0] * 1e3, "ok": err < 1e-2}
                    rows.append(row)
                    if row["ok"] and (best is None or us[0] < best["us"][0]):
                        best = row
                    print(f"  {j[3:]}: {us[0]:7.1f} us ({us[1]:.1f}-{us[2]:.1f}) x{cublas[0] / us[0]:.2f} "
                          f"{gbytes / us[0] * 1e3:.2f} TB/s err {err:.1e}", flush=True)
                if best is not None:
                    cfg = tuple(best[g] for g in FAMILIES[best["family"]][2])
                    print(f"  BEST {best['family']} {cfg}: {best['us'][0]:.1f} us "
                          f"x{best['speedup_vs_cublas']:.2f} (x{best['speedup_vs_best_torch']:.2f} vs the faster "
                          f"of matmul and F.linear)", flush=True)
    with open(args.out, "w") as f:
        json.dump({"script": "benchmarks/dev/gemv_kn_sweep.py", "device": torch.cuda.get_device_name(),
                   "torch": torch.__version__, "families": {f: FAMILIES[f] for f in fams},
                   "ratio": "speedup = cuBLAS us / kernel us (> 1: kernel faster); speedup_vs_best_torch: "
                            "min(matmul, F.linear) us / kernel us",
                   "errors": {str(k): v for k, v in errors.items()},
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
