"""`tileship serve --workers 1` on the fault-injection release: the hop, kill -9, a sticky fault under load (issue 16).

The release holds ``fault_copy`` (``benchmarks/fault_kernel.py``: a copy, except that an input
whose first element is ``POISON`` makes the kernel write ~4 GiB past its output). Built for
cuda-sm90a when torch sees a GPU (the GPU host: a sticky CUDA error, the worker's context is
lost), else for "c" (the fault is a SIGSEGV of the worker: a crash, not a fatal reply; the
front-end answers 503 and does not retry the poison on the standby). Two servers run as child
processes, ``--workers 0`` and ``--workers 1``; one client process talks raw keep-alive HTTP/1.1
(``serve_load.Conn``) with binary tensors. Phases:

1. hop: ``--rounds`` x ``--per-round`` sequential copies of N floats to each server, alternating
   rounds; p50/p99 per mode and the p50 difference (on the GPU: the hop of a CUDA call).
2. kill -9: a closed loop of ``--clients`` on the workers server; ``--kills`` times kill -9 the
   serving worker, then time kill -> the next successful answer and kill -> a new standby ready.
3. sticky fault: the same loop; ``--faults`` times send one poisoned request on its own
   connection, then time: its answer (status, message, round trip), poison sent -> the first
   successful answer of the loop after the poison's answer (serving again), poison sent -> a new
   standby ready; and readiness right after the poison's answer.
Every answer of the loop is compared with its input; non-200 answers are counted by status and
message. Then /metrics (worker failures by reason, retries, compile attempts) and the server's
``worker_ready`` log events (start / load / warm-up seconds of every worker, replacements included).

    python benchmarks/serve_failover.py --out OUT/serve_failover.json        # builds the release into OUT/
    python benchmarks/serve_failover.py --release REL --kills 3 --faults 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from serve_load import Conn, _metric, hop_by_round, scrape, summary_us  # noqa: E402
from serve_workers import MODES, readiness, start, wait_ready  # noqa: E402

OP, PATH = "fault_copy", "/v2/models/fault_copy/infer"
FAILOVER_GOAL_S = 1.0


def request(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(
        {
            "inputs": [
                {"name": "X", "shape": [len(x)], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
            ],
            "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return head + x.tobytes(), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }


def answer(status: int, hdrs: dict[str, str], data: bytes, x: np.ndarray) -> tuple[bool, str]:
    """(correct, what to count): a 200 compared with the input, else the status and the error message."""
    if status != 200:
        try:
            msg = json.loads(data).get("error", "")
        except ValueError:
            msg = data[:200].decode("latin-1")
        return False, f"{status}: {msg}"
    got = np.frombuffer(data[int(hdrs["inference-header-content-length"]) :], dtype=np.float32)
    return bool(np.array_equal(got, x)), "200"


async def hop(ports: dict[str, int], n: int, rounds: int, per_round: int) -> dict[str, Any]:
    conns = {m: Conn("127.0.0.1", p) for m, p in ports.items()}
    times: dict[str, list[float]] = {m: [] for m in ports}
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    body, headers = request(x)
    paths: dict[str, str] = {}
    for m, c in conns.items():  # warm-up
        for _ in range(50):
            st, h, d = await c.post(PATH, body, headers)
            assert answer(st, h, d, x)[0], (m, st, d[:300])
        paths[m] = f"{h.get('x-tileship-path')}:{h.get('x-tileship-reason')}"
    for _ in range(rounds):
        for m, c in conns.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                st, h, d = await c.post(PATH, body, headers)
                times[m].append(time.perf_counter() - t0)
                assert answer(st, h, d, x)[0], (m, st, d[:300])
    for c in conns.values():
        c.close()
    out: dict[str, Any] = {m: summary_us(t) for m, t in times.items()}
    out["paths"] = paths
    out.update(hop_by_round(times, per_round, 100.0))
    return out


class Loop:
    """A closed loop of clients; ``answers`` holds (sent, answered, correct, what) per request."""

    def __init__(self, port: int, clients: int, n: int) -> None:
        self.port, self.clients, self.n = port, clients, n
        self.answers: list[tuple[float, float, bool, str]] = []
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._client(i)) for i in range(self.clients)]

    async def _client(self, seed: int) -> None:
        c, rng = Conn("127.0.0.1", self.port), np.random.default_rng(seed)
        while not self.stop.is_set():
            x = rng.standard_normal(self.n, dtype=np.float32)
            body, headers = request(x)
            t0 = time.perf_counter()
            try:
                st, h, d = await c.post(PATH, body, headers)
                ok, what = answer(st, h, d, x)
            except (OSError, ConnectionError, asyncio.IncompleteReadError) as exc:
                c.close()
                ok, what = False, f"connection: {type(exc).__name__}"
            self.answers.append((t0, time.perf_counter(), ok, what))
        c.close()

    async def first_success_after(
        self, t: float, *, answered_after: float | None = None, timeout: float = 60.0
    ) -> float | None:
        """Seconds from ``t`` to the first correct answer sent after ``t`` (or, with ``answered_after``,
        answered after that instant, whenever sent); None past ``timeout``."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if answered_after is None:
                done = [b for a, b, ok, _ in self.answers[-self.clients * 8 :] if ok and a > t]
            else:
                done = [b for _, b, ok, _ in self.answers[-self.clients * 8 :] if ok and b > answered_after]
            if done:
                return min(done) - t
            await asyncio.sleep(0.0005)
        return None

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    def counts(self, since: int = 0) -> dict[str, Any]:
        part = self.answers[since:]
        what: dict[str, int] = {}
        for *_, w in part:
            if w != "200":
                what[w[:160]] = what.get(w[:160], 0) + 1
        return {
            "answers": len(part),
            "correct": sum(1 for *_, ok, _ in part if ok),
            "wrong_200": sum(1 for *_, ok, w in part if w == "200" and not ok),
            "failed": what,
        }


def poison_value() -> float:
    """``fault_kernel.POISON``, read from its source: importing the module would import tilelang here."""
    import ast

    tree = ast.parse((BENCH / "fault_kernel.py").read_text())
    return next(
        float(ast.literal_eval(node.value))
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "POISON"
    )


async def kills_and_faults(proc: Any, port: int, *, kills: int, faults: int, clients: int, n: int) -> dict[str, Any]:
    loop = Loop(port, clients, n)
    loop.start()
    seen: set[int] = set()
    ms = lambda s: None if s is None else round(s * 1e3, 2)  # noqa: E731
    out: dict[str, Any] = {"kill9": [], "sticky_fault": []}
    try:
        await asyncio.sleep(0.5)
        mark = len(loop.answers)
        for _ in range(kills):
            body = await asyncio.to_thread(wait_ready, proc, port, standby_not=seen, timeout=120)
            victim = body["workers"]["serving"][0]
            seen.update([victim, body["workers"]["standby"]])
            t = time.perf_counter()
            os.kill(victim, signal.SIGKILL)
            nxt = await loop.first_success_after(t)
            await asyncio.to_thread(wait_ready, proc, port, standby_not=seen, timeout=120)
            out["kill9"].append(
                {"victim": victim, "to_next_success_ms": ms(nxt), "to_new_standby_ms": ms(time.perf_counter() - t)}
            )
        out["kill9_answers"] = loop.counts(mark)
        mark = len(loop.answers)
        x = np.random.default_rng(99).standard_normal(n, dtype=np.float32)
        x[0] = poison_value()
        pbody, pheaders = request(x)
        for _ in range(faults):
            body = await asyncio.to_thread(wait_ready, proc, port, standby_not=seen, timeout=120)
            victim, standby = body["workers"]["serving"][0], body["workers"]["standby"]
            seen.update([victim, standby])
            c = Conn("127.0.0.1", port)
            t = time.perf_counter()
            st, h, d = await c.post(PATH, pbody, pheaders)
            t_ans = time.perf_counter()
            c.close()
            rst, rbody = await asyncio.to_thread(readiness, port)
            # from the poison sent to the first loop answer after the poison's own answer: nothing after that
            # can have come from the faulty worker (on a GPU its fatal reply retires it before the 503 goes out)
            nxt = await loop.first_success_after(t, answered_after=t_ans)
            await asyncio.to_thread(wait_ready, proc, port, standby_not=seen, timeout=120)
            t_standby = time.perf_counter() - t
            after = (await asyncio.to_thread(readiness, port))[1].get("workers") or {}
            out["sticky_fault"].append(
                {
                    "victim": victim,
                    "standby_before": standby,
                    "poison_status": st,
                    "poison_answer": answer(st, h, d, x)[1][:300],
                    "poison_round_trip_ms": ms(t_ans - t),
                    "to_next_success_ms": ms(nxt),
                    "to_new_standby_ms": ms(t_standby),
                    "ready_right_after": rst,
                    "ready_reason_right_after": rbody.get("reason"),
                    "serving_after": after.get("serving"),
                    "standby_promoted": standby in (after.get("serving") or []),
                }
            )
        out["fault_answers"] = loop.counts(mark)
    finally:
        await loop.close()
    return out


def worker_events(log: Path) -> list[dict[str, Any]]:
    evs = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"worker_' in line:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") in ("worker_ready", "worker_failed", "worker_start_failed"):
                evs.append({k: v for k, v in e.items() if k not in ("level",)})
    return evs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--release", type=Path, help="a release holding fault_copy for this machine (default: build one into --work)"
    )
    ap.add_argument("--work", type=Path, help="where the release is built and the server logs go (default: a temp dir)")
    ap.add_argument("--n", type=int, default=4096, help="elements per request (fp32)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=200)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--faults", type=int, default=3)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # under `timeout`: still write what was measured (finally)
    work = a.work or Path(tempfile.mkdtemp(prefix="serve-failover-"))
    work.mkdir(parents=True, exist_ok=True)
    # the workers import fault_kernel (the operator module: its reference); the release allows unverified kernels
    os.environ["PYTHONPATH"] = os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("TILELANG_CACHE_DIR", str(work / "tlcache"))
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    if a.release is None:
        from gpu_fault_recovery import build_release

        release = build_release(work / "build", device)
    else:
        release = a.release
    build_s = round(time.perf_counter() - t0, 1) if a.release is None else None
    print(
        f"serve_failover: {device}, release {release} ({f'built in {build_s:.1f} s' if build_s else 'given'})",
        flush=True,
    )
    logs = {m: work / f"server_{m}.log" for m in ("workers0", "workers1")}
    procs = {m: start(release, MODES[m], logs[m]) for m in ("workers0", "workers1")}
    result: dict[str, Any] = {
        "benchmark": "serve_failover",
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "release": str(release),
        "build_s": build_s,
        "request": f"{OP}, FP32, N={a.n}, binary tensors",
        "fault": "sticky CUDA error (illegal address)"
        if device == "cuda"
        else 'SIGSEGV of the worker ("c" target): a crash, a 503, not retried',
    }
    rc = 1
    try:
        t = time.perf_counter()
        for m, (p, _, port) in procs.items():
            wait_ready(p, port, standby_not=set() if m == "workers1" else None)
        result["both_ready_s"] = round(time.perf_counter() - t, 2)
        print(f"  both servers ready in {result['both_ready_s']} s", flush=True)
        result["hop_us"] = asyncio.run(hop({m: port for m, (_, _, port) in procs.items()}, a.n, a.rounds, a.per_round))
        print(f"  hop: {json.dumps(result['hop_us'])}", flush=True)
        p1, _, port1 = procs["workers1"]
        result["failover"] = asyncio.run(
            kills_and_faults(p1, port1, kills=a.kills, faults=a.faults, clients=a.clients, n=a.n)
        )
        text = scrape(f"http://127.0.0.1:{port1}")
        result["metrics"] = {
            "worker_failures": {
                ln.split('reason="')[1].split('"')[0]: float(ln.split()[-1])
                for ln in text.splitlines()
                if ln.startswith("tileship_worker_failures_total{")
            },
            "worker_retries": _metric(text, "tileship_worker_retries_total"),
            "compile_attempts": _metric(text, "tileship_serve_compile_attempts"),
        }
        result["ready_at_end"] = readiness(port1)[0]
        rc = 0
    finally:
        result["complete"] = rc == 0
        for p, _, _ in procs.values():
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(60)
            except Exception:
                p.kill()
        result["worker_events"] = worker_events(logs["workers1"])
        result["server_logs"] = {m: str(p) for m, p in logs.items()}
        fo = result.get("failover") or {}
        sticky = [f["to_next_success_ms"] for f in fo.get("sticky_fault", [])]
        kills = [k["to_next_success_ms"] for k in fo.get("kill9", [])]
        result["summary"] = {
            "hop_p50_us": (result.get("hop_us") or {}).get("hop_p50_us"),
            "hop_spread_us": (result.get("hop_us") or {}).get("hop_spread_us"),
            "hop_verdict": (result.get("hop_us") or {}).get("hop_verdict"),
            "kill9_to_next_success_ms": kills,
            "fault_to_next_success_ms": sticky,
            "fault_under_1s": bool(sticky) and all(s is not None and s < FAILOVER_GOAL_S * 1e3 for s in sticky),
            "wrong_200": sum((fo.get(k) or {}).get("wrong_200", 0) for k in ("kill9_answers", "fault_answers")),
            "failed": {k: (fo.get(k) or {}).get("failed") for k in ("kill9_answers", "fault_answers")},
            # issue 16: a replacement standby ready within its imports + 2 s
            "ready_beyond_imports_s": [
                round(e["start_s"] - e["import_s"], 3)
                for e in result.get("worker_events", [])
                if e.get("event") == "worker_ready" and "import_s" in e
            ],
        }
        text = json.dumps(result, indent=2)
        print(text)
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(text + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
