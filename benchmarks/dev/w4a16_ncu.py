"""Run the catalog's W4A16 decode-batch kernels under Nsight Compute (development; GPU host).

usage (repo root):
    ncu --clock-control none --kernel-name regex:^main \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --section LaunchStats --section SchedulerStats \\
        -o OUT/w4a16 python3 benchmarks/dev/w4a16_ncu.py --ops down,gate_up,o --m 8
    ncu --import OUT/w4a16.ncu-rep --page details > OUT/w4a16_ncu.txt

Each (op, M) compiles ``w4a16_linear``'s kernel (the same TileLang function and pass configs the
catalog builds) and calls it 4 times, a 512 MiB buffer zeroed before each call, as the sweep's
timing does (so each call starts with a cold L2). With split-K the call is two kernels (the
tile kernel and the sum of the partials): ncu times them apart, which is what round 12 could not
(``benchmarks/README.md``: about 9-11 us of each call are not explained by its bytes).
Prints each kernel's name and the op, in call order, so the report's rows can be matched.

``--kind wg --cfg '{"wk": 2, "ks": 2, "unroll": 1, "x_depth": 2, "layout": 2}'`` profiles the warpgroup-MMA
kernel (``catalog/w4a16_wgmma.py``) with that tiling instead, beside the catalog's (``--kind catalog,wg``).
"""

from __future__ import annotations

import argparse
import json

import torch

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
TARGET = {"kind": "cuda", "arch": "sm_90a"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="down,gate_up,o")
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--kind", default="catalog", help="comma list of catalog, wg")
    ap.add_argument("--cfg", default="{}", help="the wg kernel's keyword arguments, as JSON")
    args = ap.parse_args()
    import tilelang

    from tileship.catalog.w4a16 import quantize, w4a16_linear
    from tileship.catalog.w4a16_wgmma import w4a16_gemm_wg

    flush = torch.empty(512 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    dt = getattr(torch, args.dtype)
    cfg = json.loads(args.cfg)
    for op in args.ops.split(","):
        N, K = SHAPES[op]
        qw, sc = quantize(torch.randn(N, K, device="cuda", dtype=torch.float16) * 0.02)
        x = torch.randn(args.m, K, device="cuda", dtype=dt)
        for kind in args.kind.split(","):
            func = (w4a16_gemm_wg(args.m, N, K, args.dtype, **cfg) if kind == "wg"
                    else w4a16_linear(args.m, N, K, args.dtype))
            # as w4a16_sweep.compile_variant: the catalog without warp specialization, wg with TileLang's default
            pcfg = {} if kind == "wg" else {"tl.disable_warp_specialized": True}
            kern = tilelang.compile(func, out_idx=[3], target=TARGET, pass_configs=pcfg)
            for _ in range(4):
                flush.zero_()
                kern(x, qw, sc.to(dt))
            torch.cuda.synchronize()
            print(f"{kind} {op} M={args.m} N={N} K={K} {args.dtype}: 4 calls", flush=True)


if __name__ == "__main__":
    main()
