"""Runtime overhead, measured side by side in one process (issue 14).

1. Host time per call at a small shape of each operator (where the host, not the device,
   decides the latency), rows:
     floor           the compiled entry point called with pre-packed arguments and a preallocated
                     output: ctypes pointers (the "c" target's cython library) or the tvm-ffi
                     function with tensors (CUDA); no cuLaunchKernel row (no cuda-python here)
     tilelang        TileLang's adapter: ``kernel(*args)``
     kernel          tileship's kernel path: ``release.op(name)(*args)`` (the release's compiled
                     dispatch table where it has one, ``runtime.native``; else the fast launcher)
     kernel (python) the same specialization through a dispatcher without the table (the Python
                     key, memo lookup and fast launcher), only where the table serves ``kernel``
     kernel out=     the same, writing into a preallocated ``out``
     reference       tileship's reference path (the dispatcher, then the PyTorch reference)
     reference (table)  the same through a compiled table (the key's route row, then the reference),
                     only where the release has the table
     torch           PyTorch's own op: the operator's reference called directly (``torch.add``,
                     ``F.rms_norm``), and ``torch.add(out=)`` for an add
   and, per operator, ``reference - torch``: what the dispatcher adds on the reference route.
   Each round times ``--calls`` back-to-back calls with ``time.perf_counter_ns`` (one device
   sync at the ends on CUDA: a device-bound row shows device time); rows are interleaved and
   their order rotated per round. A row reports the median and the spread (max - min) of its
   rounds. A difference between two rows is taken per round (paired) and reported as
   "not resolved" when its rounds do not all agree in sign, never as a number. No
   torch.profiler / CUPTI cross-check of the launch is done by this script.
2. ``--load``: load time per specialization, from the bundle (no JIT, no re-trace) vs
   ``tilelang.compile`` from an empty TileLang cache and from its warm disk cache (fresh child).

    python benchmarks/runtime_overhead.py --release PATH [--device cpu|cuda] [--rounds 15]
        [--calls 4000] [--load] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
import tilelang
from tilelang.cache import kernel_cache
from tileship.build.worker import find_operator
from tileship.declare.factory import trace
from tileship.declare.spec import Specialization, Target
out = {}
for job in json.loads(sys.argv[1]):
    op = find_operator(job["module"], job["op"])
    spec = Specialization.from_json(job["spec"])
    def trace_and_compile():  # tracing is part of TileLang's JIT path, even on a cache hit
        return tilelang.compile(trace(op, spec), out_idx=op.out_idx, target=Target(spec.target).tilelang(),
                                pass_configs=op.compile_pass_configs() or None)
    t = time.perf_counter(); trace_and_compile(); cold = time.perf_counter() - t
    kernel_cache.KernelCache()._memory_cache.clear()
    t = time.perf_counter(); trace_and_compile(); warm = time.perf_counter() - t
    out[job["spec_id"]] = {"jit_empty_cache_s": cold, "jit_warm_disk_cache_s": warm}
print(json.dumps(out))
"""


def floor_fn(kernel, args, outs):
    """The compiled entry point with everything packed once (the launch floor), or None."""
    import ctypes

    adapter = getattr(kernel, "adapter", None)
    backends = {"tvm_ffi": "TVMFFIKernelAdapter", "cython": "CythonKernelAdapter"}  # runtime.artifact's kernels
    kind = backends.get(getattr(adapter, "backend", None) or "", type(adapter).__name__)
    idx = list(getattr(adapter, "result_idx", []))
    params, ins = [], iter(args)
    for i in range(len(args) + len(outs)):
        params.append(outs[idx.index(i)] if i in idx else next(ins))
    if kind == "TVMFFIKernelAdapter" and not adapter._ffi_callee_allocated_output_abi:
        fn = adapter._get_executable().get_function("main")
        return lambda: fn(*params)
    if kind == "TVMFFIKernelAdapter":
        fn = adapter._get_executable().get_function("main")
        return lambda: fn(*args, args[0])  # callee-allocated outputs: no preallocated form
    if kind == "CythonKernelAdapter":
        dyn = []
        for _v, (ref, buf, dim, _scale) in adapter.dynamic_symbolic_map.items():
            t = params[buf]
            dyn.append(t.shape[dim] if ref == 0 else t.stride(dim))
        proto = ctypes.CFUNCTYPE(
            ctypes.c_int32, *([ctypes.c_void_p] * len(params)), *([ctypes.c_int64] * len(dyn)), ctypes.c_void_p
        )
        fn = proto(ctypes.cast(adapter.lib.call, ctypes.c_void_p).value)
        packed = (*[t.data_ptr() for t in params], *dyn, None)
        return lambda: fn(*packed)
    return None


def time_rows(rows: dict, rounds: int, n: int, sync) -> dict[str, list[float]]:
    """us per call of every row, one value per round; rows interleaved, order rotated per round."""
    names = list(rows)
    per = {k: [] for k in names}
    for fn in rows.values():  # warm-up
        for _ in range(min(n, 200)):
            fn()
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            fn = rows[k]
            sync()
            t = time.perf_counter_ns()
            for _ in range(n):
                fn()
            sync()
            per[k].append((time.perf_counter_ns() - t) / n / 1e3)
    return per


def compare(a: list[float], b: list[float]) -> dict:
    """a - b per round (paired): the median, or 'not resolved' when the rounds disagree in sign."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    resolved = min(d) > 0 or max(d) < 0
    return {
        "median_us": round(statistics.median(d), 3) if resolved else "not resolved",
        "min_us": round(min(d), 3),
        "max_us": round(max(d), 3),
    }


def per_call(release, device: str, rounds: int, n: int) -> list[dict]:
    import torch

    from tileship.runtime.dispatch import Decision, Entry, OpRunner
    from tileship.runtime.native import NativeTable

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    results = []
    for name, runner in sorted(release.ops.items()):
        for entry in runner.entries:
            spec = entry.spec
            if entry.kernel is None or (spec.target == "c") != (device == "cpu"):
                continue
            dims = {d: (v[0] if isinstance(v, tuple) else v) for d, v in spec.dims}  # smallest size: host-bound
            if spec.dynamic_dim == "N" and name.startswith("add"):
                dims["N"] = 1024
            if spec.dynamic_dim is None and any(v > 4096 for v in dims.values()):
                continue
            args = runner.sample_inputs(dims, spec.dtype, device, 0)
            out, d = runner.call(*args)
            if d.path != "kernel":
                continue
            outs = [out] if isinstance(out, torch.Tensor) else list(out)
            given = [torch.empty_like(o) for o in outs]
            ref_only = OpRunner(runner.shape, runner.reference, [], device_reasons={device: "disabled_by_policy"})
            kernel = entry.kernel
            rows = {}
            floor = floor_fn(kernel, args, given)
            if floor is not None:
                rows["floor"] = floor
            rows["tilelang"] = lambda kernel=kernel, args=args: kernel(*args)
            rows["kernel"] = lambda runner=runner, args=args: runner(*args)
            native = runner._table is not None
            if native:
                py = OpRunner(runner.shape, runner.reference, [entry], device_reasons={})
                rows["kernel (python)"] = lambda py=py, args=args: py(*args)
            o = given[0] if len(given) == 1 else given
            rows["kernel out="] = lambda runner=runner, args=args, o=o: runner(*args, out=o)
            rows["reference"] = lambda r=ref_only, args=args: r(*args)
            if native:  # the reference route through a table: the key's route row, then the reference
                ref_table = OpRunner(runner.shape, runner.reference,
                                     [Entry(spec, None, Decision("reference", "disabled_by_policy", spec.id))])
                ref_table.use_native(NativeTable(runner._table.module, ref_table.n_inputs, 1))
                rows["reference (table)"] = lambda r=ref_table, args=args: r(*args)
            rows["torch"] = lambda ref=runner.reference, args=args: ref(*args)
            if name.startswith("add") and len(args) == 2:
                rows["torch.add(out=)"] = lambda a=args[0], b=args[1], c=given[0]: torch.add(a, b, out=c)
            per = time_rows(rows, rounds, n, sync)
            launcher = next((v for k, v in runner.launchers().items() if k.startswith(spec.id)), "?")
            row = {
                "spec_id": spec.id,
                "dims": dims,
                "launcher": launcher,
                "native_table": native,
                "rows": {
                    k: {
                        "median_us": round(statistics.median(v), 3),
                        "spread_us": round(max(v) - min(v), 3),
                        "rounds_us": [round(x, 3) for x in v],
                    }
                    for k, v in per.items()
                },
                "kernel_minus": {k: compare(per["kernel"], per[k]) for k in per if k != "kernel"},
                # the dispatcher's cost on the reference route: the same reference, through it and direct
                "reference_minus_torch": compare(per["reference"], per["torch"]),
            }
            results.append(row)
            break  # one shape per operator
    return results


def _fmt(c: dict) -> str:
    m = c["median_us"]
    return f"{m:+.2f} us" if isinstance(m, float) else f"not resolved ({c['min_us']:+.2f}..{c['max_us']:+.2f})"


def load_times(release_path: Path, device: str, jit_specs: int) -> list[dict]:
    from tileship.runtime.loader import load_artifact

    # load from the bundle, per specialization (each loaded again, fresh objects)
    target_kind = "c" if device == "cpu" else "cuda"
    rel = json.loads((release_path / "release.json").read_text())
    chosen = []
    seen_ops = set()
    for sid, info in sorted(rel["specializations"].items()):
        if info["status"] != "built" or (info["spec"]["target"] == "c") != (target_kind == "c"):
            continue
        if info["spec"]["op"] in seen_ops:
            continue
        seen_ops.add(info["spec"]["op"])
        chosen.append((sid, info))
    chosen = chosen[:jit_specs]
    loads = {}
    for sid, _ in chosen:
        samples = []
        for _ in range(5):
            t = time.perf_counter()
            load_artifact(release_path / "specs" / sid, sid)
            samples.append(time.perf_counter() - t)
        loads[sid] = statistics.median(samples)
    jobs = [
        {
            "spec_id": sid,
            "module": rel["operators"][info["spec"]["op"]]["module"],
            "op": info["spec"]["op"],
            "spec": info["spec"],
        }
        for sid, info in chosen
    ]
    env = dict(os.environ, TILELANG_CACHE_DIR=tempfile.mkdtemp(prefix="tl-bench-"))
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(jobs)], capture_output=True, text=True, env=env, timeout=900
    )
    jit = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else {}
    if child.returncode != 0:
        print(child.stderr[-3000:], file=sys.stderr)
    load_rows = []
    for sid, _ in chosen:
        row = {"spec_id": sid, "bundle_load_ms": round(loads[sid] * 1e3, 2)}
        if sid in jit:
            row["jit_empty_cache_ms"] = round(jit[sid]["jit_empty_cache_s"] * 1e3, 1)
            row["jit_warm_disk_cache_ms"] = round(jit[sid]["jit_warm_disk_cache_s"] * 1e3, 1)
            row["speedup_vs_warm_cache"] = round(jit[sid]["jit_warm_disk_cache_s"] / loads[sid], 1)
            row["speedup_vs_empty_cache"] = round(jit[sid]["jit_empty_cache_s"] / loads[sid], 1)
        load_rows.append(row)

    return load_rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--release", required=True, type=Path)
    ap.add_argument("--device", default=None)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--load", action="store_true", help="also time loading from the bundle vs tilelang.compile")
    ap.add_argument(
        "--jit-specs", type=int, default=4, help="how many specializations to compare against tilelang.compile"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    from tileship.runtime.loader import load

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    load_before = list(os.getloadavg())  # other work on the machine shows up as spread
    t = time.perf_counter()
    release = load(args.release, allow_unverified=True)
    total_load = time.perf_counter() - t
    calls = per_call(release, device, args.rounds, args.calls)
    load_rows = load_times(args.release, device, args.jit_specs) if args.load else []
    result = {
        "device": device,
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "release": release.release_id,
        "release_load_total_s": round(total_load, 3),
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "per_call": calls,
        "load": load_rows,
        "rule": "median and spread (max - min) of per-round means; a paired per-round difference whose rounds "
        "disagree in sign is 'not resolved'",
        "targets": {"kernel_minus_torch_us_max": 0.0, "kernel_minus_floor_us_max": 0.5},
    }
    print(
        f"{device} ({os.cpu_count()} cpus, load average {load_before[0]:.2f} before, "
        f"{result['load_average_after'][0]:.2f} after), {args.rounds} rounds x {args.calls} calls; "
        "us per call: median (spread)"
    )
    for r in calls:
        print(f"\n{r['spec_id']}  dims {r['dims']}  launcher: {r['launcher']}  compiled table: {r['native_table']}")
        for k, v in r["rows"].items():
            vs = "" if k == "kernel" else f"   kernel - {k}: {_fmt(r['kernel_minus'][k])}"
            print(f"  {k:16s} {v['median_us']:9.3f} ({v['spread_us']:.3f}){vs}")
        print(f"  reference - torch (the dispatcher on the reference route): {_fmt(r['reference_minus_torch'])}")
    if load_rows:
        print(f"\n{'specialization':55s} {'bundle ms':>10s} {'JIT empty ms':>13s} {'JIT warm-cache ms':>18s}")
        for r in load_rows:
            print(
                f"{r['spec_id']:55s} {r['bundle_load_ms']:10.2f} {r.get('jit_empty_cache_ms', float('nan')):13.1f} "
                f"{r.get('jit_warm_disk_cache_ms', float('nan')):18.1f}"
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
