"""What Triton clients send and expect where tileship answered otherwise: an unloaded model's metadata, config,
statistics and inference; the request parameters ``timeout`` and ``priority``; the trace extension. Real clients
(``tritonclient.http``, ``tritonclient.grpc`` and its ``aio``) against one server of the hostile release (references
only, REST and gRPC, one worker thread) on 127.0.0.1; each test failed on the code before its fix."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
import tritonclient.http as th
from tests.test_serve_limits import hostile_server, metric
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer

#: holds the ``slow`` model's calls while clear (each waits at most 10 s), so that the one worker thread is busy
GATE = threading.Event()
GATE.set()


def _slow(x: torch.Tensor) -> torch.Tensor:
    GATE.wait(10)
    return x + 1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with hostile_server(tmp_path_factory.mktemp("protocol"), extra={"slow": _slow}, grpc_port=0) as srv:
        yield srv
    GATE.set()


X = np.arange(4, dtype=np.float32)


def _inputs(mod: Any, model: str = "add") -> list[Any]:
    out = []
    for name in ("X", "Y") if model == "add" else ("X",):
        i = mod.InferInput(name, [4], "FP32")
        i.set_data_from_numpy(X)
        out.append(i)
    return out


def _error(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value


# -- an unloaded model --------------------------------------------------------------------------------------------

def test_an_unloaded_model_answers_as_triton_over_rest_and_grpc(server: BackgroundServer) -> None:
    """After ``unload``, Triton has no available version of the model: metadata, config and inference are
    NOT_FOUND (404), and UNAVAILABLE (503) when the request names the version; ready is false. Metadata and
    config answered 200 for the unloaded model, inference 400 over REST and UNAVAILABLE over gRPC."""
    h = th.InferenceServerClient(server.url.removeprefix("http://"))
    g = tg.InferenceServerClient(server.grpc_url)
    h.unload_model("add")
    try:
        for what, call in (("metadata", lambda: h.get_model_metadata("add")),
                           ("config", lambda: h.get_model_config("add")),
                           ("infer", lambda: h.infer("add", _inputs(th)))):
            e = _error(call)
            assert (e.status(), "model add is unloaded" in e.message()) == ("404", True), (what, e)
            assert "/v2/repository/models/add/load" in e.message(), (what, e)
        e = _error(lambda: h.get_model_metadata("add", model_version="hostile"))
        assert e.status() == "503" and "version hostile of model add is unloaded" in e.message(), e
        e = _error(lambda: h.infer("add", _inputs(th), model_version="hostile"))
        assert e.status() == "503" and "unloaded" in e.message(), e
        assert not h.is_model_ready("add") and h.is_model_ready("outer")
        for what, call in (("metadata", lambda: g.get_model_metadata("add")),
                           ("config", lambda: g.get_model_config("add")),
                           ("infer", lambda: g.infer("add", _inputs(tg)))):
            e = _error(call)
            assert (e.status(), "model add is unloaded" in e.message()) == ("StatusCode.NOT_FOUND", True), (what, e)
            assert "RepositoryModelLoad" in e.message(), (what, e)
        e = _error(lambda: g.get_model_config("add", model_version="hostile"))
        assert e.status() == "StatusCode.UNAVAILABLE" and "unloaded" in e.message(), e
        assert not g.is_model_ready("add") and g.is_model_ready("outer")

        async def aio() -> str:
            c = tga.InferenceServerClient(server.grpc_url)
            try:
                await c.get_model_metadata("add")
                return "answered"
            except InferenceServerException as exc:
                return f"{exc.status()} {exc.message()}"
            finally:
                await c.close()

        assert asyncio.run(aio()).startswith("StatusCode.NOT_FOUND model add is unloaded")
    finally:
        h.load_model("add")
    assert h.get_model_metadata("add")["name"] == "add" and g.get_model_config("add").config.name == "add"
    assert h.infer("add", _inputs(th)).as_numpy("Z").tolist() == (2 * X).tolist()
    h.close()
    g.close()


def test_an_unloaded_model_has_no_statistics_over_rest_and_grpc(server: BackgroundServer) -> None:
    """After ``unload`` the model's statistics answer as its metadata (404 / NOT_FOUND, 503 / UNAVAILABLE naming the
    version) and the statistics of all models leave it out, as Triton lists only ready versions; after ``load`` its
    counters answer again. They answered 200 with its counters, and the list of all models held it."""
    h = th.InferenceServerClient(server.url.removeprefix("http://"))
    g = tg.InferenceServerClient(server.grpc_url)
    h.unload_model("add")
    try:
        e = _error(lambda: h.get_inference_statistics("add"))
        assert e.status() == "404" and "model add is unloaded" in e.message(), e
        e = _error(lambda: h.get_inference_statistics("add", model_version="hostile"))
        assert e.status() == "503" and "version hostile of model add is unloaded" in e.message(), e
        e = _error(lambda: g.get_inference_statistics("add"))
        assert e.status() == "StatusCode.NOT_FOUND" and "RepositoryModelLoad" in e.message(), e
        e = _error(lambda: g.get_inference_statistics("add", model_version="hostile"))
        assert e.status() == "StatusCode.UNAVAILABLE" and "unloaded" in e.message(), e
        rest = {r["name"] for r in h.get_inference_statistics()["model_stats"]}
        grpc_names = {r.name for r in g.get_inference_statistics().model_stats}
        assert "add" not in rest and "outer" in rest and rest == grpc_names, (rest, grpc_names)
    finally:
        h.load_model("add")
    assert [r["name"] for r in h.get_inference_statistics("add")["model_stats"]] == ["add"]
    assert "add" in {r.name for r in g.get_inference_statistics().model_stats}
    h.close()
    g.close()


# -- request parameters timeout and priority ---------------------------------------------------------------------

def _post(server: BackgroundServer, params: dict[str, Any]) -> httpx.Response:
    body = {"parameters": params, "inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": X.tolist()}
                                             for n in ("X", "Y")]}
    return httpx.post(server.url + "/v2/models/add/infer", content=json.dumps(body), timeout=30)


@pytest.mark.parametrize("params,name", [({"timeout": -1}, "timeout"), ({"timeout": "100"}, "timeout"),
                                         ({"timeout": 1.5}, "timeout"), ({"timeout": True}, "timeout"),
                                         ({"priority": -2}, "priority"), ({"priority": None}, "priority"),
                                         ({"priority": 1 << 64}, "priority")],
                         ids=["timeout-negative", "timeout-string", "timeout-float", "timeout-bool",
                              "priority-negative", "priority-null", "priority-past-uint64"])
def test_timeout_and_priority_must_be_non_negative_integers(server: BackgroundServer, params: dict[str, Any],
                                                            name: str) -> None:
    """Over REST a wrong ``timeout``/``priority`` is a 400 naming the parameter (they were ignored: 200)."""
    r = _post(server, params)
    assert r.status_code == 400 and f"parameters.{name}" in r.json()["error"], r.text


def test_timeout_and_priority_from_the_clients(server: BackgroundServer) -> None:
    """tritonclient's ``timeout=``/``priority=`` are served when valid; over gRPC a negative timeout or a priority
    of the wrong type is INVALID_ARGUMENT naming it (was served)."""
    h = th.InferenceServerClient(server.url.removeprefix("http://"))
    g = tg.InferenceServerClient(server.grpc_url)
    try:
        z = (2 * X).tolist()
        assert h.infer("add", _inputs(th), priority=3, timeout=10_000_000).as_numpy("Z").tolist() == z
        assert h.infer("add", _inputs(th), timeout=0).as_numpy("Z").tolist() == z  # 0: no deadline, as Triton
        assert g.infer("add", _inputs(tg), priority=1, timeout=10_000_000).as_numpy("Z").tolist() == z
        e = _error(lambda: g.infer("add", _inputs(tg), timeout=-5))
        assert e.status() == "StatusCode.INVALID_ARGUMENT" and "parameters.timeout" in e.message(), e
    finally:
        h.close()
        g.close()
    raw = pb.ModelInferRequest(model_name="add")
    for n in ("X", "Y"):
        raw.inputs.add(name=n, datatype="FP32", shape=[4])
        raw.raw_input_contents.append(X.tobytes())
    raw.parameters["priority"].string_param = "high"
    with grpc.insecure_channel(server.grpc_url) as ch, pytest.raises(grpc.RpcError) as err:
        pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(raw, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "parameters.priority" in err.value.details()


def _rejected(server: BackgroundServer) -> float:
    return metric(httpx.get(server.url + "/metrics").text, "tileship_rejected_total", reason="timeout")


def test_timeout_bounds_the_wait_for_the_worker(server: BackgroundServer) -> None:
    """With the one worker thread held by a ``slow`` call, a request whose ``timeout`` (us) passes while it
    waits for the thread is answered 504 / DEADLINE_EXCEEDED naming the parameter, is never run, and counts as
    ``rejected{reason="timeout"}``; a request with a longer timeout waits and is served. The timeout was ignored:
    the short requests waited for the slow call and were served."""
    h = th.InferenceServerClient(server.url.removeprefix("http://"))
    g = tg.InferenceServerClient(server.grpc_url)
    before = _rejected(server)
    pool = concurrent.futures.ThreadPoolExecutor(2)
    GATE.clear()
    try:
        slow = pool.submit(httpx.post, server.url + "/v2/models/slow/infer", timeout=30, json={
            "inputs": [{"name": "X", "shape": [4], "datatype": "FP32", "data": X.tolist()}]})
        deadline = time.monotonic() + 10
        while server.service.slots.inflight < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        patient = pool.submit(_post, server, {"timeout": 20_000_000})  # 20 s
        t0 = time.monotonic()
        e = _error(lambda: h.infer("add", _inputs(th), timeout=100_000))  # 0.1 s
        assert e.status() == "504" and "parameters.timeout" in e.message() and "not run" in e.message(), e
        e = _error(lambda: g.infer("add", _inputs(tg), timeout=100_000))
        assert e.status() == "StatusCode.DEADLINE_EXCEEDED" and "parameters.timeout" in e.message(), e
        assert time.monotonic() - t0 < 5, "the requests waited for the slow call"
        assert _rejected(server) == before + 2
        GATE.set()
        assert slow.result().json()["outputs"][0]["data"] == (X + 1).tolist()
        assert patient.result().json()["outputs"][0]["data"] == (2 * X).tolist()
    finally:
        GATE.set()
        pool.shutdown()
        h.close()
        g.close()
    assert server.service.slots.inflight == 0


# -- the trace extension ---------------------------------------------------------------------------------------

DEFAULTS = {"trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "log_frequency": "0", "trace_mode": "triton"}
CLEAR = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}


def _traces(server: BackgroundServer) -> list[dict[str, Any]]:
    lines = server.service.config.log_stream.getvalue().splitlines()
    return [d for d in map(json.loads, lines) if d.get("event") == "trace"]


def _grpc_settings(g: tg.InferenceServerClient, model: str = "", **update: Any) -> dict[str, Any]:
    resp = g.update_trace_settings(model, update) if update else g.get_trace_settings(model)
    return {k: list(v.value) for k, v in resp.settings.items()}


def test_trace_settings_over_rest_and_grpc(server: BackgroundServer) -> None:
    """Triton's trace extension: global settings, a model's own settings over them, ``null`` clears, both
    protocols on one store, clear errors for what tileship does not do; "trace" is claimed (404 / UNIMPLEMENTED)."""
    h = th.InferenceServerClient(server.url.removeprefix("http://"))
    g = tg.InferenceServerClient(server.grpc_url)
    try:
        assert "trace" in h.get_server_metadata()["extensions"]
        assert h.get_trace_settings() == DEFAULTS and h.get_trace_settings("add") == DEFAULTS
        got = h.update_trace_settings("add", {"trace_rate": "12", "log_frequency": "34"})
        assert got == DEFAULTS | {"trace_rate": "12", "log_frequency": "34"}
        assert h.update_trace_settings(settings={"trace_rate": "56", "trace_count": "78", "trace_level": ["OFF"]}) \
            == DEFAULTS | {"trace_rate": "56", "trace_count": "78"}
        # cleared globally: back to the defaults; the model keeps its own and follows the rest
        assert h.update_trace_settings(settings={"trace_rate": None, "trace_count": None}) == DEFAULTS
        assert h.get_trace_settings("add") == DEFAULTS | {"trace_rate": "12", "log_frequency": "34"}
        assert _grpc_settings(g, "add")["trace_rate"] == ["12"]
        assert _grpc_settings(g, "add", trace_rate=None, trace_level=["TIMESTAMPS"])["trace_rate"] == ["1000"]
        assert h.get_trace_settings("add")["trace_level"] == ["TIMESTAMPS"] and h.get_trace_settings() == DEFAULTS
        assert _grpc_settings(g, trace_count="5")["trace_count"] == ["5"]
        for settings, words in (({"trace_file": "/tmp/x.json"}, "trace_file"), ({"trace_level": ["TENSORS"]},
                                "TENSORS"), ({"trace_rate": "0"}, "trace_rate"), ({"trace_count": "-2"},
                                "trace_count"), ({"trace_rate": "many"}, "trace_rate"), ({"nope": "1"}, "nope"),
                                ({"trace_mode": "opentelemetry"}, "trace_mode")):
            e = _error(lambda s=settings: h.update_trace_settings(settings=s))  # type: ignore[misc]
            assert e.status() == "400" and words in e.message(), (settings, e)
            e = _error(lambda s=settings: g.update_trace_settings(settings=s))  # type: ignore[misc]
            assert e.status() == "StatusCode.INVALID_ARGUMENT" and words in e.message(), (settings, e)
        assert _error(lambda: h.get_trace_settings("nope")).status() == "404"
        assert _error(lambda: g.get_trace_settings("nope")).status() == "StatusCode.NOT_FOUND"
        r = httpx.post(server.url + "/v2/trace/setting", content=b"[1]", timeout=30)
        assert r.status_code == 400 and "JSON object" in r.json()["error"], r.text
    finally:
        h.update_trace_settings("add", CLEAR)
        h.update_trace_settings(settings=CLEAR)
        settled = h.get_trace_settings("add")
        h.close()
        g.close()
    assert settled == DEFAULTS


def test_traces_are_written_for_the_sampled_requests(server: BackgroundServer) -> None:
    """TIMESTAMPS at rate 2 with a count of 2 for ``add``: its 2nd and 4th answered requests are traced as ``trace``
    log lines (Triton's timestamps, in order), then the count is spent; ``outer`` (still OFF) is never traced."""
    h = th.InferenceServerClient(server.url.removeprefix("http://"))
    g = tg.InferenceServerClient(server.grpc_url)
    before = len(_traces(server))
    try:
        h.update_trace_settings("add", {"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "2"})
        for i in range(6):
            if i % 2:
                g.infer("add", _inputs(tg), request_id=f"t{i}")
            else:
                h.infer("add", _inputs(th), request_id=f"t{i}")
        w = th.InferInput("W", [2], "FP32")
        w.set_data_from_numpy(np.ones(2, np.float32))
        h.infer("outer", [_inputs(th)[0], w])
        traces = _traces(server)[before:]
        assert [(t["model_name"], t["id"], t["protocol"]) for t in traces] == \
            [("add", "t1", "grpc"), ("add", "t3", "grpc")], traces
        names = [s["name"] for s in traces[0]["timestamps"]]
        assert names == ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"]
        ns = [s["ns"] for s in traces[0]["timestamps"]]
        assert ns == sorted(ns) and traces[0]["model_version"] == "hostile", traces[0]
        assert h.get_trace_settings("add")["trace_count"] == "0"
    finally:
        h.update_trace_settings("add", CLEAR)
        h.close()
        g.close()
