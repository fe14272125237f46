"""Where the dispatcher's host time goes, per call, on both routes (CPU, the "c" release's ``add``).

Rows (each round: ``--calls`` back-to-back calls timed with ``time.perf_counter_ns``; rows
interleaved, their order rotated per round; N=1024 float32 tensors):

  reference route, with a trivial reference (``lambda a, b: a``) so that only host cost is timed:
    ref direct        the reference called directly
    __call__ shell    an object whose ``__call__(self, *args, out=None)`` only calls the reference
    key               ``runner._key_of(args)``: the memo key
    key + lookup      ``runner._memo[runner._key_of(args)]``
    ref runner        ``runner(a, b)``: the whole reference route (no compiled table)
    ref table         the same through the release's compiled dispatch table, as the loaded
                      release serves a key its table answers with a reference row (``runtime.native``)
    table call        that table's own call: the tvm-ffi call that answers the row's index
    ref runner.call   ``runner.call(a, b)`` (what the torch custom ops call)
  kernel route, the compiled ``add``:
    floor             the entry point with pre-packed pointers and a preallocated output
    launch out=       the route's fast launcher writing into a preallocated output
    launch            the fast launcher, allocating its output
    kernel            ``runner(a, b)``: the whole kernel route
    kernel .call      ``runner.call(a, b)``
    layout            the contiguity and alignment checks of two tensors
    empty(shape)      ``torch.empty(shape, dtype=, device=)``; ``empty(size=)`` the same by keyword

Derived, per round (paired), as median and range: the parts listed in ``PARTS``.

    python benchmarks/dispatch_breakdown.py --release REL [--rounds 9] [--calls 100000] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: derived part -> (row, minus row)
PARTS = {
    "reference route: dispatcher total": ("ref runner", "ref direct"),
    "reference route through the compiled table: dispatcher total": ("ref table", "ref direct"),
    "  the table's call (answers the route's index)": ("table call", "none"),
    "  the table route - the Python route": ("ref table", "ref runner"),
    "  __call__ with *args (the shell)": ("__call__ shell", "ref direct"),
    "  memo key": ("key", "none"),
    "  dict lookup": ("key + lookup", "key"),
    "  the rest (route, counter, sampling)": ("ref runner", "__call__ shell", "key + lookup", "none"),
    "reference route via .call: dispatcher total": ("ref runner.call", "ref direct"),
    "kernel route: dispatcher + launcher over floor": ("kernel", "floor"),
    "  dispatcher (kernel - launch)": ("kernel", "launch"),
    "    of which the layout checks": ("layout", "none"),
    "  output allocation (launch - launch out=)": ("launch", "launch out="),
    "  launcher closure and pointer reads (launch out= - floor)": ("launch out=", "floor"),
    "kernel route via .call: over floor": ("kernel .call", "floor"),
    "torch.empty positional - by keyword": ("empty(shape)", "empty(size=)"),
}


def rows_for(release_path: Path) -> dict:
    import torch
    from runtime_overhead import floor_fn

    from tileship.runtime.dispatch import OpRunner
    from tileship.runtime.loader import load
    from tileship.verify.tune import _runner

    release = load(release_path, allow_unverified=True)
    add = release.op("add")
    a, b = torch.randn(1024), torch.randn(1024)
    args = (a, b)
    out, d = add.call(a, b)
    assert d.path == "kernel", d
    route = next(r for r in add._memo.values() if r.entry.kernel is not None)
    o = torch.empty_like(out)
    floor = floor_fn(route.entry.kernel, args, [o])
    assert floor is not None and route.launch is not None

    def ref(x, y):
        return x

    class Shell:
        def __call__(self, *args, out=None):
            return ref(*args)

    shell = Shell()
    r = OpRunner(add.shape, ref, [], device_reasons={"cpu": "disabled_by_policy"})
    r(a, b)
    spec = route.entry.spec
    rt = _runner(release.declarations["add"], "add", ref, spec, None, release_path)  # as tune times the reference
    rt(a, b)
    table = rt._native
    assert table is not None and isinstance(table(a, b), int), "the table answers a reference row's index"
    launch, memo, key_of, f32, dev = route.launch, r._memo, r._key_of, torch.float32, a.device
    empty = torch.empty

    def layout():
        for t in args:
            if not t.is_contiguous():
                return 1
            if t.data_ptr() % 16:
                return 2
        return 0

    return {"none": lambda: None, "ref direct": lambda: ref(a, b), "__call__ shell": lambda: shell(a, b),
            "key": lambda: key_of(args), "key + lookup": lambda: memo[key_of(args)], "ref runner": lambda: r(a, b),
            "ref table": lambda: rt(a, b), "table call": lambda: table(a, b),
            "ref runner.call": lambda: r.call(a, b), "floor": floor, "launch out=": lambda: launch(args, [o]),
            "launch": lambda: launch(args, None), "kernel": lambda: add(a, b), "kernel .call": lambda: add.call(a, b),
            "layout": layout, "empty(shape)": lambda: empty((1024,), dtype=f32, device=dev),
            "empty(size=)": lambda: empty(size=(1024,), dtype=f32, device=dev)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--release", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    rows = rows_for(args.release)
    names = list(rows)
    per: dict[str, list[float]] = {k: [] for k in names}
    for fn in rows.values():  # warm-up
        for _ in range(2000):
            fn()
    load = [os.getloadavg()[0]]
    for i in range(args.rounds):
        for k in names[i % len(names):] + names[:i % len(names)]:
            fn, n = rows[k], args.calls
            t = time.perf_counter_ns()
            for _ in range(n):
                fn()
            per[k].append((time.perf_counter_ns() - t) / n)
    load.append(os.getloadavg()[0])

    def st(v: list[float]) -> dict:
        return {"median_ns": round(statistics.median(v)), "min_ns": round(min(v)), "max_ns": round(max(v))}

    parts = {}
    for name, (row, *minus) in PARTS.items():
        d = [per[row][i] - sum(per[m][i] for m in minus) + (len(minus) - 1) * per["none"][i]
             for i in range(args.rounds)]  # each subtracted row carries the loop's own cost once
        parts[name] = st(d)
    result = {"command": " ".join(["python", *sys.argv]), "rounds": args.rounds, "calls_per_round": args.calls,
              "cpus": os.cpu_count(), "load_average_1m": load, "torch": torch.__version__,
              "rows": {k: st(v) | {"rounds_ns": [round(x) for x in v]} for k, v in per.items()}, "parts": parts,
              "rule": "ns per call: median and range (min..max) over rounds; parts are paired per round"}
    print(f"{args.rounds} rounds x {args.calls} calls, load average {load[0]:.2f} -> {load[1]:.2f}; ns per call")
    for k, v in result["rows"].items():
        print(f"  {k:18s} {v['median_ns']:7d} ({v['min_ns']}..{v['max_ns']})")
    for k, v in parts.items():
        print(f"  {k:58s} {v['median_ns']:6d} ({v['min_ns']}..{v['max_ns']})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
