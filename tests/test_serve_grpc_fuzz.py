"""Property tests of the gRPC endpoint against a real server on 127.0.0.1 (issue 15, item 5): any
bytes as any RPC's request, and structurally valid but wrong ModelInferRequests, get a status
that names a client-side problem (or OK), never INTERNAL or UNKNOWN; afterwards the metrics add
up, nothing is in flight, nothing compiled, and the server is live and ready.
``TILESHIP_FUZZ_EXAMPLES`` sets the examples per property (CI: the default)."""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.test_serve_limits import hostile_server, metric
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tileship.serve import BackgroundServer

EXAMPLES = int(os.environ.get("TILESHIP_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
#: what a client may be told; INTERNAL and UNKNOWN mean a bug
CLIENT_SIDE = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
               grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED}
SENT: collections.Counter[str] = collections.Counter()
METHODS = [m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
           if not (m.client_streaming or m.server_streaming)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with hostile_server(tmp_path_factory.mktemp("grpc-fuzz"), grpc_port=0,
                        max_body_bytes=1 << 20) as srv:
        yield srv


@pytest.fixture(scope="module")
def channel(server: BackgroundServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as ch:
        yield ch


def _code(call: Any, request: Any) -> grpc.StatusCode:
    try:
        call(request, timeout=30)
        code = grpc.StatusCode.OK
    except grpc.RpcError as exc:
        code = exc.code()
        assert code in CLIENT_SIDE, (code, exc.details(), request if not isinstance(request, bytes) else request[:200])
        assert exc.details() and len(exc.details()) < 1000, exc.details()
    return code


@FUZZ
@given(method=st.sampled_from(METHODS), blob=st.binary(max_size=512))
def test_any_bytes_as_any_request_get_a_client_side_status(channel, method, blob):
    code = _code(channel.unary_unary(f"/inference.GRPCInferenceService/{method}"), blob)
    if method == "ModelInfer":
        SENT[f"bytes:{code.name}"] += 1


MODELS = st.sampled_from(["add", "outer", "nope", ""])
NAMES = st.sampled_from(["X", "Y", "W", "Z", "", "x" * 300])
DTYPES = st.sampled_from(["FP32", "FP16", "BF16", "FP64", "INT8", "INT32", "INT64", "UINT8", "BOOL", "BYTES", "fp32",
                          ""])
DIMS = st.one_of(st.integers(-3, 6), st.sampled_from([1 << 20, 1 << 33, (1 << 63) - 1, -(1 << 63)]))
VALUES = {"fp32_contents": st.floats(width=32), "fp64_contents": st.floats(),
          "int_contents": st.integers(-(1 << 31), (1 << 31) - 1),
          "int64_contents": st.integers(-(1 << 63), (1 << 63) - 1), "uint_contents": st.integers(0, (1 << 32) - 1),
          "bool_contents": st.booleans()}


@st.composite
def infer_request(draw: Any) -> Any:
    req = pb.ModelInferRequest(model_name=draw(MODELS), id=draw(st.sampled_from(["", "k-1"])))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        t = req.inputs.add(name=draw(NAMES), datatype=draw(DTYPES), shape=draw(st.lists(DIMS, max_size=10)))
        if draw(st.booleans()):
            t.parameters["shared_memory_region"].string_param = "r"
        if raw:
            req.raw_input_contents.append(draw(st.binary(max_size=64)))
        else:
            field = draw(st.sampled_from(sorted(VALUES)))
            getattr(t.contents, field).extend(draw(st.lists(VALUES[field], max_size=12)))
    if raw and draw(st.booleans()):
        req.raw_input_contents.append(b"\0" * 4)  # one entry too many
    for _ in range(draw(st.integers(0, 2))):
        o = req.outputs.add(name=draw(st.sampled_from(["Z", "Y", "nope", ""])))
        if draw(st.booleans()):
            o.parameters["classification"].int64_param = 2
    if draw(st.booleans()):
        req.model_version = draw(st.sampled_from(["hostile", "0123", ""]))
    return req


@FUZZ
@given(req=infer_request())
def test_valid_but_wrong_infer_requests_get_a_client_side_status(channel, req):
    code = _code(pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer, req)
    SENT[f"infer:{code.name}"] += 1


@st.composite
def near_valid(draw: Any) -> Any:
    """``add`` or ``outer`` with their inputs, mostly right, sometimes one thing wrong."""
    model = draw(st.sampled_from(["add", "outer"]))
    names = ["X", "Y"] if model == "add" else ["X", "W"]
    req = pb.ModelInferRequest(model_name=model)
    raw = draw(st.booleans())
    for name in names:
        n = draw(st.sampled_from([1, 4, 7, 4, 4, 0]))
        dt = draw(st.sampled_from(["FP32"] * 6 + ["FP64", "FP16", "INT32"]))
        t = req.inputs.add(name=name, datatype=dt, shape=[n])
        size = n * {"FP32": 4, "FP64": 8, "FP16": 2, "INT32": 4}[dt]
        if raw:
            req.raw_input_contents.append(
                b"\x00\x00\xc0\x7f" * (size // 4) + b"\x01" * (size % 4 + draw(st.sampled_from([0] * 5 + [1, 3])))
            )
        else:
            field = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT32": "int_contents",
                     "FP16": "fp32_contents"}[dt]
            v = VALUES[field]
            extra = draw(st.sampled_from([0] * 5 + [1]))
            getattr(t.contents, field).extend(draw(st.lists(v, min_size=n + extra, max_size=n + extra)))
    if draw(st.booleans()):
        req.outputs.add(name=draw(st.sampled_from(["Z", "Y"])))
    return req


@FUZZ
@given(req=near_valid())
def test_near_valid_infer_requests_run_or_get_a_client_side_status(channel, req):
    code = _code(pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer, req)
    SENT[f"near:{code.name}"] += 1


def test_after_fuzzing_the_metrics_add_up_and_the_server_is_live_and_ready(server, channel):
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    assert stub.ServerLive(pb.ServerLiveRequest()).live and stub.ServerReady(pb.ServerReadyRequest()).ready
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "tileship_requests_total", code="500") == 0
    assert metric(text, "tileship_requests_total", code="503") == 0
    assert metric(text, "tileship_inflight_requests") == 0 and metric(text, "tileship_serve_compile_attempts") == 0
    if SENT:  # the properties ran in this process: every inference request was counted once
        assert metric(text, "tileship_requests_total") == sum(SENT.values()), (SENT, text)
