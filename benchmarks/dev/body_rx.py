"""How fast a large request body gets into the server, by server variant, side by side in one run (issue 16).

Each variant is a server process on its own port; one client sends the same body (``--mib`` MiB, one
POST with Content-Length) to each in turn, ``--rounds`` times, over loopback, and reads the server's
own receive time (first body byte to last, in the response) and its round trip. Variants:

  raw            a blocking socket reading the body with ``recv_into`` into one buffer (the floor)
  tileship       tileship's protocol (``serve.connections.guarded_http``) and body reader (``serve.body.read_pooled``
                 into the server's reused blocks, ``serve.staging.Pool``)
  tileship_nosink the same without the protocol's sink (``serve.body.Sink``): each chunk through uvicorn's
                 bytearray and its ``bytes`` per message, then copied into the block (tileship before round 21)
  *_m<M>t<T>     the same under glibc's ``MALLOC_MMAP_THRESHOLD_`` M MiB and ``MALLOC_TRIM_THRESHOLD_`` T MiB

Prints a table (median and p10-p90 per variant, in ms and GB/s) and writes JSON with every sample.

    python benchmarks/dev/body_rx.py --mib 64 --rounds 15 --out /tmp/body_rx.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("raw", "tileship", "tileship_nosink")

SERVER = r'''
import os, socket, sys, time
variant, port = sys.argv[1], int(sys.argv[2])

class Rej:
    def labels(self, *a): return self
    def inc(self): pass

def answer(n, dt):
    return f"{n} {dt * 1e3:.3f}".encode()

if variant == "raw":
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port)); ls.listen()
    print("ready", flush=True)
    c, _ = ls.accept()
    buf = None
    while True:
        head = b""
        while b"\r\n\r\n" not in head:
            b = c.recv(1)
            if not b: sys.exit(0)
            head += b
        size = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
        if buf is None or len(buf) < size: buf = bytearray(size)
        mv = memoryview(buf)
        n = 0
        t0 = None
        while n < size:
            r = c.recv_into(mv[n:size])
            if t0 is None: t0 = time.perf_counter()
            n += r
        body = answer(n, time.perf_counter() - t0)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

import uvicorn

class Req:
    def __init__(self, scope, receive):
        self.scope, self.receive = scope, receive
        self.headers = {k.decode(): v.decode() for k, v in scope["headers"]}

async def tileship_app(scope, receive, send):
    if scope["type"] != "http": return
    from tileship.serve.body import read_pooled
    t0 = time.perf_counter()
    buf, lease = await read_pooled(Req(scope, receive), POOL, limit=1 << 34, timeout_s=60, rejected=Rej())
    body = answer(len(buf), time.perf_counter() - t0)
    if lease is not None:
        lease.give_back()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

from tileship.serve.connections import guarded_http
from tileship.serve.staging import Pool
if sys.argv[3] == "nosink":
    import tileship.serve.body as body_mod
    body_mod.Sink.install = classmethod(lambda cls, receive, into: None)
POOL = Pool()  # the server's reused (pinned where torch sees a GPU) body blocks
config = uvicorn.Config(tileship_app, port=port, log_level="warning", http=guarded_http(30.0),
                        timeout_keep_alive=600)
server = uvicorn.Server(config)
print("ready", flush=True)
server.run()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(sock: socket.socket, payload: bytes) -> tuple[float, float]:
    """(server receive ms, client round trip ms) of one POST on a keep-alive socket."""
    t0 = time.perf_counter()
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(payload))
    sock.sendall(payload)
    data = b""
    while True:
        data += sock.recv(65536)
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            length = int([line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")][0])
            if len(rest) >= length:
                break
    rt = (time.perf_counter() - t0) * 1e3
    n, ms = rest[:length].split()
    if int(n) != len(payload):
        raise RuntimeError(f"server read {n} of {len(payload)} bytes")
    return float(ms), rt


def start(variant: str, port: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base, _, tune = variant.partition("_")
    if tune.startswith("m"):  # m<mmap MiB>t<trim MiB>, e.g. m1t64
        m, _, t = tune[1:].partition("t")
        env.update(MALLOC_MMAP_THRESHOLD_=str(int(m) << 20), MALLOC_TRIM_THRESHOLD_=str(int(t) << 20))
    proc = subprocess.Popen([sys.executable, "-c", SERVER, base, str(port), tune],
                            env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


def connect(port: int) -> socket.socket:
    for _ in range(100):
        try:
            return socket.create_connection(("127.0.0.1", port))
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"no server on port {port}")


def summary(xs: list[float], mib: int) -> dict[str, float]:
    q = statistics.quantiles(xs, n=10) if len(xs) > 1 else [xs[0]] * 9
    med = statistics.median(xs)
    return {"median_ms": round(med, 3), "p10_ms": round(q[0], 3), "p90_ms": round(q[-1], 3),
            "median_gb_s": round(mib * (1 << 20) / (med * 1e-3) / 1e9, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    variants = a.variants.split(",")
    payload = os.urandom(1 << 20) * a.mib
    procs, socks = {}, {}
    try:
        for v in variants:
            port = free_port()
            procs[v] = start(v, port)
            socks[v] = connect(port)
        for v in variants:  # one untimed request each: buffers and pages in place
            post(socks[v], payload)
        samples: dict[str, dict[str, list[float]]] = {v: {"server_ms": [], "round_trip_ms": []} for v in variants}
        for r in range(a.rounds):
            for v in (variants if r % 2 == 0 else variants[::-1]):
                s, rt = post(socks[v], payload)
                samples[v]["server_ms"].append(s)
                samples[v]["round_trip_ms"].append(rt)
    finally:
        for s in socks.values():
            s.close()
        for p in procs.values():
            p.terminate()
            p.wait(timeout=10)
    result = {"mib": a.mib, "rounds": a.rounds, "python": sys.version.split()[0], "host": socket.gethostname(),
              "variants": {v: {"server": summary(samples[v]["server_ms"], a.mib),
                               "round_trip": summary(samples[v]["round_trip_ms"], a.mib),
                               "samples": samples[v]} for v in variants}}
    print(f"body_rx: {a.mib} MiB bodies, {a.rounds} rounds, variants in turns (server: first body byte to last)")
    for v in variants:
        s, rt = result["variants"][v]["server"], result["variants"][v]["round_trip"]
        print(f"  {v:12s} server {s['median_ms']:9.2f} ms [{s['p10_ms']:.2f}..{s['p90_ms']:.2f}] "
              f"{s['median_gb_s']:6.2f} GB/s   round trip {rt['median_ms']:9.2f} ms")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
