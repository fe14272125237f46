"""A/B of two source trees of `tileship serve`, side by side: the HTTP p50 of small requests.

Two servers run at once, one from each tree (``PYTHONPATH=TREE/src``), on the same release and
flags; one client process sends them the same `add` request (N floats, binary or ``--json``, sequential,
keep-alive), alternating rounds so that this machine's noise lands on both alike. Prints the
pooled p50 of each and B - A round by round (negative: B is faster); the difference is "resolved"
only when every round has the same sign.

    git archive HEAD src | tar -C /tmp/ab/A -x
    python benchmarks/dev/serve_ab.py /tmp/ab/A .  --rounds 16 --per-round 200 --out ab.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve_load import Conn, build_cpu_release, free_port, make_request, pct  # noqa: E402


def start(tree: Path, release: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    proc = subprocess.Popen([sys.executable, "-c", "from tileship.cli import main; main()", "serve", str(release),
                             "--port", str(port), *extra], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2)
            return proc, port
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the server from {tree} did not get ready") from None
            time.sleep(0.1)


async def rounds(ports: dict[str, int], body: bytes, headers: dict[str, str], n_rounds: int,
                 per_round: int) -> dict[str, Any]:
    conns = {k: Conn("127.0.0.1", p) for k, p in ports.items()}
    times: dict[str, list[float]] = {k: [] for k in conns}
    diffs = []
    path = "/v2/models/add/infer"
    for c in conns.values():
        for _ in range(100):
            assert (await c.post(path, body, headers))[0] == 200
    for _ in range(n_rounds):
        p50 = {}
        for k, c in conns.items():
            xs = []
            for _ in range(per_round):
                t0 = time.perf_counter()
                status, _, _ = await c.post(path, body, headers)
                xs.append(time.perf_counter() - t0)
                assert status == 200, (k, status)
            times[k] += xs
            p50[k] = pct(xs, 50)
        diffs.append(round((p50["B"] - p50["A"]) * 1e6, 1))
    for c in conns.values():
        c.close()
    verdict = ("B faster" if all(d < 0 for d in diffs) else "A faster" if all(d > 0 for d in diffs)
               else "not resolved")
    return {"A_p50_us": round(pct(times["A"], 50) * 1e6, 1), "B_p50_us": round(pct(times["B"], 50) * 1e6, 1),
            "B_minus_A_by_round_us": diffs, "B_minus_A_median_round_us": sorted(diffs)[len(diffs) // 2],
            "verdict": verdict}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path, help="tree A (a directory holding src/tileship)")
    ap.add_argument("b", type=Path, help="tree B")
    ap.add_argument("--release", type=Path, help="a CPU release (default: build the CPU catalog)")
    ap.add_argument("--n", type=int, default=4096, help="floats per input of the add requests")
    ap.add_argument("--json", action="store_true", help="JSON tensors instead of the binary extension")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--per-round", type=int, default=200)
    ap.add_argument("--server-arg", action="append", default=[], help="extra `tileship serve` flag (both servers)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(a.b.resolve() / "src"))
    from tileship.runtime.loader import load

    release = a.release or build_cpu_release(Path(tempfile.mkdtemp(prefix="serve-ab-rel-")))
    body, headers, _ = make_request(load(release), "add", {"N": a.n}, "float32", not a.json)
    procs = {k: start(tree.resolve(), release, a.server_arg) for k, tree in (("A", a.a), ("B", a.b))}
    try:
        result = asyncio.run(rounds({k: port for k, (_, port) in procs.items()}, body, headers, a.rounds,
                                    a.per_round))
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(30)
    result = {"benchmark": "serve_ab", "a": str(a.a), "b": str(a.b), "release": release.name, "n": a.n, "json": a.json,
              "rounds": a.rounds, "per_round": a.per_round, "server_args": a.server_arg,
              "load_average_1m": round(os.getloadavg()[0], 2), "command": " ".join(sys.argv), **result}
    print(json.dumps(result, indent=2))
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
