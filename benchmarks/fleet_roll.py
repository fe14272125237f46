"""Rolling activation on a `tileship serve --ray` fleet under a bounded loopback load (issue 19, item 2).

A local Ray cluster (``num_cpus=2``), a fleet of ``--replicas`` replicas on a registry holding the
CPU catalog release and copies of it under other versions (distinct release ids, same kernels),
and ``--clients`` client threads sending ``add`` requests with random inputs over loopback,
checking every answer against ``x + y``. The registry's active release is then moved ``--rolls``
times (A -> B -> C -> A ...); each roll goes canary replica -> judged window -> the rest. Then two
bad releases are activated and must be rolled back on their own, the registry's pointer with them:
an ``add`` kernel that computes A - B on every 97th element (warm-up catches it on the canary),
and one that returns NaN from N = 1024 on (warm-up passes; under a load at N = 2048 the canary's
calls open the circuit and are answered by the reference, and the error rule rolls it back).

Reported: per roll the time from the registry change to fully rolled (the fleet's own clock),
and over the whole run the requests sent, failed (any status but 200 or a dropped connection),
wrong (values that are not x + y) and answered by the bad release (must be 0), per release id.

    python benchmarks/fleet_roll.py --rolls 5 --out benchmarks/results/cpu/fleet_roll.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

BAD_OPS = '''
import tilelang.language as T
from tileship.declare.spec import Operator, TensorArg


def wrong_add_kernel(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 256)) as bx:
            for i in T.Parallel(256):
                idx = bx * 256 + i
                if idx < N:
                    C[idx] = T.if_then_else(idx % 97 == 0, A[idx] - B[idx], A[idx] + B[idx])

    return main


def add_reference(a, b):
    import torch

    return torch.add(a, b)


add = Operator(name="add", factory=wrong_add_kernel, reference=add_reference,
               inputs=(TensorArg("A", ("N",)), TensorArg("B", ("N",))), outputs=(TensorArg("C", ("N",)),),
               dtypes=("float32",), targets=("c",), shapes=({"N": 4096},))
'''


#: an ``add`` whose kernel is right at the sizes warm-up tries (N <= 256 of its range) and returns NaN
#: from N = 1024 on: the server recomputes those calls on the reference and opens the circuit (reason
#: ``circuit_open``), so clients get right answers while the canary's error count climbs
FAULTY_OPS = BAD_OPS.replace("idx % 97 == 0, A[idx] - B[idx]",
                             "N >= 1024, T.sqrt(0.0 - 1.0 - A[idx] * A[idx])").replace(
    'shapes=({"N": 4096},))', 'ranges=(DynamicRange("N", 1, 65536),))').replace(
    "from tileship.declare.spec import Operator, TensorArg",
    "from tileship.declare.spec import DynamicRange, Operator, TensorArg")


def build_bad_release(root: Path, source: str = BAD_OPS, module: str = "fleet_bad_ops") -> Path:
    """A release whose ``add`` kernel is wrong (the reference is right): by default one that
    warm-up refuses (``BAD_OPS``); ``FAULTY_OPS``: one that faults only under traffic."""
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import Project, load_operators

    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(source)
    proj = Project(model="fleet-bad", model_version="1", operator_modules=(module,), targets=("c",), root=root)
    result = build(proj, load_operators(proj), root / "out", BuildOptions(jobs=2))
    assert result.ok, [r.error for r in result.failed]
    return Path(result.path)


class Load:
    """``clients`` threads sending ``add`` requests until ``stop`` (at most ``max_requests``)."""

    def __init__(self, url: str, clients: int = 4, n: int = 256, max_requests: int = 1_000_000) -> None:
        self.url, self.clients, self.n, self.max_requests = url, clients, n, max_requests
        self.sent = 0
        self.failed: list[str] = []
        self.wrong: list[str] = []
        self.by_release: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _client(self, seed: int) -> None:
        import httpx
        import numpy as np

        rng = np.random.default_rng(seed)
        with httpx.Client(timeout=60.0) as c:
            while not self.halt.is_set():
                with self.lock:
                    if self.sent >= self.max_requests:
                        return
                    self.sent += 1
                x, y = rng.standard_normal(self.n).astype(np.float32), rng.standard_normal(self.n).astype(np.float32)
                body = {"inputs": [{"name": k, "shape": [self.n], "datatype": "FP32", "data": v.tolist()}
                                   for k, v in (("A", x), ("B", y))]}
                try:
                    r = c.post(self.url + "/v2/models/add/infer", json=body)
                except Exception as exc:  # a connection the fleet dropped counts as failed
                    with self.lock:
                        self.failed.append(f"{type(exc).__name__}: {exc}")
                    continue
                with self.lock:
                    if r.status_code != 200:
                        self.failed.append(f"{r.status_code}: {r.text[:300]}")
                        continue
                    got = np.asarray(r.json()["outputs"][0]["data"], dtype=np.float32)
                    release = r.headers.get("x-tileship-release", "?")
                    self.by_release[release] += 1
                    if not np.allclose(got, x + y, atol=1e-5):
                        self.wrong.append(f"release {release}: {int((~np.isclose(got, x + y, atol=1e-5)).sum())} "
                                          f"of {self.n} elements differ")

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.halt.set()
        for t in self.threads:
            t.join(120)

    def summary(self) -> dict[str, Any]:
        with self.lock:
            return {"sent": self.sent, "ok": sum(self.by_release.values()), "failed": len(self.failed),
                    "wrong": len(self.wrong), "by_release": dict(self.by_release),
                    "failures": self.failed[:10], "wrong_examples": self.wrong[:10]}


def roll_to(fleet: Any, registry: Any, release: str, timeout: float = 120.0) -> dict[str, Any]:
    """Activate ``release`` in the registry; wait for the fleet to finish the roll it starts; its record."""
    before = len(fleet.status()["rolls"])
    registry.activate(release)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rolls = fleet.status()["rolls"]
        if len(rolls) > before:
            return rolls[before]  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise TimeoutError(f"the fleet did not finish rolling to {release} within {timeout} s: {fleet.status()['roll']}")


def phases(events: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per roll, seconds from its start to each later event of it (canary_serving, canary_promoted, rolled...)."""
    out: list[dict[str, float]] = []
    for ev in events:
        if ev["event"] == "roll_start":
            out.append({"_t": ev["t"]})
        elif out and ev["event"] in ("canary_serving", "canary_promoted", "rolled", "rolled_back", "aborted"):
            out[-1][ev["event"]] = round(ev["t"] - out[-1]["_t"], 3)
    return [{k: v for k, v in p.items() if k != "_t"} for p in out]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rolls", type=int, default=5)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--window-requests", type=int, default=50)
    ap.add_argument("--window-seconds", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import ray

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from serve_load import build_cpu_release, free_port

    from tileship.release import bundle
    from tileship.release.registry import Registry
    from tileship.serve import ServeConfig
    from tileship.serve.canary import CanaryPolicy
    from tileship.serve.fleet_plan import FleetPolicy
    from tileship.serve.ray_fleet import Fleet, FleetOptions

    tmp = Path(tempfile.mkdtemp(prefix="tileship-fleet-roll-"))
    a = build_cpu_release(tmp / "a")
    reg = Registry(tmp / "registry")
    ids = [reg.publish(a)]
    for i in (2, 3):  # the same kernels under another model version: another release id
        import shutil

        dest = tmp / f"v{i}"
        shutil.copytree(a, dest)
        rel = json.loads((dest / "release.json").read_text())
        rel["model"]["version"] = f"fleet-{i}"
        (dest / "release.json").write_text(json.dumps(rel, indent=1, sort_keys=True))
        bundle.write_manifest(dest)
        ids.append(reg.publish(dest))
    bad = reg.publish(build_bad_release(tmp / "bad"))
    faulty = reg.publish(build_bad_release(tmp / "faulty", FAULTY_OPS, "fleet_faulty_ops"))
    reg.activate(ids[0])

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    policy = FleetPolicy(CanaryPolicy(window_requests=args.window_requests, window_seconds=args.window_seconds))
    fleet = Fleet(ServeConfig(source=reg.root), FleetOptions(replicas=args.replicas, replica_cpus=0.5, policy=policy))
    url = fleet.start("127.0.0.1", free_port())
    started_s = time.perf_counter() - t0
    rolls = []
    try:
        with Load(url, clients=args.clients) as load:
            time.sleep(2.0)
            for k in range(args.rolls):
                rolls.append(roll_to(fleet, reg, ids[(k + 1) % len(ids)]))
                time.sleep(1.0)
            bad_roll = roll_to(fleet, reg, bad)
            time.sleep(1.0)
        with Load(url, clients=args.clients, n=2048) as faulty_load:  # N >= 1024: the faulty kernel's NaN
            time.sleep(1.0)
            faulty_roll = roll_to(fleet, reg, faulty)
            time.sleep(1.0)
        status = fleet.status()
    finally:
        fleet.stop()
        ray.shutdown()
    result = {"benchmark": "fleet_roll", "host": platform.node(), "cpus": 2, "replicas": args.replicas,
              "clients": args.clients, "window": {"requests": args.window_requests, "seconds": args.window_seconds},
              "fleet_start_s": round(started_s, 2), "rolls": rolls, "bad_canary": bad_roll,
              "faulty_canary": faulty_roll, "faulty_load": faulty_load.summary(),
              "faulty_release_errors": status["per_release"].get(faulty, {}).get("errors", 0),
              "registry_active_after": reg.active().release_id, "load": load.summary(),
              "answered_by_bad_release": load.by_release.get(bad, 0),
              "per_release": status["per_release"], "phases": phases(status["events"]), "events": status["events"]}
    good = [r["seconds"] for r in rolls if r["outcome"] == "rolled"]
    lines = [f"fleet of {args.replicas} replicas on a local Ray cluster (num_cpus=2), {args.clients} clients, "
             f"window {args.window_requests} canary requests and {args.window_seconds:g} s; fleet up in "
             f"{started_s:.1f} s",
             *(f"roll {i + 1}: {r['previous'][:8]} -> {r['release'][:8]}: {r['outcome']} in {r['seconds']:.2f} s "
               f"(canary serving after {p.get('canary_serving', 0):.2f} s, promoted after "
               f"{p.get('canary_promoted', 0):.2f} s)"
               for i, (r, p) in enumerate(zip(rolls, result["phases"][:len(rolls)], strict=True))),
             (f"time to fully rolled: min {min(good):.2f} s, max {max(good):.2f} s over {len(good)} rolls"
              if good else ""),
             f"bad canary {bad[:8]}: {bad_roll['outcome']} in {bad_roll['seconds']:.2f} s: {bad_roll['reason'][:200]}",
             f"faulty canary {faulty[:8]} (NaN from N=1024; load at N=2048): {faulty_roll['outcome']} in "
             f"{faulty_roll['seconds']:.2f} s: {faulty_roll['reason'][:200]}; its requests: "
             f"{faulty_load.summary()['sent']} sent, {faulty_load.summary()['failed']} failed, "
             f"{faulty_load.summary()['wrong']} wrong",
             f"registry active after: {result['registry_active_after']}",
             f"requests: {load.summary()['sent']} sent, {load.summary()['ok']} ok, {load.summary()['failed']} failed, "
             f"{load.summary()['wrong']} wrong, {result['answered_by_bad_release']} by the bad release; "
             f"by release {dict(load.by_release)}"]
    text = "\n".join(x for x in lines if x)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        args.out.with_suffix(".txt").write_text(text + "\n")
    s = load.summary()
    fs = faulty_load.summary()
    clean = s["failed"] == 0 and s["wrong"] == 0 and fs["failed"] == 0 and fs["wrong"] == 0
    return 0 if clean and not result["answered_by_bad_release"] and faulty_roll["outcome"] == "rolled_back" else 1


if __name__ == "__main__":
    raise SystemExit(main())
