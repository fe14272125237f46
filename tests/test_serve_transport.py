"""The server's HTTP transport against real clients and raw sockets: request bodies compressed the way
tritonclient compresses them (``request_compression_algorithm``), compressed bodies that lie or inflate
past the limit, and request heads that never end. Each answer is a clear 4xx (or the right result), and
the server serves the next request. A real server on 127.0.0.1 (tests/test_serve_limits's fake release:
``add`` X[N] + Y[N] -> Z[N])."""

from __future__ import annotations

import gzip
import json
import socket
import time
import zlib
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tests.test_serve_limits import hostile_server, metric

from tileship.serve import BackgroundServer, content_coding
from tileship.serve.connections import REQUEST_HEAD_LIMIT

LIMIT = 1 << 20  # the server's body limit here: a bomb needs to inflate past only this


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with hostile_server(tmp_path_factory.mktemp("transport"), max_body_bytes=LIMIT, header_timeout_s=3.0) as srv:
        yield srv


def served_right(srv: BackgroundServer) -> None:
    """The next plain request is answered, and right."""
    doc = {"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "data": [1, 2]},
                      {"name": "Y", "shape": [2], "datatype": "FP32", "data": [3, 4]}]}
    r = httpx.post(srv.url + "/v2/models/add/infer", json=doc, timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [4.0, 6.0], r.text


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_requests_are_inflated_and_answered(server, algorithm, binary):
    x, y = np.arange(1000, dtype=np.float32), np.full(1000, 0.25, dtype=np.float32)
    inputs = [triton.InferInput("X", [1000], "FP32"), triton.InferInput("Y", [1000], "FP32")]
    inputs[0].set_data_from_numpy(x, binary_data=binary)
    inputs[1].set_data_from_numpy(y, binary_data=binary)
    c = triton.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        res = c.infer("add", inputs, request_compression_algorithm=algorithm,
                      outputs=[triton.InferRequestedOutput("Z", binary_data=binary)])
    finally:
        c.close()
    np.testing.assert_array_equal(res.as_numpy("Z"), x + y)


def _post(srv: BackgroundServer, body: bytes, encoding: str) -> httpx.Response:
    return httpx.post(srv.url + "/v2/models/add/infer", content=body, timeout=30,
                      headers={"content-type": "application/json", "content-encoding": encoding})


_DOC = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]},
                              {"name": "Y", "shape": [1], "datatype": "FP32", "data": [2]}]}).encode()


@pytest.mark.parametrize("body,encoding,status,words", [
    (gzip.compress(_DOC + b" " * (LIMIT + 1)), "gzip", 413, f"inflates past {LIMIT} bytes"),
    (zlib.compress(_DOC + b" " * (64 * LIMIT)), "deflate", 413, f"inflates past {LIMIT} bytes"),
    (gzip.compress(_DOC)[:-12], "gzip", 400, "ends before its compressed stream does"),
    (gzip.compress(_DOC) * 2, "gzip", 400, "bytes after its compressed stream"),
    (zlib.compress(_DOC), "gzip", 400, "not valid gzip data"),
    (_DOC, "compress", 415, "Content-Encoding 'compress' is not supported"),
    (_DOC, "gzip, br", 415, "Content-Encoding 'gzip, br' names 2 codings"),
    (_DOC, "identity, gzip", 415, "Content-Encoding 'identity, gzip' names 2 codings"),
], ids=["gzip-bomb", "deflate-bomb", "truncated", "trailing", "deflate-as-gzip", "unknown", "a-list",
        "identity-in-a-list"])
def test_compressed_bodies_that_lie_get_a_4xx_naming_the_problem(server, body, encoding, status, words):
    r = _post(server, body, encoding)
    assert r.status_code == status and words in r.json()["error"], r.text
    served_right(server)


@pytest.mark.parametrize("fields,body", [
    (["identity", "gzip"], _DOC), (["identity", "gzip"], gzip.compress(_DOC)), (["gzip", "identity"], _DOC),
    (["gzip", "gzip"], gzip.compress(gzip.compress(_DOC))),
], ids=["identity-gzip-plain", "identity-gzip-gzipped", "gzip-identity-plain", "gzip-twice"])
def test_content_encoding_sent_twice_is_a_415_naming_both_never_decoded_by_the_first(server, fields, body):
    headers = [("content-type", "application/json")] + [("content-encoding", f) for f in fields]
    r = httpx.post(server.url + "/v2/models/add/infer", content=body, timeout=30, headers=headers)
    assert r.status_code == 415, r.text
    assert f"Content-Encoding '{', '.join(fields)}' names 2 codings" in r.json()["error"], r.text
    served_right(server)


def test_identity_and_an_exact_limit_inflate_as_sent(server):
    assert _post(server, _DOC, "identity").json()["outputs"][0]["data"] == [3.0]
    exact = _DOC + b" " * (LIMIT - len(_DOC))
    assert _post(server, gzip.compress(exact), "gzip").json()["outputs"][0]["data"] == [3.0]


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_a_head_past_the_limit_gets_a_431_the_client_reads_and_the_server_serves_on(server):
    before = metric(httpx.get(server.url + "/metrics").text, "tileship_rejected_total", reason="headers_too_large")
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(10)
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
        t0, sent = time.monotonic(), 0
        try:  # a header that never ends, in pieces, as a slow client sends it
            while sent < 16 * REQUEST_HEAD_LIMIT:
                s.sendall(b"a" * 4096)
                sent += 4096
                time.sleep(0.0005)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert f"pass {REQUEST_HEAD_LIMIT} bytes".encode() in answer, answer
    assert time.monotonic() - t0 < 3.0, "refused at the header deadline, not at the limit"
    after = metric(httpx.get(server.url + "/metrics").text, "tileship_rejected_total", reason="headers_too_large")
    assert after == before + 1
    served_right(server)


def test_heads_under_the_limit_and_pipelined_requests_are_served(server):
    r = httpx.get(server.url + "/v2/health/live", headers={"x-big": "a" * (REQUEST_HEAD_LIMIT - 1024)})
    assert r.status_code == 200, r.text
    one = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 20_000 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # 5 x 20 KB heads in one stream: each counts alone
        s.settimeout(10)
        s.sendall(one * 4 + one.replace(b"Host: x", b"Host: x\r\nConnection: close"))
        answer = _read_all(s)
    assert answer.count(b"HTTP/1.1 200 OK") == 5, answer[:500]


@pytest.mark.parametrize("head,words", [
    (b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", "Content-Length"),
    (b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
     "Duplicate Content-Length"),
    (b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
     "Transfer-Encoding can't be present with Content-Length"),
    (b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
     "chunk size"),
    (b"GET /v2/health/live HTTP/9.9\r\nHost: x\r\n\r\n", "HTTP version"),
], ids=["content-length-not-a-number", "two-content-lengths", "content-length-and-chunked", "bad-chunk-size",
        "http-9.9"])
def test_bytes_that_are_no_http_request_get_a_json_400_naming_the_problem(server, head, words):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(10)
        s.sendall(head)
        answer = _read_all(s)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400 ") and b"application/json" in status, answer
    assert words in json.loads(body)["error"], body
    served_right(server)


def test_a_small_body_that_inflates_large_is_left_to_a_thread():
    bomb = gzip.compress(b" " * (8 * content_coding.LOOP_BYTES))
    assert len(bomb) < content_coding.LOOP_BYTES
    assert content_coding.inflate(bomb, "gzip", LIMIT, content_coding.LOOP_BYTES) is None  # not on the loop
    assert content_coding.inflate(bomb, "gzip", LIMIT) == b" " * (8 * content_coding.LOOP_BYTES)
