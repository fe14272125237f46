"""A response's head and body leave the server in one write (``serve.one_write.OneWrite``):
the contract on a recording transport, then a real server on 127.0.0.1 whose answers stay whole
and in order (keep-alive, pipelined requests, a body larger than the join limit, HEAD, 100-continue)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest

from tileship.serve.one_write import HEAD_BYTES, JOIN_BYTES, OneWrite

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


class Recording:
    """A transport that records what it is asked to send, in order."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def write_eof(self) -> None:
        self.writes.append(b"<eof>")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


def _run(steps: Any) -> Recording:
    async def go() -> Recording:
        rec = Recording()
        await steps(OneWrite(rec, asyncio.get_running_loop()), rec)
        return rec
    return asyncio.run(go())


def test_head_and_body_go_out_as_one_write():
    async def steps(t: OneWrite, rec: Recording) -> None:
        t.write(HEAD)
        assert rec.writes == []  # held for the body
        t.write(memoryview(b"hello"))
        assert rec.writes == [HEAD + b"hello"]
        await asyncio.sleep(0)  # the loop's turn finds nothing held
        assert rec.writes == [HEAD + b"hello"]
    _run(steps)


def test_a_head_without_a_body_goes_out_on_the_loops_next_turn():
    async def steps(t: OneWrite, rec: Recording) -> None:
        t.write(HEAD)
        await asyncio.sleep(0)
        assert rec.writes == [HEAD]
    _run(steps)


def test_a_large_body_follows_the_head_in_order_without_a_join():
    big = b"x" * (JOIN_BYTES + 1)

    async def steps(t: OneWrite, rec: Recording) -> None:
        t.write(HEAD)
        t.write(big)
        assert rec.writes == [HEAD, big]
    _run(steps)


def test_close_and_eof_send_what_is_held_first_and_other_writes_pass_through():
    async def steps(t: OneWrite, rec: Recording) -> None:
        t.write(b"partial body without a blank line")  # not a head: straight through
        assert rec.writes == [b"partial body without a blank line"]
        t.write(b"x" * HEAD_BYTES + b"\r\n\r\n")  # too large to be held
        assert len(rec.writes) == 2
        t.write(HEAD)
        t.write_eof()
        assert rec.writes[2:] == [HEAD, b"<eof>"]
        t.write(HEAD)
        t.close()
        assert rec.writes[4:] == [HEAD] and rec.closed
        assert t.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's
    _run(steps)


def test_a_head_held_past_close_is_not_written_to_a_closing_transport():
    async def steps(t: OneWrite, rec: Recording) -> None:
        t.write(HEAD)
        rec.closed = True  # the peer went away before the loop's turn
        await asyncio.sleep(0)
        assert rec.writes == []
    _run(steps)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.test_serve_limits import hostile_server

    with hostile_server(tmp_path_factory.mktemp("onewrite")) as srv:
        yield srv


def _read_response(s: socket.socket, buf: bytearray) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response with a content-length from ``s`` (``buf`` holds bytes read ahead)."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, "connection closed mid-head"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    buf[:] = rest[length:]
    return head, rest[:length]


def test_pipelined_keep_alive_requests_get_whole_answers_in_order(server):
    req = (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
           b"GET /v2/models/add HTTP/1.1\r\nHost: x\r\n\r\n"
           b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        for _ in range(3):
            s.sendall(req)
            buf = bytearray()
            answers = [_read_response(s, buf) for _ in range(3)]
            assert [h.split(b"\r\n", 1)[0] for h, _ in answers] == [b"HTTP/1.1 200 OK"] * 3
            assert b'"name":"add"' in answers[1][1].replace(b" ", b"")
            assert buf == b""


def test_head_request_and_expect_continue_are_answered(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        data = s.recv(65536)
        assert data.startswith(b"HTTP/1.1 ") and data.endswith(b"\r\n\r\n")
    body = b'{"inputs":[{"name":"X","shape":[3],"datatype":"FP32","data":[1,2,3]},' \
           b'{"name":"Y","shape":[3],"datatype":"FP32","data":[1,1,1]}]}'
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        head, answer = _read_response(s, bytearray())
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"[2.0,3.0,4.0]" in answer.replace(b" ", b"")


def test_an_answer_larger_than_the_join_limit_arrives_whole(server):
    n = JOIN_BYTES // 4 + 1000  # fp32 output over the join limit
    body = json.dumps({"inputs": [{"name": "X", "shape": [n], "datatype": "FP32", "data": [1] * n},
                                  {"name": "Y", "shape": [n], "datatype": "FP32", "data": [2] * n}]})
    r = httpx.post(server.url + "/v2/models/add/infer", content=body,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text[:300]
    out = r.json()["outputs"][0]
    assert out["shape"] == [n] and out["data"][:2] == [3.0, 3.0] and len(out["data"]) == n
