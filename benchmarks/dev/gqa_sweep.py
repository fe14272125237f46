"""Kernel development sweep (GPU host): gqa_decode's launch forms and tiling vs SDPA, and the timing floor.

usage: python3 benchmarks/dev/gqa_sweep.py OUT.json [--jobs 14] [--quick]

Not the product path (no release, no dispatcher): it times the catalog's ``gqa_decode`` kernel
builder itself under both launch forms (``split``: two kernels and a workspace; ``cluster``: one
kernel, the splits of a head in one thread-block cluster), split counts, KV tiles, pipeline depths
and thread counts.

Two timing methods, both for every kernel and for SDPA:

- ``cold1``: CUDA events around one call, a 512 MiB buffer zeroed before each call (L2 flushed),
  median of 60 calls after 5 warm-ups, p10/p90 kept (``decode_kernels.py``'s method);
- ``graph``: one CUDA graph of R calls over R copies of the cache (R x the cache's bytes >= 256 MiB, so
  no call finds its cache in L2), replayed 20 times; us per call = total / (20 R), the median of
  three such runs (round 11 took the best of three). This is how a decode step runs the kernel:
  back to back, inside a graph, with no launch gap.

The floor of the ``cold1`` method itself: the same method around a one-element add (launch and
event overhead) and around reductions (``amax``) that read 4, 32 and 128 MiB once, the fastest
single-pass read PyTorch has (round 11: slower than SDPA on the same bytes, so not a usable floor;
the one-element add is). A kernel cannot read its cache faster than such a pass under the same
method, so ``floor_us(bytes)`` bounds what any decode attention can reach under it.

Correctness: max abs error against float32 SDPA over the same cache, for full caches and for
lengths that leave some splits empty (B=1: S/3 + 5; B>1: random lengths); above 2e-2 a variant is
reported, never picked. Speedup = SDPA us / kernel us (> 1: kernel faster); SDPA is
``F.scaled_dot_product_attention(enable_gqa=True)`` over the valid length with no mask (every
sequence full: the fastest SDPA call there is for this case).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

TARGET = {"kind": "cuda", "arch": "sm_90a"}
SHAPES = ((1, 8192), (1, 1024), (1, 32768), (8, 1024), (8, 8192), (32, 1024), (32, 8192))
SMEM_LIMIT = 200 * 1024


def smem_bytes(cfg: dict[str, Any]) -> int:
    """Shared memory a variant asks for: K/V stages, Q, P, and the cluster's partials."""
    bn, st = cfg.get("block_N", 64), cfg.get("num_stages", 2)
    extra = 40 * 1024 if cfg.get("launch") == "cluster" else 0
    extra += 16 * 1024 if cfg.get("ws") else 0
    return st * 2 * bn * 128 * 2 + 16 * 128 * 2 + 16 * bn * 2 + extra


def variants(B: int, S: int, quick: bool) -> list[dict[str, Any]]:
    """The configurations tried at one shape; the first two are the launch forms at their defaults."""
    out: list[dict[str, Any]] = [{"launch": "split"}, {"launch": "cluster"}]
    if (B, S) == (1, 8192) and not quick:
        grid = itertools.product((8, 16), (32, 64, 128), (2, 3, 4), (128, 256))
        out += [dict(launch="cluster", num_split=sp, block_N=bn, num_stages=st, threads=th)
                for sp, bn, st, th in grid]
        out += [dict(launch="split", num_split=sp) for sp in (16, 32, 64)]
        out += [dict(launch="cluster", bounded=False)]
        grid = itertools.product(("cluster", "split"), (8, 16), (64, 128), (2, 3, 4))
        out += [dict(launch=la, num_split=sp, block_N=bn, num_stages=st, bounded=False, ws=True)
                for la, sp, bn, st in grid]
    else:
        out += [dict(launch="cluster", num_split=sp) for sp in (4, 8, 16) if B * 8 * sp <= 1024]
        out += [dict(launch="cluster", num_stages=3), dict(launch="cluster", threads=256)]
        out += [dict(launch=la, bounded=False, ws=True) for la in ("cluster", "split")]
    keep = []
    for cfg in out:
        split = cfg.get("num_split", 0)
        if split and S // split < cfg.get("block_N", 64) or smem_bytes(cfg) > SMEM_LIMIT:
            continue
        if cfg not in keep:
            keep.append(cfg)
    return keep


def make(B: int, S: int, dtype: str, cfg: dict[str, Any]) -> Any:
    from tileship.catalog.gqa_decode import gqa_decode

    return gqa_decode(B, S, dtype=dtype, **{k: v for k, v in cfg.items() if k != "ws"})


def pass_configs(cfg: dict[str, Any]) -> dict[str, Any]:
    """The catalog's pass configs; ``ws`` lets TileLang warp-specialize (TMA producer warps)."""
    from tileship.catalog.gqa_decode import PASS_CONFIGS

    if cfg.get("ws"):
        return {k: v for k, v in PASS_CONFIGS.items() if k != "tl.disable_warp_specialized"}
    return PASS_CONFIGS


def build(job: tuple) -> tuple[tuple, str | None]:
    B, S, dtype, cfg = job
    try:
        import tilelang

        tilelang.compile(make(B, S, dtype, cfg), out_idx=[4], target=TARGET, pass_configs=pass_configs(cfg))
        return job[:3] + (json.dumps(cfg, sort_keys=True),), None
    except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
        return job[:3] + (json.dumps(cfg, sort_keys=True),), f"{type(e).__name__}: {e}"[-400:]


def graph_timer(torch: Any) -> Any:
    """us per call of ``fn(i)`` for i over R copies, captured R at a time in one CUDA graph
    (``decode_kernels.graph_time``: the median of three timed replay runs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from decode_kernels import graph_time

    return lambda fn, copies: graph_time(torch, fn, copies)["us"]


def floors(torch: Any, timeit: Any) -> dict[str, Any]:
    """The cold1 method around a one-element add and single-pass reads of 4/32/128 MiB."""
    one = torch.zeros(1, device="cuda")
    out: dict[str, Any] = {"one_element_add_us": timeit(lambda: one.add_(1.0))}
    reads = {}
    for mib in (4, 32, 128):
        x = torch.randn(mib * 1024 * 1024 // 2, device="cuda").half()
        reads[mib] = timeit(lambda x=x: torch.amax(x))
        del x
    out["amax_read_us"] = {str(k): v for k, v in reads.items()}
    (t4, t128) = reads[4][0], reads[128][0]
    slope = (t128 - t4) / (124 * 1024 * 1024)
    out["fit"] = {"fixed_us": t4 - slope * 4 * 1024 * 1024, "tb_s": 1e-6 / slope if slope > 0 else None,
                  "how": "a line through the 4 and 128 MiB medians"}
    print(f"floor: one-element add {out['one_element_add_us'][0]:.1f} us; amax reads "
          + ", ".join(f"{k} MiB {v[0]:.1f} us" for k, v in reads.items())
          + f"; line: {out['fit']['fixed_us']:.1f} us + bytes / {out['fit']['tb_s'] or 0:.2f} TB/s", flush=True)
    return out


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
    from w4a16_sweep import timer  # the cold1 method: L2 flushed, median of 60 after 5 warm-ups

    from tileship.catalog.gqa_decode import gqa_decode_reference, gqa_decode_sample

    timeit, gtime = timer(torch), graph_timer(torch)
    result: dict[str, Any] = {"script": "benchmarks/dev/gqa_sweep.py", "device": torch.cuda.get_device_name(),
                              "torch": torch.__version__, "floor": floors(torch, timeit),
                              "ratio": "speedup = SDPA us / kernel us (> 1: kernel faster), per method",
                              "compile_errors": {str(k): e for k, e in errors.items()}, "rows": []}
    for B, S in SHAPES:
        kv_bytes = 2 * B * S * 8 * 128 * 2
        copies = max(2, -(-256 * 1024 * 1024 // kv_bytes))
        sets = [gqa_decode_sample({"B": B, "S": S, "HQ": 32, "HKV": 8, "D": 128}, dtype, "cuda") for _ in range(copies)]
        q, k, v, lengths = sets[0]
        short = (torch.full((B,), S // 3 + 5, dtype=torch.int32, device="cuda") if B == 1
                 else torch.randint(1, S + 1, (B,), dtype=torch.int32, device="cuda"))
        refs = {"full": gqa_decode_reference(q.float(), k.float(), v.float(), lengths),
                "short": gqa_decode_reference(q.float(), k.float(), v.float(), short)}

        def sdpa(i: int) -> Any:
            qq, kk, vv, _ = sets[i]
            return torch.nn.functional.scaled_dot_product_attention(
                qq.unsqueeze(2), kk.transpose(1, 2), vv.transpose(1, 2), enable_gqa=True)

        base = {"cold1": timeit(lambda: sdpa(0)), "graph": gtime(sdpa, copies)}
        print(f"B={B} S={S}: SDPA cold1 {base['cold1'][0]:.1f} us, graph {base['graph']:.1f} us "
              f"({copies} copies)", flush=True)
        result["rows"].append({"B": B, "S": S, "path": "sdpa", "cold1_us": base["cold1"], "graph_us": base["graph"],
                               "kv_bytes": kv_bytes})
        for cfg in variants(B, S, args.quick):
            key = (B, S, dtype, json.dumps(cfg, sort_keys=True))
            row: dict[str, Any] = {"B": B, "S": S, "path": "kernel", "cfg": cfg, "kv_bytes": kv_bytes}
            if key in errors:
                result["rows"].append({**row, "error": errors[key]})
                continue
            kern = tilelang.compile(make(B, S, dtype, cfg), out_idx=[4], target=TARGET, pass_configs=pass_configs(cfg))
            err = {"full": (kern(q, k, v, lengths).float() - refs["full"]).abs().max().item(),
                   "short": (kern(q, k, v, short).float() - refs["short"]).abs().max().item()}
            t = timeit(lambda: kern(q, k, v, lengths))
            try:
                g = gtime(lambda i: kern(*sets[i]), copies)
            except Exception as e:  # noqa: BLE001 - a kernel that cannot be captured is reported, not fatal
                row["graph_error"] = f"{type(e).__name__}: {e}"[-300:]
                g = math.inf
            row.update(cold1_us=t, graph_us=g, max_abs_err=err, ok=max(err.values()) < 2e-2,
                       speedup={"cold1": base["cold1"][0] / t[0], "graph": base["graph"] / g},
                       kv_tb_s={"cold1": kv_bytes / t[0] / 1e6, "graph": kv_bytes / g / 1e6})
            result["rows"].append(row)
            print(f"  {json.dumps(cfg):90s} cold1 {t[0]:6.1f} ({t[1]:.1f}-{t[2]:.1f}) x{row['speedup']['cold1']:.2f}"
                  f"  graph {g:6.1f} x{row['speedup']['graph']:.2f} {row['kv_tb_s']['graph']:.2f} TB/s"
                  f"  err {max(err.values()):.1e}", flush=True)
        sets = []
        torch.cuda.empty_cache()
        json.dump(result, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
