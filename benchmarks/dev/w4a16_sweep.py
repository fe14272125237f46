"""Kernel development sweep (GPU host): every W4A16 kernel variant vs cuBLAS fp16 and torch's int4 path.

usage: python3 benchmarks/dev/w4a16_sweep.py OUT.json [--ms 1,4,8,16,32] [--ops qkv,down] [--jobs 14]

This is not the product path (no release, no dispatcher): it times the kernels themselves so
that the catalog's ``w4a16_linear`` can pick, per shape, the variant that measured fastest. Its
output is committed under ``benchmarks/results/h200/dev/``; the product path is measured by
``benchmarks/decode_kernels.py`` over a built release.

Method: CUDA events around one call, a 512 MiB buffer zeroed before each call (L2 flushed),
median of 60 calls after 5 warm-ups; p10/p90 kept. Correctness: relative L2 error against
float32 ``x @ dequantize(W)^T``; a variant above 2e-2 is reported and never picked.
The baselines are ``F.linear`` on the fp16 weight (cuBLAS) and, in bf16,
``torch.ops.aten._weight_int4pack_mm`` (torch's own int4 weight-only path, group 128).
Speedups are baseline us / kernel us (> 1: the kernel is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
TARGET = {"kind": "cuda", "arch": "sm_90a"}


#: kernel kinds to try (``--kinds``); "nows": the tensor-core ones again without warp specialization;
#: "rsl": ``w4a16_gemm_rs`` with the LOP3 decode (``decode="lop3"``), always without warp specialization
KINDS = {"catalog", "gemv3", "swap", "rs"}


def variants(M: int, N: int, K: int) -> list[tuple[str, dict[str, Any]]]:
    """The (kernel, config) pairs tried for one shape; the catalog's current pick is named 'catalog'."""
    out = [(k, c) for k, c in _variants(M, N, K) if k in KINDS]
    if "nows" in KINDS:
        out += [(k, {**c, "ws": False}) for k, c in _variants(M, N, K) if k in ("swap", "rs")]
    return out


def _variants(M: int, N: int, K: int) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = [("catalog", {})]
    steps = K // 1024
    if M <= 8:
        for rows in (1, 2, 4, 8):
            for kw in (1, 2, 4, 7, 14):
                if steps % kw or (kw > 1 and rows * M > 32) or (kw == 1 and rows > 2):
                    continue
                if kw == 1:
                    out.append(("gemv3", dict(rows=rows, k_warps=1, n_warps=4)))
                else:
                    out.append(("gemv3", dict(rows=rows, k_warps=kw)))
    # "gemv3a": w4a16_gemv3 with its weights and scales streamed through a cp.async ring of `depth` K steps a
    # warp (w4a16_async: ptxas keeps only about 1.5 steps of gemv3's register loads in flight, round 31)
    if M <= 4:
        for rows in (2, 4, 8):
            for kw in (1, 2, 4, 7, 14):
                for depth in (2, 3, 4, 6):
                    if steps % kw or (kw > 1 and rows * M > 32) or (kw == 1 and rows > 4) or depth > steps // kw:
                        continue
                    if kw == 1:
                        out.append(("gemv3a", dict(rows=rows, k_warps=1, n_warps=4, depth=depth)))
                    else:
                        out.append(("gemv3a", dict(rows=rows, k_warps=kw, depth=depth)))
    # "mva": the MMA-GEMV with its weights streamed through a cp.async ring of `depth` groups a warp
    # (w4a16_mma_async, round 31), 8 or 16 groups a warp
    if 2 <= M <= 32:
        groups = K // 128
        for rt in (1, 2):
            for wn in (1, 2):
                for gpw in (8, 16):
                    wk = groups // gpw
                    for depth in (2, 4, 6):
                        if groups % gpw or not 64 <= 32 * wn * wk <= 512 or N % (16 * rt * wn) or depth > gpw:
                            continue
                        if rt * wn > 2:
                            continue
                        out.append(("mva", dict(rt=rt, wn=wn, wk=wk, depth=depth)))
    if M >= 4:
        bm = max(8, M) if M <= 64 else 64
        for bn, split, stages in ((128, 1, 4), (128, 2, 4), (128, 4, 3), (64, 2, 4), (64, 4, 4), (256, 2, 3)):
            if K % (128 * split) or N % bn or (split > 1 and N % 256):
                continue
            out.append(("swap", dict(block_M=bm, block_N=bn, split_k=split, num_stages=stages)))
        for bn, split, stages, threads in ((128, 1, 3, 128), (128, 1, 4, 128), (128, 2, 3, 128), (128, 4, 3, 128),
                                           (256, 1, 3, 256), (256, 2, 3, 256), (64, 2, 3, 128), (64, 4, 3, 128)):
            if K % (128 * split) or N % bn or (split > 1 and N % 256):
                continue
            out.append(("rs", dict(block_M=bm, block_N=bn, split_k=split, num_stages=stages, threads=threads)))
    if M >= 8:
        bm = max(8, M) if M <= 64 else 64
        grid = [(bn, sp, st, 128) for bn in (64, 128) for sp in (1, 2, 4) for st in (3, 4)]
        grid += [(256, 2, 3, 256), (256, 4, 3, 256), (128, 4, 3, 256), (128, 8, 3, 128), (64, 8, 3, 128)]
        for bn, split, stages, threads in grid:
            if K % (128 * split) or N % bn or (split > 1 and N % 256):
                continue
            out.append(("rsl", dict(block_M=bm, block_N=bn, split_k=split, num_stages=stages, threads=threads,
                                    decode="lop3", ws=False)))
    # "rule": the catalog's M >= 8 pick (w4a16_linear) at any M, the batch padded to 8 rows;
    # "rsp": the same tilings with the pair decode (decode="pair"), and split-K one step either side
    split = 8 if N <= 4096 else 4 if N <= 8192 else (4 if M <= 8 else 1) if N >= 65536 else 1
    bm = max(8, -(-M // 8) * 8)
    rule = dict(block_M=bm, block_N=64, split_k=split, num_stages=4 if N >= 65536 else 3, threads=128, ws=False)
    out.append(("rule", {**rule, "decode": "lop3"}))
    # "rulev": the rule with the split-K sum's loads all in flight (reduce="vector", round 29), where it applies
    if split > 1 and N % 1024 == 0:
        out.append(("rulev", {**rule, "decode": "lop3", "reduce": "vector"}))
    for sp in sorted({max(1, split // 2), split, split * 2}):
        for stages in (3, 4):
            if K % (128 * sp) == 0 and (sp == 1 or N % 256 == 0):
                out.append(("rsp", {**rule, "split_k": sp, "num_stages": stages, "decode": "pair"}))
    # "rsc": the rule's tilings with the split-K partials reduced inside a thread-block cluster
    # (reduce="cluster": one launch), both decodes, split-K at most 8
    for sp in sorted({max(2, split // 2), max(2, split), min(8, split * 2)}):
        for dec in ("lop3", "pair"):
            for stages in (3, 4):
                if K % (128 * sp) == 0 and sp <= 8:
                    out.append(("rsc", {**rule, "split_k": sp, "num_stages": stages, "decode": dec,
                                        "reduce": "cluster"}))
    # "rsw": the rule's tilings with the packed tile swizzled (swizzle=True: no shared-memory bank
    # conflicts on the weight loads), both decodes, split-K one step either side
    for sp in sorted({max(1, split // 2), split, split * 2}):
        for dec in ("lop3", "pair"):
            for stages in (3, 4):
                if K % (128 * sp) == 0 and (sp == 1 or N % 256 == 0):
                    out.append(("rsw", {**rule, "split_k": sp, "num_stages": stages, "decode": dec, "swizzle": True}))
    # "rsg": the rule's tilings with each scale read where it is used (scales="global": the weight
    # pipeline starts without waiting for a shared copy of the block's scales), swizzled or not
    for sp in sorted({max(1, split // 2), split, split * 2}):
        for swz in (False, True):
            for stages in (3, 4):
                if K % (128 * sp) == 0 and (sp == 1 or N % 256 == 0):
                    out.append(("rsg", {**rule, "split_k": sp, "num_stages": stages, "decode": "lop3",
                                        "swizzle": swz, "scales": "global"}))
    # "rst": the rule's tilings with a deeper pipeline (more weight bytes in flight per SM: Nsight Compute
    # showed the M=8 kernels at 22% achieved occupancy and 0.65 waves, round 13), split-K as the rule's
    # and one step either side
    for sp in sorted({max(1, split // 2), split, split * 2}):
        for stages in (5, 6, 8):
            if K % (128 * sp) == 0 and (sp == 1 or N % 256 == 0) and K // 128 // sp >= stages:
                out.append(("rst", {**rule, "split_k": sp, "num_stages": stages, "decode": "lop3"}))
    # "rsr": the rule's kernel with 128 or 256 weight rows a block, one warpgroup (128 threads) per 64 rows
    # (``rows_per_warpgroup``: TileLang's default warp policy gave each warpgroup all the block's rows and half
    # the columns, so both decoded every weight: the 2-3x slower 256-thread rows of round 11). The block's
    # activation tile then serves 128-256 rows: a half or a quarter of the rule's L2 traffic for x at M=32
    for bn in (128, 256):
        for sp in sorted({max(1, split // 2), split, split * 2}):
            for stages in (3, 4):
                if K % (128 * sp) == 0 and N % bn == 0 and (sp == 1 or N % 256 == 0) and M > 8:
                    out.append(("rsr", {**rule, "block_N": bn, "threads": 2 * bn, "split_k": sp, "num_stages": stages,
                                        "decode": "lop3", "rows_per_warpgroup": True}))
    # "mv": the MMA-GEMV (``w4a16_mma``: weights streamed to registers, mma.sync m16n8k16 on them)
    groups = K // 128
    for rt in (1, 2, 4):
        for wn in (1, 2, 4):
            for wk in (1, 2, 4, 8):
                for unroll, pf in ((2, True), (4, False)):
                    blocks = N // (16 * rt * wn) if N % (16 * rt * wn) == 0 else 0
                    if not (128 <= 32 * wn * wk <= 512) or blocks < 64 or groups % (wk * unroll) or M > 32:
                        continue
                    if rt * unroll * (2 if pf else 1) > 8:
                        continue
                    out.append(("mv", dict(rt=rt, wn=wn, wk=wk, unroll=unroll, prefetch=pf)))
    # "mv2": round 24's second grid, around the first one's M=8 winners (wn 1, wk 8, unroll 4): wider K splits,
    # deeper unrolls at one row tile, and the activations loaded early (x_early)
    for rt in (1, 2):
        for wn in (1, 2):
            for wk in (4, 8, 16):
                for unroll, pf in ((2, True), (4, False), (4, True), (8, False)):
                    for xe in (False, True):
                        blocks = N // (16 * rt * wn) if N % (16 * rt * wn) == 0 else 0
                        if wn * wk > 16 or blocks < 64 or groups % (wk * unroll) or M > 32:
                            continue
                        if rt * unroll * (2 if pf else 1) > 8 or (xe and unroll * -(-M // 8) > 4):
                            continue
                        out.append(("mv2", dict(rt=rt, wn=wn, wk=wk, unroll=unroll, prefetch=pf, x_early=xe)))
    # "mv3": blocks that serve several row blocks in turn (tiles), the next one's weights loaded during the
    # current one's last groups: about one or two waves of blocks instead of 3-7
    for rt in (1, 2):
        for wn in (1, 2):
            for wk in (4, 8):
                for unroll, pf, xe in ((4, False, False), (2, True, False), (2, True, True), (8, False, False)):
                    blocks = N // (16 * rt * wn) if N % (16 * rt * wn) == 0 else 0
                    if blocks < 64 or groups % (wk * unroll) or M > 16 or rt * unroll * (2 if pf else 1) > 8:
                        continue
                    if xe and unroll * -(-M // 8) > 4:
                        continue
                    tiles = sorted({t for t in range(1, blocks + 1) if blocks % t == 0 and 120 <= blocks // t <= 300})
                    for t in {1, *tiles[:1], *tiles[-1:]}:
                        out.append(("mv3", dict(rt=rt, wn=wn, wk=wk, unroll=unroll, prefetch=pf, x_early=xe, tiles=t)))
    # "mvk": K split 7 to 28 ways along a block's warps (down's 112 groups; round 24's grids stopped at 8 there)
    for rt in (1, 2):
        for wn in (1, 2):
            for wk in (7, 14, 16, 28):
                for unroll, pf in ((1, True), (2, True), (1, False), (2, False), (4, False)):
                    blocks = N // (16 * rt * wn) if N % (16 * rt * wn) == 0 else 0
                    if 32 * wn * wk > 1024 or blocks < 64 or groups % (wk * unroll) or M > 16:
                        continue
                    if rt * unroll * (2 if pf else 1) > 8:
                        continue
                    out.append(("mvk", dict(rt=rt, wn=wn, wk=wk, unroll=unroll, prefetch=pf)))
    # "mv4": four and eight row tiles a warp at M = 9..32. Each warp's activation bytes per weight byte are
    # 4 M / (16 rt) (8 at M=32, rt=1), and at M=32 round 24's best time fell 35-40% from rt 1 to 2 (gate_up
    # 85.6 -> 55.9 us), so the activation loads, not the weights, set the pace there. ptxas (nvcc 13.0, sm_90a,
    # M=32, ``-Xptxas=-v``): rt 4 takes 193-248 registers a thread with no spill, rt 8 255 with 8-28 bytes
    # spilled (unroll 1, no prefetch), so a block stays within 256 threads
    for rt in (4, 8):
        for wn in (1, 2):
            for wk in (1, 2, 4, 8):
                for unroll, pf in ((1, False), (1, True), (2, False)):
                    blocks = N // (16 * rt * wn) if N % (16 * rt * wn) == 0 else 0
                    if not 64 <= 32 * wn * wk <= 256 or blocks < 32 or groups % (wk * unroll) or not 9 <= M <= 32:
                        continue
                    if rt == 8 and (unroll, pf) != (1, False):
                        continue
                    out.append(("mv4", dict(rt=rt, wn=wn, wk=wk, unroll=unroll, prefetch=pf)))
    # "mvp": the catalog's MMA-GEMV tiling at M = 4..8 (``mv_config``) and its neighbours in unroll and warps along
    # K, each with the weight loads asking L2 for the aligned 128 or 256 bytes around them (``l2_prefetch``) and
    # without (0: the same kernel as "mv"): a warp's load takes 64 bytes of each of 16 rows, so the rows' next
    # groups would be in L2 before their loads are issued, with no register held for them
    if 4 <= M <= 8:
        from tileship.catalog.w4a16_mma import mv_config

        base = mv_config(M, N, K)
        if base is not None:
            tilings = {(base["wk"], base["unroll"])}
            tilings |= {(base["wk"], u) for u in (1, 2, 4)} | {(w, base["unroll"]) for w in (7, 14) if K > 4096}
            for wk, unroll in sorted(tilings):
                cfg = {**base, "wk": wk, "unroll": unroll, "prefetch": False}
                if groups % (wk * unroll) or 32 * base["wn"] * wk > 1024:
                    continue
                for l2 in (0, 128, 256):
                    out.append(("mvp", {**cfg, "l2_prefetch": l2}))
    # "mvc": the MMA-GEMV with K split across the CTAs of a cluster (``w4a16_mma_split``): row blocks of 64-256
    # rows read x once each (``mv``'s blocks of 16-32 rows read it 8-16 times more at M=32) while the grid keeps
    # ks times as many CTAs; CTA 0 of a cluster adds the others' partials after the cluster barrier
    for rt in (2, 4):
        for wn in (1, 2, 4):
            for wk in (1, 2):
                for ks in (2, 4, 8):
                    for unroll, pf in ((1, True), (1, False), (2, False)):
                        blocks = N // (16 * rt * wn) if N % (16 * rt * wn) == 0 else 0
                        if not 64 <= 32 * wn * wk <= 256 or blocks * ks < 128 or groups % (ks * wk * unroll):
                            continue
                        if rt * unroll * (2 if pf else 1) > 8 or not 8 <= M <= 32 or 16 * rt * wn < 64:
                            continue
                        out.append(("mvc", dict(rt=rt, wn=wn, wk=wk, ks=ks, unroll=unroll, prefetch=pf)))
    # "wg": the warpgroup-MMA kernel (``w4a16_wgmma``: weights decoded into wgmma's register operand, x in shared
    # memory), CTAs of wk warpgroups over 64 rows, clusters of ks CTAs along K; the descriptor reading
    # (layout, swap_fields, trans) from WG_LAYOUT (``wg_probe.py`` writes a correct one; 2,0,0: the padded layout)
    if "wg" in KINDS and 1 <= M <= 32 and N % 64 == 0:
        lay, swap, tr = (int(v) for v in os.environ.get("WG_LAYOUT", "0,0,0").split(","))
        for wk in (1, 2, 4):
            for ks in (1, 2, 4, 8):
                for unroll, xd in ((1, 2), (2, 2), (4, 2), (2, 3), (2, 4)):
                    warps = (N // 64) * ks * wk * 4
                    if groups % (ks * wk) or (groups // (ks * wk)) % unroll or not 1024 <= warps <= 16384:
                        continue
                    out.append(("wg", dict(wk=wk, ks=ks, unroll=unroll, x_depth=xd, layout=lay,
                                           swap_fields=bool(swap), trans=tr)))
    return out


def make(kind: str, M: int, N: int, K: int, dtype: str, cfg: dict[str, Any]) -> Any:
    from tileship.catalog import w4a16_gemv, w4a16_mma, w4a16_mma_split, w4a16_tc
    from tileship.catalog.w4a16 import w4a16_linear

    if kind == "catalog":
        return w4a16_linear(M, N, K, dtype)
    if kind == "mva":
        from tileship.catalog import w4a16_mma_async

        return w4a16_mma_async.w4a16_gemm_mva(M, N, K, dtype, **cfg)
    if kind == "wg":
        from tileship.catalog import w4a16_wgmma

        return w4a16_wgmma.w4a16_gemm_wg(M, N, K, dtype, **cfg)
    if kind == "mvc":
        return w4a16_mma_split.w4a16_gemm_mv_split(M, N, K, dtype, **cfg)
    if kind in ("mv", "mv2", "mv3", "mvk", "mv4", "mvp"):
        return w4a16_mma.w4a16_gemm_mv(M, N, K, dtype, **cfg)
    if kind in ("gemv3", "gemv3a"):
        return w4a16_gemv.w4a16_gemv3(M, N, K, dtype, **cfg)
    if kind in ("rs", "rsl", "rule", "rulev", "rsp", "rsc", "rsw", "rsg", "rst", "rsr"):
        return w4a16_tc.w4a16_gemm_rs(M, N, K, dtype, **cfg)
    return w4a16_tc.w4a16_gemm_swap(M, N, K, dtype, **cfg)


def compile_variant(tilelang: Any, kind: str, M: int, N: int, K: int, dtype: str, cfg: dict[str, Any]) -> Any:
    """The compiled kernel; ``cfg["ws"] = False`` compiles without warp specialization."""
    cfg = dict(cfg)
    # the catalog, the GEMVs and the MMA-GEMVs: no warp specialization
    ws = cfg.pop("ws", not kind.startswith(("catalog", "mv", "gemv")))
    pass_configs = {} if ws else {"tl.disable_warp_specialized": True}
    return tilelang.compile(make(kind, M, N, K, dtype, cfg), out_idx=[3], target=TARGET, pass_configs=pass_configs)


def build(job: tuple) -> tuple[tuple, str | None]:
    import tilelang

    kind, M, N, K, dtype, cfg = job
    try:
        compile_variant(tilelang, kind, M, N, K, dtype, cfg)
        return job, None
    except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
        return job, repr(e)[-400:]


def timer(torch: Any) -> Any:
    flush = torch.empty(512 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")

    def timeit(fn: Any, reps: int = 60) -> tuple[float, float, float]:
        for _ in range(5):
            fn()
        ts = []
        for _ in range(reps):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1000.0)
        ts.sort()
        return statistics.median(ts), ts[len(ts) // 10], ts[(9 * len(ts)) // 10]

    return timeit


def torch_int4(torch: Any, wdq: Any, sc: Any) -> Any:
    """torch's int4 operands for the same quantized weight (bf16 scales, zero folded to 0)."""
    nat = wdq.float() / sc.float().repeat_interleave(128, dim=1)
    qn = (torch.round(nat) + 8).clamp(0, 15).to(torch.uint8)
    u8 = (qn[:, 0::2] << 4 | qn[:, 1::2]).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack(u8, 8)
    sbf = sc.to(torch.bfloat16).t().contiguous()
    sz = torch.stack([sbf, torch.zeros_like(sbf)], dim=-1).contiguous()
    return packed, sz


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ms", default="1,4,8,16,32")
    ap.add_argument("--ops", default=",".join(SHAPES))
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--bf16", action="store_true", help="also time bf16 at M=1")
    ap.add_argument("--bf16-all", action="store_true", help="also time bf16 at every M")
    ap.add_argument("--kinds", default=",".join(sorted(KINDS)), help="catalog,gemv3,swap,rs and/or nows")
    args = ap.parse_args()
    KINDS.clear()
    KINDS.update(args.kinds.split(","))
    ms = [int(m) for m in args.ms.split(",")]
    ops = args.ops.split(",")
    dtypes = ("float16", "bfloat16") if args.bf16 or args.bf16_all else ("float16",)
    jobs = [(kind, M, *SHAPES[op], dt, cfg) for op in ops for M in ms for dt in dtypes
            if dt == "float16" or M == 1 or args.bf16_all for kind, cfg in variants(M, *SHAPES[op])]
    t0 = time.time()
    errors: dict[str, str] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        for job, err in ex.map(build, jobs):
            if err:
                errors[repr(job)] = err
    print(f"compiled {len(jobs)} variants in {time.time() - t0:.1f}s, {len(errors)} failed", flush=True)
    for k, v in list(errors.items())[:8]:
        print("  ", k, v[-200:], flush=True)

    import tilelang
    import torch
    import torch.nn.functional as F

    from tileship.catalog.w4a16 import dequantize, quantize

    timeit = timer(torch)
    src = torch.empty(1024**3, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    cp_us = timeit(lambda: dst.copy_(src), reps=20)[0]
    hbm = 2 * src.numel() * 2 / (cp_us * 1e-6)
    src = dst = None
    print(f"copy ceiling {hbm / 1e12:.2f} TB/s", flush=True)
    rows = []
    torch.manual_seed(0)
    for op in ops:
        N, K = SHAPES[op]
        w = torch.randn(N, K, device="cuda", dtype=torch.float16) * 0.02
        qw, sc = quantize(w)
        wdq = dequantize(qw, sc)
        packed, sz = torch_int4(torch, wdq, sc)
        wbytes = qw.numel() * 4 + sc.numel() * 2
        for M in ms:
            x = torch.randn(M, K, device="cuda", dtype=torch.float16)
            ref = x.float() @ wdq.float().t()
            cub = timeit(lambda: F.linear(x, w))
            xb = x.to(torch.bfloat16)
            i4 = timeit(lambda: torch.ops.aten._weight_int4pack_mm(xb, packed, 128, sz))
            y4 = torch.ops.aten._weight_int4pack_mm(xb, packed, 128, sz)
            row: dict[str, Any] = dict(op=op, N=N, K=K, M=M, weight_bytes_int4=wbytes, cublas_fp16_us=cub[0],
                                       cublas_p10_p90=cub[1:], torch_int4_bf16_us=i4[0], torch_int4_p10_p90=i4[1:],
                                       torch_int4_relerr=((y4.float() - ref).norm() / ref.norm()).item())
            cands = []
            for dt in dtypes:
                if dt != "float16" and M != 1 and not args.bf16_all:
                    continue
                xd, scd = x.to(getattr(torch, dt)), sc.to(getattr(torch, dt))
                for kind, cfg in variants(M, N, K):
                    job = (kind, M, N, K, dt, cfg)
                    if repr(job) in errors:
                        cands.append(dict(kind=kind, dtype=dt, cfg=cfg, error=errors[repr(job)][-200:]))
                        continue
                    try:
                        kern = compile_variant(tilelang, kind, M, N, K, dt, cfg)
                        y = kern(xd, qw, scd)
                        err = ((y.float() - ref).norm() / ref.norm()).item()
                        tt = timeit(lambda: kern(xd, qw, scd))
                        cands.append(dict(kind=kind, dtype=dt, cfg=cfg, us=tt[0], p10_p90=tt[1:], relerr=err,
                                          tbps=wbytes / (tt[0] * 1e-6) / 1e12))
                    except Exception as e:  # noqa: BLE001
                        cands.append(dict(kind=kind, dtype=dt, cfg=cfg, error=repr(e)[-300:]))
            row["candidates"] = cands
            for dt in dtypes:
                ok = [c for c in cands if c["dtype"] == dt and "us" in c and c["relerr"] < 2e-2]
                if not ok:
                    continue
                best = min(ok, key=lambda c: c["us"])
                cat = next((c for c in ok if c["kind"] == "catalog"), None)
                row[f"best_{dt}"] = best
                row[f"speedup_vs_cublas_fp16_{dt}"] = cub[0] / best["us"]
                row[f"speedup_vs_torch_int4_{dt}"] = i4[0] / best["us"]
                row[f"pct_hbm_{dt}"] = 100 * best["tbps"] * 1e12 / hbm
                if cat:
                    row[f"catalog_us_{dt}"] = cat["us"]
            print(json.dumps({k: v for k, v in row.items() if k != "candidates"}), flush=True)
            rows.append(row)
            write(args.out, hbm, torch, errors, rows)  # after every row: a run cut short keeps what it measured
        w = wdq = packed = None
        torch.cuda.empty_cache()


def write(path: str, hbm: float, torch: Any, errors: dict[str, str], rows: list[dict[str, Any]]) -> None:
    with open(path, "w") as fh:
        json.dump(dict(script="benchmarks/dev/w4a16_sweep.py", hbm_copy_tbps=hbm / 1e12, torch=torch.__version__,
                       device=torch.cuda.get_device_name(), compile_errors=errors, rows=rows,
                       note="speedup = baseline us / kernel us (>1: kernel faster); CUDA events, 512 MiB L2 flush "
                            "per call, median of 60"), fh, indent=1)


if __name__ == "__main__":
    main()
