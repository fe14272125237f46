"""Where eager decode spends host time: the swapped Llama layers beside the PyTorch layers they replace.

    PYTHONPATH=src:. python benchmarks/dev/eager_profile.py --release REL --out DIR [--dtype float16]

The model is ``model_e2e.py``'s (2 layers, hidden 4096, 32 heads, intermediate 11008, vocab 32000,
random weights), one decode token at batch 1. Two measurements, side by side in one process:

1. per layer: ``calls`` back-to-back calls of the PyTorch layer, then of the swapped one, on the
   layer's real decode input, ``rounds`` times alternating; time per call = wall time / calls with
   one synchronisation at the end (so it is max(host, GPU) per call), median and spread (max - min)
   of the rounds. ``swapped - torch`` within the larger spread is printed as "not resolved";
2. one decode step of each model under ``torch.profiler`` (CPU and CUDA activities), 10 steps:
   the top ops by self CPU time, written as text.

Writes DIR/eager_profile.json and DIR/eager_profile.txt. Development script: it explains
``model_e2e.py``'s eager ratio, it sets no target.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def per_call_us(fn: Any, x: Any, calls: int, sync: Any) -> float:
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        fn(x)
    sync()
    return (time.perf_counter() - t) * 1e6 / calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    import tileship
    from examples.llama import LlamaConfig, random_llama
    from tileship.torchops.swap import swap

    dev = args.device
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    release = tileship.load(args.release, allow_unverified=True)
    cfg = LlamaConfig(vocab_size=32000, hidden=4096, n_layers=2, n_heads=32, intermediate=11008, max_seq=16)
    torch_model = random_llama(cfg, dtype=getattr(torch, args.dtype), device=dev, seed=0)
    ts_model = copy.deepcopy(torch_model)
    report = swap(ts_model, release)
    tokens = torch.zeros(1, 1, dtype=torch.long, device=dev)

    # the real decode inputs of each layer, captured from one step of the PyTorch model
    seen: dict[str, Any] = {}
    names = ["layers.0.input_norm", "layers.0.attn.q_proj", "layers.0.mlp.gate_proj", "layers.0.mlp.down_proj", "norm"]

    def keep(name: str) -> Any:
        def hook(_m: Any, inp: tuple[Any, ...], _out: Any) -> None:  # returns None: the output is left alone
            seen.setdefault(name, inp[0].detach().clone())

        return hook

    hooks = [dict(torch_model.named_modules())[n].register_forward_hook(keep(n)) for n in names]
    with torch.inference_mode():
        torch_model(tokens)
    for h in hooks:
        h.remove()

    rows: dict[str, Any] = {}
    device_name = torch.cuda.get_device_name(0) if dev == "cuda" else dev
    lines = [
        f"release {release.release_id}, {args.dtype}, device {device_name}, "
        f"{args.rounds} rounds x {args.calls} calls; us per call (one sync at the end): median (spread)",
        "",
    ]
    with torch.inference_mode():
        mods = {"torch": dict(torch_model.named_modules()), "tileship": dict(ts_model.named_modules())}
        pairs = {n: (mods["torch"][n], mods["tileship"][n]) for n in names}
        pairs["whole decode step"] = (torch_model, ts_model)
        inputs = {**seen, "whole decode step": tokens}
        for n, (tm, km) in pairs.items():
            calls = args.calls if n != "whole decode step" else max(50, args.calls // 20)
            x = inputs[n]
            tm(x), km(x)  # warm
            ts_: list[float] = []
            ks: list[float] = []
            for r in range(args.rounds):
                order = [(tm, ts_), (km, ks)] if r % 2 == 0 else [(km, ks), (tm, ts_)]
                for m, acc in order:
                    acc.append(per_call_us(m, x, calls, sync))
            t_med, k_med = statistics.median(ts_), statistics.median(ks)
            spread = max(max(ts_) - min(ts_), max(ks) - min(ks))
            diff = k_med - t_med
            verdict = f"{diff:+.2f} us" if abs(diff) > spread else f"not resolved ({diff:+.2f}, spread {spread:.2f})"
            rows[n] = {
                "torch_us": t_med,
                "tileship_us": k_med,
                "spread_us": spread,
                "torch_rounds": ts_,
                "tileship_rounds": ks,
                "torch_type": type(tm).__name__,
                "tileship_type": type(km).__name__,
            }
            lines.append(
                f"{n:22s} torch {type(tm).__name__:14s} {t_med:9.2f} ({max(ts_) - min(ts_):.2f})   "
                f"tileship {type(km).__name__:14s} {k_med:9.2f} ({max(ks) - min(ks):.2f})   swapped - torch: {verdict}"
            )
        profiles = {}
        for label, model in (("torch", torch_model), ("tileship", ts_model)):
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
            with profile(activities=acts) as prof:
                for _ in range(10):
                    model(tokens)
                sync()
            profiles[label] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    lines += ["", f"counters after the run: {release.counters()}", ""]
    for label, table in profiles.items():
        lines += [f"--- torch.profiler, 10 decode steps, {label} model (top 25 by self CPU time) ---", table, ""]
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "eager_profile.txt").write_text(text + "\n")
    (args.out / "eager_profile.json").write_text(
        json.dumps(
            {
                "release_id": release.release_id,
                "dtype": args.dtype,
                "rows": rows,
                "swap": report.to_json(),
                "counters": release.counters(),
                "command": " ".join(sys.argv),
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
