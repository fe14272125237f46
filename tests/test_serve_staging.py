"""Pooled request bodies (issue 16, item 2, ``serve.staging``): blocks are reused per size class and
bounded; a large binary request through a real server lands in a pooled block, answers correctly,
and gives the block back; an output that shares memory with a pooled input is copied first."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as th

from tileship.serve import ServeConfig
from tileship.serve.calls import _own
from tileship.serve.staging import MIN_BYTES, Pool, size_class


def test_small_bodies_are_not_pooled_and_blocks_come_back():
    pool = Pool(pinned=False)
    assert pool.take(MIN_BYTES - 1) is None
    a = pool.take(MIN_BYTES + 5)
    assert a is not None and len(a.view) == MIN_BYTES + 5 and pool.stats()["out_bytes"] == 2 * MIN_BYTES
    a.view[:4] = b"abcd"
    ptr = a._block.data_ptr()
    a.give_back()
    a.give_back()  # once only
    assert pool.stats() == {"out_bytes": 0, "free_bytes": 2 * MIN_BYTES, "pinned": False}
    b = pool.take(2 * MIN_BYTES)  # the same size class: the same block again
    assert b is not None and b._block.data_ptr() == ptr
    b.give_back()


def test_the_pool_is_bounded():
    pool = Pool(pinned=False, keep_bytes=2 * MIN_BYTES, max_bytes=4 * MIN_BYTES)
    leases = [pool.take(MIN_BYTES) for _ in range(4)]
    assert all(x is not None for x in leases) and pool.take(MIN_BYTES) is None  # 4 MiB out: the limit
    for x in leases:
        x.give_back()
    assert pool.stats()["free_bytes"] == 2 * MIN_BYTES and pool.stats()["out_bytes"] == 0  # at most 2 kept


def test_size_classes_waste_at_most_a_sixteenth():
    assert size_class(MIN_BYTES) == MIN_BYTES and size_class(MIN_BYTES + 1) == 2 * MIN_BYTES
    assert size_class((4 << 20) + 300) == 5 << 20
    assert size_class((64 << 20) + 300) == 68 << 20  # a power of two would have been 128 MiB
    for n in (MIN_BYTES, 3 << 20, (17 << 20) + 1, (64 << 20) + 15, 1 << 30, (1 << 30) + 1):
        assert n <= size_class(n) <= max(n + MIN_BYTES, n * 17 // 16 + 1)


def test_a_body_waits_for_a_block_while_the_pool_is_at_its_bound():
    """``lease`` waits while ``max_bytes`` are out and takes a block as soon as one is given back, from
    another thread as a finished call gives it; with none back in time it answers None (the body then
    goes to a plain buffer), and a body too small to pool never waits."""
    import threading
    import time

    pool = Pool(pinned=False, max_bytes=2 * MIN_BYTES)
    held = [pool.take(MIN_BYTES), pool.take(MIN_BYTES)]
    assert all(x is not None for x in held) and pool.take(MIN_BYTES) is None

    async def wait_for_one() -> tuple[Any, float]:
        t0 = time.perf_counter()
        got = await pool.lease(MIN_BYTES, timeout_s=10.0)
        return got, time.perf_counter() - t0

    threading.Timer(0.2, held[0].give_back).start()
    got, waited = asyncio.run(wait_for_one())
    assert got is not None and 0.15 < waited < 5.0, waited
    t0 = time.perf_counter()
    assert asyncio.run(pool.lease(MIN_BYTES, timeout_s=0.2)) is None  # both out again: none back in time
    assert 0.15 < time.perf_counter() - t0 < 5.0
    assert asyncio.run(pool.lease(1000, timeout_s=10.0)) is None  # not pooled: no wait
    got.give_back()
    held[1].give_back()
    assert pool.stats()["out_bytes"] == 0


def test_an_output_sharing_an_input_is_copied():
    x = torch.arange(8.0)
    assert _own(x[2:], [x]) is not x[2:] and _own(x.view(2, 4), [x]).data_ptr() != x.data_ptr()
    y = torch.zeros(3)
    assert _own(y, [x]) is y


def test_a_large_binary_request_lands_in_a_pooled_block(cpu_release_build, tmp_path: Path, monkeypatch):
    from test_serve import serving

    from tileship.serve.body import Sink

    sinks: list[Any] = []
    install = Sink.install
    monkeypatch.setattr(Sink, "install", classmethod(lambda cls, r, into: sinks.append(install(r, into)) or sinks[-1]))
    n = 1 << 19  # 2 MiB a tensor: the body is pooled
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    with serving(ServeConfig(source=cpu_release_build.path, diagnostics_dir=tmp_path / "d",
                             log_stream=io.StringIO())) as srv:
        c = th.InferenceServerClient(f"127.0.0.1:{srv.port}", network_timeout=60.0)
        try:
            for _ in range(3):
                inputs = [th.InferInput("A", [n], "FP32"), th.InferInput("B", [n], "FP32")]
                inputs[0].set_data_from_numpy(a, binary_data=True)
                inputs[1].set_data_from_numpy(b, binary_data=True)
                res = c.infer("add", inputs, outputs=[th.InferRequestedOutput("C", binary_data=True)])
                np.testing.assert_array_equal(res.as_numpy("C"), a + b)
                stats = srv.service.staging.stats()
                assert stats["out_bytes"] == 0 and stats["free_bytes"] == 5 << 20  # one 5 MiB block, back
        finally:
            c.close()
        assert httpx.get(srv.url + "/v2/health/ready").json()["ready"] is True
    # the real protocol wrote each body straight into its block (one copy), and the sinks are gone
    assert len(sinks) == 3 and all(k is not None and k.pos == k.into.nbytes for k in sinks), sinks
    assert all(getattr(k.cycle, "tileship_sink", None) is None for k in sinks)


def _post_head(port: int, size: int, head_len: int) -> Any:
    import socket

    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
              b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (head_len, size))
    return s


def _binary_add(n: int, seed: int) -> tuple[bytes, int, np.ndarray]:
    import json

    a, b = np.random.default_rng(seed).standard_normal((2, n), dtype=np.float32)
    head = json.dumps({"inputs": [{"name": k, "shape": [n], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 4 * n}} for k in ("A", "B")],
                       "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}).encode()
    return head + a.tobytes() + b.tobytes(), len(head), a + b


def test_a_body_stalled_or_cut_mid_block_loses_nothing_and_writes_no_late_byte(cpu_release_build, tmp_path: Path):
    """A large body that stalls past the body timeout is a 408 and one cut short by the client a 400; either
    way the block goes back, bytes arriving after the 408 never land in it, and the next request is right."""
    from test_serve import serving

    n = 1 << 19
    body, hl, want = _binary_add(n, 5)
    with serving(ServeConfig(source=cpu_release_build.path, diagnostics_dir=tmp_path / "d", body_timeout_s=1.0,
                             log_stream=io.StringIO())) as srv:
        pool = srv.service.staging
        s = _post_head(srv.port, len(body), hl)
        s.sendall(body[:len(body) // 3])
        s.settimeout(20)
        answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408") and b"within 1 s" in answer, answer[:300]
        assert pool.stats()["out_bytes"] == 0
        blocks = [bytes(memoryview(blk.numpy())) for blk in pool.free_blocks()]
        try:
            s.sendall(body[len(body) // 3:])  # late bytes: the connection may be closed already
        except OSError:
            pass
        s.close()
        time.sleep(0.3)
        assert [bytes(memoryview(blk.numpy())) for blk in pool.free_blocks()] == blocks  # no late byte landed
        s = _post_head(srv.port, len(body), hl)
        s.sendall(body[:12345])
        s.shutdown(__import__("socket").SHUT_WR)  # the client gives up mid-body
        s.settimeout(20)
        answer = s.recv(65536)
        s.close()
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:300]
        with httpx.Client() as c:
            r = c.post(srv.url + "/v2/models/add/infer", content=body, timeout=30,
                       headers={"inference-header-content-length": str(hl), "content-type": "application/octet-stream"})
        assert r.status_code == 200, r.text[:300]
        got = np.frombuffer(r.content[int(r.headers["inference-header-content-length"]):], dtype=np.float32)
        assert np.array_equal(got, want)
        assert pool.stats()["out_bytes"] == 0


def _request(body: bytes, chunk: int = 4096):
    from starlette.requests import Request

    parts = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]

    async def receive():
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"content-length", str(len(body)).encode())]}
    return Request(scope, receive)


def test_a_binary_body_is_placed_so_its_tensors_are_aligned():
    """``align_at`` (the JSON header's length) lands on a 16-byte address, in a plain buffer and in a
    pooled block alike, so tensors viewed in the body need no aligning copy; the bytes are the body's."""
    import asyncio
    import ctypes

    from tileship.serve.body import read_pooled
    from tileship.serve.metrics import ServeMetrics

    rejected = ServeMetrics(lambda: 0.0).rejected
    pool = Pool(pinned=False)
    for size in (1000, MIN_BYTES + 3):
        body = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
        for align_at in (0, 1, 37, 999):
            data, lease = asyncio.run(read_pooled(_request(body), pool, limit=1 << 30, timeout_s=5, rejected=rejected,
                                                  align_at=align_at))
            assert (lease is not None) == (size > MIN_BYTES)
            assert bytes(data) == body and len(data) == size
            assert (ctypes.addressof(ctypes.c_char.from_buffer(data)) + align_at) % 16 == 0
            if lease is not None:
                lease.give_back()
    plain, _ = asyncio.run(read_pooled(_request(b"xyz"), pool, limit=100, timeout_s=5, rejected=rejected))
    assert isinstance(plain, bytearray) and plain == b"xyz"  # without align_at: the bytearray as before


def test_a_stalled_body_is_a_408_and_an_outside_cancellation_stays_one():
    """``read_body``'s deadline: its own timer is a 408 counted as ``body_timeout``; a cancellation from
    elsewhere (a client gone, a shutdown) propagates as a cancellation, never a 408."""
    from starlette.requests import Request

    from tileship.serve.body import read_body
    from tileship.serve.validate import BadRequest

    reasons: list[str] = []

    class Rejected:
        def labels(self, reason: str) -> Any:
            reasons.append(reason)
            return type("Child", (), {"inc": lambda _self: None})()

    rejected = Rejected()

    async def stall() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"content-length", b"10")]}

    async def timed_out() -> None:
        with pytest.raises(BadRequest) as e:
            await read_body(Request(scope, stall), limit=100, timeout_s=0.05, rejected=rejected)
        assert e.value.status == 408 and "within 0.05 s" in e.value.message

    asyncio.run(timed_out())
    assert reasons == ["body_timeout"]

    async def cancelled() -> None:
        task = asyncio.create_task(read_body(Request(scope, stall), limit=100, timeout_s=30, rejected=rejected))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert reasons == ["body_timeout"]


def test_a_new_block_is_allocated_off_the_loop_and_kept_when_its_lease_is_cancelled():
    import threading

    pool = Pool(pinned=False)
    threads: list[str] = []
    new = pool._new

    def slow_new(size: int) -> Any:
        threads.append(threading.current_thread().name)
        time.sleep(0.2)
        return new(size)

    pool._new = slow_new  # type: ignore[method-assign]

    async def main() -> None:
        lease = await pool.lease(MIN_BYTES + 1, 5.0)
        assert lease is not None and threads and threads[-1] != threading.current_thread().name
        lease.give_back()
        task = asyncio.ensure_future(pool.lease(2 * MIN_BYTES + 1, 5.0))  # another size class: a new block
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.4)  # the allocation ends on its thread

    asyncio.run(main())
    stats = pool.stats()
    assert stats["out_bytes"] == 0 and len(pool.free_blocks()) == 2, stats  # both blocks kept, none lost


def test_a_sink_goes_only_on_cycles_of_tileships_protocol_and_takes_early_bytes():
    """``Sink.install`` needs a cycle that ``serve.connections``' protocol marked (stock uvicorn and h11 never
    call a sink); it moves the bytes that came before it into the block, and ``remove`` leaves the cycle clean."""
    from tileship.serve.body import Sink

    class Cycle:
        def __init__(self, marked: bool) -> None:
            self.body = bytearray(b"early")
            if marked:
                self.tileship_sinkable = True

        async def receive(self) -> dict[str, Any]:
            return {}

    into = memoryview(bytearray(8))
    assert Sink.install(Cycle(False).receive, into) is None           # not marked: uvicorn's own path
    assert Sink.install(lambda: None, into) is None                   # a plain callable (tests, gRPC)
    cycle = Cycle(True)
    sink = Sink.install(cycle.receive, into)
    assert sink is not None and cycle.tileship_sink is sink and cycle.body == b"" and bytes(into[:5]) == b"early"
    sink.write(b"abc")
    sink.write(b"toolong")                                            # past the end: counted, not written
    assert bytes(into) == b"earlyabc" and sink.pos == 15
    sink.remove()
    assert cycle.tileship_sink is None
