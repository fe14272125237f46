"""Valid-request latency of `tileship serve` while hostile clients send malformed requests (issue 15:
"a burst of 2000 malformed requests at concurrency 64 moves valid-request p50 latency by less than 2x,
and writes no diagnostics").

The server runs as a child process with its own diagnostics directory (``serve_load.start_server``);
one well-behaved client in this process sends valid requests (``--op``/``--dims``, binary tensors)
over one keep-alive connection (``serve_load.Conn``) and checks every answer against the first, which
is checked against the same call in-process. Rounds alternate (``--pattern``, default ABABABAB):

- A: the valid client alone for ``--a-seconds``;
- B: the valid client while ``--concurrency`` hostile connections, in another process (so their
  client work does not stall this one's event loop), send ``--burst`` malformed requests, one
  connection each (``Connection: close``). The corpus: tests/serve_corpus.py's inference cases
  (bad JSON, deep nesting, huge integers, lying lengths, wrong Content-Type, unknown models, ...),
  the valid request spoiled (truncated, wrong shape or dtype, header length past or inside the
  body), and raw framing faults (an oversized declared Content-Length, a body cut off by the
  client's half-close, a garbage request line, a non-numeric Content-Length).

Reported: p50/p90/p99 of the valid requests per round, each B round's p50 over the A round before it
(their range decides the target: "met" when every round's ratio is under ``--target``, "missed" when
none is, else "not resolved"), the B rounds' median p50 over the A rounds', and whether B is slower at
all (B's p50s all above A's, or the spreads overlap).
Each round also records the CPU seconds of the server, of this client and of the hostile process: on a
small machine shared with other work, the server's share of a core in a B round says how far the ratio
is the server's doing.
Accounted (the exit status, not the timing): malformed answers by status (no 5xx, no time-out),
diagnostics written during the rounds (0), live and ready after, and /metrics against what was sent:
requests by code, refusals by reason, in-flight 0, compile attempts 0.

    python benchmarks/serve_malformed_burst.py --out benchmarks/results/cpu/malformed_burst/run1.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import re
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import (  # noqa: E402
    ROOT,
    Conn,
    _max_diff,
    build_cpu_release,
    free_port,
    make_request,
    pct,
    ready_release,
    scrape,
    start_server,
    stop_server,
)

_INFER = re.compile(r"/v2/models/[^/]+(/versions/[^/]+)?/infer")
#: a hostile request: (case, raw HTTP bytes, half-close after sending, counted as an inference request)
Hostile = tuple[str, bytes, bool, bool]


# -- the hostile corpus ------------------------------------------------------------------------------

def raw_request(method: str, path: str, body: bytes, headers: dict[str, Any]) -> bytes:
    """HTTP/1.1 bytes for one request on its own connection; a Content-Length in ``headers`` is sent as
    given (a lie), else the body's; header values may be bytes (sent as they are)."""
    hdrs = {k.lower(): v for k, v in headers.items()}
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    if "content-length" not in hdrs:
        lines.append(b"Content-Length: %d" % len(body))
    lines += [k.encode() + b": " + (v if isinstance(v, bytes) else str(v).encode("latin-1")) for k, v in hdrs.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def hostile_corpus(op: str, body: bytes, headers: dict[str, str]) -> list[Hostile]:
    """tests/serve_corpus.py's cases on inference routes (control routes left out: a hostile request
    there must not change what is served), the valid request ``body`` spoiled, and framing faults."""
    sys.path.insert(0, str(ROOT))
    from tests.serve_corpus import CASES

    out: list[Hostile] = []
    for name, method, path, data, hdrs, _, _ in CASES:
        if _INFER.fullmatch(path) or method == "GET":
            out.append((name, raw_request(method, path, data, hdrs), False, bool(_INFER.fullmatch(path))))
    hl = int(headers["Inference-Header-Content-Length"])
    head, blobs = body[:hl], body[hl:]
    infer = f"/v2/models/{op}/infer"
    doc = json.loads(head)
    reshaped = json.dumps({**doc, "inputs": [{**doc["inputs"][0], "shape": [len(blobs) // 8 - 1]},
                                             *doc["inputs"][1:]]}).encode()
    retyped = json.dumps({**doc, "inputs": [{**i, "datatype": "FP16"} for i in doc["inputs"]]}).encode()
    spoiled = {
        "valid-truncated": (infer, body[: hl + len(blobs) // 2], headers),
        "valid-header-length-past-body": (infer, body, {**headers, "Inference-Header-Content-Length": len(body) + 9}),
        "valid-header-length-inside-json": (infer, body, {**headers, "Inference-Header-Content-Length": hl - 7}),
        "valid-wrong-shape": (infer, reshaped + blobs, {**headers, "Inference-Header-Content-Length": len(reshaped)}),
        "valid-wrong-dtype": (infer, retyped + blobs, {**headers, "Inference-Header-Content-Length": len(retyped)}),
        "valid-broken-json": (infer, b"{" + head[2:] + blobs, {**headers, "Inference-Header-Content-Length": hl - 1}),
        "valid-text-plain": (infer, body, {**headers, "Content-Type": "text/plain"}),
        "valid-unknown-model": ("/v2/models/no-such-model/infer", body, headers),
        "valid-oversized-content-length": (infer, b"", {**headers, "Content-Length": 1 << 40}),
    }
    out += [(name, raw_request("POST", path, data, hdrs), False, True) for name, (path, data, hdrs) in spoiled.items()]
    out.append(("framing-cut-by-half-close", raw_request("POST", infer, body, headers)[: -len(blobs) // 2], True, True))
    out.append(("framing-garbage-request-line", b"\x16\x03\x01 GARBAGE /\r\n\r\n", False, False))
    out.append(("framing-content-length-not-a-number", b"POST " + infer.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: 12abc\r\nConnection: close\r\n\r\n{}", False, False))
    return out


# -- the hostile clients (another process) -----------------------------------------------------------

async def burst(port: int, cases: list[Hostile], total: int, concurrency: int, timeout_s: float,
                seed: int) -> dict[str, Any]:
    """``total`` requests from ``cases`` (shuffled by ``seed``) over ``concurrency`` connections at a time;
    answers by case and status ("none": the server closed with no answer; "reset": the connection was
    reset before any answer; "timeout"), and how many answers a reset followed."""
    order = [cases[i % len(cases)] for i in range(total)]
    random.Random(seed).shuffle(order)
    by_case: dict[str, dict[str, int]] = {}
    resets = [0]  # answers followed by a reset (the server closed with bytes of the request unread)
    nxt = 0

    async def one(raw: bytes, half_close: bool) -> str:
        # plain sockets, not asyncio streams: a stream raises a reset before handing over the answer
        # that came ahead of it, as a server does that answers and closes before reading the whole body
        loop = asyncio.get_running_loop()
        with socket.socket() as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            data = b""
            try:
                await loop.sock_sendall(sock, raw)
                if half_close:
                    sock.shutdown(socket.SHUT_WR)
                while chunk := await loop.sock_recv(sock, 1 << 16):
                    data += chunk
            except OSError:
                if not data.startswith(b"HTTP/1."):
                    raise
                resets[0] += 1
            return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.") else "none"

    async def client() -> None:
        nonlocal nxt
        while nxt < total:
            name, raw, half_close, _ = order[nxt]
            nxt += 1
            try:
                code = await asyncio.wait_for(one(raw, half_close), timeout_s)
            except TimeoutError:
                code = "timeout"
            except OSError:
                code = "reset"
            counts = by_case.setdefault(name, {})
            counts[code] = counts.get(code, 0) + 1

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return {"seconds": round(time.perf_counter() - t0, 3), "cpu_s": round(time.process_time() - c0, 3),
            "by_case": by_case, "answered_then_reset": resets[0]}


def hostile_process(ctl: Any, port: int, cases: list[Hostile], total: int, concurrency: int, timeout_s: float) -> None:
    """Runs one burst per message on ``ctl`` (its seed) and sends back its result; None ends it."""
    while (seed := ctl.recv()) is not None:
        ctl.send(asyncio.run(burst(port, cases, total, concurrency, timeout_s, seed)))


# -- the valid client and the rounds ----------------------------------------------------------------

async def valid_phase(port: int, path: str, body: bytes, headers: dict[str, str], expect: bytes,
                      done: Any) -> dict[str, Any]:
    """Sequential valid requests on one connection until ``done()``: latencies, statuses, wrong answers."""
    conn, lat, codes, wrong = Conn("127.0.0.1", port), [], {}, 0
    try:
        while not done():
            t0 = time.perf_counter()
            status, _, data = await conn.post(path, body, headers)
            lat.append(time.perf_counter() - t0)
            codes[str(status)] = codes.get(str(status), 0) + 1
            wrong += status == 200 and data != expect
    finally:
        conn.close()
    return {"n": len(lat), "codes": codes, "wrong": wrong, **{f"p{q}_us": round(pct(lat, q) * 1e6, 1)
                                                                 for q in (50, 90, 99)}}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc), all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def rounds(a: argparse.Namespace, port: int, path: str, body: bytes, headers: dict[str, str], expect: bytes,
                 ctl: Any, server_pid: int) -> list[dict[str, Any]]:
    """The rounds of ``a.pattern``; each row: the valid client's numbers, its own and the server's CPU
    seconds (and the hostile process's, in ``burst``), the 1-minute load average before it."""
    loop = asyncio.get_running_loop()
    out = []
    for i, kind in enumerate(a.pattern):
        load = round(os.getloadavg()[0], 2)
        t0, c0, s0 = time.perf_counter(), time.process_time(), cpu_seconds(server_pid)
        if kind == "A":
            end = time.perf_counter() + a.a_seconds
            row = await valid_phase(port, path, body, headers, expect, lambda: time.perf_counter() >= end)
        else:
            ctl.send(i)
            got = loop.run_in_executor(None, ctl.recv)
            row = await valid_phase(port, path, body, headers, expect, got.done)
            row["burst"] = await got
        wall, server_cpu = time.perf_counter() - t0, cpu_seconds(server_pid) - s0
        row.update(seconds=round(wall, 3), client_cpu_s=round(time.process_time() - c0, 3),
                   server_cpu_s=round(server_cpu, 3), server_cpu_share=round(server_cpu / wall, 2))
        out.append({"round": i, "kind": kind, "load_average_1m": load, **row})
        await asyncio.sleep(a.pause)
    return out


# -- accounting -----------------------------------------------------------------------------------

def samples(text: str, name: str, label: str) -> dict[str, float]:
    """``name``'s samples in a Prometheus exposition, summed by the value of ``label``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                key = s.labels.get(label, "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: int(v - before.get(k, 0.0)) for k, v in sorted(after.items()) if v != before.get(k, 0.0)}


def entries(d: Path) -> int:
    return sum(1 for _ in d.rglob("*")) if d.exists() else 0


def account(rows: list[dict[str, Any]], cases: list[Hostile], m0: str, m1: str) -> dict[str, Any]:
    """What the clients saw against what /metrics counted between the scrapes ``m0`` and ``m1``.

    An inference request whose client got no answer (it half-closed mid-body, or the server answered
    before reading a large body and closed, so the client's socket was reset) is still counted by the
    server, under a code the client never saw: ``unanswered`` of them, spread over the codes."""
    infer = {name for name, _, _, counted in cases if counted}
    seen: dict[str, int] = {}  # the malformed answers by status, as the clients saw them
    expect: dict[str, int] = {}  # what tileship_requests_total should count at least, by code
    unanswered: dict[str, dict[str, int]] = {}
    for r in rows:
        for code, n in r["codes"].items():
            expect[code] = expect.get(code, 0) + n
        for name, counts in r.get("burst", {}).get("by_case", {}).items():
            for code, n in counts.items():
                seen[code] = seen.get(code, 0) + n
                if code.isdigit():
                    expect[code] = expect.get(code, 0) + n * (name in infer)
                else:
                    unanswered.setdefault(name, {})[code] = unanswered.setdefault(name, {}).get(code, 0) + n
    n_unanswered = sum(n for name, counts in unanswered.items() if name in infer for n in counts.values())
    counted = delta(samples(m1, "tileship_requests_total", "code"), samples(m0, "tileship_requests_total", "code"))
    rejected = delta(samples(m1, "tileship_rejected_total", "reason"), samples(m0, "tileship_rejected_total", "reason"))
    oversized = sum(r["burst"]["by_case"].get("valid-oversized-content-length", {}).get("413", 0)
                    for r in rows if "burst" in r)
    adds_up = (all(counted.get(c, 0) >= n for c, n in expect.items())
               and sum(counted.values()) == sum(expect.values()) + n_unanswered)
    return {"malformed_by_status": dict(sorted(seen.items())), "requests_total_by_code": counted,
            "expected_by_code": dict(sorted(expect.items())), "unanswered_inference_requests": n_unanswered,
            "requests_by_code_add_up": adds_up, "rejected_by_reason": rejected,
            "body_too_large_expected": oversized,
            "unanswered_by_case": unanswered,
            "answered_then_reset": sum(r["burst"]["answered_then_reset"] for r in rows if "burst" in r),
            "inflight_after": samples(m1, "tileship_inflight_requests", "").get("", -1.0),
            "compile_attempts": samples(m1, "tileship_serve_compile_attempts", "").get("", -1.0)}


def verdicts(rows: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Each B round's p50 over the A round before it; the target's verdict and whether B is slower."""
    ratios, a_p50s, b_p50s, last_a = [], [], [], None
    for r in rows:
        if r["kind"] == "A":
            last_a = r["p50_us"]
            a_p50s.append(last_a)
        else:
            b_p50s.append(r["p50_us"])
            if last_a:
                ratios.append(round(r["p50_us"] / last_a, 3))
    verdict = ("met" if ratios and max(ratios) < target else "missed" if ratios and min(ratios) >= target
               else "not resolved")
    slower = ("resolved: slower" if min(b_p50s) > max(a_p50s) else "resolved: faster" if max(b_p50s) < min(a_p50s)
              else "not resolved")
    return {"a_p50_us": a_p50s, "b_p50_us": b_p50s, "ratios": ratios,
            "ratio_of_medians": round(statistics.median(b_p50s) / statistics.median(a_p50s), 3),
            "ratio_spread": [min(ratios), max(ratios)] if ratios else None, "target": target,
            "target_verdict": verdict, "b_vs_a": slower}


def health(url: str) -> dict[str, int]:
    out = {}
    for what in ("live", "ready"):
        try:
            with urllib.request.urlopen(f"{url}/v2/health/{what}", timeout=10) as r:
                out[what] = r.status
        except OSError as exc:
            out[what] = getattr(exc, "code", 0) or 0
    return out


def log_levels(log_path: Path) -> dict[str, int]:
    """The server log's lines by level (JSON lines; anything else is ``other``)."""
    out: dict[str, int] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            level = str(json.loads(line).get("level", "other"))
        except (ValueError, AttributeError):
            level = "other"
        out[level] = out.get(level, 0) + 1
    return out


# -- orchestration -------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", type=Path, help="release directory (default: build the CPU catalog into a temp dir)")
    ap.add_argument("--op", default="add")
    ap.add_argument("--dims", default="N=4096", help="comma-separated dim=size")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--burst", type=int, default=2000, help="malformed requests in each B round")
    ap.add_argument("--concurrency", type=int, default=64, help="hostile connections at a time")
    ap.add_argument("--pattern", default="ABABABAB", help="the rounds, in order")
    ap.add_argument("--a-seconds", type=float, default=2.0, help="length of an A round")
    ap.add_argument("--pause", type=float, default=0.5, help="seconds between rounds")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one malformed request may take")
    ap.add_argument("--target", type=float, default=2.0, help="B p50 / A p50 must stay under this")
    ap.add_argument("--out", type=Path, help="JSON result; a .txt summary is written beside it")
    a = ap.parse_args(argv)
    if set(a.pattern) - {"A", "B"} or "A" not in a.pattern or "B" not in a.pattern[a.pattern.index("A"):]:
        ap.error("--pattern holds A and B rounds, an A before the first B")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    os.environ.setdefault("TILELANG_CACHE_DIR", tempfile.mkdtemp(prefix="malformed-burst-tl-"))
    load_start = [round(x, 2) for x in os.getloadavg()]
    release_dir = a.release or build_cpu_release(Path(tempfile.mkdtemp(prefix="malformed-burst-rel-")))
    diag = Path(tempfile.mkdtemp(prefix="malformed-burst-diag-")) / "diagnostics"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc, log_path = start_server(release_dir, port, ["--diagnostics-dir", str(diag)], "malformed-burst-log-")
    ctx = multiprocessing.get_context("spawn")
    ctl, child_end = ctx.Pipe()
    hostile = None
    try:
        _, ready_s, release, _ = ready_release(url, proc, time.perf_counter(), release_dir, a.op, False)
        dims = {k: int(v) for k, v in (p.split("=") for p in a.dims.split(","))}
        body, headers, tensors = make_request(release, a.op, dims, a.dtype, True)
        path = f"/v2/models/{a.op}/infer"
        cases = hostile_corpus(a.op, body, headers)
        hostile = ctx.Process(target=hostile_process, args=(child_end, port, cases, a.burst, a.concurrency, a.timeout),
                              daemon=True)
        hostile.start()

        async def first() -> bytes:
            conn = Conn("127.0.0.1", port)
            try:
                status, hdrs, data = await conn.post(path, body, headers)
                ref = tensors[0] + tensors[1] if a.op == "add" else None
                if ref is not None and _max_diff(status, hdrs, data, ref) > 0:
                    raise SystemExit("the valid request's answer differs from the in-process add")
                for _ in range(50):  # warm the path (the inline decision, pools)
                    await conn.post(path, body, headers)
                return data
            finally:
                conn.close()

        expect = asyncio.run(first())
        diag_start = entries(diag)
        m0 = scrape(url)
        rows = asyncio.run(rounds(a, port, path, body, headers, expect, ctl, proc.pid))
        time.sleep(1.0)  # a bundle is written off the loop: give the queue time to land one
        m1 = scrape(url)
        diag_end = entries(diag)
        alive = health(url)
    finally:
        if hostile is not None:
            ctl.send(None)
            hostile.join(10)
        stop_server(proc)
    acc = account(rows, cases, m0, m1)
    acc.update(diagnostics_at_start=diag_start, diagnostics_new=diag_end - diag_start, health_after=alive,
               server_log_levels=log_levels(log_path))
    fives = {k: v for k, v in {**acc["malformed_by_status"], **acc["requests_total_by_code"]}.items()
             if k.startswith("5")}
    checks = {
        "no_5xx": not fives,
        "no_timeout": "timeout" not in acc["malformed_by_status"],
        "no_new_diagnostics": acc["diagnostics_new"] == 0,
        "live_and_ready_after": alive == {"live": 200, "ready": 200},
        "valid_all_200_and_right": all(set(r["codes"]) == {"200"} and r["wrong"] == 0 and r["n"] > 0 for r in rows),
        "requests_by_code_add_up": acc["requests_by_code_add_up"],
        "rejections_add_up": acc["rejected_by_reason"] == ({"body_too_large": acc["body_too_large_expected"]}
                                                           if acc["body_too_large_expected"] else {}),
        "inflight_back_to_0": acc["inflight_after"] == 0,
        "compile_attempts_0": acc["compile_attempts"] == 0,
        "no_error_log_lines": not {"error", "critical"} & set(acc["server_log_levels"]),
    }
    import torch

    result = {
        "benchmark": "serve_malformed_burst",
        "config": {"op": a.op, "dims": dims, "dtype": a.dtype, "tensors": "binary", "request_bytes": len(body),
                   "burst": a.burst, "concurrency": a.concurrency, "pattern": a.pattern, "a_seconds": a.a_seconds,
                   "corpus_cases": len(cases), "valid_clients": 1},
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
                        "platform": platform.platform(), "load_average_at_start": load_start},
        "release_id": release.release_id, "server_ready_s": round(ready_s, 2), "server_log": str(log_path),
        "rounds": rows, "latency": verdicts(rows, a.target), "accounting": acc, "checks": checks,
        "ok": all(checks.values()),
    }
    text = summary(result)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        a.out.with_suffix(".txt").write_text(text + "\n")
    return 0 if result["ok"] else 1


def summary(r: dict[str, Any]) -> str:
    c, lat, acc = r["config"], r["latency"], r["accounting"]
    lines = [f"serve_malformed_burst: release {r['release_id']}; valid {c['op']} {c['dims']} {c['dtype']} binary "
             f"({c['request_bytes']} B), 1 client; B rounds: {c['burst']} malformed requests over {c['concurrency']} "
             f"connections ({c['corpus_cases']} cases); load average at start "
             f"{r['environment']['load_average_at_start']}"]
    for row in r["rounds"]:
        extra = ""
        if "burst" in row:
            b = row["burst"]
            extra = f"; burst {b['seconds']} s ({round(c['burst'] / b['seconds'])} req/s), its CPU {b['cpu_s']} s"
        lines.append(f"  round {row['round']} {row['kind']}: n {row['n']:>6}  p50 {row['p50_us']:>9.1f} us  "
                     f"p90 {row['p90_us']:>9.1f}  p99 {row['p99_us']:>9.1f}  load {row['load_average_1m']}; "
                     f"{row['seconds']} s, CPU server {row['server_cpu_s']} s ({row['server_cpu_share']} of a core), "
                     f"client {row['client_cpu_s']} s{extra}")
    lines.append(f"  B/A p50 by round {lat['ratios']}; ratio of medians {lat['ratio_of_medians']} (spread "
                 f"{lat['ratio_spread']}); target < {lat['target']}: {lat['target_verdict']}; B vs A: {lat['b_vs_a']}")
    lines.append(f"  malformed answers by status {acc['malformed_by_status']}; diagnostics new "
                 f"{acc['diagnostics_new']} (at start {acc['diagnostics_at_start']}); "
                 f"health after {acc['health_after']}; no answer {acc['unanswered_by_case']}; answered, then reset "
                 f"{acc['answered_then_reset']}")
    lines.append(f"  /metrics: requests by code {acc['requests_total_by_code']} (expected {acc['expected_by_code']}); "
                 f"rejected {acc['rejected_by_reason']}; in flight {acc['inflight_after']}; compile attempts "
                 f"{acc['compile_attempts']}; server log levels {acc['server_log_levels']}")
    failed = [k for k, v in r["checks"].items() if not v]
    lines.append(f"  accounting ok: {r['ok']}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
