"""Kernel development sweep (GPU host): gqa_decode's split count and tiling vs SDPA.

usage: python3 benchmarks/dev/gqa_sweep.py OUT.json [--jobs 14] [--quick]

Not the product path (no release, no dispatcher): it times the catalog's ``gqa_decode`` kernel
builder itself under other split counts (``pick_split`` replaced per variant), KV tile sizes,
pipeline depths and thread counts, to see what decode attention at batch 1 is bound by.

Method (as ``w4a16_sweep.py``): CUDA events around one call, a 512 MiB buffer zeroed before
each call (L2 flushed), median of 60 calls after 5 warm-ups, p10/p90 kept. Correctness: max
abs error against float32 SDPA over the same cache; above 2e-2 a variant is reported, never
picked. Baselines: ``F.scaled_dot_product_attention(enable_gqa=True)`` with the boolean mask of
valid positions (the catalog's reference), and without a mask (every sequence full: the
fastest SDPA call there is for this case). Speedup = best SDPA us / kernel us (> 1: faster).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

TARGET = {"kind": "cuda", "arch": "sm_90a"}
SHAPES = ((1, 8192), (1, 1024), (1, 32768), (8, 8192))


def variants(B: int, S: int, quick: bool) -> list[dict[str, Any]]:
    """The configurations tried at one shape; ``{}`` is the catalog's own choice."""
    out: list[dict[str, Any]] = [{}]
    full = (B, S) == (1, 8192) and not quick
    splits = (8, 16, 32, 64, 128)
    grid = itertools.product(splits, (32, 64, 128) if full else (64,), (1, 2, 3) if full else (2,),
                             (128, 256) if full else (128,))
    for split, bn, stages, threads in grid:
        if S // split < bn:
            continue
        out.append(dict(split=split, block_N=bn, num_stages=stages, threads=threads))
    return out


def make(B: int, S: int, dtype: str, cfg: dict[str, Any]) -> Any:
    from tileship.catalog import gqa_decode as mod

    original = mod.pick_split
    if "split" in cfg:
        mod.pick_split = lambda *a, **k: cfg["split"]  # noqa: E731 - only while this variant is built
    try:
        kw = {k: v for k, v in cfg.items() if k != "split"}
        return mod.gqa_decode(B, S, dtype=dtype, **kw)
    finally:
        mod.pick_split = original


def build(job: tuple) -> tuple[tuple, str | None]:
    B, S, dtype, cfg = job
    try:
        import tilelang

        from tileship.catalog.gqa_decode import PASS_CONFIGS

        tilelang.compile(make(B, S, dtype, cfg), out_idx=[4], target=TARGET, pass_configs=PASS_CONFIGS)
        return job[:3] + (json.dumps(cfg, sort_keys=True),), None
    except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
        return job[:3] + (json.dumps(cfg, sort_keys=True),), f"{type(e).__name__}: {e}"[-400:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    dtype = "float16"
    jobs = [(B, S, dtype, cfg) for B, S in SHAPES for cfg in variants(B, S, args.quick)]
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:  # fills TileLang's disk cache in parallel
        errors = {k: e for k, e in ex.map(build, jobs) if e}
    print(f"compiled {len(jobs)} variants in {time.time() - t0:.1f}s, {len(errors)} failed", flush=True)
    import tilelang
    import torch
    from w4a16_sweep import timer  # same method: L2 flushed, median of 60 after 5 warm-ups

    from tileship.catalog.gqa_decode import PASS_CONFIGS, gqa_decode_reference, gqa_decode_sample

    timeit = timer(torch)
    rows: list[dict[str, Any]] = []
    for B, S in SHAPES:
        q, k, v, lengths = gqa_decode_sample({"B": B, "S": S, "HQ": 32, "HKV": 8, "D": 128}, dtype, "cuda")
        ref = gqa_decode_reference(q.float(), k.float(), v.float(), lengths)
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)
        sdpa_mask = timeit(lambda: gqa_decode_reference(q, k, v, lengths))
        sdpa_full = timeit(lambda: torch.nn.functional.scaled_dot_product_attention(
            q.unsqueeze(2), kt, vt, enable_gqa=True))
        best = min(sdpa_mask[0], sdpa_full[0])
        kv_bytes = 2 * B * S * 8 * 128 * 2
        print(f"B={B} S={S}: SDPA mask {sdpa_mask[0]:.1f} us, SDPA no mask {sdpa_full[0]:.1f} us", flush=True)
        for cfg in variants(B, S, args.quick):
            key = (B, S, dtype, json.dumps(cfg, sort_keys=True))
            row: dict[str, Any] = {"B": B, "S": S, "cfg": cfg or "catalog", "sdpa_mask_us": sdpa_mask,
                                   "sdpa_nomask_us": sdpa_full}
            if key in errors:
                rows.append({**row, "error": errors[key]})
                continue
            kern = tilelang.compile(make(B, S, dtype, cfg), out_idx=[4], target=TARGET, pass_configs=PASS_CONFIGS)
            err = (kern(q, k, v, lengths).float() - ref).abs().max().item()
            t = timeit(lambda: kern(q, k, v, lengths))
            row.update(us=t, max_abs_err=err, speedup_vs_best_sdpa=best / t[0],
                       kv_tb_s=kv_bytes / t[0] / 1e6, ok=err < 2e-2)
            rows.append(row)
            print(f"  {str(cfg or 'catalog'):70s} {t[0]:7.1f} us ({t[1]:.1f}-{t[2]:.1f})  "
                  f"x{best / t[0]:.2f} vs best SDPA  {kv_bytes / t[0] / 1e6:.2f} TB/s  err {err:.1e}", flush=True)
    json.dump({"script": "benchmarks/dev/gqa_sweep.py", "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "ratio": "speedup = best SDPA us / kernel us (> 1: kernel faster)",
               "compile_errors": {str(k): e for k, e in errors.items()}, "rows": rows},
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
