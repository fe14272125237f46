"""Large request bodies read on a thread straight from the socket (issue 16, ``serve.body_pull``), through a
real server on 127.0.0.1 and raw sockets: several on one keep-alive connection and a request pipelined
right behind one, a client that sends in slow pieces, one that stalls (408, no late byte lands in a
block), one that goes away mid-body, ``Expect: 100-continue``, and ``body_threads=0``. Every answer is
compared with the exact sum; every block goes back to the pool."""

from __future__ import annotations

import io
import json
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

from tileship.serve import ServeConfig
from tileship.serve.body_pull import PULL_BYTES

N = 1 << 20  # 4 MiB a tensor: an 8 MiB body, past PULL_BYTES once its headers are read


def _body(n: int, seed: int) -> tuple[bytes, int, np.ndarray]:
    a, b = np.random.default_rng(seed).standard_normal((2, n), dtype=np.float32)
    head = json.dumps({"inputs": [{"name": k, "shape": [n], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 4 * n}} for k in ("A", "B")],
                       "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}).encode()
    return head + a.tobytes() + b.tobytes(), len(head), a + b


def _head(size: int, hl: int, extra: bytes = b"") -> bytes:
    return (b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n%s\r\n" % (hl, size, extra))


class Reader:
    """HTTP/1.1 responses off one raw socket, in order."""

    def __init__(self, s: socket.socket) -> None:
        self.s, self.buf = s, b""

    def _fill(self) -> bool:
        chunk = self.s.recv(1 << 20)
        self.buf += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), f"the connection closed before a response head: {self.buf[:200]!r}"
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
        n = int(headers.get("content-length", 0))
        while len(self.buf) < n:
            assert self._fill(), "the connection closed mid-response"
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, body

    def closed(self) -> bool:
        try:
            return not self._fill()
        except OSError:
            return True


def _sum_of(headers: dict[str, str], body: bytes) -> np.ndarray:
    return np.frombuffer(body[int(headers["inference-header-content-length"]):], dtype=np.float32)


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(60)
    return s


def _answered(port: int, body: bytes, hl: int, want: np.ndarray) -> None:
    """One request on a new connection, answered 200 with the exact sum."""
    s = _connect(port)
    s.sendall(_head(len(body), hl) + body)
    status, headers, out = Reader(s).response()
    assert status == 200 and np.array_equal(_sum_of(headers, out), want), out[:300]
    s.close()


def _config(release: Any, tmp_path: Path, **kw: Any) -> ServeConfig:
    return ServeConfig(source=release.path, diagnostics_dir=tmp_path / "d", log_stream=io.StringIO(),
                       **{"body_threads": 8, **kw})


def test_bodies_on_one_keep_alive_connection_and_a_pipelined_request(cpu_release_build, tmp_path: Path):
    from test_serve import serving

    bodies = [_body(N, seed) for seed in range(3)]
    small, small_hl, small_want = _body(1000, 9)
    with serving(_config(cpu_release_build, tmp_path)) as srv:
        s = _connect(srv.port)
        r = Reader(s)
        for body, hl, want in bodies:  # one after another on the same connection
            s.sendall(_head(len(body), hl) + body)
            status, headers, out = r.response()
            assert status == 200 and np.array_equal(_sum_of(headers, out), want), out[:200]
        body, hl, want = bodies[0]  # a large body and a small request right behind it, in one write
        s.sendall(_head(len(body), hl) + body + _head(len(small), small_hl) + small)
        for expect in (want, small_want):
            status, headers, out = r.response()
            assert status == 200 and np.array_equal(_sum_of(headers, out), expect), out[:200]
        s.close()
        assert srv.service.pulls.bodies >= 4, "no large body was read on a thread"
        assert srv.service.staging.stats()["out_bytes"] == 0


def test_a_slow_client_and_expect_continue(cpu_release_build, tmp_path: Path):
    """A body sent in 512 KiB pieces with pauses arrives whole; with ``Expect: 100-continue`` the server
    answers 100 first (the loop's path: the thread never reads before that answer)."""
    from test_serve import serving

    body, hl, want = _body(N, 3)
    with serving(_config(cpu_release_build, tmp_path)) as srv:
        s = _connect(srv.port)
        r = Reader(s)
        s.sendall(_head(len(body), hl))
        for i in range(0, len(body), 512 << 10):
            s.sendall(body[i:i + (512 << 10)])
            time.sleep(0.02)
        status, headers, out = r.response()
        assert status == 200 and np.array_equal(_sum_of(headers, out), want)
        pulled = srv.service.pulls.bodies
        s.sendall(_head(len(body), hl, b"Expect: 100-continue\r\n"))
        while b"\r\n\r\n" not in r.buf:
            assert r._fill()
        assert r.buf.startswith(b"HTTP/1.1 100"), r.buf[:100]
        r.buf = r.buf.split(b"\r\n\r\n", 1)[1]
        s.sendall(body)
        status, headers, out = r.response()
        assert status == 200 and np.array_equal(_sum_of(headers, out), want)
        assert srv.service.pulls.bodies == pulled  # not on a thread
        s.close()
        assert srv.service.staging.stats()["out_bytes"] == 0


def test_a_stalled_body_is_a_408_that_closes_and_no_late_byte_lands(cpu_release_build, tmp_path: Path):
    from test_serve import serving

    body, hl, want = _body(N, 5)
    with serving(_config(cpu_release_build, tmp_path, body_timeout_s=1.0)) as srv:
        pool = srv.service.staging
        s = _connect(srv.port)
        r = Reader(s)
        s.sendall(_head(len(body), hl) + body[:PULL_BYTES // 4])
        status, _, out = r.response()
        assert status == 408 and b"within 1 s" in out, out[:300]
        assert r.closed(), "the connection stayed open mid-body"
        assert pool.stats()["out_bytes"] == 0
        blocks = [bytes(memoryview(blk.numpy())) for blk in pool.free_blocks()]
        try:
            s.sendall(body[PULL_BYTES // 4:])  # late bytes
        except OSError:
            pass
        s.close()
        time.sleep(0.3)
        assert [bytes(memoryview(blk.numpy())) for blk in pool.free_blocks()] == blocks
        _answered(srv.port, body, hl, want)  # the server serves on


def test_a_client_gone_mid_body_gives_its_block_back(cpu_release_build, tmp_path: Path):
    from test_serve import serving

    body, hl, want = _body(N, 6)
    with serving(_config(cpu_release_build, tmp_path)) as srv:
        for cut in (socket.SHUT_WR, None):  # half-closed (EOF), then reset by a plain close
            s = _connect(srv.port)
            s.sendall(_head(len(body), hl) + body[:PULL_BYTES // 2])
            time.sleep(0.2)
            if cut is None:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()
            else:
                s.shutdown(cut)
                r = Reader(s)
                status = r.response()[0] if not r.closed() or r.buf else None
                assert status in (None, 400), status
                s.close()
        deadline = time.monotonic() + 10
        while srv.service.staging.stats()["out_bytes"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.service.staging.stats()["out_bytes"] == 0
        _answered(srv.port, body, hl, want)


def test_no_threads_keeps_every_body_on_the_loop(cpu_release_build, tmp_path: Path):
    """``body_threads=0``, the default: no thread, every body read on the event loop."""
    from test_serve import serving

    body, hl, want = _body(N, 7)
    assert ServeConfig(source=cpu_release_build.path).body_threads == 0
    with serving(_config(cpu_release_build, tmp_path, body_threads=0)) as srv:
        _answered(srv.port, body, hl, want)
        assert srv.service.pulls.bodies == 0 and srv.service.pulls.threads == 0


def test_cli_refuses_a_negative_or_huge_thread_count(cpu_release_build):
    import subprocess
    import sys

    base = [sys.executable, "-m", "tileship.cli", "serve", str(cpu_release_build.path), "--port", "0"]
    for value in ("-1", "257"):
        r = subprocess.run([*base, "--body-threads", value], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "--body-threads 0 to 256" in r.stdout + r.stderr, r.stdout + r.stderr


def test_no_descriptor_to_spare_leaves_the_body_to_the_loop(cpu_release_build, tmp_path: Path, monkeypatch):
    """When the socket cannot be duplicated (EMFILE), the event loop reads the body as without threads."""
    from test_serve import serving

    from tileship.serve import body_pull

    def no_fd(fd: int) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(body_pull.socket, "dup", no_fd)
    body, hl, want = _body(N, 8)
    with serving(_config(cpu_release_build, tmp_path)) as srv:
        _answered(srv.port, body, hl, want)
        _answered(srv.port, body, hl, want)
        assert srv.service.pulls.bodies == 0 and srv.service.staging.stats()["out_bytes"] == 0
