"""Sticky CUDA error drill (GPU host): poison a worker's CUDA context, notice, restart, time it.

    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/gpu_fault_recovery.py --out OUT [--release DIR] [--restarts 3]

Without --release, builds ``benchmarks/fault_kernel.py`` (``fault_copy``, a copy kernel with a
deliberate out-of-bounds write when ``X[0] == POISON``) for cuda-sm90a into OUT/build with
nvcc. Then, with plain subprocesses and a JSON-lines pipe (no HTTP stack needed):

1. cold start: a worker process imports torch/tilelang/tileship, loads the release (no JIT)
   and warms ``fault_copy`` (one call, compared with the input) -> "ready";
2. good calls are answered by the kernel path and are correct;
3. a poisoned call: the kernel writes ~4 GiB past its output -> illegal address; the worker's
   readiness probe (a tiny CUDA op + synchronize) must now report not ready, and a good call
   must fail too (the context is lost for good: the process must not keep answering);
4. the first time, the poisoned worker writes a diagnostics bundle (nvidia-smi -q, SASS of
   the faulting kernel via cuobjdump, traceback) to show diagnostics work after the fault;
5. the parent kills the worker (SIGKILL) and starts a fresh one; restart-to-ready is timed
   from "readiness false observed" to "new worker ready", split into python startup, import
   (torch + tilelang + tileship), load, warm-up. Goal: total minus (startup + import) < 3 s.
Steps 3-5 repeat --restarts times. Writes OUT/fault_recovery.json and OUT/fault_recovery.txt
(printed too) and OUT/worker-<n>.log (each worker's stderr). Exit 0 when every round
faulted, was detected, and recovered with correct answers; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
BENCH = ROOT / "benchmarks"  # fault_kernel.py: the fault-injection operator module
GOAL_BEYOND_IMPORT_S = 3.0


# -- worker (child process) ---------------------------------------------------------------------

def worker(release: str, n: int, device: str) -> int:
    t_wall = time.time()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed to stdout (TileLang, TVM) goes to stderr, not the protocol

    def send(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    from tileship import env

    env.ensure_tilelang_cache_dir()
    import tilelang  # noqa: F401  (timed here so that load_s is the load alone)

    t2 = time.perf_counter()
    from fault_kernel import POISON  # benchmarks/, this script's directory

    from tileship.release import diagnostics
    from tileship.runtime.device_faults import is_sticky_text
    from tileship.runtime.loader import load

    t3 = time.perf_counter()
    rel = load(release)
    op = rel.op("fault_copy")
    t4 = time.perf_counter()
    cuda = device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    x = torch.randn(n, device=device)
    y, d = op.call(x)
    sync()
    warm_ok = bool(torch.equal(x, y))
    t5 = time.perf_counter()
    name = torch.cuda.get_device_properties(0).name if cuda else "cpu"
    send({"event": "ready", "wall_start": t_wall, "import_torch_s": t1 - t0, "import_tilelang_s": t2 - t1,
          "import_tileship_s": t3 - t2, "load_s": t4 - t3, "warm_s": t5 - t4, "warm_ok": warm_ok, "path": d.path,
          "reason": d.reason, "release_id": rel.release_id, "device": name, "torch": torch.__version__,
          "tilelang": getattr(sys.modules.get("tilelang"), "__version__", None),
          "load_errors": rel.load_errors, "notes": rel.notes})
    last_exc: BaseException | None = None
    last_call: Any = None
    for line in sys.stdin:
        req = json.loads(line)
        rid, cmd = req.get("id"), req.get("cmd")
        t = time.perf_counter()
        try:
            if cmd == "call":
                x = torch.randn(int(req.get("n", n)), device=device)
                if req.get("poison"):
                    x[0] = POISON
                last_call = (x,)
                y, d = op.call(x)
                sync()
                ok = bool(torch.equal(x, y)) if not req.get("poison") else None
                send({"id": rid, "ok": ok, "path": d.path, "reason": d.reason, "s": time.perf_counter() - t})
            elif cmd == "ready":
                sync()
                probe = torch.ones(16, device=device) + 1
                send({"id": rid, "ready": bool(probe.sum().item() == 32.0), "s": time.perf_counter() - t})
            elif cmd == "diagnose":
                ref = diagnostics.capture(rel, spec_id=op.entries[0].decision.spec_id, exc=last_exc, call=last_call,
                                          out_dir=req["out"], reason="sticky_cuda_error")
                summary = json.loads((Path(ref.path) / "summary.json").read_text())
                send({"id": rid, "diagnostics_id": ref.id, "path": str(ref.path), "files": summary["files"],
                      "notes": summary["notes"], "tools": summary["tools"], "s": time.perf_counter() - t})
            elif cmd == "exit":
                send({"id": rid, "bye": True})
                return 0
        except Exception as exc:  # report it; the parent decides
            last_exc = exc
            text = f"{type(exc).__name__}: {exc}".strip()
            send({"id": rid, "ok": False, "ready": False, "error": text.splitlines()[0][:500],
                  "sticky": is_sticky_text(text), "s": time.perf_counter() - t})
    return 0


# -- parent -------------------------------------------------------------------------------------

class Worker:
    """A worker process and a reader thread, so that no pipe read can hang the drill."""

    def __init__(self, release: Path, n: int, log: Path, device: str) -> None:
        self.log = open(log, "wb")  # noqa: SIM115 (closed in kill)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["TILESHIP_ALLOW_UNVERIFIED"] = "1"  # the fault kernel has no verification evidence, by design
        self.spawn_wall = time.time()
        self.spawn = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(release), "--n",
                                      str(n), "--device", device],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except json.JSONDecodeError:
                pass
        self.lines.put(None)

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        msg = self._next(timeout)
        if msg.get("event") != "ready":
            raise RuntimeError(f"worker sent {msg} instead of ready")
        msg["ready_at"] = time.perf_counter()
        return msg

    def request(self, cmd: str, timeout: float = 60.0, **kw: Any) -> dict[str, Any]:
        self.next_id += 1
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"id": self.next_id, "cmd": cmd, **kw}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            return {"ok": False, "ready": False, "error": f"worker gone: {exc}", "sticky": False}
        while True:
            try:
                msg = self._next(timeout)
            except RuntimeError as exc:  # the worker died (on the CPU dry run, the out-of-bounds write is a SIGSEGV)
                return {"ok": False, "ready": False, "error": str(exc), "sticky": False, "worker_exited": True}
            if msg.get("id") == self.next_id:
                return msg

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            msg = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no answer from the worker within {timeout} s") from None
        if msg is None:
            raise RuntimeError(f"the worker exited (status {self.proc.wait()}); see {self.log.name}")
        return msg

    def kill(self) -> float:
        t = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.log.close()
        return time.perf_counter() - t


def timings(ready: dict[str, Any], w: Worker, t_from: float) -> dict[str, float]:
    startup = ready["wall_start"] - w.spawn_wall
    imp = ready["import_torch_s"] + ready["import_tilelang_s"] + ready["import_tileship_s"]
    total = ready["ready_at"] - t_from
    return {"total_s": total, "python_startup_s": startup, "import_s": imp, "import_torch_s": ready["import_torch_s"],
            "import_tilelang_s": ready["import_tilelang_s"], "import_tileship_s": ready["import_tileship_s"],
            "load_s": ready["load_s"], "warm_s": ready["warm_s"], "beyond_import_s": total - startup - imp}


def build_release(out: Path, device: str) -> Path:
    if (
        not any((Path(p) / "nvcc").exists() for p in os.environ.get("PATH", "").split(os.pathsep))
        and Path("/usr/local/cuda/bin/nvcc").exists()
    ):
        os.environ["PATH"] = "/usr/local/cuda/bin" + os.pathsep + os.environ.get("PATH", "")
    sys.path.insert(0, str(SRC))
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import Project, load_operators

    targets = ("cuda-sm90a",) if device == "cuda" else ("c",)
    proj = Project(model="fault-drill", model_version="1", operator_modules=("fault_kernel",), targets=targets,
                   allow_unverified=True, root=BENCH)
    result = build(proj, load_operators(proj), out, BuildOptions(jobs=1, timeout_s=600))
    if not result.ok:
        raise SystemExit(
            f"building the fault kernel failed: {[(r.spec.id, r.error, r.log[-2000:]) for r in result.failed]}"
        )
    return result.path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fault-recovery"))
    ap.add_argument("--release", type=Path,
                    help="a release holding fault_copy for this GPU (default: build one into OUT/build)")
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--n", type=int, default=4096, help="elements per call")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a worker may take to become ready")
    ap.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help='cpu: a dry run of this script with the "c" target (the fault is a SIGSEGV, not a CUDA error)',
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.n, a.device)
    a.out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    release = a.release or build_release(a.out / "build", a.device)
    build_s = time.perf_counter() - t if a.release is None else None
    report: dict[str, Any] = {"device_kind": a.device, "release": str(release), "build_s": build_s, "n": a.n,
                              "goal_beyond_import_s": GOAL_BEYOND_IMPORT_S,
                              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rounds": [],
                              "problems": []}
    problems: list[str] = report["problems"]
    k = 0
    w = Worker(release, a.n, a.out / f"worker-{k}.log", a.device)
    ready = w.wait_ready(a.timeout)
    report["cold_start"] = timings(ready, w, w.spawn)
    report["worker"] = {key: ready[key] for key in ("release_id", "device", "torch", "tilelang", "path", "reason",
                                                    "warm_ok", "load_errors", "notes")}
    if ready["path"] != "kernel" or not ready["warm_ok"]:
        problems.append(f"the warm-up call ran the {ready['path']} path ({ready['reason']}), "
                        f"warm_ok={ready['warm_ok']}: the fault kernel is not serving")
    for r in range(a.restarts):
        rnd: dict[str, Any] = {"round": r}
        good = [w.request("call") for _ in range(5)]
        rnd["good_calls_before"] = sum(1 for g in good if g.get("ok") and g.get("path") == "kernel")
        t_poison = time.perf_counter()
        res = w.request("call", poison=True)
        rnd["poisoned_call"] = res
        probe = w.request("ready")
        t_detect = time.perf_counter()
        rnd["readiness_after_fault"] = bool(probe.get("ready"))
        rnd["probe"] = probe
        rnd["detect_s"] = t_detect - t_poison
        after = w.request("call")
        rnd["good_call_on_poisoned_worker"] = after
        if r == 0:
            diag = w.request("diagnose", timeout=120, out=str(a.out / "diagnostics"))
            report["diagnostics"] = diag
        if res.get("ok") is not False or probe.get("ready"):
            problems.append(f"round {r}: the poisoned call did not poison the context (call: {res}, probe: {probe})")
        if after.get("ok"):
            problems.append(f"round {r}: the poisoned worker still answered a call correctly")
        rnd["kill_s"] = w.kill()
        k += 1
        w = Worker(release, a.n, a.out / f"worker-{k}.log", a.device)
        ready = w.wait_ready(a.timeout)
        rnd["restart"] = timings(ready, w, t_detect)
        check = w.request("call")
        rnd["good_call_after_restart"] = check
        if not (ready["warm_ok"] and check.get("ok") and check.get("path") == "kernel"):
            problems.append(f"round {r}: the restarted worker did not serve correctly (ready: {ready}, call: {check})")
        report["rounds"].append(rnd)
    w.request("exit", timeout=30)
    w.kill()
    restarts = [rd["restart"] for rd in report["rounds"]]
    if restarts:
        report["median"] = {key: statistics.median(x[key] for x in restarts) for key in restarts[0]}
        report["median"]["detect_s"] = statistics.median(rd["detect_s"] for rd in report["rounds"])
        report["median"]["kill_s"] = statistics.median(rd["kill_s"] for rd in report["rounds"])
        report["goal_met"] = report["median"]["beyond_import_s"] < GOAL_BEYOND_IMPORT_S
    report["fault"] = {
        "readiness_after_fault": any(rd["readiness_after_fault"] for rd in report["rounds"])
        if report["rounds"]
        else None
    }
    report["passed"] = not problems and bool(report["rounds"])
    (a.out / "fault_recovery.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    text = render(report)
    (a.out / "fault_recovery.txt").write_text(text)
    print(text)
    return 0 if report["passed"] else 1


def render(rep: dict[str, Any]) -> str:
    wk = rep.get("worker", {})
    lines = [f"sticky CUDA error recovery: {'PASSED' if rep['passed'] else 'FAILED'}  ({rep['created']})",
             f"device {wk.get('device')}, torch {wk.get('torch')}, tilelang {wk.get('tilelang')}, release "
             f"{wk.get('release_id')}"
             + (f", built in {rep['build_s']:.1f} s" if rep.get("build_s") else ""), ""]
    c = rep["cold_start"]
    lines.append(f"cold start: {c['total_s']:.2f} s = python {c['python_startup_s']:.2f} + import {c['import_s']:.2f} "
                 f"(torch {c['import_torch_s']:.2f}, tilelang {c['import_tilelang_s']:.2f}, tileship "
                 f"{c['import_tileship_s']:.2f}) "
                 f"+ load {c['load_s'] * 1e3:.0f} ms + warm {c['warm_s'] * 1e3:.0f} ms + other")
    lines.append(f"{'round':>5} {'fault':>6} {'detect':>8} {'kill':>7} {'restart':>8} {'python':>7} {'import':>7} "
                 f"{'load':>7} {'warm':>7} "
                 f"{'beyond import':>14}")
    for rd in rep["rounds"]:
        s = rd["restart"]
        fault = "yes" if rd["poisoned_call"].get("ok") is False and not rd["readiness_after_fault"] else "NO"
        lines.append(f"{rd['round']:>5} {fault:>6} {rd['detect_s'] * 1e3:>6.0f}ms {rd['kill_s'] * 1e3:>5.0f}ms "
                     f"{s['total_s']:>7.2f}s "
                     f"{s['python_startup_s']:>6.2f}s {s['import_s']:>6.2f}s {s['load_s'] * 1e3:>5.0f}ms "
                     f"{s['warm_s'] * 1e3:>5.0f}ms "
                     f"{s['beyond_import_s']:>13.2f}s")
    if "median" in rep:
        m = rep["median"]
        lines += ["", f"median restart-to-ready {m['total_s']:.2f} s; beyond python startup + import: "
                      f"{m['beyond_import_s']:.2f} s "
                      f"(goal < {rep['goal_beyond_import_s']:.0f} s: {'met' if rep['goal_met'] else 'NOT met'})"]
    if rep["rounds"]:
        r0 = rep["rounds"][0]
        lines.append(f"poisoned call: {r0['poisoned_call'].get('error')}")
        lines.append(f"probe after the fault: ready={r0['readiness_after_fault']} ({r0['probe'].get('error')})")
    d = rep.get("diagnostics")
    if d:
        lines.append(f"diagnostics after the fault: {d.get('diagnostics_id')} ({len(d.get('files', []))} files, tools "
                     f"{d.get('tools')}) "
                     f"{d.get('error') or ''}")
    lines += [f"PROBLEM: {p}" for p in rep["problems"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
