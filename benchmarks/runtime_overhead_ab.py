"""Before/after of the dispatcher's host cost: ``runtime_overhead.py`` run on two source trees, alternately.

Runs ``benchmarks/runtime_overhead.py`` (this tree's copy, for both sides) in child processes whose
``PYTHONPATH`` is the ``--before`` or the ``--after`` source tree, in the order B A A B B A ... so
that a drift of the machine's load hits both sides alike, then pools each side's rounds. Per
operator and side it reports, over the pooled rounds (each round: ``--calls`` back-to-back calls):

    reference - torch   the dispatcher on the reference route (the same reference, through
                        ``OpRunner`` and direct; paired within a round)
    kernel - floor      the dispatcher and the fast launcher over the compiled entry point called
                        with pre-packed arguments and a preallocated output (paired within a round)
    kernel, reference   the rows themselves

as the median and the range (min..max), and each run's median. A round can land on a burst of
other work on the machine, so the comparison is made on the runs: ``after - before`` is the
difference of the medians of the run medians, reported only when the two sides' run medians do
not overlap (every after run below every before run, or above); otherwise "not resolved".

    git archive COMMIT src | tar -x -C /tmp/before
    python benchmarks/runtime_overhead_ab.py --release REL --before /tmp/before/src --after src \
        [--pairs 3] [--rounds 7] [--calls 20000] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_side(src: Path, release: Path, rounds: int, calls: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        env = dict(os.environ, PYTHONPATH=str(src.resolve()))
        subprocess.run([sys.executable, str(HERE / "runtime_overhead.py"), "--release", str(release), "--device", "cpu",
                        "--rounds", str(rounds), "--calls", str(calls), "--out", str(out)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def series(runs: list[dict]) -> dict[str, dict[str, list[list[float]]]]:
    """Per specialization: each metric's per-round values, one list per run."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    for run in runs:
        for row in run["per_call"]:
            r = {k: v["rounds_us"] for k, v in row["rows"].items()}
            m = out.setdefault(row["spec_id"], {})
            pairs = {"reference - torch": ("reference", "torch"), "kernel - floor": ("kernel", "floor")}
            for name, (a, b) in pairs.items():
                if a in r and b in r:
                    m.setdefault(name, []).append([x - y for x, y in zip(r[a], r[b], strict=True)])
            for k in ("kernel", "reference", "torch", "floor"):
                if k in r:
                    m.setdefault(k, []).append(r[k])
    return out


def stats(runs: list[list[float]]) -> dict:
    v = [x for run in runs for x in run]
    meds = [statistics.median(run) for run in runs]
    return {"median_us": round(statistics.median(v), 3), "min_us": round(min(v), 3), "max_us": round(max(v), 3),
            "rounds": len(v), "run_medians_us": [round(m, 3) for m in meds],
            "median_of_run_medians_us": round(statistics.median(meds), 3)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--release", required=True, type=Path)
    ap.add_argument("--before", required=True, type=Path, help="source tree (the folder holding tileship/)")
    ap.add_argument("--after", required=True, type=Path)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    order = []
    for i in range(args.pairs):
        order += ["before", "after"] if i % 2 == 0 else ["after", "before"]
    load = [os.getloadavg()[0]]
    for side in order:
        runs[side].append(run_side(getattr(args, side), args.release, args.rounds, args.calls))
        load.append(os.getloadavg()[0])
    s = {side: series(r) for side, r in runs.items()}
    summary: dict[str, dict] = {}
    for spec in s["before"]:
        summary[spec] = {}
        for metric in s["before"][spec]:
            b, a = stats(s["before"][spec][metric]), stats(s["after"][spec][metric])
            am, bm = a["run_medians_us"], b["run_medians_us"]
            apart = max(am) < min(bm) or min(am) > max(bm)
            change = round(a["median_of_run_medians_us"] - b["median_of_run_medians_us"],
                           3) if apart else "not resolved"
            summary[spec][metric] = {"before": b, "after": a, "after_minus_before_us": change}
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "order": order, "load_average_1m": load,
              "cpus": os.cpu_count(), "before_src": str(args.before), "after_src": str(args.after),
              "rule": "median and range (min..max) of the pooled rounds, and each run's median; after - before is the "
                      "difference of the medians of the run medians, only when the two sides' run medians do not "
                      "overlap, else 'not resolved'; differences within a round are paired",
              "summary": summary, "runs": runs}
    for spec, metrics in summary.items():
        print(spec)
        for metric, v in metrics.items():
            b, a = v["before"], v["after"]
            print(f"  {metric:18s} before {b['median_us']:7.3f} ({b['min_us']:.3f}..{b['max_us']:.3f}; runs "
                  f"{min(b['run_medians_us']):.3f}..{max(b['run_medians_us']):.3f})  after {a['median_us']:7.3f} "
                  f"({a['min_us']:.3f}..{a['max_us']:.3f}; runs {min(a['run_medians_us']):.3f}.."
                  f"{max(a['run_medians_us']):.3f})  after - before: {v['after_minus_before_us']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
