"""Every way a gRPC client is refused, or its RPC ends before its answer, shows in ``tileship_rejected_total``
(``serve.grpc_gate``): real servers on 127.0.0.1, real tritonclient.grpc clients, the exposition read with
prometheus_client's own parser.

Before the gate, grpcio's own refusals counted nowhere: its ``maximum_concurrent_rpcs`` (twice
``--max-connections``) answered "Concurrent RPC limit exceeded!" before any handler ran, a message past its receive
limit was refused before any handler ran, and a client's deadline or cancel ended an RPC unseen (an inference's
only trace was ``tileship_requests_total{code="499"}``)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tg
from prometheus_client.parser import text_string_to_metric_families
from test_serve import fake_config, fake_release, serving
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer

LIMIT = 2  # --max-connections
BODY = 1 << 20  # --max-body-mib: 1 MiB; grpc's own receive limit is twice it


class Hold:
    """The ``hold`` operator: each call says it started, then waits until the test lets it go."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)
        self.go = threading.Event()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.started.release()
        self.go.wait(120)
        return x

    def wait_started(self, n: int) -> None:
        for _ in range(n):
            assert self.started.acquire(timeout=60), "a held call never started"


@pytest.fixture
def held(tmp_path) -> Iterator[tuple[BackgroundServer, Hold]]:
    hold = Hold()
    path, rel = fake_release(tmp_path, "h", {"hold": hold, "echo": lambda x: x})
    cfg = fake_config(tmp_path, {"h": rel}, path, grpc_port=0, max_connections=LIMIT, max_body_bytes=BODY,
                      request_timeout_s=120.0, worker_threads=LIMIT)
    with serving(cfg) as srv:
        try:
            yield srv, hold
        finally:
            hold.go.set()


def rejected(srv: BackgroundServer) -> dict[str, float]:
    """``tileship_rejected_total`` by reason, parsed by prometheus_client."""
    text = httpx.get(srv.url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name == "tileship_rejected":
            return {s.labels["reason"]: s.value for s in family.samples if s.name == "tileship_rejected_total"}
    raise AssertionError("no tileship_rejected family in /metrics")


def counted(srv: BackgroundServer, reason: str, want: float) -> float:
    """The count of ``reason`` once it reaches ``want`` (an RPC's end reaches the server after its client saw it),
    or what it is after a generous wait."""
    end = time.monotonic() + 30
    got = rejected(srv).get(reason, 0.0)
    while got < want and time.monotonic() < end:
        time.sleep(0.05)
        got = rejected(srv).get(reason, 0.0)
    return got


def _x(n: int) -> list[tg.InferInput]:
    i = tg.InferInput("X", [n], "FP32")
    i.set_data_from_numpy(np.arange(n, dtype=np.float32))
    return [i]


def _async(c: tg.InferenceServerClient, model: str, n: int, into: queue.Queue) -> Any:
    return c.async_infer(model, _x(n), callback=lambda result, error: into.put((result, error)))


def test_rpcs_past_the_limit_are_refused_named_and_every_one_counted(held):
    """With --max-connections held by slow calls, a burst of concurrent calls is refused RESOURCE_EXHAUSTED, every
    one naming the limit and the flag, and counted as ``connection_limit`` (one count per refusal a client saw);
    the held calls then finish. Before, past twice the limit grpcio answered "Concurrent RPC limit exceeded!"
    itself: not counted, naming neither."""
    srv, hold = held
    before = rejected(srv).get("connection_limit", 0.0)
    c = tg.InferenceServerClient(srv.grpc_url)
    try:
        done: queue.Queue = queue.Queue()
        for _ in range(LIMIT):
            _async(c, "hold", 4, done)
        hold.wait_started(LIMIT)
        burst: queue.Queue = queue.Queue()
        for _ in range(40):
            _async(c, "echo", 4, burst)
        outcomes = [burst.get(timeout=60) for _ in range(40)]
        assert all(r is None for r, _ in outcomes), "a call past the limit was answered"
        messages = {(e.status(), e.message()) for _, e in outcomes}
        assert messages == {("StatusCode.RESOURCE_EXHAUSTED", f"the server is at its limit of {LIMIT} concurrent "
                                                              "RPCs (--max-connections): retry later")}, messages
        assert rejected(srv)["connection_limit"] == before + 40
        hold.go.set()
        finished = [done.get(timeout=60) for _ in range(LIMIT)]
        assert all(e is None and r.as_numpy("Y").tolist() == [0.0, 1.0, 2.0, 3.0] for r, e in finished), finished
        assert c.infer("echo", _x(2)).as_numpy("Y").tolist() == [0.0, 1.0]  # the slots came back
    finally:
        c.close()


def test_an_rpc_waiting_for_its_request_holds_a_slot_and_its_deadline_is_counted(held):
    """RPCs whose request message has not arrived take their slot (grpcio buffers nothing for one refused), so the
    next call is refused and counted; when their deadline passes before the message came they are counted as
    ``deadline_exceeded``, and their slots free. Before, such an RPC was invisible to the server until its
    message arrived, and its deadline counted nowhere."""
    srv, _ = held
    before = rejected(srv)
    stop = threading.Event()

    def never() -> Iterator[pb.ModelInferRequest]:
        stop.wait(60)
        return
        yield  # a generator that sends nothing

    with grpc.insecure_channel(srv.grpc_url) as ch:
        call = ch.stream_unary("/inference.GRPCInferenceService/ModelInfer",
                               request_serializer=pb.ModelInferRequest.SerializeToString,
                               response_deserializer=pb.ModelInferResponse.FromString)
        waiting = [call.future(never(), timeout=6.0) for _ in range(LIMIT)]
        c = tg.InferenceServerClient(srv.grpc_url)
        try:
            end = time.monotonic() + 30  # until both reached the server: then a call is refused
            while True:
                try:
                    c.infer("echo", _x(2))
                except InferenceServerException as e:
                    assert e.status() == "StatusCode.RESOURCE_EXHAUSTED" and "--max-connections" in e.message()
                    break
                assert time.monotonic() < end, "the RPCs waiting for their request never took their slots"
            for f in waiting:
                with pytest.raises(grpc.RpcError) as err:
                    f.result()
                assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            stop.set()
            want = before.get("deadline_exceeded", 0.0) + LIMIT
            assert counted(srv, "deadline_exceeded", want) == want
            assert rejected(srv)["connection_limit"] >= before.get("connection_limit", 0.0) + 1
            assert c.infer("echo", _x(2)).as_numpy("Y").tolist() == [0.0, 1.0]  # their slots came back
        finally:
            c.close()


def test_a_deadline_and_a_cancel_while_running_are_counted(held):
    """A call whose client deadline passes while it runs is DEADLINE_EXCEEDED for the client and counted as
    ``deadline_exceeded``; one the client cancels while it runs is counted as ``cancelled``. Before, neither
    showed in ``tileship_rejected_total`` (only as ``tileship_requests_total{code="499"}``)."""
    srv, hold = held
    before = rejected(srv)
    c = tg.InferenceServerClient(srv.grpc_url)
    try:
        got: queue.Queue = queue.Queue()
        ctx = _async(c, "hold", 4, got)
        hold.wait_started(1)
        ctx.cancel()
        _, error = got.get(timeout=60)
        assert error is not None and "CANCELLED" in error.status(), error
        want = before.get("cancelled", 0.0) + 1
        assert counted(srv, "cancelled", want) == want
        with pytest.raises(InferenceServerException) as e:
            c.infer("hold", _x(4), client_timeout=1.0)
        assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED", e.value.message()
        want = before.get("deadline_exceeded", 0.0) + 1
        assert counted(srv, "deadline_exceeded", want) == want
        assert rejected(srv)["cancelled"] == before.get("cancelled", 0.0) + 1
    finally:
        hold.go.set()
        c.close()


def test_a_request_past_grpcs_receive_limit_is_counted_and_one_past_ours_is_named(held):
    """A request past twice --max-body-mib is refused by grpc itself before it is read (RESOURCE_EXHAUSTED naming
    its size and grpc's limit) and counted as ``request_not_received``; one past --max-body-mib but within that
    is refused by the server naming its size, the limit and the flag, counted as ``body_too_large``. The server
    answers the next call. Before, grpc's refusal counted nowhere."""
    srv, _ = held
    before = rejected(srv)
    c = tg.InferenceServerClient(srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            c.infer("echo", _x(BODY // 4 * 3))  # 3 MiB of input
        assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED", e.value.message()
        assert "larger than max" in e.value.message() and f"vs. {2 * BODY})" in e.value.message(), e.value.message()
        want = before.get("request_not_received", 0.0) + 1
        assert counted(srv, "request_not_received", want) == want
        with pytest.raises(InferenceServerException) as e:
            c.infer("echo", _x(BODY // 4 + 1000))  # just past 1 MiB
        msg = e.value.message()
        assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED", msg
        assert f"over the server's limit of {BODY} bytes (--max-body-mib)" in msg, msg
        after = rejected(srv)
        assert after["body_too_large"] == before.get("body_too_large", 0.0) + 1
        assert after["request_not_received"] == want and after.get("cancelled", 0.0) == before.get("cancelled", 0.0)
        assert c.infer("echo", _x(2)).as_numpy("Y").tolist() == [0.0, 1.0]
    finally:
        c.close()


def test_a_unary_rpc_closed_without_its_request_is_answered_and_counted(held):
    """A client that closes its side of ModelInfer without sending a message gets INVALID_ARGUMENT saying so, counted
    as ``request_not_received``. Before, grpcio never ran the handler and said nothing: the client waited for its
    deadline (DEADLINE_EXCEEDED), and nothing was counted."""
    srv, _ = held
    before = rejected(srv).get("request_not_received", 0.0)
    with grpc.insecure_channel(srv.grpc_url) as ch:
        call = ch.stream_unary("/inference.GRPCInferenceService/ModelInfer",
                               request_serializer=pb.ModelInferRequest.SerializeToString,
                               response_deserializer=pb.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as err:
            call(iter(()), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.value.code(), err.value.details())
    assert err.value.details() == "no request message: the client closed its side of the RPC without one"
    assert rejected(srv)["request_not_received"] == before + 1


def _request(model: str) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
        name="X", datatype="FP32", shape=[2])], raw_input_contents=[np.arange(2, dtype=np.float32).tobytes()])


def test_a_stream_takes_one_slot_and_its_cancel_mid_request_is_counted(held):
    """A ModelStreamInfer stream holds one of the --max-connections slots while open; cancelled by its client while
    a request runs, it is counted as ``cancelled`` and its slot frees. Before, a stream's cancel counted nowhere."""
    srv, hold = held
    before = rejected(srv)
    sends: queue.Queue = queue.Queue()

    def requests() -> Iterator[pb.ModelInferRequest]:
        while (r := sends.get(timeout=120)) is not None:
            yield r

    c = tg.InferenceServerClient(srv.grpc_url)
    try:
        with grpc.insecure_channel(srv.grpc_url) as ch:
            call = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                    request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelStreamInferResponse.FromString)
            responses = call(requests())
            sends.put(_request("echo"))
            first = next(responses)
            assert not first.error_message and first.infer_response.model_name == "echo", first
            sends.put(_request("hold"))
            hold.wait_started(1)
            assert c.infer("echo", _x(2)).as_numpy("Y").tolist() == [0.0, 1.0]  # the second slot
            responses.cancel()
            sends.put(None)
        want = before.get("cancelled", 0.0) + 1
        assert counted(srv, "cancelled", want) == want
        assert rejected(srv).get("connection_limit", 0.0) == before.get("connection_limit", 0.0)
        hold.go.set()
        assert c.infer("echo", _x(2)).as_numpy("Y").tolist() == [0.0, 1.0]
    finally:
        hold.go.set()
        c.close()
