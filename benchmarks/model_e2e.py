"""On the GPU host: a Llama-style decoder, pure PyTorch vs tileship kernels, end to end.

Two copies of one random-weight model (hidden 4096, 32 heads of 128, intermediate 11008,
vocab 32000, --layers decoder layers): the pure-PyTorch model, and the same weights with the
release's kernels swapped in (``tileship.torchops.swap``: q/k/v/o and MLP projections -> gemm, the
norms -> rmsnorm, the attention core -> attention, where the release declares the shape).
Each case runs in four modes, for both models:

    eager          the model called from Python
    eager+graph    the eager forward captured once in a torch.cuda.CUDAGraph, then replayed
    compile        torch.compile(fullgraph=True) (inductor), decode batch dim unbacked-dynamic
    compile+graph  the compiled forward captured in a CUDAGraph (or --compile-graph reduce-overhead)

Cases: a prefill (--prefill-batch x --prefill-seq tokens) and decode steps for each
--decode-batches B. A decode step here has NO KV cache: it is the forward of B sequences of
one new token (position 0), so every projection, the MLP and the norms run at M=B, and the
attention attends to that single position, which the catalog attention does not declare
(S=1): it takes the reference (SDPA) path, as the per-case dispatch counters show.

Per case and mode: milliseconds per forward (CUDA events over --iters forwards, median of
--repeats; the two models timed in turns, round by round), ratio = tileship / torch (below 1:
tileship faster), the paired ratio (median of the rounds' ratios, their range, and whether every
round falls on one side of 1), the relative L2 error of the
logits against the eager PyTorch model in the same dtype (tolerance per dtype) and of both
against the float32 model (for scale). Also: the swap report, what each case dispatched, a
host-sync check (one tileship forward under torch.cuda.set_sync_debug_mode("error")).

    PYTHONPATH=/tmp/site:$PWD/src:$PWD python3 benchmarks/model_e2e.py --release DIR --out model_e2e.json   # $PWD: examples/llama

Exit status 0 when every output is within tolerance and nothing failed; 1 otherwise.
"""  # noqa: E501

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODES = ("eager", "eager+graph", "compile", "compile+graph")
#: max relative L2 error of tileship's logits vs the PyTorch model's, same dtype
TOLERANCE = {"float16": 1e-2, "bfloat16": 4e-2, "float32": 1e-4}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", required=True, type=Path, help="the CUDA catalog release directory")
    ap.add_argument("--out", required=True, type=Path, help="JSON results")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=11008)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prefill-batch", type=int, default=1)
    ap.add_argument("--prefill-seq", type=int, default=2048)
    ap.add_argument("--decode-batches", default="1,8,32,64")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile-graph", choices=("capture", "reduce-overhead"), default="capture",
                    help="compile+graph: capture the compiled forward in a CUDAGraph, or use mode='reduce-overhead'")
    ap.add_argument("--require-evidence", action="store_true",
                    help="load without allow_unverified (kernels need verification evidence)")
    ap.add_argument("--names", default="", help="layer kind=operator overrides, e.g. rmsnorm=rmsnorm_cpu")
    ap.add_argument("--serving-only", action="store_true",
                    help="swap(serving_only=True): keep on PyTorch the layers whose kernels all serve the reference")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only dry-runs the script (no graph modes)")
    return ap.parse_args(argv)


def rel_l2(a: Any, b: Any) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


class Timer:
    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.cuda = device == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def ms_per_call(self, fn: Callable[[], Any], iters: int, repeats: int) -> float:
        torch = self.torch
        fn()
        fn()
        self.sync()
        samples = []
        for _ in range(repeats):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(iters):
                    fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / iters)
            else:
                t = time.perf_counter()
                for _ in range(iters):
                    fn()
                samples.append((time.perf_counter() - t) * 1e3 / iters)
        return statistics.median(samples)


def capture(fn: Callable[[Any], Any], static_in: Any) -> tuple[Callable[[], Any], Any]:
    """Warm ``fn`` up on a side stream, capture one call in a CUDAGraph; returns (replay, static output)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(static_in)
    return graph.replay, out


def counters_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for op, counts in after.items():
        d = {k: v - before.get(op, {}).get(k, 0) for k, v in counts.items()}
        d = {k: v for k, v in d.items() if v}
        if d:
            out[op] = d
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    import torch
    from torch._dynamo.utils import counters

    import tileship
    from examples.llama import LlamaConfig, random_llama
    from tileship.runtime import nojit
    from tileship.torchops.custom_ops import register
    from tileship.torchops.swap import swap

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run this on the GPU host (or --device cpu for a dry run)", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    if device != "cuda":
        modes = [m for m in modes if "graph" not in m]
    names = dict(kv.split("=", 1) for kv in args.names.split(",") if kv)
    for knob in ("recompile_limit", "cache_size_limit"):  # both models share Llama.forward's code object
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    release = tileship.load(args.release, allow_unverified=not args.require_evidence)
    register(release)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden=args.hidden, n_layers=args.layers, n_heads=args.heads,
                      intermediate=args.intermediate, max_seq=max(args.prefill_seq, 16))
    cases = [(f"prefill_b{args.prefill_batch}_s{args.prefill_seq}", args.prefill_batch, args.prefill_seq)]
    cases += [(f"decode_b{b}", int(b), 1) for b in args.decode_batches.split(",") if b]
    timer = Timer(device)
    result: dict[str, Any] = {
        "host": {"gpu": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor(),
                 "torch": torch.__version__, "python": platform.python_version()},
        "release": {"id": release.release_id, "kernel_revision": release.kernel_revision, "status": release.status(),
                    "decisions": release.decisions()},
        "config": {**cfg.__dict__, "head_dim": cfg.head_dim, "modes": modes, "iters": args.iters,
                   "repeats": args.repeats, "compile_graph": args.compile_graph,
                   "allow_unverified": not args.require_evidence},
        "decode_note": "decode_bB = forward of B sequences of 1 new token, no KV cache; attention at S=1 is not in the "
                       "catalog and runs the reference (SDPA) in both models",
        "ratio_note": "ratio = tileship ms / torch ms in the same mode (below 1: tileship faster)",
        "dtypes": {},
    }
    failures: list[str] = []

    def flush() -> None:  # after every case: a run cut short by a time limit keeps what it measured
        result["failures"] = failures
        result["seconds"] = round(time.perf_counter() - t_start, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")

    t = time.perf_counter()
    base = random_llama(cfg, dtype=torch.float32, device=device, seed=0)
    result["weights_s"] = round(time.perf_counter() - t, 1)
    inputs = {name: torch.randint(0, cfg.vocab_size, (b, s), generator=torch.Generator().manual_seed(i)).to(device)
              for i, (name, b, s) in enumerate(cases)}
    with torch.inference_mode():
        fp32_logits = {name: base(x).float().cpu() for name, x in inputs.items()}

    for dtype_name in [d for d in args.dtypes.split(",") if d]:
        dtype = getattr(torch, dtype_name)
        tol = TOLERANCE[dtype_name]
        ref = copy.deepcopy(base).to(dtype)
        ts = copy.deepcopy(base).to(dtype)
        report = swap(ts, release, names=names, serving_only=args.serving_only)
        print(report)
        entry: dict[str, Any] = {"tolerance_rel_l2": tol, "swap": report.to_json(), "cases": {}}
        result["dtypes"][dtype_name] = entry
        models = {"torch": ref, "tileship": ts}

        if device == "cuda":  # no host synchronisation on the kernel path: a sync raises in this mode
            sync_check: dict[str, Any] = {}
            for name, x in inputs.items():
                try:
                    with torch.inference_mode():
                        torch.cuda.synchronize()
                        torch.cuda.set_sync_debug_mode("error")
                        try:
                            ts(x)
                        finally:
                            torch.cuda.set_sync_debug_mode("default")
                    sync_check[name] = "ok"
                except RuntimeError as exc:  # recorded, not fatal: the timing is still worth having
                    sync_check[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    failures.append(f"{dtype_name} {name}: host sync on the tileship path")
            entry["sync_check"] = sync_check

        # one wrapper per model and kind; fullgraph: a graph break is an error, not a silent slowdown
        plain = {label: torch.compile(model, fullgraph=True) for label, model in models.items()}
        graphed = plain if args.compile_graph == "capture" else {
            label: torch.compile(model, fullgraph=True, mode="reduce-overhead") for label, model in models.items()}
        torch._dynamo.reset()
        counters.clear()
        compile_s: dict[str, float] = {}

        for name, batch, seq in cases:
            x = inputs[name]
            case: dict[str, Any] = {"batch": batch, "seq": seq, "tokens": batch * seq, "modes": {}}
            entry["cases"][name] = case
            with torch.inference_mode():
                want = ref(x)
                before = release.counters()
                got = ts(x)
                timer.sync()
                case["dispatch_eager"] = counters_delta(before, release.counters())
                case["torch_vs_fp32_rel_l2"] = rel_l2(want.float().cpu(), fp32_logits[name])
                case["tileship_vs_fp32_rel_l2"] = rel_l2(got.float().cpu(), fp32_logits[name])
                del got
                for mode in modes:
                    row: dict[str, Any] = {}
                    case["modes"][mode] = row
                    fns: dict[str, Callable[[], Any]] = {}
                    for label, model in models.items():
                        try:
                            compiled = graphed[label] if mode == "compile+graph" else plain[label]
                            fn, out, extra = _prepare(mode, label, model, compiled, x, seq, args.compile_graph,
                                                      compile_s, release, timer)
                            row.update(extra)
                            err = rel_l2(out.float(), want.float())
                            row[f"{label}_rel_l2"] = err
                            fns[label] = fn
                            if label == "tileship" and not err <= tol:
                                failures.append(f"{dtype_name} {name} {mode}: rel L2 {err:.2e} > {tol:.0e}")
                            del fn, out
                        # one mode failing (a compile error) must not lose the others
                        except Exception as exc:  # noqa: BLE001
                            row[f"{label}_error"] = f"{type(exc).__name__}: {exc}"[:2000]
                            traceback.print_exc()
                            failures.append(f"{dtype_name} {name} {mode} {label}: {type(exc).__name__}")
                    iters = args.iters if seq == 1 else max(5, args.iters // 2)
                    # reduce-overhead graphs of two models are not stepped in turns (cudagraph trees re-record)
                    row.update(time_rows(timer, fns, iters, args.repeats,
                                         paired=not (mode == "compile+graph" and args.compile_graph != "capture")))
                    del fns
                    if device == "cuda":
                        torch.cuda.empty_cache()
                    if "torch_ms" in row and "tileship_ms" in row:
                        row["ratio"] = round(row["tileship_ms"] / row["torch_ms"], 3)
                        row["ok"] = row["tileship_rel_l2"] <= tol
                    paired = (f"  paired {row['ratio_paired']:.3f} [{row['ratio_range'][0]:.3f}, "
                              f"{row['ratio_range'][1]:.3f}]{'' if row['ratio_resolved'] else ' not resolved'}"
                              if "ratio_paired" in row else "")
                    print(f"{dtype_name:9s} {name:22s} {mode:14s} torch {row.get('torch_ms', float('nan')):9.3f} ms  "
                          f"tileship {row.get('tileship_ms', float('nan')):9.3f} ms  ratio "
                          f"{row.get('ratio', float('nan')):6.3f}  "
                          f"rel_l2 {row.get('tileship_rel_l2', float('nan')):.2e}{paired}", flush=True)
            flush()
        entry["compile_s"] = {k: round(v, 1) for k, v in compile_s.items()}
        entry["counters_total"] = release.counters()
        entry["dynamo_stats"] = dict(counters["stats"])
        if not any(c.get("kernel:kernel") for c in entry["counters_total"].values()):
            failures.append(f"{dtype_name}: no tileship kernel ran (see release.status and release.decisions): the "
                            "ratios compare torch with torch")
        del ref, ts, plain, graphed, models
        torch._dynamo.reset()
        if device == "cuda":
            torch.cuda.empty_cache()

    result["compile_attempts"] = nojit.attempts()
    flush()
    print(f"wrote {args.out}; {len(failures)} failure(s); {result['seconds']} s")
    for f in failures:
        print("  FAIL", f)
    return 0 if not failures else 1


def time_rows(timer: Timer, fns: dict[str, Callable[[], Any]], iters: int, repeats: int,
              paired: bool) -> dict[str, Any]:
    """``<label>_ms`` (median of ``repeats`` timings of ``iters`` calls) for each of ``fns``. ``paired``:
    the models are timed in turns, one timing each per round, so a change of the host's speed during
    the case falls on both; with torch and tileship both there, also ``ratio_paired`` (the median of the
    rounds' tileship / torch), ``ratio_range`` (their min and max) and ``ratio_resolved`` (every round
    on the same side of 1; otherwise the ratio is not resolved)."""
    samples: dict[str, list[float]] = {label: [] for label in fns}
    if paired:
        for _ in range(repeats):
            for label, fn in fns.items():
                samples[label].append(timer.ms_per_call(fn, iters, 1))
    else:
        for label, fn in fns.items():
            samples[label].append(timer.ms_per_call(fn, iters, repeats))
    out: dict[str, Any] = {f"{label}_ms": round(statistics.median(v), 4) for label, v in samples.items()}
    if paired and {"torch", "tileship"} <= samples.keys():
        ratios = [t / r for t, r in zip(samples["tileship"], samples["torch"], strict=True)]
        out["ratio_paired"] = round(statistics.median(ratios), 3)
        out["ratio_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        out["ratio_resolved"] = min(ratios) > 1 or max(ratios) < 1
    return out


def _prepare(mode: str, label: str, model: Any, compiled: Any, x: Any, seq: int, compile_graph: str,
             compile_s: dict[str, float], release: Any, timer: Timer) -> tuple[Callable[[], Any], Any, dict[str, Any]]:
    """(a no-argument forward to time, its output, extra facts) for one model in one mode."""
    import torch

    from tileship.torchops.custom_ops import mark_dynamic

    extra: dict[str, Any] = {}
    if mode == "eager":
        return (lambda: model(x)), model(x), extra
    if mode == "eager+graph":
        static_in = x.clone()  # the graph reads this buffer's address: it must outlive the graph
        replay, out = capture(model, static_in)
        replay()
        return (lambda: (replay(), static_in)[0]), out.clone(), extra
    xin = x.clone()
    if seq == 1:
        mark_dynamic(xin, 0)  # one decode graph for every batch size, 1 included
    reduce_overhead = mode == "compile+graph" and compile_graph == "reduce-overhead"
    key = f"{label}:{'prefill' if seq > 1 else 'decode'}" + (":reduce-overhead" if reduce_overhead else "")
    if key not in compile_s:  # the first call compiles (or reuses the graph a previous case compiled)
        t = time.perf_counter()
        compiled(xin)
        timer.sync()
        compile_s[key] = time.perf_counter() - t
    if mode == "compile":
        before = release.counters()
        out = compiled(xin)
        timer.sync()
        if label == "tileship":
            extra["dispatch"] = counters_delta(before, release.counters())
        return (lambda: compiled(xin)), out.clone(), extra
    if reduce_overhead:
        def step() -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(xin)

        return step, step().clone(), extra
    replay, out = capture(compiled, xin)
    replay()
    return (lambda: (replay(), xin)[0]), out.clone(), extra  # keep the captured input alive


if __name__ == "__main__":
    raise SystemExit(main())
