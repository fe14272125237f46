"""Served latency vs the best path, for every declared shape of a release (every candidate counted).

    PYTHONPATH=src python benchmarks/served_vs_best.py RELEASE [--routing evidence] [--out served.json]

For each group this machine runs (operator x dtype x shape or range x target; CUDA on a GPU
host, else "c") and each of its shapes (the tuned bucket points; else the sizes verification
recorded; else the verification points), times on the same rotating inputs, in interleaved
rounds whose first path changes every round (``tileship.verify.timing.measure``: CUDA events /
perf_counter; median of the round medians, spread = ``timing.round_spread`` of them):

    served       release.op(name)(*inputs): the dispatcher, whichever path it picks
    kernel:<id>  each candidate alone, through a dispatcher serving only it (its best served path:
                 the release's compiled dispatch table where the served operator has one)
    reference    the PyTorch reference alone (the operator's best PyTorch path)

and prints served / best per shape; the target is <= 1.05. On CUDA each shape also records the
host's state while it was timed (``host_probe_us``: ``verify.latency.HostGauge``'s probe, us per
launch, median of 16), so that a run can be set beside the tune that made its table. A difference within the larger of
the two spreads is "not resolved" and counts as met (both counts are printed). A candidate that
failed verification at that shape is not a candidate for best (it is wrong). Exit 1 when a
resolved miss remains. Never compiles (the no-JIT guard counts attempts; printed at the end).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

TARGET = 1.05


def _interleaved(
    paths: dict[str, Any], sets: list[Any], device: str, budget_ms: float, rounds: int
) -> dict[str, tuple[float, float, list[float]]]:
    """name -> (median of the round medians, spread = ``round_spread`` of them, the round medians);
    the paths take turns, the first one changing every round, so drift in clocks or temperature
    hits all of them alike."""
    from tileship.verify.timing import measure, round_spread

    names = list(paths)
    meds: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            meds[n].append(measure(paths[n], sets, device=device, budget_ms=budget_ms, warmup_ms=10.0).median_us)
    return {n: (statistics.median(v), round_spread(v), v) for n, v in meds.items()}


def paired_ratio(served: list[float], best: list[float]) -> float:
    """The median over rounds of served / best in the same round: a host whose speed changes
    between rounds (on the H200 host whole rounds move by 3-4 us) moves both sides of a round
    together, where it moves the two medians apart."""
    return statistics.median(s / b for s, b in zip(served, best, strict=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("release", type=Path)
    ap.add_argument("--routing", choices=("pinned", "evidence"), default="evidence")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    ap.add_argument(
        "--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda when there is a GPU, else cpu"
    )
    ap.add_argument(
        "--budget-ms", type=float, default=60.0, help="measured ms per timing run (each callable is timed twice)"
    )
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per shape (spread = noise)")
    ap.add_argument("--limit", type=int, default=None, help="cap on T.dynamic sizes when there is no evidence")
    args = ap.parse_args(argv)

    import torch

    from tileship.declare.inputs import shapes_of, verification_points
    from tileship.declare.spec import Target, tensor_dtypes
    from tileship.release import evidence, tuning
    from tileship.runtime import nojit
    from tileship.runtime.loader import load, load_artifact
    from tileship.verify.latency import HostGauge
    from tileship.verify.spec_check import dynamic_block
    from tileship.verify.timing import rotation_sets
    from tileship.verify.tune import _runner, served_table

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    gauge = HostGauge("cuda") if device == "cuda" else None
    if gauge is not None:
        gauge.calibrate()
    release = load(args.release, routing=args.routing)
    ev = evidence.read(args.release) or {}
    ev_specs = ev.get("specializations", {})
    rows: list[dict[str, Any]] = []
    print(
        f"release {release.release_id}, routing {args.routing}, device {device}"
        + (f" ({torch.cuda.get_device_name(0)})" if device == "cuda" else "")
    )
    for note in release.notes:
        print(f"note: {note}")
    header = (
        f"{'group':40s} {'shape':22s} {'path:what':36s} {'served':>10s} {'best':>10s} {'best path':28s} "
        f"{'reference':>10s} {'ratio':>6s}"
    )
    print(header)
    print("-" * len(header))
    tuned = tuning.table(ev, lock_digest=release.lock_digest, release_id=release.release_id)
    for name, runner in release.ops.items():
        desc = release.declarations[name]
        groups: dict[str, list[Any]] = {}
        for entry in runner.entries:
            if entry.spec is not None and Target(entry.spec.target).device_type == device:
                groups.setdefault(entry.spec.group_id, []).append(entry.spec)
        for gid, specs in groups.items():
            spec0 = specs[0]
            group = tuned.get(gid)
            recorded = ev_specs.get(spec0.id)
            if group is not None:
                points = [p["dims"] for p in group["points"]]
            elif recorded and recorded.get("points"):
                points = [p["dims"] for p in recorded["points"]]
            else:
                block = dynamic_block({**desc.get("config", {}), **dict(spec0.config)}, spec0.dynamic_dim)
                points = verification_points(spec0, block=block, limit=args.limit)
            alone = {}
            table = served_table(args.release, [e.kernel for e in runner.entries])
            for spec in specs:
                try:
                    kernel = load_artifact(args.release / "specs" / spec.id, spec.id)
                    alone[spec.candidate or "default"] = (
                        spec,
                        _runner(desc, name, runner.reference, spec, kernel, table),
                    )
                except Exception as exc:  # noqa: BLE001 -- not built / not loadable: not a candidate for best
                    print(f"note: {spec.id} not measured: {type(exc).__name__}: {exc}")
            for dims in points:
                first = runner.sample_inputs(dims, spec0.dtype, device, 0)
                out_shapes = shapes_of([(n, d) for n, d, *_ in desc["outputs"]], dims)
                out_bytes = sum(
                    int(torch.Size(s).numel()) * torch.empty((), dtype=getattr(torch, dt)).element_size()
                    for s, dt in zip(out_shapes, tensor_dtypes(desc, "outputs", spec0.dtype), strict=True)
                )

                def fresh(i: int, d: dict[str, int] = dims, r: Any = runner, dtype: str = spec0.dtype) -> list[Any]:
                    return r.sample_inputs(d, dtype, device, i)

                sets = rotation_sets(first, fresh, device=device, out_bytes=out_bytes)
                _, decision = runner.call(*first)
                point = tuning.point_for(group, dims) if group is not None else None
                verified = {}
                for cid, (spec, _) in alone.items():
                    if point is not None:
                        verified[cid] = bool((point["candidates"].get(cid) or {}).get("passed"))
                    else:
                        rec = ev_specs.get(spec.id)
                        verified[cid] = not rec or bool(rec.get("passed"))
                paths = {
                    "served": runner,
                    "reference": runner.reference,
                    **{f"kernel:{cid}": r for cid, (_, r) in alone.items() if verified[cid]},
                }
                t = _interleaved(paths, sets, device, args.budget_ms, args.rounds)
                probe_us = None if gauge is None else statistics.median(gauge.probe() for _ in range(16))
                best_name = min((n for n in t if n != "served"), key=lambda n: t[n][0])
                served, s_spread, s_rounds = t["served"]
                best, b_spread, b_rounds = t[best_name]
                ratio = served / best
                paired = paired_ratio(s_rounds, b_rounds)
                resolved = served - best > max(s_spread, b_spread)
                met = ratio <= TARGET or not resolved
                shown = ",".join(f"{k}={v}" for k, v in dims.items())
                rows.append(
                    {
                        "group": gid,
                        "spec_id": decision.spec_id,
                        "dims": dict(dims),
                        "path": decision.path,
                        "reason": decision.reason,
                        "served_us": served,
                        "reference_us": t["reference"][0],
                        "kernels_us": {n.split(":", 1)[1]: v[0] for n, v in t.items() if n.startswith("kernel:")},
                        "spread_us": {n: v[1] for n, v in t.items()},
                        "best": best_name,
                        "best_us": best,
                        "ratio": ratio,
                        "resolved": resolved,
                        "within_target": met,
                        "paired_ratio": paired,
                        "within_target_paired": paired <= TARGET,
                        "round_medians_us": {n: v[2] for n, v in t.items()},
                        "unverified": sorted(c for c, ok in verified.items() if not ok),
                        "host_probe_us": probe_us,
                    }
                )
                flag = "" if ratio <= TARGET else ("  <-- over target" if resolved else "  (over, not resolved)")
                served_by = decision.spec_id.rsplit(".", 1)[-1] if decision.path == "kernel" else decision.reason
                print(
                    f"{gid:40s} {shown:22s} {decision.path + ':' + served_by:36s} {served:10.1f} {best:10.1f} "
                    f"{best_name:28s} {t['reference'][0]:10.1f} {ratio:6.3f} paired {paired:6.3f}{flag}"
                )
                del sets, first
            del alone
    over = [r for r in rows if not r["within_target"]]
    strict = [r for r in rows if r["ratio"] > TARGET]
    kernel_best = [r for r in rows if r["best"].startswith("kernel:")]
    kernel_served = [r for r in rows if r["path"] == "kernel"]
    summary = {
        "shapes": len(rows),
        "within_target": len(rows) - len(over),
        "within_target_strict": len(rows) - len(strict),
        "target": TARGET,
        "worst_ratio": max((r["ratio"] for r in rows), default=None),
        "worst_resolved_ratio": max((r["ratio"] for r in rows if r["resolved"]), default=None),
        "kernel_is_best": len(kernel_best),
        "kernel_served": len(kernel_served),
        "compile_attempts": nojit.attempts(),
        "rounds": args.rounds,
        "within_target_paired": sum(r["within_target_paired"] for r in rows),
        "worst_paired_ratio": max((r["paired_ratio"] for r in rows), default=None),
        "host_probe_us": None if gauge is None else {
            "fastest": gauge.best_us, "median": statistics.median(r["host_probe_us"] for r in rows) if rows else None},
    }
    print(
        f"\n{summary['within_target']}/{summary['shapes']} shapes within {TARGET:.2f}x of the best path or within the "
        f"noise ({summary['within_target_strict']} by the ratio alone); worst ratio "
        f"{summary['worst_ratio'] if summary['worst_ratio'] is None else round(summary['worst_ratio'], 3)} "
        f"(worst resolved {summary['worst_resolved_ratio']}); a kernel is the best path at {len(kernel_best)} shapes "
        f"and serves {len(kernel_served)}; compile attempts {summary['compile_attempts']}"
    )
    print(
        f"paired by round (median of served / best within each round): {summary['within_target_paired']}/"
        f"{summary['shapes']} within {TARGET:.2f}x; worst {summary['worst_paired_ratio']}. The exit code follows "
        "the first count"
    )
    if summary["host_probe_us"] is not None:
        print(f"host probe: {summary['host_probe_us']} us per launch (fastest seen, median over shapes)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "release_id": release.release_id,
                    "routing": args.routing,
                    "device": device,
                    "device_fingerprint": evidence.current_device(),
                    "summary": summary,
                    "rows": rows,
                },
                indent=2,
                sort_keys=True,
            )
            + "\n"
        )
    return 1 if over or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
