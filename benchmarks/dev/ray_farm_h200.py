"""The two halves of benchmarks/dev/gpu_ray.sh that are Python (issue 19, the build farm on 16 cores).

    python benchmarks/dev/ray_farm_h200.py serial PROJECT OUT.json --k 8 --budget-s 90
        a stratified sample of the project's specializations compiled one at a time with
        ``builder.compile_one`` (what a local build runs per specialization), nothing else running:
        the serial seconds per specialization, per operator, written after each compile (so a cut
        run still leaves what it measured)
    python benchmarks/dev/ray_farm_h200.py summary DIR --cores 16
        reads DIR/{local,ray}.log, DIR/times.txt, DIR/serial.json and both releases (the paths
        the build logs name) and writes DIR/summary.json: wall times, specializations per minute,
        tasks built / failed, Ray's per-node line, whether the releases are the same (release id,
        and every identity file byte for byte), and the parallel efficiency against the serial
        estimate: (serial seconds of all specializations) / (cores x build seconds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DONE = re.compile(r"(\d+) built, (\d+) failed in ([\d.]+) s -> (\S+)")


def sample(specs: list[Any], k: int) -> list[Any]:
    """About ``k`` specializations, each operator in proportion to its count (at least one),
    evenly spaced within it, interleaved across operators so a cut run still covers them all."""
    by_op: dict[str, list[Any]] = {}
    for s in specs:
        by_op.setdefault(s.op, []).append(s)
    picks = []
    for group in by_op.values():
        n = max(1, round(k * len(group) / len(specs)))
        picks.append([group[int((i + 0.5) * len(group) / n)] for i in range(n)])
    out = []
    for i in range(max(len(p) for p in picks)):
        out += [p[i] for p in picks if i < len(p)]
    return out


def serial(args: argparse.Namespace) -> int:
    from tileship.build.builder import compile_one
    from tileship.declare.project import find_project, load_operators, specializations

    t0 = time.perf_counter()
    proj = find_project(args.project)
    ops = load_operators(proj)
    specs = specializations(proj, ops)
    counts: dict[str, int] = {}
    for s in specs:
        counts[s.op] = counts.get(s.op, 0) + 1
    result: dict[str, Any] = {"project": str(args.project), "specializations": len(specs), "per_op_count": counts,
                              "k": args.k, "budget_s": args.budget_s, "samples": []}
    root = Path(tempfile.mkdtemp(prefix="ray-farm-serial-"))
    last = 0.0
    for s in sample(specs, args.k):
        left = args.budget_s - (time.perf_counter() - t0)
        if left < max(last, 5.0) * 1.2:
            result["cut"] = f"stopped with {left:.0f} s of the budget left"
            break
        r = compile_one(ops[s.op], s, root / s.id, timeout_s=min(args.timeout_s, left),
                        sys_path=str(proj.root) if proj.root else None)
        last = r.seconds
        result["samples"].append({"spec": s.id, "op": s.op, "ok": r.ok, "seconds": round(r.seconds, 3),
                                  "error": r.error})
        print(f"serial {s.id}: {'ok' if r.ok else 'FAILED ' + str(r.error)} {r.seconds:.1f} s", flush=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


def serial_estimate(data: dict[str, Any]) -> dict[str, Any] | None:
    """Seconds to build every specialization one at a time, from the sample: sum over operators of
    (count x mean sampled seconds); an operator with no sample gets the mean of all samples."""
    ok = [s for s in data.get("samples", []) if s["ok"]]
    if not ok:
        return None
    every = statistics.mean(s["seconds"] for s in ok)
    per_op = {op: statistics.mean([s["seconds"] for s in ok if s["op"] == op] or [every])
              for op in data["per_op_count"]}
    total = sum(n * per_op[op] for op, n in data["per_op_count"].items())
    return {"samples": len(ok), "mean_s": round(every, 3), "per_op_mean_s": {k: round(v, 3) for k, v in per_op.items()},
            "total_s": round(total, 1), "per_minute": round(data["specializations"] / total * 60, 2)}


def paired_efficiency(data: dict[str, Any], build: dict[str, Any]) -> dict[str, Any] | None:
    """A cross-check of ``parallel_efficiency`` that does not depend on which specializations the
    serial sample drew: utilization x the mean, over the sampled specializations, of (seconds alone /
    seconds in this build). It splits the loss into idle cores (utilization) and compiles slowed by
    their neighbours (the mean ratio)."""
    during = build.get("task_seconds") or {}
    ratios = [s["seconds"] / during[s["spec"]] for s in data.get("samples", [])
              if s.get("ok") and during.get(s.get("spec"))]
    if not ratios or build.get("utilization") is None:
        return None
    mean = statistics.mean(ratios)
    return {"samples": len(ratios), "alone_over_in_build": round(mean, 3),
            "efficiency": round(build["utilization"] * mean, 3)}


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _build(log: Path, times: dict[str, dict[str, float]], name: str) -> dict[str, Any]:
    text = log.read_text(errors="replace") if log.exists() else ""
    m = ([None, *DONE.finditer(text)])[-1]  # the last summary line
    out: dict[str, Any] = {"log": log.name, "command_wall_s": times.get(name, {}).get("wall"),
                           "rc": times.get(name, {}).get("rc")}
    if m is None:
        out["error"] = "no summary line in the log (cut or crashed): " + " | ".join(text.strip().splitlines()[-3:])
        return out
    built, failed, seconds, path = int(m[1]), int(m[2]), float(m[3]), Path(m[4])
    out.update(built=built, failed=failed, build_s=seconds, per_minute=round(built / seconds * 60, 2),
               release_id=path.name, path=str(path))
    blog = path / "build-log.json"
    if blog.exists():
        per = json.loads(blog.read_text())["specializations"]
        out["task_seconds_sum"] = round(sum(v["seconds"] for v in per.values()), 1)
        out["task_seconds"] = {k: v["seconds"] for k, v in per.items() if v["ok"]}
        out["failures"] = {k: v["error"] for k, v in per.items() if not v["ok"]}
    try:  # the git revision the release records: a commit between the two builds changes the id
        out["kernel_revision"] = json.loads((path / "release.json").read_text())["kernel_revision"]
    except (OSError, ValueError, KeyError):
        pass
    nodes = [line for line in text.splitlines() if line.startswith("[ray] per node:")]
    if nodes:
        out["per_node"] = nodes[-1].removeprefix("[ray] per node:").strip()
    return out


def summary(args: argparse.Namespace) -> int:
    d: Path = args.dir
    times: dict[str, dict[str, float]] = {}
    if (d / "times.txt").exists():
        for line in (d / "times.txt").read_text().splitlines():
            name, start, end, rc = line.split()
            times[name] = {"wall": round(float(end) - float(start), 2), "rc": int(rc)}
    local, farm = _build(d / "local.log", times, "local"), _build(d / "ray.log", times, "ray")
    res: dict[str, Any] = {"cores": args.cores, "steps": times, "local": local, "ray": farm}
    if local.get("per_minute") and farm.get("per_minute"):
        res["ray_vs_local"] = round(farm["per_minute"] / local["per_minute"], 3)
    if local.get("release_id") and farm.get("release_id"):
        res["same_release_id"] = local["release_id"] == farm["release_id"]
        a, b = _tree(Path(local["path"])), _tree(Path(farm["path"]))
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        res["files"] = len(a)
        res["files_differing"] = differ[:50]
        # the build log (timings) and the manifest that hashes it differ by design; nothing else may
        res["identity_files_identical"] = not [k for k in differ if k not in ("build-log.json", "manifest.json")]
    if (d / "serial.json").exists():
        est = serial_estimate(json.loads((d / "serial.json").read_text()))
        res["serial_estimate"] = est
        if est:
            for b in (local, farm):
                if b.get("build_s"):
                    b["speedup_vs_serial"] = round(est["total_s"] / b["build_s"], 2)
                    b["parallel_efficiency"] = round(est["total_s"] / (args.cores * b["build_s"]), 3)
                    b["utilization"] = (round(b["task_seconds_sum"] / (args.cores * b["build_s"]), 3)
                                        if "task_seconds_sum" in b else None)
                    b["paired_efficiency"] = paired_efficiency(json.loads((d / "serial.json").read_text()), b)
    res["target"] = "ray parallel efficiency >= 0.8 on 16 cores with candidates; ray/local >= 0.8; same release"
    (d / "summary.json").write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    for k in ("local", "ray"):
        b = res[k]
        if "error" in b:
            print(f"{k}: {b['error']}")
            continue
        print(f"{k}: {b['built']} built, {b['failed']} failed in {b['build_s']:.1f} s ({b['per_minute']:.1f}/min, "
              f"command {b['command_wall_s']} s), efficiency {b.get('parallel_efficiency')} "
              f"(speedup {b.get('speedup_vs_serial')} on {args.cores}), utilization {b.get('utilization')}, "
              f"paired {b.get('paired_efficiency')}"
              + (f"; per node: {b['per_node']}" if b.get("per_node") else ""))
    print(f"ray/local {res.get('ray_vs_local')}   same release id {res.get('same_release_id')}   identity files "
          f"identical {res.get('identity_files_identical')}   serial estimate {res.get('serial_estimate')}")
    if res.get("same_release_id") is False:
        print(f"  differing: {res['files_differing'][:8]}; kernel revisions {local.get('kernel_revision')} / "
              f"{farm.get('kernel_revision')} (a commit between the builds changes the id)")
    return 0 if res.get("same_release_id") and not math.isnan(res.get("ray_vs_local", float("nan"))) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serial")
    s.add_argument("project", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--k", type=int, default=8)
    s.add_argument("--budget-s", type=float, default=90.0)
    s.add_argument("--timeout-s", type=float, default=120.0)
    m = sub.add_parser("summary")
    m.add_argument("dir", type=Path)
    m.add_argument("--cores", type=int, default=16)
    args = ap.parse_args()
    return serial(args) if args.cmd == "serial" else summary(args)


if __name__ == "__main__":
    sys.exit(main())
