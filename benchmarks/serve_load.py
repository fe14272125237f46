"""Bounded load on `tileship serve` over loopback, next to the same calls in-process.

The server runs as a child process (`tileship serve`, its own GIL); the load comes from this
process over raw keep-alive HTTP/1.1 sockets (asyncio's socket calls), so client overhead stays small and
no HTTP library is needed on the GPU host. Phases, one after the other:

1. in-process: ``call``: the operator on tensors already on the device, synchronized;
   ``full``: what the server does around it without HTTP: copy the request bytes into the server's
   pooled body buffer (serve.staging), parse them
   (tileship.serve.protocol), tensors to the device, call, synchronize, copy back, encode.
2. HTTP, one client, sequential: p50/p99, and the p50 overhead over both in-process numbers.
3. HTTP, ``--clients`` concurrent clients for ``--duration`` s, at most ``--max-requests``:
   throughput, p50/p99, errors (any non-200), compared with the in-process throughput.
Then /metrics: compile attempts (must be 0) and the paths that served.

    # CPU (builds the CPU catalog when no --release is given)
    python benchmarks/serve_load.py --op add --dims N=4096 --out benchmarks/results/serve_load_cpu.json
    # GPU host: a 4096x4096x4096 fp16 GEMM with binary tensors
    python3 benchmarks/serve_load.py --release REL --op gemm --dims M=4096,N=4096,K=4096 --dtype float16 \
        --max-body-mib 256 --allow-unverified --out out/serve_load_gpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


def summary_us(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "p50_us": round(pct(xs, 50) * 1e6, 1), "p99_us": round(pct(xs, 99) * 1e6, 1),
            "mean_us": round(statistics.fmean(xs) * 1e6, 1) if xs else None}


def hop_by_round(times: dict[str, list[float]], per_round: int, target_us: float) -> dict[str, Any]:
    """The workers hop (``workers1`` p50 - ``workers0`` p50) over all requests and round by round
    (``times[mode]`` holds ``per_round`` requests a round, the rounds alternating between modes),
    and the target's verdict: "met" when every round's hop is at most ``target_us``, "missed" when
    none is, else "not resolved" (the spread straddles it)."""
    w0, w1 = times["workers0"], times["workers1"]
    rounds = [round((pct(w1[i:i + per_round], 50) - pct(w0[i:i + per_round], 50)) * 1e6, 1)
              for i in range(0, min(len(w0), len(w1)), per_round)]
    verdict = ("met" if all(h <= target_us for h in rounds) else "missed" if all(h > target_us for h in rounds)
               else "not resolved")
    return {"hop_p50_us": round((pct(w1, 50) - pct(w0, 50)) * 1e6, 1), "hop_rounds_us": rounds,
            "hop_spread_us": [min(rounds), max(rounds)] if rounds else None, "hop_target_us": target_us,
            "hop_verdict": verdict}


# -- the request -----------------------------------------------------------------------------

def make_request(release: Any, op: str, dims: dict[str, int], dtype: str,
                 binary: bool) -> tuple[bytes, dict[str, str], list[Any]]:
    """(body, extra headers, the CPU tensors it carries)."""
    import torch

    from tileship.serve.protocol import KSERVE

    runner = release.ops[op]
    tensors = runner.sample_inputs(dims, dtype, "cpu", 0)
    out_name = release.declarations[op]["outputs"][0][0]
    inputs, blobs = [], []
    for (name, _), t in zip(runner.shape.inputs, tensors, strict=True):
        entry: dict[str, Any] = {"name": name, "shape": list(t.shape),
                                 "datatype": KSERVE[str(t.dtype).removeprefix("torch.")]}
        if binary:
            raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).contiguous().numpy().tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = t.reshape(-1).tolist()
        inputs.append(entry)
    head = json.dumps({"inputs": inputs, "outputs": [{"name": out_name,
                                                      "parameters": {"binary_data": binary}}]}).encode()
    headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
    if binary:
        headers["Inference-Header-Content-Length"] = str(len(head))
    return head + b"".join(blobs), headers, tensors


# -- in-process --------------------------------------------------------------------------------

def in_process(release: Any, op: str, body: bytes, headers: dict[str, str], tensors: list[Any], device: str,
               n: int) -> dict[str, Any]:
    import torch

    from tileship.serve import protocol
    from tileship.serve.plans import Plans
    from tileship.serve.staging import Pool

    runner = release.ops[op]
    decl = release.declarations[op]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dev_args = [t.to(device) for t in tensors]
    for _ in range(3):
        runner.call(*dev_args)
    sync()
    call_t = []
    for _ in range(n):
        t0 = time.perf_counter()
        out, decision = runner.call(*dev_args)
        sync()
        call_t.append(time.perf_counter() - t0)
    full_t = []
    hl = headers.get("Inference-Header-Content-Length")
    pool = Pool()  # the server's own body buffers (serve.staging): the body is copied in once, as received
    plans = Plans()  # planned as the server plans (serve.plans: kept per request signature)
    for i in range(n + 3):
        t0 = time.perf_counter()
        lease = pool.take(len(body))
        buf = lease.view if lease is not None else bytearray(len(body))
        buf[:] = body
        req = protocol.parse_infer(buf, hl)
        plan = plans.plan(req, op, decl)
        args = plan.arguments(device)
        out, decision = runner.call(*args)
        sync()
        host = out.detach().cpu()
        enc = protocol.encode_response(model=op, version=release.release_id, request_id=None, parameters={},
                                       outputs=[(plan.outputs[0][0], host, plan.outputs[0][1])])
        if lease is not None:
            lease.give_back()
        if i >= 3:
            full_t.append(time.perf_counter() - t0)
    return {"call": summary_us(call_t), "full": summary_us(full_t), "decision": f"{decision.path}:{decision.reason}",
            "response_bytes": enc.size, "output": host}


# -- HTTP client ---------------------------------------------------------------------------------

class Conn:
    """One keep-alive HTTP/1.1 connection; ``post`` returns (status, headers, body).

    On the loop's own socket calls (``sock_sendall``, ``sock_recv_into``), not asyncio streams: a large
    body goes out from the caller's bytes and a large response comes into one buffer, with no copy in
    between. Through ``StreamWriter`` a 128 MiB body was first copied whole into the transport's buffer
    and the client, not the server, set the pace (4x slower than a blocking ``sendall`` on the CPU
    machine; ``benchmarks/README.md``, 2026-12-03 nineteenth session)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sock: socket.socket | None = None
        self._rest = bytearray()  # bytes read past the last response's end (none from a well-behaved server)

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        loop = asyncio.get_running_loop()
        if self.sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, (self.host, self.port))
            except BaseException:
                sock.close()
                raise
            self.sock, self._rest = sock, bytearray()
        sock = self.sock
        head = ("\r\n".join([f"POST {path} HTTP/1.1", f"Host: {self.host}", f"Content-Length: {len(body)}"]
                             + [f"{k}: {v}" for k, v in headers.items()]) + "\r\n\r\n").encode()
        if len(body) <= 1 << 16:
            await loop.sock_sendall(sock, head + body)
        else:
            await loop.sock_sendall(sock, head)
            await loop.sock_sendall(sock, body)
        buf = self._rest
        while (end := buf.find(b"\r\n\r\n")) < 0:
            chunk = await loop.sock_recv(sock, 1 << 16)
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        n = int(hdrs.get("content-length", "0"))
        have = buf[end + 4:end + 4 + n]
        data = bytearray(n)
        data[:len(have)] = have
        self._rest = buf[end + 4 + n:]
        view, pos = memoryview(data), len(have)
        while pos < n:
            got = await loop.sock_recv_into(sock, view[pos:])
            if not got:
                raise ConnectionError("server closed the connection mid-response")
            pos += got
        if hdrs.get("connection", "").lower() == "close":
            self.close()
        return status, hdrs, data  # type: ignore[return-value]  # a bytearray: bytes to every reader here

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self._rest = bytearray()


async def http_phase(host: str, port: int, path: str, body: bytes, headers: dict[str, str], clients: int,
                     duration: float, max_requests: int) -> dict[str, Any]:
    lat: list[float] = []
    codes: dict[str, int] = {}
    paths: dict[str, int] = {}
    releases: set[str] = set()
    issued = 0
    t_end = time.perf_counter() + duration

    async def worker() -> None:
        nonlocal issued
        conn = Conn(host, port)
        try:
            while time.perf_counter() < t_end and issued < max_requests:
                issued += 1
                t0 = time.perf_counter()
                try:
                    status, hdrs, _ = await conn.post(path, body, headers)
                except (OSError, ConnectionError, asyncio.IncompleteReadError) as exc:
                    codes[type(exc).__name__] = codes.get(type(exc).__name__, 0) + 1
                    conn.close()
                    continue
                lat.append(time.perf_counter() - t0)
                codes[str(status)] = codes.get(str(status), 0) + 1
                key = f"{hdrs.get('x-tileship-path')}:{hdrs.get('x-tileship-reason')}"
                paths[key] = paths.get(key, 0) + 1
                releases.add(hdrs.get("x-tileship-release", "?"))
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - t0
    errors = sum(v for k, v in codes.items() if k != "200")
    return {"clients": clients, "duration_s": round(wall, 3),
            "requests": len(lat) + sum(v for k, v in codes.items() if not k.isdigit()),
            "errors": errors, "codes": codes, "paths": paths, "releases": sorted(releases),
            "throughput_rps": round(codes.get("200", 0) / wall, 2), **summary_us(lat)}


# -- orchestration -------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_cpu_release(out: Path) -> Path:
    import dataclasses

    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import builtin_project, load_operators

    proj = dataclasses.replace(builtin_project(), targets=("c",), operator_modules=("tileship.catalog.cpu",))
    return Path(build(proj, load_operators(proj), out, BuildOptions(jobs=os.cpu_count() or 1)).path)


def start_server(release_dir: Path, port: int, args: list[str],
                 log_prefix: str) -> tuple[subprocess.Popen[bytes], Path]:
    """`tileship serve RELEASE_DIR --port PORT *ARGS` as a child process of this Python (src/ first on
    its PYTHONPATH), stdout and stderr to a fresh log file; (the process, the log's path). Not waited on:
    see ``wait_ready``; stop it with ``stop_server``."""
    cmd = [sys.executable, "-c", "from tileship.cli import main; main()", "serve", str(release_dir), "--port",
           str(port), *args]
    log_path = Path(tempfile.mkdtemp(prefix=log_prefix)) / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
    return proc, log_path


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, up to 60 s for a clean exit, then SIGKILL."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/v2/health/ready", timeout=5) as r:
                return json.loads(r.read())  # type: ignore[no-any-return]
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.1)
    raise SystemExit(f"the server was not ready within {timeout} s")


def ready_release(url: str, proc: subprocess.Popen[bytes], t_start: float, release_dir: Path, op: str,
                  allow_unverified: bool) -> tuple[dict[str, Any], float, Any, str]:
    """Wait for the server started at ``t_start``, then load the same release in this process:
    (readiness body, seconds to ready, the release, the device ``op`` runs on there)."""
    import torch

    from tileship.runtime.loader import load

    ready = wait_ready(url, proc, 600)
    ready_s = time.perf_counter() - t_start
    release = load(release_dir, allow_unverified=True if allow_unverified else None)
    gpu = any(e.spec is not None and e.spec.target != "c" for e in release.ops[op].entries)
    return ready, ready_s, release, "cuda" if torch.cuda.is_available() and gpu else "cpu"


_ECHO = """
import sys, uvicorn
size = int(sys.argv[2])
reply = b"x" * size
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        msg = await receive()
        more = msg.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/octet-stream"), (b"content-length", str(size).encode())]})
    await send({"type": "http.response.body", "body": reply})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="auto", access_log=False, log_level="warning",
            server_header=False)
"""


def http_floor(path: str, body: bytes, headers: dict[str, str], response_bytes: int, n: int) -> dict[str, Any]:
    """The same sequential client against a bare uvicorn app in another process that reads the
    body and answers ``response_bytes`` bytes (the same loop and HTTP parser tileship gets): what
    the HTTP stack itself costs per request here, before tileship does anything."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _ECHO, str(port), str(response_bytes)])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the bare uvicorn server did not start") from None
                time.sleep(0.05)

        async def run() -> dict[str, Any]:
            await http_phase("127.0.0.1", port, path, body, headers, 1, 60.0, 20)
            return await http_phase("127.0.0.1", port, path, body, headers, 1, 600.0, n)

        return asyncio.run(run())
    finally:
        proc.kill()
        proc.wait()


def scrape(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return r.read().decode()  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", type=Path, help="release directory (default: build the CPU catalog into a temp dir)")
    ap.add_argument("--op", default="add")
    ap.add_argument("--dims", default="N=4096", help="comma-separated dim=size, e.g. M=4096,N=4096,K=4096")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", action="store_true", help="JSON tensors instead of the binary extension")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--max-requests", type=int, default=20000)
    ap.add_argument("--seq", type=int, default=300, help="sequential HTTP requests and in-process calls")
    ap.add_argument("--max-body-mib", type=float, default=64.0)
    ap.add_argument("--threads", type=int, default=1, help="server worker threads")
    ap.add_argument("--allow-unverified", action="store_true", help="run GPU kernels without verification evidence")
    ap.add_argument("--profile-load", type=Path, help="sample the server with py-spy (PY_SPY, else on PATH) during "
                                                      "the loaded phase; its raw stacks go to this file")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="one more argument for `tileship serve` (repeat it), e.g. --server-arg=--body-threads=0")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    os.environ.setdefault("TILELANG_CACHE_DIR", tempfile.mkdtemp(prefix="serve-load-tl-"))
    dims = {k: int(v) for k, v in (p.split("=") for p in a.dims.split(","))}
    binary = not a.json

    import torch


    release_dir = a.release or build_cpu_release(Path(tempfile.mkdtemp(prefix="serve-load-rel-")))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--max-body-mib", str(a.max_body_mib), "--max-inflight", str(max(64, a.clients * 2)), "--threads",
            str(a.threads)]
    if a.allow_unverified:
        args.append("--allow-unverified")
    args += a.server_arg
    t_start = time.perf_counter()
    proc, log_path = start_server(release_dir, port, args, "serve-load-log-")
    try:
        ready, ready_s, release, device = ready_release(url, proc, t_start, release_dir, a.op, a.allow_unverified)
        body, headers, tensors = make_request(release, a.op, dims, a.dtype, binary)
        inproc = in_process(release, a.op, body, headers, tensors, device, a.seq)
        ref_out = inproc.pop("output")
        path = f"/v2/models/{a.op}/infer"

        async def run_http() -> tuple[dict[str, Any], dict[str, Any], float]:
            conn = Conn("127.0.0.1", port)
            status, hdrs, data = await conn.post(path, body, headers)
            diff = _max_diff(status, hdrs, data, ref_out)
            conn.close()
            await http_phase("127.0.0.1", port, path, body, headers, 1, 60.0, 5)  # warm the connection path
            seq = await http_phase("127.0.0.1", port, path, body, headers, 1, 600.0, a.seq)
            spy = _profile(proc.pid, a.profile_load, a.duration) if a.profile_load else None
            loaded = await http_phase("127.0.0.1", port, path, body, headers, a.clients, a.duration, a.max_requests)
            if spy is not None:
                loaded["profile"] = _profile_done(spy, a.profile_load)
            return seq, loaded, diff

        seq, loaded, diff = asyncio.run(run_http())
        metrics = scrape(url)
    finally:
        stop_server(proc)
    floor = http_floor(path, body, headers, inproc["response_bytes"], a.seq)
    compiles = _metric(metrics, "tileship_serve_compile_attempts")
    inproc_rps = 1e6 / inproc["full"]["mean_us"] if inproc["full"]["mean_us"] else None
    result = {
        "benchmark": "serve_load",
        "config": {"op": a.op, "dims": dims, "dtype": a.dtype, "tensors": "binary" if binary else "json",
                   "clients": a.clients, "duration_s": a.duration, "max_requests": a.max_requests, "seq": a.seq,
                   "server_threads": a.threads, "server_args": a.server_arg, "request_bytes": len(body),
                   "response_bytes": inproc["response_bytes"]},
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
                        "device": device, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                        "platform": platform.platform(), "http_parser": _http_parser(),
                        "load_average_1m": round(os.getloadavg()[0], 2)},
        "release_id": release.release_id,
        "server_ready_s": round(ready_s, 2),
        "ready": {k: ready.get(k) for k in ("ready", "reason", "device")},
        "in_process": inproc,
        "http_sequential": seq,
        "http_load": loaded,
        "overhead_p50_us": {"vs_in_process_full": round(seq["p50_us"] - inproc["full"]["p50_us"], 1),
                            "vs_in_process_call": round(seq["p50_us"] - inproc["call"]["p50_us"], 1),
                            "over_the_floor_and_in_process_full": round(
                                seq["p50_us"] - floor["p50_us"] - inproc["full"]["p50_us"], 1)},
        "http_floor": floor,
        "throughput_ratio_http_over_in_process": (round(loaded["throughput_rps"] / inproc_rps, 3)
                                                  if inproc_rps else None),
        "in_process_rps": round(inproc_rps, 2) if inproc_rps else None,
        "max_abs_diff_http_vs_in_process": diff,
        "compile_attempts": compiles,
        "server_side_p50_ms": _server_side(log_path),
        "server_log": str(log_path),
    }
    tol = release.declarations[a.op]["tolerances"][a.dtype]
    ok = (
        loaded["errors"] == 0
        and seq["errors"] == 0
        and compiles == 0
        and diff <= tol["atol"] + tol["rtol"] * float(ref_out.double().abs().max())
    )
    result["ok"] = ok
    _print(result)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0 if ok else 1


def _max_diff(status: int, hdrs: dict[str, str], data: bytes, ref: Any) -> float:
    import torch

    from tileship.serve.protocol import DATATYPES

    if status != 200:
        raise SystemExit(f"the first request failed: {status} {data[:500]!r}")
    hl = hdrs.get("inference-header-content-length")
    head = json.loads(data[: int(hl)] if hl else data)
    out = head["outputs"][0]
    dt = getattr(torch, DATATYPES[out["datatype"]])
    if hl:
        got = torch.frombuffer(bytearray(data[int(hl):]), dtype=dt).reshape(out["shape"])
    else:
        got = torch.tensor(out["data"], dtype=dt).reshape(out["shape"])
    return float((got.double() - ref.double()).abs().max())


def _http_parser() -> str:
    """What uvicorn parses HTTP with here (it prefers httptools when importable)."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def _server_side(log_path: Path) -> dict[str, Any]:
    """Medians over the server's own `infer` log lines: receiving the body, running (queue
    wait plus the worker: tensors, call, sync, copy back, encode), and receive-to-response."""
    rows = []
    for line in log_path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "infer" and rec.get("status") == 200:
            rows.append(rec)
    out: dict[str, Any] = {"n": len(rows)}
    for key in ("body_ms", "run_ms", "ms"):
        vals = [r[key] for r in rows if key in r]
        out[key] = round(statistics.median(vals), 3) if vals else None
    return out


def _profile(pid: int, out: Path, duration_s: float) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the server (``pid``) for the loaded phase, without pausing it (``--nonblocking``);
    None when there is no py-spy."""
    exe = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if exe is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([exe, "record", "-p", str(pid), "-d", str(max(1, int(duration_s) - 1)), "-r", "200",
                             "--nonblocking", "--threads", "-f", "raw", "-o", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def _profile_done(spy: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    """py-spy's exit status and its last words (it may not be allowed to attach: ptrace)."""
    try:
        text, _ = spy.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        spy.kill()
        text, _ = spy.communicate()
    return {"rc": spy.returncode, "file": str(out), "exists": out.exists(),
            "tail": text.decode(errors="replace")[-400:]}


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def _print(r: dict[str, Any]) -> None:
    c, ip, sq, ld = r["config"], r["in_process"], r["http_sequential"], r["http_load"]
    print(f"serve_load: {c['op']} {c['dims']} {c['dtype']} {c['tensors']} tensors; request {c['request_bytes']} B, "
          f"response {c['response_bytes']} B; "
          f"device {r['environment']['device']}; release {r['release_id']}; server ready in {r['server_ready_s']} s "
          f"({r['ready']['reason']})")
    print(f"  in-process call only        p50 {ip['call']['p50_us']:>10.1f} us  p99 {ip['call']['p99_us']:>10.1f} us  "
          f"({ip['decision']})")
    print(f"  in-process parse+call+encode p50 {ip['full']['p50_us']:>10.1f} us  p99 {ip['full']['p99_us']:>10.1f} us  "
          f"-> {r['in_process_rps']} calls/s")
    print(f"  HTTP 1 client               p50 {sq['p50_us']:>10.1f} us  p99 {sq['p99_us']:>10.1f} us  errors "
          f"{sq['errors']}  "
          f"overhead p50 {r['overhead_p50_us']['vs_in_process_full']:.1f} us over parse+call+encode, "
          f"{r['overhead_p50_us']['vs_in_process_call']:.1f} us over the call")
    fl = r["http_floor"]
    print(f"  bare uvicorn, 1 client      p50 {fl['p50_us']:>10.1f} us  p99 {fl['p99_us']:>10.1f} us  (the HTTP stack "
          f"alone, same bytes); tileship's own part: "
          f"{r['overhead_p50_us']['over_the_floor_and_in_process_full']:.1f} us over it and parse+call+encode")
    print(f"  HTTP {ld['clients']} clients {ld['duration_s']} s: {ld['requests']} requests, {ld['throughput_rps']} "
          f"req/s, p50 {ld['p50_us']:.1f} us, "
          f"p99 {ld['p99_us']:.1f} us, errors {ld['errors']} {ld['codes']}, paths {ld['paths']}")
    print(f"  server side, medians: body received {r['server_side_p50_ms']['body_ms']} ms, run "
          f"{r['server_side_p50_ms']['run_ms']} ms, "
          f"receive-to-response {r['server_side_p50_ms']['ms']} ms over {r['server_side_p50_ms']['n']} requests")
    print(f"  throughput HTTP / in-process: {r['throughput_ratio_http_over_in_process']}; compile attempts: "
          f"{r['compile_attempts']}; "
          f"max |HTTP - in-process|: {r['max_abs_diff_http_vs_in_process']}; ok: {r['ok']}")


if __name__ == "__main__":
    sys.exit(main())
