"""Kernel development (GPU host; prepared in round 24, not yet run): the fp16/bf16 MMA-GEMV for the decode ``linear``.

usage: python3 benchmarks/dev/linear_mv.py OUT.json [--ms 4,8,16] [--ops qkv,o,gate_up,down,lm_head] [--jobs 16]

The kernel is ``tileship.catalog.linear_mma.linear_mv`` (its module doc; ``linear`` declares some of its
tilings as tune candidates); this sweep tries every tiling ``variants`` lists.
On the H200 the catalog's swapped-operand GEMM (``linear_decode`` at M = 3..64) streams 16-bit weights
at about half the copy ceiling at M=8 (``benchmarks/README.md`` round 17: 2.1-2.2 TB/s), the int4
MMA-GEMV streams its weights at up to 2.9 TB/s (round 24). Not the product path: the kernels are timed
alone (``w4a16_sweep.timer``: CUDA events around one call, 512 MiB L2 flush, median of 60) beside
``F.linear`` (cuBLAS) and the catalog's kernel for the shape; error against float32; above 1e-2 a
variant is reported, never ranked. Speedup = baseline us / kernel us (above 1: the kernel faster).
"""

import argparse  # no ``from __future__ import annotations``: TVMScript reads the prim_func's annotations
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET = {"kind": "cuda", "arch": "sm_90a"}
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}


def variants(M: int, N: int, K: int) -> list[dict[str, int]]:
    """The tilings tried for one shape: at most 2 groups of 4 uint4 a row in flight a lane per row tile."""
    groups, out = K // 128, []
    for rt in (1, 2):
        for wn in (1, 2):
            for wk in (4, 7, 8, 14, 16):
                for unroll in (1, 2):
                    blocks = N // (16 * rt * wn) if N % (16 * rt * wn) == 0 else 0
                    if 32 * wn * wk > 1024 or blocks < 64 or groups % (wk * unroll) or rt * unroll > 2:
                        continue
                    out.append(dict(rt=rt, wn=wn, wk=wk, unroll=unroll))
    return out


def build(job: tuple) -> tuple[tuple, str | None]:
    import tilelang

    from tileship.catalog.linear_mma import linear_mv

    M, N, K, dtype, cfg = job
    try:
        tilelang.compile(linear_mv(M, N, K, dtype, **cfg), out_idx=[2], target=TARGET)
        return job, None
    except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
        return job, repr(e)[-400:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ms", default="4,8,16")
    ap.add_argument("--ops", default=",".join(SHAPES))
    ap.add_argument("--jobs", type=int, default=16)
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    jobs = [(M, *SHAPES[op], "float16", cfg) for op in args.ops.split(",") for M in ms
            for cfg in variants(M, *SHAPES[op])]
    t0 = time.time()
    errors: dict[str, str] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        for job, err in ex.map(build, jobs):
            if err:
                errors[repr(job)] = err
    print(f"compiled {len(jobs)} variants in {time.time() - t0:.1f}s, {len(errors)} failed", flush=True)

    import tilelang
    import torch
    import torch.nn.functional as F
    from w4a16_sweep import timer

    from tileship.catalog.gemv import linear_decode
    from tileship.catalog.linear_mma import linear_mv

    timeit = timer(torch)
    rows = []
    for op in args.ops.split(","):
        N, K = SHAPES[op]
        w = (torch.randn(N, K, device="cuda") / K**0.5).half()
        for M in ms:
            x = torch.randn(M, K, device="cuda").half()
            ref = x.float() @ w.float().t()
            cub = timeit(lambda: F.linear(x, w))
            cat = tilelang.compile(linear_decode(M, N, K), out_idx=[2], target=TARGET)
            cat_t = timeit(lambda: cat(x, w))
            cands = []
            for cfg in variants(M, N, K):
                if repr((M, N, K, "float16", cfg)) in errors:
                    cands.append(dict(cfg=cfg, error=errors[repr((M, N, K, "float16", cfg))][-200:]))
                    continue
                kern = tilelang.compile(linear_mv(M, N, K, "float16", **cfg), out_idx=[2], target=TARGET)
                y = kern(x, w)
                err = ((y.float() - ref).norm() / ref.norm()).item()
                t = timeit(lambda: kern(x, w))
                cands.append(dict(cfg=cfg, us=t[0], p10_p90=t[1:], relerr=err, tbps=N * K * 2 / (t[0] * 1e-6) / 1e12))
            ok = [c for c in cands if "us" in c and c["relerr"] < 1e-2]
            best = min(ok, key=lambda c: c["us"]) if ok else None
            row = dict(op=op, M=M, N=N, K=K, cublas_us=cub[0], catalog_us=cat_t[0], best=best, candidates=cands,
                       wrong=sum(1 for c in cands if "us" in c and c["relerr"] >= 1e-2))
            print(f"{op:8s} M={M:3d} cuBLAS {cub[0]:7.1f} catalog {cat_t[0]:7.1f} mv "
                  f"{best['us'] if best else float('nan'):7.1f} {best['cfg'] if best else None} "
                  f"x{cub[0] / best['us'] if best else 0:.2f} cuBLAS, x{cat_t[0] / best['us'] if best else 0:.2f} "
                  f"catalog; wrong {row['wrong']}", flush=True)
            rows.append(row)
    Path(args.out).write_text(json.dumps(dict(script="benchmarks/dev/linear_mv.py", device=torch.cuda.get_device_name(),
                                              torch=torch.__version__, compile_errors=errors, rows=rows), indent=1))


if __name__ == "__main__":
    main()
