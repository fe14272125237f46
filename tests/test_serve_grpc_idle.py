"""A gRPC RPC whose request message does not arrive within ``--body-timeout`` is ended and its slot freed
(``serve.grpc_gate.Gate.read``): real servers on 127.0.0.1, raw ``grpc.aio`` calls that open ModelInfer and send
nothing, real tritonclient.grpc clients after them, the exposition read with prometheus_client's parser.

Before, such an RPC held one of the ``--max-connections`` slots until its client's deadline, or forever when the
client set none: a few of them locked every other client out with RESOURCE_EXHAUSTED (slowloris)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import tritonclient.grpc as tg
from test_serve import fake_config, fake_release, serving
from test_serve_grpc_refusals import LIMIT, Hold, _async, _request, _x, counted, rejected
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer

BODY_TIMEOUT = 1.0  # --body-timeout, seconds
INFER = "/inference.GRPCInferenceService/ModelInfer"
#: what a client whose request did not arrive in time is told
TOLD = f"timeout: the request message did not arrive within {BODY_TIMEOUT:g} s (--body-timeout)"


@pytest.fixture
def idle_server(tmp_path) -> Iterator[tuple[BackgroundServer, Hold]]:
    hold = Hold()
    path, rel = fake_release(tmp_path, "h", {"hold": hold, "echo": lambda x: x})
    cfg = fake_config(tmp_path, {"h": rel}, path, grpc_port=0, max_connections=LIMIT, body_timeout_s=BODY_TIMEOUT,
                      request_timeout_s=120.0, worker_threads=LIMIT)
    with serving(cfg) as srv:
        try:
            yield srv, hold
        finally:
            hold.go.set()


async def _idle_calls(url: str, n: int, admitted: queue.Queue) -> list[grpc.aio.AioRpcError]:
    """``n`` ModelInfer calls, no deadline, that send no request message (nor close their side); each one's error.
    ``admitted`` gets None once they are open; the test bounds the wait for their end (60 s), so a server that
    never ends them fails it rather than hanging."""
    async with grpc.aio.insecure_channel(url) as ch:
        infer = ch.stream_unary(INFER, request_serializer=pb.ModelInferRequest.SerializeToString,
                                response_deserializer=pb.ModelInferResponse.FromString)
        calls = [infer() for _ in range(n)]
        for call in calls:
            await call.wait_for_connection()
        admitted.put(None)
        errors = []
        for call in calls:
            try:
                await asyncio.wait_for(call, 60)
            except grpc.aio.AioRpcError as exc:
                errors.append(exc)
            except TimeoutError:
                call.cancel()
                raise AssertionError("an RPC that sent no request was never ended by the server") from None
        return errors


def test_an_rpc_that_never_sends_its_request_is_ended_after_the_body_timeout(idle_server):
    """ModelInfer opened with no deadline and no message is ended DEADLINE_EXCEEDED naming --body-timeout, counted
    as ``body_timeout``; a normal call after it is answered. Before, it waited forever, holding its slot."""
    srv, _ = idle_server
    before = rejected(srv)
    errors = asyncio.run(_idle_calls(srv.grpc_url, 1, queue.Queue()))
    assert [(e.code(), e.details()) for e in errors] == [(grpc.StatusCode.DEADLINE_EXCEEDED, TOLD)]
    want = before.get("body_timeout", 0.0) + 1
    assert counted(srv, "body_timeout", want) == want
    after = rejected(srv)
    for reason in ("deadline_exceeded", "request_not_received", "cancelled"):  # counted once, as body_timeout
        assert after.get(reason, 0.0) == before.get(reason, 0.0), (reason, before, after)
    c = tg.InferenceServerClient(srv.grpc_url)
    try:
        assert c.infer("echo", _x(2)).as_numpy("Y").tolist() == [0.0, 1.0]
    finally:
        c.close()


def test_idle_rpcs_holding_every_slot_free_them_after_the_body_timeout(idle_server):
    """With --max-connections 2 taken by two RPCs that send nothing, a normal call is refused; once the body timeout
    has ended both, a normal call is admitted, and so are two held at once (no slot leaked). Before, the two idle
    RPCs locked every other client out for as long as they stayed open."""
    srv, hold = idle_server
    before = rejected(srv)
    open_: queue.Queue = queue.Queue()
    ended: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: ended.put(asyncio.run(_idle_calls(srv.grpc_url, LIMIT, open_))),
                     daemon=True).start()
    open_.get(timeout=60)
    c = tg.InferenceServerClient(srv.grpc_url)
    try:
        refused = 0
        end = time.monotonic() + 60
        while True:  # refused while both idle RPCs hold their slots, then answered once the timeout freed them
            assert time.monotonic() < end, "the idle RPCs never freed their slots"
            try:
                assert c.infer("echo", _x(2)).as_numpy("Y").tolist() == [0.0, 1.0]
                break
            except InferenceServerException as e:
                assert e.status() == "StatusCode.RESOURCE_EXHAUSTED" and "--max-connections" in e.message(), e
                refused += 1
                time.sleep(0.05)
        errors = ended.get(timeout=60)
        assert [(e.code(), e.details()) for e in errors] == [(grpc.StatusCode.DEADLINE_EXCEEDED, TOLD)] * LIMIT
        want = before.get("body_timeout", 0.0) + LIMIT
        assert counted(srv, "body_timeout", want) == want
        done: queue.Queue = queue.Queue()
        for _ in range(LIMIT):  # both slots are free: two calls held at once are admitted
            _async(c, "hold", 4, done)
        hold.wait_started(LIMIT)
        hold.go.set()
        finished = [done.get(timeout=60) for _ in range(LIMIT)]
        assert all(e is None and r.as_numpy("Y").tolist() == [0.0, 1.0, 2.0, 3.0] for r, e in finished), finished
        assert rejected(srv).get("connection_limit", 0.0) == before.get("connection_limit", 0.0) + refused
    finally:
        hold.go.set()
        c.close()


def test_an_idle_open_stream_is_not_ended_by_the_body_timeout(idle_server):
    """A ModelStreamInfer stream may wait between requests (and before its first) past --body-timeout: its next
    request is still answered, and nothing is counted as ``body_timeout``."""
    srv, _ = idle_server
    before = rejected(srv).get("body_timeout", 0.0)
    sends: queue.Queue = queue.Queue()

    def requests() -> Iterator[pb.ModelInferRequest]:
        while (r := sends.get(timeout=120)) is not None:
            yield r

    with grpc.insecure_channel(srv.grpc_url) as ch:
        call = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                request_serializer=pb.ModelInferRequest.SerializeToString,
                                response_deserializer=pb.ModelStreamInferResponse.FromString)
        responses = call(requests())
        time.sleep(2.5 * BODY_TIMEOUT)  # idle before the first request
        sends.put(_request("echo"))
        assert next(responses).infer_response.model_name == "echo"
        time.sleep(2.5 * BODY_TIMEOUT)  # idle between two requests
        sends.put(_request("echo"))
        second = next(responses)
        assert not second.error_message and second.infer_response.model_name == "echo", second
        sends.put(None)
        assert list(responses) == []
    assert rejected(srv).get("body_timeout", 0.0) == before
