"""HTTP framing and header hostility over raw sockets (``serve.framing``, ``serve.connections``): transfer
codings, Expect, Host, Transfer-Encoding with Content-Length, chunked requests and their trailers, pipelined
refusals, upgrades, request targets, with worker processes too. Each answer is a JSON 4xx/5xx (or the right
result), closing the connection where the framing is lost; the server logs no traceback, and a second
connection is served afterwards. A real server on 127.0.0.1 (tests/test_serve_limits's fake release:
``add`` X[N] + Y[N] -> Z[N])."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from tests.test_serve_limits import hostile_server
from tests.test_serve_transport import _read_all, served_right

from tileship.serve import BackgroundServer
from tileship.serve.connections import REQUEST_HEAD_LIMIT

LIMIT = 1 << 20
INFER = b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
DOC = json.dumps({"inputs": [{"name": "X", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]},
                             {"name": "Y", "shape": [3], "datatype": "FP32", "data": [10, 20, 30]}]}).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with hostile_server(tmp_path_factory.mktemp("framing"), max_body_bytes=LIMIT, header_timeout_s=3.0) as srv:
        yield srv


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def no_traceback(server: BackgroundServer) -> Iterator[None]:
    """No uvicorn or asyncio record with a traceback (or at level error) while the test runs, no JSON log
    line with one, and the server serves a second connection afterwards."""
    kept = _Kept()
    loggers = [logging.getLogger(name) for name in ("uvicorn", "asyncio")]
    for lg in loggers:
        lg.addHandler(kept)
    log = server.service.config.log_stream
    start = len(log.getvalue())
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeHandler(kept)
    bad = [r.getMessage() for r in kept.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, bad
    assert '"traceback"' not in log.getvalue()[start:]
    served_right(server)


def chunked(body: bytes, pieces: int = 1) -> bytes:
    step = -(-len(body) // pieces)
    parts = [body[i:i + step] for i in range(0, len(body), step)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def exchange(srv: BackgroundServer, data: bytes) -> bytes:
    """``data`` sent on a fresh connection; every byte the server sends until it closes (10 s at most)."""
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.settimeout(10)
        s.sendall(data)
        return _read_all(s)


def answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """The first response in ``raw``: (status, headers by lower-case name, body by its Content-Length)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest[:int(headers.get("content-length", len(rest)))]


def answers(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Every response in ``raw``, in order."""
    out = []
    while raw:
        code, headers, body = answer(raw)
        out.append((code, headers, body))
        raw = raw[raw.index(b"\r\n\r\n") + 4 + len(body):]
    return out


def refused(raw: bytes, status: int, words: str) -> None:
    """``raw`` is one JSON answer of ``status`` whose error holds ``words``, then the end of the stream."""
    code, headers, body = answer(raw)
    assert code == status and headers["content-type"] == "application/json", raw[:600]
    assert words in json.loads(body)["error"], body
    assert headers.get("connection") == "close" and raw.endswith(b"\r\n\r\n" + body), raw[:600]


@pytest.mark.parametrize("codings,body", [
    ([b"gzip, chunked"], chunked(gzip.compress(DOC))),
    ([b"gzip"], gzip.compress(DOC)),
    ([b"gzip", b"chunked"], chunked(gzip.compress(DOC))),
    ([b"identity"], DOC),
    ([b"x-custom;p=1, Chunked"], chunked(DOC)),
], ids=["gzip-chunked", "gzip", "two-headers", "identity", "custom-with-a-parameter"])
def test_a_transfer_coding_other_than_chunked_gets_a_json_501_naming_it_and_a_close(server, codings, body):
    te = b"".join(b"Transfer-Encoding: %s\r\n" % c for c in codings)
    raw = exchange(server, INFER + te + b"\r\n" + body)
    name = next(m.strip() for c in codings for m in c.decode().split(",") if m.strip().lower() != "chunked")
    refused(raw, 501, f"Transfer-Encoding {name!r} is not implemented")


@pytest.mark.parametrize("te", [b"chunked", b"CHUNKED", b" , chunked"], ids=["chunked", "upper-case", "empty-member"])
def test_a_chunked_inference_request_is_answered(server, te):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(10)
        s.sendall(INFER + b"Transfer-Encoding: " + te + b"\r\nConnection: close\r\n\r\n")
        body = chunked(DOC, pieces=4)
        for i in range(0, len(body), 40):  # the chunks in pieces, as a streaming client sends them
            s.sendall(body[i:i + 40])
            time.sleep(0.002)
        code, _, out = answer(_read_all(s))
    assert code == 200 and json.loads(out)["outputs"][0]["data"] == [11.0, 22.0, 33.0], out


def test_a_streamed_body_from_httpx_goes_chunked_and_is_answered(server):
    def pieces() -> Iterator[bytes]:
        yield from (DOC[i:i + 17] for i in range(0, len(DOC), 17))

    r = httpx.post(server.url + "/v2/models/add/infer", content=pieces(), timeout=30,
                   headers={"content-type": "application/json"})
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [11.0, 22.0, 33.0], r.text


@pytest.mark.parametrize("head", [
    b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n",
    b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip, chunked\r\nContent-Length: 2\r\n",
    b"Content-Length: 2\r\nTransfer-Encoding: gzip, chunked\r\n",
], ids=["te-then-cl", "cl-then-te", "gzip-te-then-cl", "cl-then-gzip-te"])
def test_transfer_encoding_with_content_length_gets_a_json_400_and_a_close(server, head):
    raw = exchange(server, INFER + head + b"\r\n" + chunked(b"{}") + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    refused(raw, 400, "present with")


@pytest.mark.parametrize("value,named", [
    (b"200-ok", "200-ok"), (b"100-continue, x-fast", "x-fast"), (b"100-continue=1", "100-continue=1"),
], ids=["other", "in-a-list", "with-a-value"])
def test_an_expectation_other_than_100_continue_gets_a_json_417_naming_it(server, value, named):
    raw = exchange(server, INFER + b"Expect: %s\r\nContent-Length: %d\r\n\r\n%s" % (value, len(DOC), DOC))
    refused(raw, 417, f"Expect {named!r} is not supported")


@pytest.mark.parametrize("value", [b"100-continue", b"100-Continue", b"100-CONTINUE"])
def test_expect_100_continue_gets_its_interim_answer_before_the_body_is_sent(server, value):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(10)
        s.sendall(INFER + b"Expect: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (value, len(DOC)))
        assert s.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"  # the body is not sent before this
        s.sendall(DOC)
        code, _, out = answer(_read_all(s))
    assert code == 200 and json.loads(out)["outputs"][0]["data"] == [11.0, 22.0, 33.0], out


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_sending_expect_100_continue_is_answered(server, tmp_path):
    body = tmp_path / "body.json"  # past 1 MiB curl sends Expect: 100-continue itself; here it is asked for
    body.write_bytes(DOC)
    out = subprocess.run(["curl", "-sS", "-H", "Expect: 100-continue", "-H", "Content-Type: application/json",
                          "--data-binary", f"@{body}", server.url + "/v2/models/add/infer"],
                         capture_output=True, timeout=30, check=True)
    assert json.loads(out.stdout)["outputs"][0]["data"] == [11.0, 22.0, 33.0], out


@pytest.mark.parametrize("head,has", [
    (b"GET /v2/health/live HTTP/1.1\r\n\r\n", 0),
    (b"GET /v2/health/live HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 2),
    (b"GET /v2/health/live HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n", 2),
], ids=["http-1.1-without", "two", "two-in-http-1.0"])
def test_a_request_without_one_host_gets_a_json_400(server, head, has):
    refused(exchange(server, head), 400, f"Host header; this one has {has}")


def test_an_http_1_0_request_without_host_and_an_absolute_form_target_are_served(server):
    code, _, body = answer(exchange(server, b"GET /v2/health/live HTTP/1.0\r\n\r\n"))
    assert code == 200 and json.loads(body) == {"live": True}
    raw = exchange(server, b"POST http://elsewhere:1/v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           b"application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(DOC), DOC))
    code, _, body = answer(raw)
    assert code == 200 and json.loads(body)["outputs"][0]["data"] == [11.0, 22.0, 33.0], raw


_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("bad,status,words", [
    (b"GET /v2/health/live HTTP/9.9\r\nHost: x\r\n\r\n", 400, "HTTP version"),
    (_LIVE.replace(b"Host: x", b"Host: x\r\nExpect: nope"), 417, "Expect 'nope'"),
    (INFER + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n", 400, "chunk size"),
], ids=["bad-version", "bad-expect", "bad-chunk-in-the-body"])
def test_a_refusal_behind_pipelined_requests_comes_after_their_answers(server, bad, status, words):
    first = INFER + b"Content-Length: %d\r\n\r\n%s" % (len(DOC), DOC)
    got = answers(exchange(server, first + _LIVE + bad))
    assert [code for code, _, _ in got] == [200, 200, status], got
    assert json.loads(got[0][2])["outputs"][0]["data"] == [11.0, 22.0, 33.0] and json.loads(got[1][2]) == {"live": True}
    assert words in json.loads(got[2][2])["error"] and got[2][1]["connection"] == "close", got[2]


def test_a_refused_request_ahead_of_others_ends_the_connection_with_its_answer(server):
    raw = exchange(server, INFER + b"Expect: nope\r\nContent-Length: %d\r\n\r\n%s" % (len(DOC), DOC) + _LIVE)
    refused(raw, 417, "Expect 'nope'")


def _stream(srv: BackgroundServer, head: bytes, piece: bytes, total: int) -> tuple[bytes, float]:
    """``head``, then ``piece`` over and over (``total`` bytes at most, as a slow client sends them) until
    the server answers or stops reading; (everything it sent until it closed, seconds that took)."""
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.settimeout(10)
        s.sendall(head)
        t0, sent = time.monotonic(), 0
        try:
            while sent < total:
                s.sendall(piece)
                sent += len(piece)
                time.sleep(0.0005)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return _read_all(s), time.monotonic() - t0


_CHUNKED = INFER + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(DOC)[:-2]  # the last chunk; trailers next


@pytest.mark.parametrize("head,piece,status,words", [
    (_CHUNKED + b"X-Long: ", b"t" * 4096, 431, f"trailer fields of the chunked body pass {REQUEST_HEAD_LIMIT} bytes"),
    (_CHUNKED, b"X-Trailer: " + b"t" * 500 + b"\r\n", 431, "trailer fields of the chunked body pass"),
    (INFER + b"Transfer-Encoding: chunked\r\n\r\n2;ext=", b"e" * 4096, 400,
     f"a chunk line of the chunked body passes {REQUEST_HEAD_LIMIT} bytes"),
], ids=["one-endless-trailer", "endless-small-trailers", "endless-chunk-extension"])
def test_chunked_framing_past_the_head_limit_gets_a_json_4xx_at_the_limit(server, head, piece, status, words):
    raw, took = _stream(server, head, piece, 32 * REQUEST_HEAD_LIMIT)
    refused(raw, status, words)
    assert took < 3.0, "refused at the limit, not at the body deadline"


def test_a_chunked_request_with_small_trailers_is_answered(server):
    body = chunked(DOC, pieces=2)[:-2] + b"X-Checksum: 1\r\nContent-Type: text/plain\r\n\r\n"
    code, _, out = answer(exchange(server, INFER + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + body))
    assert code == 200 and json.loads(out)["outputs"][0]["data"] == [11.0, 22.0, 33.0], out


_WS = (b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
       b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")
_H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"


@pytest.mark.parametrize("upgrade", [_WS, _H2C], ids=["websocket", "h2c"])
def test_an_upgrade_request_is_served_as_http_1_1_and_the_connection_serves_on(server, upgrade):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(10)
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + upgrade + b"\r\n")
        first = answer(s.recv(65536))
        s.sendall(INFER + b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(DOC), DOC))
        second = answer(_read_all(s))
    assert first[0] == 200 and json.loads(first[2]) == {"live": True}, first
    assert second[0] == 200 and json.loads(second[2])["outputs"][0]["data"] == [11.0, 22.0, 33.0], second


@pytest.mark.parametrize("line,target", [
    (b"CONNECT example.org:443 HTTP/1.1", "example.org:443"), (b"GET http:// HTTP/1.1", "http://"),
], ids=["authority-form", "empty-authority"])
def test_a_request_target_that_is_no_path_gets_a_json_400_naming_it(server, line, target):
    refused(exchange(server, line + b"\r\nHost: x\r\n\r\n"), 400, f"the request target {target!r} is")


@pytest.fixture(scope="module")
def workers2(cpu_release_build) -> Iterator[BackgroundServer]:
    """``--workers 2`` over the CPU release (``add`` A[N] + B[N] -> C[N]): calls run in worker processes."""
    from tests.test_serve_workers import workers_server

    with workers_server(cpu_release_build.path, workers=2, header_timeout_s=3.0) as srv:
        yield srv


def test_framing_is_checked_the_same_with_worker_processes(workers2):
    doc = json.dumps({"inputs": [{"name": "A", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]},
                                 {"name": "B", "shape": [3], "datatype": "FP32", "data": [10, 20, 30]}]}).encode()
    te, ok = b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n", [11.0, 22.0, 33.0]
    code, _, out = answer(exchange(workers2, INFER + te + chunked(doc, pieces=3)))
    assert code == 200 and json.loads(out)["outputs"][0]["data"] == ok, out
    refused(exchange(workers2, INFER + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked(gzip.compress(doc))),
            501, "Transfer-Encoding 'gzip' is not implemented")
    refused(exchange(workers2, INFER + b"Expect: nope\r\nContent-Length: %d\r\n\r\n%s" % (len(doc), doc)), 417,
            "Expect 'nope'")
    refused(exchange(workers2, b"GET /v2/health/live HTTP/1.1\r\n\r\n"), 400, "exactly one Host header")
    got = answers(exchange(workers2, INFER + b"Content-Length: %d\r\n\r\n%s" % (len(doc), doc) + _LIVE
                           + INFER + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n"))
    assert [c for c, _, _ in got] == [200, 200, 400] and json.loads(got[0][2])["outputs"][0]["data"] == ok, got
    with socket.create_connection(("127.0.0.1", workers2.port)) as s:
        s.settimeout(10)
        s.sendall(INFER + b"Expect: 100-continue\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(doc))
        assert s.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(doc)
        code, _, out = answer(_read_all(s))
    assert code == 200 and json.loads(out)["outputs"][0]["data"] == ok, out
    assert '"traceback"' not in workers2.logs.getvalue()  # type: ignore[attr-defined]
    assert httpx.get(workers2.url + "/v2/health/live", timeout=10).json() == {"live": True}


@pytest.mark.parametrize("expect", [b"", b"Expect: 100-continue\r\n"], ids=["plain", "expect-100-continue"])
def test_a_content_length_past_the_limit_gets_a_413_before_any_body_byte(server, expect):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(10)
        s.sendall(INFER + expect + b"Content-Length: %d\r\n\r\n" % (LIMIT + 1))
        code, _, body = answer(s.recv(65536))  # no 100 Continue first: the body is not asked for
    assert code == 413 and f"the limit is {LIMIT} bytes" in json.loads(body)["error"], body
