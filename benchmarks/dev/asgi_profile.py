"""Where the server's time goes per small request, without sockets (development).

usage: python benchmarks/dev/asgi_profile.py [--release DIR] [--n 2000] [--json] [--profile OUT.pstats]

Drives ``tileship.serve.routes.create_app`` directly as an ASGI app (lifespan, then N requests of the
same ``add`` N=4096 fp32 inference, binary tensors or ``--json``), so the per-request time is the app's alone: routing,
middleware, validation, the call, encoding, logging. ``serve_load.py`` gives the same request over
loopback and a bare uvicorn app over the same bytes; the difference between the three is uvicorn's
HTTP work plus the client. Prints the median us per request; with ``--profile`` also the top of a
cProfile over the timed requests.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import serve_load  # noqa: E402  (benchmarks/serve_load.py: the release build and the request)


async def drive(app: object, path: str, body: bytes, headers: dict[str, str], n: int) -> list[float]:
    scope_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope_headers.append((b"content-length", str(len(body)).encode()))
    times = []
    for _ in range(n):
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "headers": scope_headers, "client": ("127.0.0.1", 5000),
                 "server": ("127.0.0.1", 8000), "state": {}}
        t = time.perf_counter()
        await app(scope, receive, send)  # type: ignore[operator]
        times.append((time.perf_counter() - t) * 1e6)
        if sent[0]["status"] != 200:
            raise SystemExit(f"status {sent[0]['status']}: {sent[1:]}")
    return times


async def main_async(args: argparse.Namespace) -> None:
    from tileship.runtime.loader import load as load_release
    from tileship.serve.config import ServeConfig
    from tileship.serve.routes import create_app

    rel_dir = args.release or serve_load.build_cpu_release(Path(tempfile.mkdtemp(prefix="asgi-rel-")))
    app = create_app(ServeConfig(source=rel_dir))
    release = load_release(rel_dir)
    body, headers, _ = serve_load.make_request(release, "add", {"N": 4096}, "float32", binary=not args.json)
    started = asyncio.Event()
    lifespan_q: asyncio.Queue = asyncio.Queue()
    await lifespan_q.put({"type": "lifespan.startup"})

    async def l_send(message: dict) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                   lifespan_q.get, l_send))
    await started.wait()
    ready = await drive_ready(app)
    print(f"ready after {ready:.1f} s; release {rel_dir.name}", file=sys.stderr)
    path = "/v2/models/add/infer"
    await drive(app, path, body, headers, 200)  # warm-up
    times = await drive(app, path, body, headers, args.n)
    ranked = sorted(times)
    kind = "JSON" if args.json else "binary"
    print(f"ASGI app alone, add N=4096 fp32 {kind}: p50 {statistics.median(times):.1f} us over {args.n} requests "
          f"(p10 {ranked[len(ranked) // 10]:.1f}, p90 {ranked[9 * len(ranked) // 10]:.1f})", file=sys.stderr)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        await drive(app, path, body, headers, args.n)
        prof.disable()
        prof.dump_stats(args.profile)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(35)
    await lifespan_q.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(task, 10)


async def drive_ready(app: object) -> float:
    t0 = time.time()
    while True:
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        await app({"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",  # type: ignore[operator]
                   "scheme": "http", "path": "/v2/health/ready", "raw_path": b"/v2/health/ready", "query_string": b"",
                   "root_path": "", "headers": [], "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
                   "state": {}}, receive, send)
        if sent[0]["status"] == 200:
            return time.time() - t0
        await asyncio.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--release", type=Path)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--profile")
    ap.add_argument("--json", action="store_true", help="JSON tensors instead of the binary extension")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
