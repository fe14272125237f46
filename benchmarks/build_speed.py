"""Build throughput, measured side by side in one run.

- specializations built per minute with ``--jobs 1`` vs ``--jobs N`` (ratio);
- time per specialization in the isolated build (child process, import included) vs
  ``tilelang.compile`` in-process (import excluded) for the same kernels.

    python benchmarks/build_speed.py [--targets c cuda-sm90a] [--jobs N] [--limit K] [--out result.json]
    python benchmarks/build_speed.py --project benchmarks/tuned/cpu/tileship.toml --limit 16   # with candidates
    python benchmarks/build_speed.py --project benchmarks/tuned/cpu/tileship.toml --limit 16 --ray   # Ray vs local -jN

With ``--ray``: local ``-jN`` and ``tileship build --ray`` on a local Ray cluster of N CPUs, alternated
``--rounds`` times on the same specializations; the cluster is started before the first Ray
build (its start-up is reported apart: a farm is already running), while Ray's worker processes
start inside the first Ray build. Both builds must give the same release id.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INPROC = r'''
import json, sys, time
import tilelang
from tileship.build.worker import find_operator, trace
from tileship.declare.spec import Specialization, Target
jobs = json.loads(sys.argv[1]); out = {}
for job in jobs:
    op = find_operator(job["module"], job["op"])
    spec = Specialization.from_json(job["spec"])
    t = time.perf_counter()
    tilelang.compile(trace(op, spec), out_idx=op.out_idx, target=Target(spec.target).tilelang(), pass_configs=dict(op.pass_configs) or None)
    out[job["spec_id"]] = time.perf_counter() - t
print(json.dumps(out))
'''  # noqa: E501


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", nargs="+", default=["c", "cuda-sm90a"])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--limit", type=int, default=8, help="specializations per build")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--project", type=Path, help="a project file to build (default: the built-in catalog)")
    ap.add_argument("--ray", action="store_true", help="compare the Ray build farm with local -jN instead")
    ap.add_argument("--rounds", type=int, default=2, help="with --ray: local and Ray builds, alternated")
    args = ap.parse_args()
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import builtin_project, find_project, load_operators, specializations

    if args.project:
        proj = find_project(args.project)
        args.targets = list(proj.targets)
    else:
        proj = dataclasses.replace(builtin_project(), targets=tuple(args.targets))
    ops = load_operators(proj)
    specs = specializations(proj, ops)[: args.limit]
    {s.id for s in specs}
    # build whole operators (a build takes operators, not single specializations): every
    # specialization of the operators the first --limit ones belong to
    chosen_ops = {n: o for n, o in ops.items() if any(s.op == n for s in specs)}
    if args.ray:
        return ray_vs_local(args, proj, chosen_ops)
    runs = {}
    for jobs in (1, args.jobs):
        out = Path(tempfile.mkdtemp(prefix=f"tileship-bench-j{jobs}-"))
        t = time.perf_counter()
        res = build(proj, chosen_ops, out, BuildOptions(jobs=jobs))
        wall = time.perf_counter() - t
        built = [r for r in res.results if r.ok]
        runs[jobs] = {"wall_s": round(wall, 2), "built": len(built), "failed": len(res.failed),
                      "per_minute": round(len(built) / wall * 60, 2),
                      "per_spec_s": {r.spec.id: round(r.seconds, 3) for r in res.results}}
    all_ids = list(runs[1]["per_spec_s"])
    sample = [s for s in specializations(proj, chosen_ops) if s.id in all_ids]
    jobs_json = [{"spec_id": s.id, "module": ops[s.op].module or ops[s.op].factory.__module__, "op": s.op,
                  "spec": s.to_json()} for s in sample]
    env = dict(os.environ, TILELANG_CACHE_DIR=tempfile.mkdtemp(prefix="tl-bench-"))
    if proj.root is not None:  # the child imports the project's operator modules too
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(proj.root), env.get("PYTHONPATH", "")) if p)
    child = subprocess.run([sys.executable, "-c", INPROC, json.dumps(jobs_json)], capture_output=True, text=True,
                           env=env, timeout=3600)
    inproc = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else {}
    rows = []
    for sid in all_ids:
        iso = runs[1]["per_spec_s"][sid]
        rows.append({"spec_id": sid, "isolated_build_s": iso,
                     "tilelang_compile_inprocess_s": round(inproc.get(sid, float("nan")), 3),
                     "ratio": round(iso / inproc[sid], 2) if sid in inproc else None})
    result = {"host": platform.node(), "cpus": os.cpu_count(), "targets": args.targets, "specializations": len(all_ids),
              "project": str(args.project) if args.project else "builtin",
              "candidates": sum(1 for s in sample if s.candidate),
              "serial": runs[1], "parallel": runs[args.jobs], "jobs": args.jobs,
              "parallel_speedup": round(runs[args.jobs]["per_minute"] / runs[1]["per_minute"], 2), "per_spec": rows,
              "median_isolation_overhead_s": None}
    if inproc:
        result["median_isolation_overhead_s"] = round(statistics.median(
            [r["isolated_build_s"] - r["tilelang_compile_inprocess_s"] for r in rows if r["ratio"]]), 3)
    print(f"{len(all_ids)} specializations on {os.cpu_count()} CPUs")
    print(f"serial (-j1): {runs[1]['per_minute']:.1f}/min   parallel (-j{args.jobs}): "
          f"{runs[args.jobs]['per_minute']:.1f}/min   "
          f"ratio {result['parallel_speedup']:.2f}x")
    print(f"{'specialization':55s} {'isolated s':>10s} {'in-process s':>12s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['spec_id']:55s} {r['isolated_build_s']:10.2f} {r['tilelang_compile_inprocess_s']:12.2f} "
              f"{r['ratio'] or float('nan'):6.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


def ray_vs_local(args: argparse.Namespace, proj, ops) -> int:
    import ray

    from tileship.build.builder import BuildOptions, build
    from tileship.build.ray_farm import RayFarm

    def one(kind: str) -> dict:
        out = Path(tempfile.mkdtemp(prefix=f"tileship-bench-{kind}-"))
        t = time.perf_counter()
        res = build(proj, ops, out, BuildOptions(jobs=args.jobs, ray=RayFarm() if kind == "ray" else None))
        wall = time.perf_counter() - t
        built = len(res.built)
        return {"wall_s": round(wall, 2), "built": built, "failed": len(res.failed), "release_id": res.release_id,
                "per_minute": round(built / wall * 60, 2)}

    t = time.perf_counter()
    ray.init(num_cpus=args.jobs, include_dashboard=False, logging_level="warning")
    init_s = time.perf_counter() - t
    rounds = []
    try:
        for _ in range(args.rounds):
            rounds.append({"local": one("local"), "ray": one("ray")})
    finally:
        ray.shutdown()
    ids = {r[k]["release_id"] for r in rounds for k in ("local", "ray")}
    local = statistics.mean(r["local"]["per_minute"] for r in rounds)
    farm = statistics.mean(r["ray"]["per_minute"] for r in rounds)
    result = {"host": platform.node(), "cpus": os.cpu_count(), "jobs": args.jobs, "targets": args.targets,
              "project": str(args.project) if args.project else "builtin",
              "specializations": rounds[0]["local"]["built"], "ray_version": ray.__version__,
              "ray_init_s": round(init_s, 2), "rounds": rounds, "local_per_minute": round(local, 2),
              "ray_per_minute": round(farm, 2), "ray_vs_local": round(farm / local, 3),
              "same_release_id": len(ids) == 1, "target": ">= 0.8"}
    print(f"{result['specializations']} specializations on {os.cpu_count()} CPUs (Ray cluster start {init_s:.1f} s, "
          "not counted)")
    for i, r in enumerate(rounds):
        print(f"round {i + 1}: local -j{args.jobs} {r['local']['per_minute']:.1f}/min ({r['local']['wall_s']:.1f} s)   "
              f"ray ({args.jobs} CPUs) {r['ray']['per_minute']:.1f}/min ({r['ray']['wall_s']:.1f} s)")
    print(f"mean: local -j{args.jobs} {local:.1f}/min   ray {farm:.1f}/min   ray/local {result['ray_vs_local']:.2f}x "
          "(target >= 0.8)   "
          f"same release id: {result['same_release_id']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0 if result["same_release_id"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
