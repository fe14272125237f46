"""`tileship serve --workers 1` against `--workers 0`: the worker hop's cost, and failover time.

Two servers run side by side as child processes (`tileship serve REL --workers 0` and
`--workers 1`, same release, same flags), and a third with `--workers 1 --worker-spin-us 0
--loop-spin-us 0` (``--no-nospin`` leaves it out: the waits sleep at once, as before the spin);
one client process sends them small binary requests over raw keep-alive HTTP/1.1
(``serve_load.Conn``), taking turns (phase 1) so that machine noise lands on all alike. Phases:

1. latency: ``--rounds`` x ``--per-round`` sequential requests to each server (after a
   warm-up), each server's round in one piece, or with ``--block B`` the servers taking turns every
   B requests within a round; p50/p99 per mode and the p50 difference: the cost of the hop (copy into
   the shared buffer, one frame each way over a Unix socket, copy out). Turns within a round keep a slow
   stretch of the machine from landing on one server's round only, but each block then starts on a server
   idle for two blocks: on the 2-core CPU machine ``--block 20`` measured a larger hop than one block a
   round (695 vs 151 us p50, a loaded day), so the two are different measurements, both kept.
2. failover: a closed loop of ``--clients`` clients on the workers server; ``--kills`` times,
   kill -9 the serving worker (its pid from /v2/health/ready), then measure kill -> the next
   successful answer, and kill -> a new standby ready (readiness names its pid). Every answer
   is compared with a + b; non-200 answers are counted, not hidden.

    python benchmarks/serve_workers.py --out benchmarks/results/cpu/serve_workers.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import ROOT, Conn, build_cpu_release, free_port, hop_by_round, pct, summary_us  # noqa: E402

#: the servers side by side: mode -> extra ``tileship serve`` arguments (``workers1_nospin``: the worker and the
#: event loop sleep at once while waiting, as before ``--worker-spin-us``/``--loop-spin-us``)
MODES = {"workers0": ["--workers", "0"], "workers1": ["--workers", "1"],
         "workers1_nospin": ["--workers", "1", "--worker-spin-us", "0", "--loop-spin-us", "0"]}


def start(release: Path, args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    port = free_port()
    cmd = [sys.executable, "-c", "from tileship.cli import main; main()", "serve", str(release), "--port", str(port),
           *args, "--timeout", "10"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=f, env=env)
    return proc, "127.0.0.1", port


def readiness(port: int) -> tuple[int, dict[str, Any]]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError:
        return 0, {}


def wait_ready(proc: subprocess.Popen[bytes], port: int, *, standby_not: set[int] | None = None,
               timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        st, body = readiness(port)
        w = body.get("workers")
        if st == 200 and (standby_not is None or (w and w.get("standby") and w["standby"] not in standby_not)):
            return body
        time.sleep(0.01)
    raise SystemExit(f"not ready within {timeout} s")


def request(n: int, rng: Any) -> tuple[bytes, dict[str, str], np.ndarray]:
    a, b = rng.standard_normal((2, n), dtype=np.float32)
    head = json.dumps({"inputs": [{"name": k, "shape": [n], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 4 * n}}
                                  for k in ("A", "B")],
                       "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}).encode()
    return head + a.tobytes() + b.tobytes(), {"Content-Type": "application/octet-stream",
                                               "Inference-Header-Content-Length": str(len(head))}, a + b


def correct(status: int, hdrs: dict[str, str], data: bytes, want: np.ndarray) -> bool:
    return status == 200 and np.array_equal(np.frombuffer(data[int(hdrs["inference-header-content-length"]):],
                                                          dtype=np.float32), want)


async def latency(ports: dict[str, int], n: int, rounds: int, per_round: int, block: int) -> dict[str, Any]:
    conns = {m: Conn("127.0.0.1", p) for m, p in ports.items()}
    times: dict[str, list[float]] = {m: [] for m in ports}
    rng = np.random.default_rng(0)
    body, headers, want = request(n, rng)
    for m, c in conns.items():  # warm-up
        for _ in range(100):
            assert correct(*(await c.post("/v2/models/add/infer", body, headers)), want), m
    step = min(block, per_round) if block > 0 else per_round
    for _ in range(rounds):
        # each round: blocks of ``step`` back-to-back requests, the servers taking turns block by block, so
        # that the machine's drift within a round lands on every server alike
        for b0 in range(0, per_round, step):
            for m, c in conns.items():
                for _ in range(min(step, per_round - b0)):
                    t0 = time.perf_counter()
                    st, h, d = await c.post("/v2/models/add/infer", body, headers)
                    times[m].append(time.perf_counter() - t0)
                    assert correct(st, h, d, want), (m, st, d[:200])
    for c in conns.values():
        c.close()
    out = {m: summary_us(t) for m, t in times.items()}
    out.update(hop_by_round(times, per_round, 100.0))
    if "workers1_nospin" in times:  # the same hop with the waits sleeping at once
        nospin = hop_by_round({"workers0": times["workers0"], "workers1": times["workers1_nospin"]}, per_round, 100.0)
        out.update({f"nospin_{k}": v for k, v in nospin.items()})
        spin = times["workers1"]
        out["spin_minus_nospin_rounds_us"] = [
            round((pct(spin[i:i + per_round], 50) - pct(times["workers1_nospin"][i:i + per_round], 50)) * 1e6, 1)
            for i in range(0, len(spin), per_round)]
    return out


async def failover(proc: subprocess.Popen[bytes], port: int, kills: int, clients: int, n: int) -> dict[str, Any]:
    answers: list[tuple[float, int, bool]] = []  # (time answered, status, correct)
    stop = asyncio.Event()

    async def client(seed: int) -> None:
        c, rng = Conn("127.0.0.1", port), np.random.default_rng(seed)
        while not stop.is_set():
            body, headers, want = request(n, rng)
            st, h, d = await c.post("/v2/models/add/infer", body, headers)
            answers.append((time.perf_counter(), st, correct(st, h, d, want) if st == 200 else False))
        c.close()

    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    seen: set[int] = set()
    to_answer, to_standby = [], []
    await asyncio.sleep(0.5)
    for _ in range(kills):
        body = await asyncio.to_thread(wait_ready, proc, port, standby_not=seen)
        victim = body["workers"]["serving"][0]
        seen.update([victim, body["workers"]["standby"]])
        first = len(answers)  # answers before this index all came before the kill
        t_kill = time.perf_counter()
        os.kill(victim, signal.SIGKILL)
        while not any(t > t_kill and st == 200 for t, st, _ in answers[-clients * 4:]):
            await asyncio.sleep(0.0005)
        to_answer.append(next(t for t, st, _ in answers[first:] if t > t_kill and st == 200) - t_kill)
        await asyncio.to_thread(wait_ready, proc, port, standby_not=seen)
        to_standby.append(time.perf_counter() - t_kill)
    stop.set()
    await asyncio.gather(*tasks)
    ms = lambda xs: {"p50_ms": round(pct(xs, 50) * 1e3, 2) if xs else None,  # noqa: E731 (--kills 0: none)
                     "max_ms": round(max(xs) * 1e3, 2) if xs else None}
    return {"kills": kills, "clients": clients, "answers": len(answers),
            "non_200": sum(1 for _, st, _ in answers if st != 200),
            "wrong": sum(1 for _, st, ok in answers if st == 200 and not ok),
            "kill_to_next_answer": ms(to_answer), "kill_to_new_standby": ms(to_standby),
            "kill_to_next_answer_all_ms": [round(x * 1e3, 2) for x in to_answer]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", type=Path, help="a CPU release (default: build the CPU catalog into a temp dir)")
    ap.add_argument("--n", type=int, default=1000, help="elements per input of the `add` requests (small: 4 KiB)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=200)
    ap.add_argument("--block", type=int, default=0,
                    help="back-to-back requests to one server before the next takes its turn, within a round "
                         "(0, the default, or >= --per-round: one block a round, each server's round in one piece)")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--nospin", action=argparse.BooleanOptionalAction, default=True,
                    help="also time a third server whose waits sleep at once (--worker-spin-us 0 --loop-spin-us 0)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    release = a.release or build_cpu_release(Path(tempfile.mkdtemp(prefix="serve-workers-rel-")))
    logs = Path(tempfile.mkdtemp(prefix="serve-workers-log-"))
    modes = MODES if a.nospin else {m: MODES[m] for m in ("workers0", "workers1")}
    procs = {m: start(release, args, logs / f"{m}.log") for m, args in modes.items()}
    try:
        t0 = time.perf_counter()
        for m, (p, _, port) in procs.items():
            wait_ready(p, port, standby_not=set() if m != "workers0" else None)
        ready_s = time.perf_counter() - t0
        lat = asyncio.run(latency({m: port for m, (_, _, port) in procs.items()}, a.n, a.rounds, a.per_round,
                                  a.block))
        p1, _, port1 = procs["workers1"]
        fo = asyncio.run(failover(p1, port1, a.kills, a.clients, a.n))
    finally:
        for p, _, _ in procs.values():
            p.send_signal(signal.SIGTERM)
            p.wait(60)
    result = {"benchmark": "serve_workers", "host": platform.node(), "cpus": os.cpu_count(), "release": release.name,
              "request": f"add, FP32, N={a.n}, binary tensors, one client, sequential",
              "rounds": a.rounds, "per_round": a.per_round, "block": a.block,
              "both_ready_s": round(ready_s, 2), "latency_us": lat, "failover": fo,
              "targets": {"hop_p50_us<=100": lat["hop_p50_us"] <= 100, "hop_verdict": lat["hop_verdict"],
                          "kill9_wrong==0": fo["wrong"] == 0}}
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
