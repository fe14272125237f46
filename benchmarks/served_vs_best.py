"""Served latency vs the faster of kernel and reference, for every declared shape of a release.

    PYTHONPATH=src python benchmarks/served_vs_best.py RELEASE [--routing evidence] [--out served.json]

For each specialization this machine runs (CUDA on a GPU host, else "c") and each declared
shape (a static shape; for a ``T.dynamic`` range the sizes verification recorded, or the
verification points when there is no evidence), times three callables on the same rotating
inputs with ``tileship.verify.verify.measure`` (CUDA events / perf_counter, median of two runs):

    served     release.op(name)(*inputs): the dispatcher, whichever path it picks
    kernel     the TileLang kernel object alone (loaded from the bundle, no dispatch)
    reference  the PyTorch reference alone

and prints served / min(kernel, reference) per shape; the target is <= 1.05. A kernel that
failed verification is not a candidate for "best" (it is wrong). Exit 1 when any shape
misses the target. Never compiles (the no-JIT guard counts attempts; printed at the end).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

TARGET = 1.05


def _median_of_two(fn: Any, sets: list[Any], device: str, budget_ms: float) -> tuple[float, float]:
    """(median, repeat difference) over two measurement runs of ``fn``."""
    from tileship.verify.verify import measure

    a = measure(fn, sets, device=device, budget_ms=budget_ms)
    b = measure(fn, sets, device=device, budget_ms=budget_ms)
    return statistics.median(a.samples + b.samples), abs(a.median_us - b.median_us)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("release", type=Path)
    ap.add_argument("--routing", choices=("pinned", "evidence"), default="evidence")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda when there is a GPU, else cpu")
    ap.add_argument("--budget-ms", type=float, default=60.0, help="measured ms per timing run (each callable is timed twice)")
    ap.add_argument("--limit", type=int, default=None, help="cap on T.dynamic sizes when there is no evidence")
    args = ap.parse_args(argv)

    import torch

    from tileship.declare.inputs import shapes_of, verification_points
    from tileship.declare.spec import Target, tensor_dtypes
    from tileship.release import evidence
    from tileship.runtime import nojit
    from tileship.runtime.loader import load, load_artifact
    from tileship.verify.timing import rotation_sets
    from tileship.verify.verify import dynamic_block

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    release = load(args.release, routing=args.routing)
    ev = evidence.read(args.release) or {}
    ev_specs = ev.get("specializations", {})
    rows: list[dict[str, Any]] = []
    print(f"release {release.release_id}, routing {args.routing}, device {device}"
          + (f" ({torch.cuda.get_device_name(0)})" if device == "cuda" else ""))
    for note in release.notes:
        print(f"note: {note}")
    header = f"{'specialization':44s} {'shape':22s} {'path:reason':40s} {'served':>10s} {'kernel':>10s} {'reference':>10s} {'ratio':>6s}"
    print(header)
    print("-" * len(header))
    for name, runner in release.ops.items():
        desc = release.declarations[name]
        for entry in runner.entries:
            spec = entry.spec
            if spec is None or Target(spec.target).device_type != device:
                continue
            recorded = ev_specs.get(spec.id)
            if recorded and recorded.get("points"):
                points = [p["dims"] for p in recorded["points"]]
            else:
                points = verification_points(spec, block=dynamic_block(desc.get("config", {}), spec.dynamic_dim), limit=args.limit)
            kernel = load_artifact(args.release / "specs" / spec.id, spec.id)
            kernel_ok = not recorded or bool(recorded.get("passed"))
            for dims in points:
                first = runner.sample_inputs(dims, spec.dtype, device, 0)
                out_shapes = shapes_of([(n, d) for n, d, *_ in desc["outputs"]], dims)
                out_bytes = sum(int(torch.Size(s).numel()) * torch.empty((), dtype=getattr(torch, dt)).element_size()
                                for s, dt in zip(out_shapes, tensor_dtypes(desc, "outputs", spec.dtype), strict=True))

                def fresh(i: int, d: dict[str, int] = dims, r: Any = runner, dtype: str = spec.dtype) -> list[Any]:
                    return r.sample_inputs(d, dtype, device, i)

                sets = rotation_sets(first, fresh, device=device, out_bytes=out_bytes)
                _, decision = runner.call(*first)
                served, s_noise = _median_of_two(runner, sets, device, args.budget_ms)
                kern, k_noise = _median_of_two(kernel, sets, device, args.budget_ms)
                ref, r_noise = _median_of_two(runner.reference, sets, device, args.budget_ms)
                best = min(kern, ref) if kernel_ok else ref
                ratio = served / best
                shown = ",".join(f"{k}={v}" for k, v in dims.items())
                rows.append({"spec_id": spec.id, "dims": dict(dims), "path": decision.path, "reason": decision.reason,
                             "served_us": served, "kernel_us": kern, "reference_us": ref, "kernel_verified": kernel_ok,
                             "best": "kernel" if kernel_ok and kern <= ref else "reference", "ratio": ratio,
                             "repeat_noise_us": {"served": s_noise, "kernel": k_noise, "reference": r_noise}})
                flag = "" if ratio <= TARGET else "  <-- over target"
                print(f"{spec.id:44s} {shown:22s} {decision.path + ':' + decision.reason:40s} {served:10.1f} {kern:10.1f} {ref:10.1f} {ratio:6.3f}{flag}")
                del sets, first
            del kernel
    over = [r for r in rows if r["ratio"] > TARGET]
    summary = {"shapes": len(rows), "within_target": len(rows) - len(over), "target": TARGET,
               "worst_ratio": max((r["ratio"] for r in rows), default=None), "compile_attempts": nojit.attempts()}
    print(f"\n{summary['within_target']}/{summary['shapes']} shapes within {TARGET:.2f}x of the faster path; "
          f"worst {summary['worst_ratio'] if summary['worst_ratio'] is None else round(summary['worst_ratio'], 3)}; "
          f"compile attempts {summary['compile_attempts']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"release_id": release.release_id, "routing": args.routing, "device": device,
                                        "device_fingerprint": evidence.current_device(), "summary": summary, "rows": rows},
                                       indent=2, sort_keys=True) + "\n")
    return 1 if over or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
