"""Real clients' public methods against ``tileship serve`` where the other serve tests leave gaps:
``tritonclient.http.aio`` (aiohttp), ``tritonclient.grpc`` streaming, ``tritonclient.grpc.aio``. One server
of the hostile release (references only, REST and gRPC) on 127.0.0.1 for the module."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
import tritonclient.http as th
import tritonclient.http.aio as tha
from tests.test_serve_limits import hostile_server, metric
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with hostile_server(tmp_path_factory.mktemp("clients"), grpc_port=0) as srv:
        yield srv


X = np.arange(4, dtype=np.float32)


def _http_inputs(binary: bool) -> list[th.InferInput]:
    out = []
    for name in ("X", "Y"):
        i = th.InferInput(name, [4], "FP32")
        i.set_data_from_numpy(X, binary_data=binary)
        out.append(i)
    return out


def test_aio_http_json_request_is_served(server: BackgroundServer) -> None:
    """tritonclient.http.aio posts a JSON-only body as bytes, which aiohttp types application/octet-stream:
    Triton reads it regardless, so the server must too (it answered 415)."""
    async def go() -> tuple[np.ndarray, str | None]:
        c = tha.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            res = await c.infer("add", _http_inputs(False), request_id="aio-json",
                                outputs=[th.InferRequestedOutput("Z", binary_data=False)])
            return res.as_numpy("Z"), res.get_response().get("id")
        finally:
            await c.close()

    z, rid = asyncio.run(go())
    assert z.tolist() == (2 * X).tolist() and rid == "aio-json"


def test_a_json_body_of_another_type_is_still_415(server: BackgroundServer) -> None:
    import httpx

    body = b'{"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[1]}]}'
    r = httpx.post(server.url + "/v2/models/add/infer", content=body, headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "text/plain" in r.json()["error"], r.text
    with pytest.raises(InferenceServerException) as e:  # and the aio client sees the server's message
        asyncio.run(_aio_infer(server, "nope"))
    assert e.value.status() == "404" and "unknown model 'nope'" in str(e.value.message())


async def _aio_infer(server: BackgroundServer, model: str) -> None:
    c = tha.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        await c.infer(model, _http_inputs(False))
    finally:
        await c.close()



def _grpc_inputs(model: str = "add") -> list[tg.InferInput]:
    out = []
    for name in ("X", "Y") if model == "add" else ("X",):
        i = tg.InferInput(name, [4], "FP32")
        i.set_data_from_numpy(X)
        out.append(i)
    return out


def test_grpc_stream_answers_each_request_in_order_and_errors_keep_it_open(server: BackgroundServer) -> None:
    """tritonclient.grpc start_stream / async_stream_infer: one result per request, an error (unknown model,
    wrong version, wrong shape) as the callback's error naming the problem, and the stream goes on (was
    UNIMPLEMENTED: the stream died at its first request)."""
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    c = tg.InferenceServerClient(server.grpc_url)
    try:
        c.start_stream(callback=lambda result, error: got.put((result, error)))
        c.async_stream_infer("add", _grpc_inputs(), request_id="s1", parameters={"p": 1})
        c.async_stream_infer("nope", _grpc_inputs(), request_id="s2")
        c.async_stream_infer("add", _grpc_inputs(), request_id="s3", model_version="7")
        c.async_stream_infer("add", _grpc_inputs()[:1], request_id="s4")
        c.async_stream_infer("add", _grpc_inputs(), request_id="s5", model_version="hostile",
                             enable_empty_final_response=True)
        answers = [got.get(timeout=30) for _ in range(5)]
        c.stop_stream()
    finally:
        c.close()
    ok = [(r.get_response().id, r.as_numpy("Z").tolist()) for r, e in answers if e is None]
    assert ok == [("s1", (2 * X).tolist()), ("s5", (2 * X).tolist())], answers
    errors = [e.message() for r, e in answers if e is not None]
    assert ["unknown model 'nope'" in errors[0], "unknown version '7'" in errors[1], "missing input Y" in errors[2]] \
        == [True] * 3, errors
    final = answers[4][0].get_response().parameters["triton_final_response"]
    assert final.bool_param is True  # asked for with enable_empty_final_response: its one response is final


def test_grpc_aio_stream_infer(server: BackgroundServer) -> None:
    """tritonclient.grpc.aio stream_infer (it raised the raw AioRpcError UNIMPLEMENTED)."""
    async def go() -> list[tuple[Any, Any]]:
        c = tga.InferenceServerClient(server.grpc_url)

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": "add", "inputs": _grpc_inputs(), "request_id": "a1"}
            yield {"model_name": "add", "inputs": _grpc_inputs(), "request_id": "a2",
                   "outputs": [tg.InferRequestedOutput("Q")]}
            yield {"model_name": "add", "inputs": _grpc_inputs(), "request_id": "a3"}
        try:
            return [(r and (r.get_response().id, r.as_numpy("Z").tolist()), e and e.message())
                    async for r, e in c.stream_infer(requests(), stream_timeout=30)]
        finally:
            await c.close()

    got = asyncio.run(go())
    z = (2 * X).tolist()
    assert got[0] == (("a1", z), None) and got[2] == (("a3", z), None), got
    assert got[1][0] is None and "unknown output 'Q'" in got[1][1], got


def test_grpc_stream_counts_each_request_like_model_infer(server: BackgroundServer) -> None:
    """The raw stub: each message is answered (an error with the request's id) and counted as a ModelInfer is."""
    def count(code: str) -> float:
        return metric(httpx.get(server.url + "/metrics").text, "tileship_requests_total", model="add", code=code)

    ok0 = count("200")
    raw = pb.ModelInferRequest(model_name="add", id="raw-1")
    for name in ("X", "Y"):
        raw.inputs.add(name=name, datatype="FP32", shape=[4])
        raw.raw_input_contents.append(X.tobytes())
    with grpc.insecure_channel(server.grpc_url) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        out = list(stub.ModelStreamInfer(iter([raw, pb.ModelInferRequest(model_name="nope", id="raw-2"), raw])))
    assert [o.infer_response.id for o in out] == ["raw-1", "raw-2", "raw-1"], out
    assert out[0].error_message == out[2].error_message == "" and "unknown model 'nope'" in out[1].error_message
    assert np.frombuffer(out[2].infer_response.raw_output_contents[0], np.float32).tolist() == (2 * X).tolist()
    assert count("200") == ok0 + 2
