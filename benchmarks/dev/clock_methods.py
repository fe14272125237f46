"""Which clock do tune and served_vs_best read? Five timing methods side by side (development, issue 13).

    python benchmarks/dev/clock_methods.py RELEASE OUT.json [--rounds 5] [--shapes all|quick]

Tune kept cuBLAS at GEMM shapes of 15-35 us where served_vs_best, in the next process, found a
candidate kernel faster (round 14: bf16 N=K=4096, M=1-16: reference 26.5-28 us there, 17-19 us in
tune; the kernel 18.5-21.8 us). This times the same paths on the same inputs with every method the
two scripts (and a serving request) could be said to use, interleaved per round, paths and methods
in rotating order:

    svb    ``verify.measure`` without a flush (served_vs_best.py: budget 15 ms, warm-up 10 ms)
    tune   ``verify.measure`` with the L2 flush (tune: budget 20 ms, warm-up 10 ms)
    gpu    one call queued behind a flush, CUDA events around it: the device's time alone
    host   host time to issue 32 calls with no sync (the GPU is not waited for), per call
    iso    one call then a sync, host clock: an isolated request's latency
    lat    ``verify.latency`` (tune's clock since round 15): max(lat_host, lat_dev), its two parts
           timed apart in one loop (lat_host: p10 of the host's issue time per call; lat_dev:
           median device time per call, the calls queued behind a device sleep)

Paths: ``reference`` (the operator's reference called directly, as served_vs_best's best path),
``reference (dispatcher)`` (a dispatcher that serves only the reference: what tune times),
``served`` (the release's own dispatcher, ``--routing pinned``, its compiled table), each
candidate through a dispatcher of its own with the release's table (``kernel:<id>``: what both
scripts time now), and the first candidate through one without it (``kernel (python):<id>``: what
both timed before).

Prints one table per shape (median over rounds, and the spread max - min of the round medians) and
writes every round's number to OUT.json with the script, the command and the release id.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

QUICK = [
    ("gemm", "bfloat16", {"M": 1, "K": 4096, "N": 4096}),
    ("gemm", "bfloat16", {"M": 8, "K": 4096, "N": 4096}),
    ("gemm", "float16", {"M": 2, "K": 4096, "N": 4096}),
    ("gemm", "float16", {"M": 8, "K": 11008, "N": 4096}),
]
ALL = QUICK + [
    ("gemm", "bfloat16", {"M": 2, "K": 4096, "N": 4096}),
    ("gemm", "bfloat16", {"M": 16, "K": 4096, "N": 4096}),
    ("gemm", "bfloat16", {"M": 64, "K": 4096, "N": 4096}),
    ("gemm", "bfloat16", {"M": 256, "K": 4096, "N": 4096}),
    ("gemm", "float16", {"M": 1, "K": 4096, "N": 4096}),
    ("gemm", "float16", {"M": 32, "K": 11008, "N": 4096}),
    ("gemm", "bfloat16", {"M": 4, "K": 4096, "N": 11008}),
    ("rmsnorm", "bfloat16", {"M": 512, "N": 4096}),
]
METHODS = ("svb", "tune", "gpu", "host", "iso", "lat", "lat_host", "lat_dev")


def _method(name: str, fn: Any, sets: list[Any], flush: Any, device: str) -> float:
    import torch

    from tileship.verify.timing import measure

    if name == "svb":
        return measure(fn, sets, device=device, budget_ms=15.0, warmup_ms=10.0).median_us
    if name == "tune":
        return measure(fn, sets, device=device, budget_ms=20.0, warmup_ms=10.0, max_repeats=40, flush=flush).median_us
    if name.startswith("lat"):  # tune's latency clock since round 15 (verify.latency), and its two parts
        from tileship.verify.latency import latency

        lat = latency(fn, sets, device=device, budget_ms=20.0, warmup_ms=10.0, max_repeats=40, flush=flush)
        return {"lat": lat.latency_us, "lat_host": lat.host_us, "lat_dev": lat.device_us}[name]
    n = len(sets)
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for i in range(3):
        fn(*sets[i % n])
    sync()
    vals: list[float] = []
    if name == "gpu":
        if not cuda:
            return float("nan")
        for r in range(40):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            flush.zero_()  # the device is busy with this while the host queues the events and the call
            a.record()
            fn(*sets[r % n])
            b.record()
            b.synchronize()
            vals.append(a.elapsed_time(b) * 1e3)
    elif name == "host":
        for r in range(15):
            sync()
            t0 = time.perf_counter_ns()
            for i in range(32):
                fn(*sets[(r + i) % n])
            vals.append((time.perf_counter_ns() - t0) / 32e3)
        sync()
    else:  # iso
        for r in range(40):
            sync()
            t0 = time.perf_counter_ns()
            fn(*sets[r % n])
            sync()
            vals.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(vals)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("release", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", choices=("all", "quick"), default="all")
    ap.add_argument("--shape", action="append", default=[],
                    help="OP:DTYPE:D=V,... instead of the built-in list (e.g. add:float32:N=1024 for a CPU smoke run)")
    args = ap.parse_args(argv)

    import torch

    from tileship.declare.spec import Target
    from tileship.runtime.loader import load, load_artifact
    from tileship.verify.timing import l2_flush_buffer, rotation_sets
    from tileship.verify.tune import _runner, served_table

    device = "cuda" if torch.cuda.is_available() else "cpu"
    release = load(args.release, routing="pinned")
    flush = l2_flush_buffer(device)
    shapes = [(o, t, {k: int(v) for k, v in (kv.split("=") for kv in d.split(","))})
              for o, t, d in (s.split(":") for s in args.shape)] or (QUICK if args.shapes == "quick" else ALL)
    rows: list[dict[str, Any]] = []
    where = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(f"release {release.release_id}, {where}; us per call, median over {args.rounds} rounds (spread max - min)")
    for op, dtype, dims in shapes:
        runner = release.ops[op]
        desc = release.declarations[op]
        specs = [e.spec for e in runner.entries if e.spec is not None and e.spec.dtype == dtype
                 and Target(e.spec.target).device_type == device]
        specs = [s for s in specs if all(not isinstance(v, int) or v == dims.get(d) for d, v in s.dims)]
        if not specs:
            print(f"{op} {dtype} {dims}: no specialization covers it; skipped")
            continue
        table = served_table(args.release, [e.kernel for e in runner.entries])
        paths: dict[str, Any] = {"reference": runner.reference,
                                 "reference (dispatcher)": _runner(desc, op, runner.reference, specs[0], None, table),
                                 "served": runner}
        for i, spec in enumerate(specs):
            kernel = load_artifact(args.release / "specs" / spec.id, spec.id)
            paths[f"kernel:{spec.candidate or 'default'}"] = _runner(desc, op, runner.reference, spec, kernel, table)
            if i == 0:  # the same through the Python path: how tune and served_vs_best timed before this
                paths[f"kernel (python):{spec.candidate or 'default'}"] = _runner(desc, op, runner.reference, spec,
                                                                                  kernel)
        first = runner.sample_inputs(dims, dtype, device, 0)
        sets = rotation_sets(first, lambda i, d=dims, r=runner, t=dtype: r.sample_inputs(d, t, device, i),
                             device=device, out_bytes=0)
        _, decision = runner.call(*first)
        res: dict[str, dict[str, list[float]]] = {p: {m: [] for m in METHODS} for p in paths}
        names = list(paths)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            methods = METHODS[r % len(METHODS):] + METHODS[: r % len(METHODS)]
            for p in order:
                for m in methods:
                    res[p][m].append(_method(m, paths[p], sets, flush, device))
        shown = ",".join(f"{k}={v}" for k, v in dims.items())
        print(f"\n{op} {dtype} {shown} (served: {decision.path}:{decision.reason} {decision.spec_id})")
        print(f"  {'path':62s}" + "".join(f"{m:>16s}" for m in METHODS))
        for p in names:
            cells = "".join(f"{statistics.median(v):9.1f} ({max(v) - min(v):4.1f})" for v in res[p].values())
            print(f"  {p[:62]:62s}{cells}")
        rows.append({"op": op, "dtype": dtype, "dims": dims, "served": [decision.path, decision.reason,
                                                                         decision.spec_id], "rounds_us": res})
        del sets, first
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"script": "benchmarks/dev/clock_methods.py", "command": " ".join(sys.argv),
                                    "release_id": release.release_id, "methods": METHODS, "rows": rows},
                                   indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
