#!/usr/bin/env python3
"""Option B's whole loop in one script (issue 13): served load with undeclared shapes -> shape
telemetry -> ``propose`` -> apply to the project file -> build -> verify + tune -> canary in the
running server -> promoted -> the same load again, with a smaller reference share of served calls.

    python3 benchmarks/option_b_loop.py --device cpu  --workdir /tmp/loop --out loop.json   # "c" target, CI
    python3 benchmarks/option_b_loop.py --device cuda --workdir /tmp/loop --out loop.json   # the GPU host (nvcc)

The project (``WORKDIR/tileship.toml``) declares one operator with two candidates and ONE static
shape: ``tests/loop_ops.py`` (loop_poly, N=4096) on the CPU, ``benchmarks/loop/loop_gemm.py``
(gemm, M=16 N=K=4096, float16) on CUDA; the module is copied next to the project file so the
releases ship it. Release A is built, tuned, published and activated in ``WORKDIR/registry``;
a real server (``tileship serve``'s app, in process, 127.0.0.1, a free port) follows that
registry. Everything runs on this machine: no network beyond 127.0.0.1. ``--rollback`` adds a
last step: a copy of release B whose evidence routes every bucket to the last declared (the
slow) candidate must be rolled back by the canary while B keeps serving.

The reference share of a phase is (reference calls) / (reference + kernel calls) in the
difference of two ``GET /v2/tileship/telemetry`` reads around it: each loaded release has its
own table, counted from its load, and a swap does not reset it (the promoted release's table
already holds its canary traffic), so only a difference describes one phase. Exit 1 when a step fails, the
canary does not promote B (or, with --rollback, does not roll the slow copy back), or the share
does not go down. The log is written as JSON (``--out``) and as text next to it (``.txt``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SETUPS = {
    # loop_ops takes its kernel and reference from tuned_ops: both are copied next to the project file
    "cpu": {"module": "loop_ops", "file": ROOT / "tests" / "loop_ops.py", "targets": ["c"], "model": "loop_poly",
            "also": [ROOT / "tests" / "tuned_ops.py"]},
    "cuda": {"module": "loop_gemm", "file": ROOT / "benchmarks" / "loop" / "loop_gemm.py", "targets": ["cuda-sm90a"],
             "model": "gemm"},
}
LINES: list[str] = []


def say(msg: str) -> None:
    LINES.append(msg)
    print(msg, flush=True)


class Load:
    """Binary KServe v2 requests of one model at the sizes of a seeded spread."""

    def __init__(self, device: str, url: str, requests: int, seed: int = 0) -> None:
        self.device, self.url, self.model = device, url, SETUPS[device]["model"]
        rng = np.random.default_rng(seed)
        if device == "cpu":  # N log-uniform over 1000..60000, one call in five at the declared N=4096
            spread = np.exp(rng.uniform(np.log(1000), np.log(60000), requests)).astype(int)
        else:  # M in 1..64 at N=K=4096, one call in five at the declared M=16
            spread = rng.integers(1, 65, requests)
            self.b = rng.standard_normal((4096, 4096)).astype(np.float16).tobytes()
        declared = 4096 if device == "cpu" else 16
        self.sizes = [declared if rng.random() < 0.2 else int(s) for s in spread]
        self.rng = rng

    def body(self, size: int) -> tuple[bytes, int]:
        if self.device == "cpu":
            x = self.rng.standard_normal(size).astype(np.float32).tobytes()
            ins = [{"name": "X", "shape": [size], "datatype": "FP32", "parameters": {"binary_data_size": len(x)}}]
            out, data = "Y", x
        else:
            a = self.rng.standard_normal((size, 4096)).astype(np.float16).tobytes()
            ins = [{"name": "A", "shape": [size, 4096], "datatype": "FP16", "parameters": {"binary_data_size": len(a)}},
                   {"name": "B", "shape": [4096, 4096], "datatype": "FP16",
                    "parameters": {"binary_data_size": len(self.b)}}]
            out, data = "C", a + self.b
        head = json.dumps({"inputs": ins, "outputs": [{"name": out, "parameters": {"binary_data": True}}]}).encode()
        return head + data, len(head)

    def call(self, client: httpx.Client, size: int) -> tuple[str, str]:
        """(release id, spec id or "reference") of one answered request; raises on an error status."""
        content, n = self.body(size)
        r = client.post(f"{self.url}/v2/models/{self.model}/infer", content=content, timeout=120.0,
                        headers={"inference-header-content-length": str(n)})
        if r.status_code != 200:
            raise RuntimeError(f"infer {self.model} at {size}: {r.status_code} {r.text[:300]}")
        return r.headers["x-tileship-release"], r.headers.get("x-tileship-spec") or "reference"

    def background(self) -> tuple[threading.Event, threading.Thread, list[Any]]:
        """Requests in a loop until the event is set (traffic for a canary); served/failed calls in the list."""
        stop, seen = threading.Event(), []

        def run() -> None:
            with httpx.Client(trust_env=False) as c:
                i = 0
                while not stop.is_set():
                    try:
                        seen.append(self.call(c, self.sizes[i % len(self.sizes)]))
                    except Exception as exc:
                        seen.append(("error", repr(exc)))
                    i += 1

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return stop, t, seen


def telemetry(url: str) -> dict[str, Any]:
    return httpx.get(url + "/v2/tileship/telemetry", timeout=30.0, trust_env=False).json()


def diff(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The telemetry of the calls between two reads of the same release's table."""
    assert after["release_id"] == before["release_id"], "the served release changed during a phase"
    out = {**after, "ops": {}}
    for name, t in after["ops"].items():
        b = before["ops"].get(name, {"rows": [], "kernel_calls": 0})
        old = {(json.dumps(r["shapes"]), r["reason"]): r for r in b["rows"]}
        rows = []
        for r in t["rows"]:
            o = old.get((json.dumps(r["shapes"]), r["reason"]), {"calls": 0, "seconds": 0.0})
            if r["calls"] > o["calls"]:
                rows.append({**r, "calls": r["calls"] - o["calls"], "seconds": max(0.0, r["seconds"] - o["seconds"])})
        out["ops"][name] = {"rows": rows, "other": t["other"], "kernel_calls": t["kernel_calls"] - b["kernel_calls"]}
    return out


def shares(tele: dict[str, Any]) -> dict[str, Any]:
    ref = sum(r["calls"] for t in tele["ops"].values() for r in t["rows"]) + \
        sum(t["other"]["calls"] for t in tele["ops"].values())
    kern = sum(t["kernel_calls"] for t in tele["ops"].values())
    reasons = Counter()
    for t in tele["ops"].values():
        for r in t["rows"]:
            reasons[r["reason"]] += r["calls"]
    return {"reference_calls": ref, "kernel_calls": kern, "reference_share": ref / max(1, ref + kern),
            "reasons": dict(reasons)}


def phase(name: str, load: Load, log: dict[str, Any]) -> dict[str, Any]:
    t0, before = time.perf_counter(), telemetry(load.url)
    served = []
    with httpx.Client(trust_env=False) as c:
        served = [(s, *load.call(c, s)) for s in load.sizes]
    tele = diff(after := telemetry(load.url), before)
    rec = {"release": after["release_id"], "telemetry_since": after["since"], "requests": len(served),
           "seconds": round(time.perf_counter() - t0, 3), **shares(tele), "telemetry": tele,
           "calls_in_table_before_phase": shares(before)["reference_calls"] + shares(before)["kernel_calls"],
           "served_by": dict(Counter(spec for _, _, spec in served)),
           "largest_sizes_served_by": dict(Counter(spec for s, _, spec in served if s >= max(load.sizes) // 2))}
    log["steps"][name] = rec
    say(f"[{name}] {len(served)} requests on {rec['release']} in {rec['seconds']} s: reference share "
        f"{rec['reference_share']:.1%} ({rec['reference_calls']} reference / {rec['kernel_calls']} kernel calls; "
        f"{rec['reasons']}); served by {rec['served_by']}")
    return rec


def canary(load: Load, release: Path, policy: dict[str, Any]) -> dict[str, Any]:
    from tileship.release import promote

    stop, t, seen = load.background()
    try:
        out = promote.canary(load.url, str(release), policy, timeout_s=600.0)
    finally:
        stop.set()
        t.join()
    st = out.status
    for d in out.decisions:
        say(f"    canary decision {d['action']}: {'; '.join(d.get('reasons', []))}")
    return {"state": out.state, "outcome": st.get("outcome"), "routed": st.get("routed"), "decisions": out.decisions,
            "policy": st.get("policy"), "traffic": dict(Counter(f"{r}:{s}" for r, s in seen))}


def step(log: dict[str, Any], name: str, fn: Any, *args: Any, **kw: Any) -> Any:
    t0 = time.perf_counter()
    value = fn(*args, **kw)
    log["timings_s"][name] = round(time.perf_counter() - t0, 3)
    say(f"[{name}] {log['timings_s'][name]} s: {value if not isinstance(value, dict) else json.dumps(value)[:400]}")
    return value


def slowest_candidate(ev: dict[str, Any], size: int) -> str:
    """A candidate B does not serve at ``size`` of the dynamic dim, the slowest tune timed there (one that tune's
    triage pruned there, when it timed none): the forced copy's canary must lose to B at that size. Not a fixed
    position in the candidate list: on the H200 the last one, the small-M tile, is the very one B serves at every M
    of the loop, and a copy forced to it was rightly promoted (round 20)."""
    for group in ev["tuning"].values():
        point = next((p for p in group["points"] if p["bucket"][0] <= size <= p["bucket"][1]), None)
        if point is None:
            continue
        others = [c for c in group["candidates"] if c != point["winner"]]
        timed = {c: r["median_us"] for c, r in point["candidates"].items()
                 if c in others and r.get("median_us") is not None}
        if timed:
            return max(timed, key=lambda c: timed[c])
        if others:
            return others[0]
    raise RuntimeError(f"no tuned bucket holds {size} with a candidate other than its winner")


def force_slow(src: Path, dest: Path, candidate: str) -> Path:
    """A copy of release ``src`` (new id) whose evidence routes every bucket to ``candidate``."""
    from tileship.release import bundle

    shutil.copytree(src, dest)
    rel = json.loads((dest / "release.json").read_text())
    rel["model"]["version"] = "forced-" + candidate
    (dest / "release.json").write_text(json.dumps(rel, indent=1, sort_keys=True))
    rid = bundle.write_manifest(dest)["release_id"]
    ev = json.loads((dest / "evidence" / "verification.json").read_text())
    ev["release_id"] = rid
    for group in ev["tuning"].values():
        for p in group["points"]:
            p["winner"], p["why"] = candidate, "forced by option_b_loop --rollback"
    (dest / "evidence" / "verification.json").write_text(json.dumps(ev, indent=1, sort_keys=True))
    bundle.write_manifest(dest)
    return dest


def run(args: argparse.Namespace, log: dict[str, Any]) -> bool:
    from tileship.declare.project import find_project, load_operators
    from tileship.declare.propose import propose, to_toml
    from tileship.declare.propose_apply import apply_to_project
    from tileship.release import promote
    from tileship.serve import BackgroundServer, ServeConfig

    setup, work = SETUPS[args.device], Path(args.workdir).resolve()
    for key in ("NO_PROXY", "no_proxy"):  # promote.canary's httpx: 127.0.0.1 never goes through a proxy
        os.environ[key] = ",".join(x for x in ("127.0.0.1", "localhost", os.environ.get(key)) if x)
    for p in ("tileship.toml", f"{setup['module']}.py", "builds", "registry", "forced", "diag", "__pycache__"):
        shutil.rmtree(work / p, ignore_errors=True) if (work / p).is_dir() else (work / p).unlink(missing_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(setup["file"], work / f"{setup['module']}.py")
    for extra in setup.get("also", []):
        shutil.copy(extra, work / extra.name)
        sys.modules.pop(extra.stem, None)
    (work / "tileship.toml").write_text(
        f'model = "option-b-loop"\nmodel_version = "1"\noperators = ["{setup["module"]}"]\n'
        f'targets = {json.dumps(setup["targets"])}\nrouting = "evidence"\n'
    )
    sys.modules.pop(setup["module"], None)  # import the copy next to the project file (the releases ship it)
    sys.path.insert(0, str(work))
    project = work / "tileship.toml"
    path_a = step(log, "build_A", promote.build, project, work / "builds", jobs=args.jobs)
    log["tune_A"] = step(log, "tune_A", promote.tune, path_a, budget_ms=args.budget_ms)
    reg, id_a = promote.publish(work / "registry", path_a)
    reg.activate(id_a)
    log["release_A"] = id_a
    config = ServeConfig(source=reg.root, diagnostics_dir=work / "diag", max_body_bytes=256 << 20,
                         log_stream=(work / "serve.log").open("w"))
    with BackgroundServer(config) as srv:
        if not srv.wait_ready():
            raise RuntimeError(f"server not ready: {srv.service.holder.readiness()[1]}")
        log["server"] = srv.url
        say(f"[serve] release A {id_a} on {srv.url}")
        load = Load(args.device, srv.url, args.requests)
        before = phase("load_before", load, log)
        proj = find_project(project)
        ops = load_operators(proj)
        t0 = time.perf_counter()
        report = propose(before["telemetry"], ops, targets=proj.targets, release=path_a)
        log["proposals"] = [{"operator": p.operator, "kind": p.kind, "static": p.static, "note": p.note,
                             "range": None if p.range is None else {"dim": p.range.dim, "min": p.range.min,
                                                                    "max": p.range.max, "fixed": dict(p.range.fixed)},
                             "calls": p.calls, "calls_share": p.calls_share, "reference_share": p.reference_share,
                             "specializations": p.specializations, "build_seconds": p.build_seconds}
                            for p in report.proposals]
        log["proposal_toml"] = to_toml(report.proposals, ops)
        if not report.proposals:
            raise RuntimeError("propose found nothing to declare")
        apply_to_project(proj, report.proposals, ops)
        log["timings_s"]["propose_apply"] = round(time.perf_counter() - t0, 3)
        say(f"[propose] {len(report.proposals)} proposal(s), applied to {project}:\n{log['proposal_toml']}")
        path_b = step(log, "build_B", promote.build, project, work / "builds", jobs=args.jobs)
        log["tune_B"] = step(log, "tune_B", promote.tune, path_b, budget_ms=args.budget_ms)
        ev = json.loads((path_b / "evidence" / "verification.json").read_text())
        log["tuning_B"] = {gid: [{"dims": p["dims"], "winner": p["winner"], "why": p["why"]} for p in g["points"]]
                           for gid, g in ev["tuning"].items()}
        _, id_b = promote.publish(work / "registry", path_b)
        log["release_B"] = id_b
        policy = {"fraction": 0.5, "window_requests": args.window, "max_p50_ratio": 1.25}
        log["canary"] = step(log, "canary_B", canary, load, reg.path_of(id_b).resolve(), policy)
        if log["canary"]["state"] != "promoted" or srv.service.holder.current.release_id != id_b:
            raise RuntimeError(f"the canary of B ended {log['canary']['state']}: {log['canary']['outcome']}")
        after = phase("load_after", load, log)
        log["reference_share"] = {"before": before["reference_share"], "after": after["reference_share"]}
        if args.rollback:
            heavy = copy.copy(load)  # one hot shape, the largest: a spread of sizes is a spread of latencies,
            heavy.sizes = [max(load.sizes)]  # which the canary counts as noise
            slow = slowest_candidate(ev, heavy.sizes[0])
            forced = force_slow(reg.path_of(id_b), work / "forced", slow)
            log["rollback"] = step(log, "canary_rollback", canary, heavy, forced, {**policy, "max_p50_ratio": 1.1})
            log["rollback"]["forced_candidate"] = slow
            log["rollback"]["active_after"] = srv.service.holder.current.release_id
            log["rollback"]["registry_active_after"] = reg.active().release_id
    ok = after["reference_share"] < before["reference_share"]
    say(f"[result] reference share of served calls: {before['reference_share']:.1%} -> {after['reference_share']:.1%}"
        f" ({'down' if ok else 'NOT down'})")
    if args.rollback:
        rb = log["rollback"]
        rolled = rb["state"] == "rolled_back" and rb["active_after"] == id_b == rb["registry_active_after"]
        say(f"[result] slow canary ({rb['forced_candidate']} everywhere): {rb['state']}; B keeps serving: {rolled}")
        ok = ok and rolled
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--workdir", default="/tmp/option_b_loop")
    ap.add_argument("--out", default="option_b_loop.json")
    ap.add_argument("--requests", type=int, default=None, help="requests per load phase (cpu 200, cuda 100)")
    ap.add_argument("--window", type=int, default=20, help="canary requests before it may be promoted")
    ap.add_argument("--budget-ms", type=float, default=20.0, help="tileship tune's timing budget per run")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rollback", action="store_true", help="also canary a forced-slow copy of B: it must roll back")
    args = ap.parse_args(argv)
    args.requests = args.requests or (200 if args.device == "cpu" else 100)
    LINES.clear()
    log: dict[str, Any] = {"device": args.device, "argv": sys.argv if argv is None else argv, "timings_s": {},
                           "steps": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.perf_counter()
    try:
        log["ok"] = run(args, log)
    except Exception as exc:
        import traceback

        log["ok"], log["error"] = False, f"{type(exc).__name__}: {exc}"
        say(f"[failed] {log['error']}\n{traceback.format_exc()}")
    log["timings_s"]["total"] = round(time.perf_counter() - t0, 3)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(log, indent=1, default=str) + "\n")
    out.with_suffix(".txt").write_text("\n".join(LINES) + "\n")
    return 0 if log["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
