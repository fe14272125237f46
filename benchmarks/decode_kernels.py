"""On the GPU host: the decode kernels of a release against the best PyTorch paths, side by side.

    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/decode_kernels.py RELEASE --out decode_kernels.json

For every declared static shape of ``w4a16_linear`` and ``gqa_decode`` in RELEASE, times in one
process, on the same inputs, with CUDA events around each call and the L2 flushed (a 512 MB
write) before every call, median of ``--reps`` calls, two repeats (their difference is the
spread; a speedup whose difference is under the spread is reported as not resolved):

  w4a16_linear (x [M, K] @ W^T, W int4, group 128):
    tileship      release.op("w4a16_linear")(x, qweight, scales): the dispatcher, whatever it routes
    kernel        the specialization's TileLang kernel alone (no dispatch)
    cublas_fp16   F.linear(x, W) with the unquantized fp16 weight: what the fp16 model runs
    reference     dequantize + torch.matmul: the release's fallback
    torch_int4    torch.ops.aten._weight_int4pack_mm (bf16 activations; torch's own int4 path)
  gqa_decode (q [B, 32, 128], KV cache [B, S, 8, 128], lengths = S):
    tileship, kernel as above
    sdpa          F.scaled_dot_product_attention(enable_gqa=True) over the valid length (the reference)
    and, for tileship and sdpa, a second method (``graph_us``): R calls over R copies of the cache
    (R x the cache >= 256 MiB, so no call finds its cache in L2) captured in one CUDA graph and
    replayed, us per call; how a decode step runs them, with no launch gap and no flush between.
  gqa_decode_paged (pages of 64, the sample's lengths and random page order):
    tileship, reference (gather the pages, then masked SDPA)
    contiguous_tileship  gqa_decode on the same cache gathered contiguous (what paging costs)
  add_rmsnorm (x, residual [M, N], w [N] -> (rms_norm(x + residual), x + residual)):
    tileship, kernel as above
    eager_pair    x + residual, then F.rms_norm (the reference: two kernels)
    compiled_pair the same pair under torch.compile(fullgraph=True) (inductor fuses it into one kernel)

Speedups are baseline time / tileship time (> 1: tileship faster). Each row also gives the
bytes each path must move and the share of the measured HBM ceiling (a 2 GB device-to-device
copy, bytes read + written) it reaches. Never compiles (the no-JIT guard is on while loading).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("release", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=50, help="timed calls per repeat")
    ap.add_argument("--ops", default="w4a16_linear,gqa_decode,add_rmsnorm,gqa_decode_paged")
    ap.add_argument("--routing", choices=("pinned", "evidence"), default="pinned")
    return ap.parse_args(argv)


class Timer:
    """CUDA-event timing of single calls with the L2 flushed before each."""

    def __init__(self, reps: int) -> None:
        import torch

        self.torch = torch
        self.reps = reps
        self.flush = torch.empty(512 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")

    def once(self, fn: Any) -> float:
        torch = self.torch
        for _ in range(3):
            fn()
        times = []
        for _ in range(self.reps):
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        return statistics.median(times)

    def __call__(self, fn: Any) -> dict[str, float]:
        a, b = self.once(fn), self.once(fn)
        return {"us": (a + b) / 2, "spread_us": abs(a - b)}


def graph_time(torch: Any, fn: Any, copies: int, replays: int = 20, repeats: int = 3) -> dict[str, float]:
    """us per call of ``fn(i)`` for i over ``copies`` input sets, all captured in one CUDA graph and
    replayed ``replays`` times; the median of ``repeats`` timed replay runs, spread = max - min."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture (allocations, lazy init)
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) * 1000.0 / (replays * copies))
    return {"us": statistics.median(runs), "spread_us": max(runs) - min(runs)}


def gqa_graph(torch: Any, runner: Any, q: Any, k: Any, v: Any, lengths: Any) -> dict[str, Any]:
    """``graph_time`` of the dispatcher and of SDPA over enough copies of the cache to overflow the L2."""
    copies = max(2, -(-256 * 1024 * 1024 // (2 * k.numel() * k.element_size())))
    sets = [(q, k, v)] + [(q.clone(), k.clone(), v.clone()) for _ in range(copies - 1)]

    def sdpa(i: int) -> Any:
        qq, kk, vv = sets[i]
        return torch.nn.functional.scaled_dot_product_attention(qq.unsqueeze(2), kk.transpose(1, 2),
                                                                vv.transpose(1, 2), enable_gqa=True)

    g = {"tileship": graph_time(torch, lambda i: runner(*sets[i], lengths), copies),
         "sdpa": graph_time(torch, sdpa, copies)}
    return {"graph_us": g, "graph_copies": copies, "graph_speedup_vs_sdpa": speedup(g["sdpa"], g["tileship"])}


def speedup(base: dict[str, float] | None, ours: dict[str, float]) -> dict[str, Any] | None:
    """base / ours, or "not resolved" when the gap is within the two paths' spreads."""
    if base is None:
        return None
    gap = abs(base["us"] - ours["us"])
    resolved = gap > base["spread_us"] + ours["spread_us"]
    return {"ratio": base["us"] / ours["us"], "resolved": resolved}


def hbm_ceiling(timer: Timer) -> float:
    torch = timer.torch
    src = torch.empty(1024**3, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))["us"]
    return 4 * 1024**3 / (t * 1e-6)


def w4a16_rows(release: Any, timer: Timer, hbm: float) -> list[dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    from tileship.catalog.w4a16 import dequantize, quantize

    if "w4a16_linear" not in release.ops:
        return []
    runner = release.op("w4a16_linear")
    rows = []
    for entry in sorted((e for e in runner.entries if e.spec is not None), key=lambda e: e.spec.id):
        spec = entry.spec
        dims = spec.dim_map()
        if spec.dynamic_dim or spec.target != "cuda-sm90a":
            continue
        m, n, k = dims["M"], dims["N"], dims["K"]
        dt = getattr(torch, spec.dtype)
        weight = (torch.randn(n, k, device="cuda") * 0.02).to(dt)
        qweight, scales = quantize(weight)
        x = torch.randn(m, k, device="cuda").to(dt)
        w_deq = dequantize(qweight, scales)
        truth = x.double() @ w_deq.double().t()
        out, decision = runner.call(x, qweight, scales)
        row: dict[str, Any] = {"op": "w4a16_linear", "spec": spec.id, "M": m, "N": n, "K": k, "dtype": spec.dtype,
                               "path": decision.path, "reason": decision.reason,
                               "rel_l2_err": float((out.double() - truth).norm() / truth.norm())}
        kern = entry.kernel
        w16 = w_deq.to(dt)
        t = {"tileship": timer(lambda: runner(x, qweight, scales)),
             "kernel": timer(lambda: kern(x, qweight, scales)) if kern is not None else None,
             "cublas_fp16": timer(lambda: F.linear(x, w16)),
             "reference": timer(lambda: runner.reference(x, qweight, scales))}
        try:  # torch's own int4 path: uint8 [N, K/2] (even element in the high nibble), bf16 scales/zeros
            nat = torch.round(w_deq.float() / scales.float().repeat_interleave(128, dim=1)) + 8
            q8 = nat.clamp(0, 15).to(torch.uint8)
            packed = torch.ops.aten._convert_weight_to_int4pack(((q8[:, 0::2] << 4) | q8[:, 1::2]).contiguous(), 8)
            sz = torch.stack([scales.t().to(torch.bfloat16), torch.zeros_like(scales.t(), dtype=torch.bfloat16)], -1)
            xb = x.to(torch.bfloat16)
            t["torch_int4"] = timer(lambda: torch.ops.aten._weight_int4pack_mm(xb, packed, 128, sz.contiguous()))
        except Exception as exc:  # noqa: BLE001 - recorded: not every torch build has the int4 kernel
            row["torch_int4_error"] = repr(exc)[:200]
            t["torch_int4"] = None
        row["times"] = t
        row["speedup_vs"] = {name: speedup(v, t["tileship"]) for name, v in t.items() if name != "tileship"}
        wbytes = qweight.numel() * 4 + scales.numel() * 2 + (m * k + m * n) * 2
        row["bytes"] = {"w4a16": wbytes, "fp16": n * k * 2 + (m * k + m * n) * 2}
        row["pct_hbm"] = {"tileship": 100 * wbytes / (t["tileship"]["us"] * 1e-6) / hbm,
                          "cublas_fp16": 100 * row["bytes"]["fp16"] / (t["cublas_fp16"]["us"] * 1e-6) / hbm}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("times",)}), flush=True)
    return rows


def gqa_rows(release: Any, timer: Timer, hbm: float) -> list[dict[str, Any]]:
    import torch

    if "gqa_decode" not in release.ops:
        return []
    runner = release.op("gqa_decode")
    rows = []
    for entry in sorted((e for e in runner.entries if e.spec is not None), key=lambda e: e.spec.id):
        spec = entry.spec
        if spec.dynamic_dim or spec.target != "cuda-sm90a":
            continue
        dims = spec.dim_map()
        b, s = dims["B"], dims["S"]
        dt = getattr(torch, spec.dtype)
        q = torch.randn(b, 32, 128, device="cuda").to(dt)
        k = torch.randn(b, s, 8, 128, device="cuda").to(dt)
        v = torch.randn(b, s, 8, 128, device="cuda").to(dt)
        lengths = torch.full((b,), s, dtype=torch.int32, device="cuda")
        out, decision = runner.call(q, k, v, lengths)
        ref = runner.reference(q.double(), k.double(), v.double(), lengths)
        kern = entry.kernel
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)

        def sdpa() -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), kt, vt, enable_gqa=True)

        t = {"tileship": timer(lambda: runner(q, k, v, lengths)),
             "kernel": timer(lambda: kern(q, k, v, lengths)) if kern is not None else None,
             "sdpa": timer(sdpa)}
        kv_bytes = 2 * b * s * 8 * 128 * 2
        row = {"op": "gqa_decode", "spec": spec.id, "B": b, "S": s, "dtype": spec.dtype, "path": decision.path,
               "reason": decision.reason, "max_abs_err": float((out.double() - ref).abs().max()), "times": t,
               "speedup_vs": {n: speedup(x, t["tileship"]) for n, x in t.items() if n != "tileship"},
               **gqa_graph(torch, runner, q, k, v, lengths), "bytes": kv_bytes,
               "pct_hbm": {"tileship": 100 * kv_bytes / (t["tileship"]["us"] * 1e-6) / hbm,
                           "sdpa": 100 * kv_bytes / (t["sdpa"]["us"] * 1e-6) / hbm}}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "times"}), flush=True)
        torch.cuda.empty_cache()
    return rows


def paged_rows(release: Any, timer: Timer, hbm: float) -> list[dict[str, Any]]:
    """gqa_decode_paged vs the contiguous gqa_decode on the same (gathered) cache, and vs its reference."""
    import torch

    if "gqa_decode_paged" not in release.ops:
        return []
    runner = release.op("gqa_decode_paged")
    contiguous = release.ops.get("gqa_decode")
    rows = []
    for entry in sorted((e for e in runner.entries if e.spec is not None), key=lambda e: e.spec.id):
        spec = entry.spec
        if spec.dynamic_dim or spec.target != "cuda-sm90a":
            continue
        dims = spec.dim_map()
        q, k, v, table, lengths = runner.sample_inputs(dims, spec.dtype, "cuda", seed=0)
        from tileship.catalog.gqa_paged import gather_pages

        kc, vc = gather_pages(k, table, lengths), gather_pages(v, table, lengths)
        out, decision = runner.call(q, k, v, table, lengths)
        ref = runner.reference(q.double(), k.double(), v.double(), table, lengths)
        t = {"tileship": timer(lambda: runner(q, k, v, table, lengths)),
             "reference": timer(lambda: runner.reference(q, k, v, table, lengths)),
             "contiguous_tileship": timer(lambda: contiguous(q, kc, vc, lengths)) if contiguous is not None else None}
        kv_bytes = 2 * int(lengths.sum()) * dims["HKV"] * dims["D"] * q.element_size()
        row = {"op": "gqa_decode_paged", "spec": spec.id, "B": dims["B"], "S": dims["S"], "dtype": spec.dtype,
               "lengths": lengths.tolist(), "path": decision.path, "reason": decision.reason,
               "max_abs_err": float((out.double() - ref).abs().max()), "times": t,
               "speedup_vs": {n: speedup(x, t["tileship"]) for n, x in t.items() if n != "tileship"},
               "bytes": kv_bytes, "pct_hbm": {n: 100 * kv_bytes / (x["us"] * 1e-6) / hbm for n, x in t.items() if x}}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("times", "lengths")}), flush=True)
        torch.cuda.empty_cache()
    return rows


def add_rmsnorm_rows(release: Any, timer: Timer, hbm: float) -> list[dict[str, Any]]:
    """add_rmsnorm vs the unfused eager pair (the reference) and the same pair under torch.compile."""
    import torch

    if "add_rmsnorm" not in release.ops:
        return []
    runner = release.op("add_rmsnorm")
    eps = release.declarations["add_rmsnorm"].get("config", {}).get("eps", 1e-6)
    rows = []
    for entry in sorted((e for e in runner.entries if e.spec is not None), key=lambda e: e.spec.id):
        spec = entry.spec
        if spec.dynamic_dim or spec.target != "cuda-sm90a":
            continue
        m, n = spec.dim_map()["M"], spec.dim_map()["N"]
        dt = getattr(torch, spec.dtype)
        x, r = torch.randn(m, n, device="cuda").to(dt), torch.randn(m, n, device="cuda").to(dt)
        w = (torch.rand(n, device="cuda") + 0.5).to(dt)

        def pair(x: Any, r: Any, w: Any) -> tuple[Any, Any]:
            h = x + r
            return torch.nn.functional.rms_norm(h, (n,), w, eps), h

        compiled = torch.compile(pair, dynamic=False, fullgraph=True)
        (y, h), decision = runner.call(x, r, w)
        y_ref, h_ref = pair(x.double(), r.double(), w.double())
        kern = entry.kernel
        t = {"tileship": timer(lambda: runner(x, r, w)),
             "kernel": timer(lambda: kern(x, r, w)) if kern is not None else None,
             "eager_pair": timer(lambda: pair(x, r, w)), "compiled_pair": timer(lambda: compiled(x, r, w))}
        nbytes = (4 * m * n + n) * x.element_size()
        row = {"op": "add_rmsnorm", "spec": spec.id, "M": m, "N": n, "dtype": spec.dtype, "path": decision.path,
               "reason": decision.reason, "max_abs_err": {"y": float((y.double() - y_ref).abs().max()),
                                                          "h": float((h.double() - h_ref).abs().max())},
               "times": t, "speedup_vs": {k: speedup(v, t["tileship"]) for k, v in t.items() if k != "tileship"},
               "bytes": nbytes, "pct_hbm": {k: 100 * nbytes / (v["us"] * 1e-6) / hbm for k, v in t.items() if v}}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "times"}), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from tileship.runtime.loader import load

    release = load(args.release, routing=args.routing, allow_unverified=True)
    timer = Timer(args.reps)
    hbm = hbm_ceiling(timer)
    print(f"HBM ceiling (device-to-device copy): {hbm / 1e12:.2f} TB/s", flush=True)
    ops = args.ops.split(",")
    result = {"script": "benchmarks/decode_kernels.py", "command": " ".join(sys.argv), "release": release.release_id,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
              "hbm_tbps": hbm / 1e12, "method": "CUDA events per call, 512 MB L2 flush before each, median of "
              f"{args.reps} calls, 2 repeats; speedup = baseline us / tileship us (>1: tileship faster)",
              "rows": []}
    if "w4a16_linear" in ops:
        result["rows"] += w4a16_rows(release, timer, hbm)
    if "gqa_decode" in ops:
        result["rows"] += gqa_rows(release, timer, hbm)
    if "add_rmsnorm" in ops:
        result["rows"] += add_rmsnorm_rows(release, timer, hbm)
    if "gqa_decode_paged" in ops:
        result["rows"] += paged_rows(release, timer, hbm)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
