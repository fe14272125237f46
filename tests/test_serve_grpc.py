"""The KServe v2 gRPC endpoint of `tileship serve` (issue 15, item 5): tritonclient.grpc, sync and
aio, against servers on 127.0.0.1 that serve REST and gRPC from one process and one Service."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
import tritonclient.http as th
from test_serve import assert_close, fake_config, fake_release, log_lines, metric, post, serving
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tileship.serve import EXIT_FATAL, BackgroundServer, ServeConfig, run
from tileship.serve.extensions import EXTENSIONS


@pytest.fixture(scope="module")
def server(grpc_server: BackgroundServer) -> BackgroundServer:
    return grpc_server


@pytest.fixture
def gc(server) -> Iterator[tg.InferenceServerClient]:
    c = tg.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def stub(server) -> Iterator[Any]:
    """The raw stub, for requests tritonclient would refuse to build."""
    with grpc.insecure_channel(server.grpc_url) as ch:
        yield pb_grpc.GRPCInferenceServiceStub(ch)


def _inputs(arrays: dict[str, np.ndarray]) -> list[tg.InferInput]:
    out = []
    for name, a in arrays.items():
        i = tg.InferInput(name, list(a.shape), {"float32": "FP32", "float16": "FP16", "float64": "FP64"}[a.dtype.name])
        i.set_data_from_numpy(a)  # raw_input_contents
        out.append(i)
    return out


def _fails(call: Any, code: str, *words: str) -> str:
    with pytest.raises(InferenceServerException) as e:
        call()
    assert e.value.status() == f"StatusCode.{code}", (e.value.status(), e.value.message())
    for w in words:
        assert w in e.value.message(), (w, e.value.message())
    return e.value.message()


# -- inference ------------------------------------------------------------------------------------

@pytest.mark.parametrize("model,dims", [("add", {"N": 1000}), ("add", {"N": 4096}),
                                        ("rmsnorm_cpu", {"M": 5, "N": 1024})],
                         ids=["add-dyn", "add-static", "rms-dyn"])
def test_infer_with_raw_contents_runs_the_kernel(server, gc, cpu_release_build, model, dims):
    rel = server.service.holder.current.release
    runner = rel.ops[model]
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn([dims[d] for d in ds], generator=g) for _, ds in runner.shape.inputs]
    out = rel.declarations[model]["outputs"][0][0]
    res = gc.infer(model, _inputs({n: t.numpy() for (n, _), t in zip(runner.shape.inputs, tensors, strict=True)}),
                   outputs=[tg.InferRequestedOutput(out)], request_id="kserve-9")
    assert_close(res.as_numpy(out), runner.reference(*[t.double() for t in tensors]), 1e-4, 1e-4)
    r = res.get_response(as_json=True)
    assert r["model_version"] == cpu_release_build.release_id and r["id"] == "kserve-9"
    p = {k: v["string_param"] for k, v in r["parameters"].items()}
    assert (p["tileship_path"], p["tileship_reason"]) == ("kernel", "kernel")
    assert p["tileship_release"] == cpu_release_build.release_id and p["tileship_spec"].startswith(f"{model}.float32.")


def test_typed_contents_and_the_reference_path(stub):
    req = pb.ModelInferRequest(model_name="rmsnorm_cpu")
    x, w = torch.randn(3, 100), torch.randn(100)
    for name, t in (("X", x), ("W", w)):
        i = req.inputs.add(name=name, datatype="FP32", shape=list(t.shape))
        i.contents.fp32_contents.extend(t.reshape(-1).tolist())
    resp = stub.ModelInfer(req)
    y = np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).reshape(list(resp.outputs[0].shape))
    assert_close(y, torch.nn.functional.rms_norm(x.double(), (100,), w.double(), 1e-6), 1e-5, 1e-5)
    assert resp.parameters["tileship_reason"].string_param == "undeclared_shape"


def _raw(model: str = "add", **tensors: tuple[str, list[int], bytes]) -> Any:
    req = pb.ModelInferRequest(model_name=model)
    for name, (dt, shape, data) in tensors.items():
        req.inputs.add(name=name, datatype=dt, shape=shape)
        req.raw_input_contents.append(data)
    return req


F4 = np.arange(4, dtype=np.float32).tobytes()
BAD = [  # (id, request, code, words in the message)
    ("shape-mismatch", _raw(A=("FP32", [4], F4), B=("FP32", [3], F4[:12])), "INVALID_ARGUMENT",
     ["wrong shape", "dim N"]),
    ("bytes-mismatch", _raw(A=("FP32", [4], F4), B=("FP32", [4], F4[:10])), "INVALID_ARGUMENT",
     ["byte size mismatch", "input B has 10 bytes", "needs 16"]),
    ("dtype", _raw(A=("FP64", [2], F4), B=("FP64", [2], F4)), "INVALID_ARGUMENT", ["wrong datatype", "FP64"]),
    ("unsupported-dtype", _raw(A=("STRING", [1], b"x"), B=("FP32", [4], F4)), "INVALID_ARGUMENT",
     ["unsupported datatype"]),
    ("negative-dim", _raw(A=("FP32", [-4], F4), B=("FP32", [4], F4)), "INVALID_ARGUMENT", ["negative dimension"]),
    ("zero-dim", _raw(A=("FP32", [0], b""), B=("FP32", [0], b"")), "INVALID_ARGUMENT", ["N=0"]),
    ("unknown-input", _raw(A=("FP32", [4], F4), Z=("FP32", [4], F4)), "INVALID_ARGUMENT",
     ["unknown input 'Z'", "A, B"]),
    ("missing-input", _raw(A=("FP32", [4], F4)), "INVALID_ARGUMENT", ["missing input B"]),
    ("too-many-elements", _raw(A=("FP32", [1 << 33], b""), B=("FP32", [4], F4)), "RESOURCE_EXHAUSTED", ["elements"]),
    ("unknown-model", _raw("gemm", A=("FP32", [4], F4)), "NOT_FOUND", ["unknown model 'gemm'", "add, rmsnorm_cpu"]),
    ("no-inputs", pb.ModelInferRequest(model_name="add"), "INVALID_ARGUMENT", ["non-empty list"]),
]


def _extra_bad() -> list[tuple[str, Any, str, list[str]]]:
    cases = []
    r = _raw(A=("FP32", [4], F4), B=("FP32", [4], F4))
    r.raw_input_contents.append(F4)
    cases.append(("raw-count", r, "INVALID_ARGUMENT", ["raw_input_contents holds 3 entries", "2 inputs"]))
    r = _raw(A=("FP32", [4], F4), B=("FP32", [4], F4))
    r.outputs.add(name="D")
    cases.append(("unknown-output", r, "INVALID_ARGUMENT", ["unknown output 'D'", "produces C"]))
    r = _raw(A=("FP32", [4], F4), B=("FP32", [4], F4))
    r.outputs.add(name="C")
    r.outputs.add(name="C")
    cases.append(("duplicate-output", r, "INVALID_ARGUMENT", ["output C is requested twice"]))
    r = _raw(A=("FP32", [4], F4), B=("FP32", [4], F4))
    r.inputs[0].parameters["shared_memory_region"].string_param = "r0"
    cases.append(("shared-memory", r, "INVALID_ARGUMENT", ["input A", "needs shared_memory_byte_size"]))
    r = _raw(A=("FP32", [4], F4), B=("FP32", [4], F4))
    r.inputs[1].contents.fp32_contents.extend([1, 2, 3, 4])
    cases.append(("raw-and-contents", r, "INVALID_ARGUMENT", ["input B: has 'contents'", "raw_input_contents"]))
    r = pb.ModelInferRequest(model_name="add")
    r.inputs.add(name="A", datatype="FP32", shape=[4]).contents.fp32_contents.extend([1, 2, 3])
    r.inputs.add(name="B", datatype="FP32", shape=[4]).contents.fp32_contents.extend([1, 2, 3, 4])
    cases.append(("contents-count", r, "INVALID_ARGUMENT", ["input A has shape [4] (4 elements)", "holds 3"]))
    r = _raw(A=("FP32", [4], F4), B=("FP32", [4], F4))
    r.model_version = "0123456789abcdef"
    cases.append(("unknown-version", r, "NOT_FOUND", ["unknown version '0123456789abcdef'"]))
    return cases


@pytest.mark.parametrize("req,code,words", [c[1:] for c in BAD + _extra_bad()], ids=[c[0] for c in BAD + _extra_bad()])
def test_bad_requests_get_a_status_naming_the_problem(server, stub, req, code, words):
    text = httpx.get(server.url + "/metrics").text
    before = metric(text, "tileship_requests_total", code="500")
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, metadata=(("x-request-id", "bad-1"),))
    assert e.value.code() == getattr(grpc.StatusCode, code), (e.value.code(), e.value.details())
    for w in words:
        assert w in e.value.details(), (w, e.value.details())
    assert ("x-request-id", "bad-1") in tuple(e.value.trailing_metadata())
    after = httpx.get(server.url + "/metrics").text
    assert metric(after, "tileship_requests_total", code="500") == before
    assert metric(after, "tileship_inflight_requests") == 0 and metric(after, "tileship_serve_compile_attempts") == 0


def test_bytes_that_are_no_message_are_invalid_argument_not_unknown(server):
    with grpc.insecure_channel(server.grpc_url) as ch:
        for method in ("ModelInfer", "ModelConfig", "RepositoryModelUnload"):
            with pytest.raises(grpc.RpcError) as e:
                ch.unary_unary(f"/inference.GRPCInferenceService/{method}")(b"\xff\xff\xff", timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details())
            assert e.value.details().startswith("malformed inference.") and "Error parsing message" in e.value.details()


def test_grpc_and_rest_share_metrics_statistics_and_logs(server, gc, cpu_release_build):
    rid = cpu_release_build.release_id
    text = httpx.get(server.url + "/metrics").text
    ok0 = metric(text, "tileship_requests_total", model="add", code="200")
    bad0 = metric(text, "tileship_requests_total", model="add", code="400")
    s0 = gc.get_inference_statistics("add", as_json=True)["model_stats"][0]
    a = np.arange(8, dtype=np.float32)
    for _ in range(3):
        gc.infer("add", _inputs({"A": a, "B": a}), headers={"x-request-id": "grpc-ok"})
    assert post(server, "/v2/models/add/infer", json={"inputs": [
        {"name": "A", "shape": [2], "datatype": "FP32", "data": [1, 2]},
        {"name": "B", "shape": [2], "datatype": "FP32", "data": [3, 4]}]}).status_code == 200
    _fails(lambda: gc.infer("add", _inputs({"A": a, "B": a[:4]})), "INVALID_ARGUMENT", "wrong shape")
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "tileship_requests_total", model="add", code="200") == ok0 + 4
    assert metric(text, "tileship_requests_total", model="add", code="400") == bad0 + 1
    s1 = gc.get_inference_statistics("add", rid, as_json=True)["model_stats"][0]
    assert s1["version"] == rid
    assert int(s1["inference_count"]) == int(s0.get("inference_count", 0)) + 4
    assert int(s1["inference_stats"]["fail"]["count"]) == int(s0["inference_stats"].get("fail", {}).get("count", 0)) + 1
    assert int(s1["inference_stats"]["compute_infer"]["ns"]) > 0
    every = gc.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in every} == {"add", "rmsnorm_cpu"}
    lines = [x for x in log_lines(server.service.log._stream) if x.get("request_id") == "grpc-ok"]
    assert len(lines) == 3 and all(
        x["protocol"] == "grpc" and x["status"] == 200 and x["path"] == "kernel" for x in lines
    )
    assert lines[0]["bytes_out"] == 32


def test_docs_grpc_example_runs(server, capsys):
    text = (Path(__file__).parents[1] / "docs" / "serving.md").read_text()
    code = text.split("## gRPC", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/serving.md", "exec"), {"GRPC_URL": server.grpc_url})
    printed = capsys.readouterr().out.split()
    assert printed == [server.service.holder.current.release_id, "kernel", "kernel"]


# -- metadata, config, repository -----------------------------------------------------------------

def test_health_metadata_and_config_match_rest(server, gc, cpu_release_build):
    rid = cpu_release_build.release_id
    assert gc.is_server_live() and gc.is_server_ready()
    assert gc.is_model_ready("add") and gc.is_model_ready("add", rid)
    assert not gc.is_model_ready("add", "0123456789abcdef") and not gc.is_model_ready("gemm")  # as Triton: no error
    meta = gc.get_server_metadata(as_json=True)
    assert meta["name"] == "tileship" and meta["extensions"] == EXTENSIONS
    for name in ("add", "rmsnorm_cpu"):
        rest = httpx.get(f"{server.url}/v2/models/{name}").json()
        got = gc.get_model_metadata(name, rid, as_json=True)
        assert got["versions"] == [rid] and got["platform"] == "tileship"
        for side in ("inputs", "outputs"):
            assert [{**t, "shape": [int(d) for d in t["shape"]]} for t in got[side]] == rest[side]
        cfg = gc.get_model_config(name, as_json=True)["config"]
        want = httpx.get(f"{server.url}/v2/models/{name}/config").json()
        assert [(i["name"], i["data_type"], [int(d) for d in i["dims"]]) for i in cfg["input"]] == \
            [(i["name"], i["data_type"], i["dims"]) for i in want["input"]]
        assert cfg["parameters"] == want["parameters"] and cfg["backend"] == "tileship"
    _fails(lambda: gc.get_model_metadata("gemm"), "NOT_FOUND", "unknown model 'gemm'")
    _fails(lambda: gc.get_model_config("gemm"), "NOT_FOUND", "unknown model 'gemm'")
    _fails(lambda: gc.get_inference_statistics("add", "0123456789abcdef"), "NOT_FOUND", "unknown version")


def test_model_ready_of_an_unknown_model_is_false_over_both_protocols(server, gc, stub, cpu_release_build):
    """Triton's ModelReady answers ``ready: false`` (status OK) for a model or version it does not know; REST's
    ``/ready`` answers a 4xx with a JSON error (KServe v2: a 4xx is "not ready"; 404 as KServe's own server), so
    tritonclient's ``is_model_ready`` says False over both, sync and aio, and raises over neither."""
    rid = cpu_release_build.release_id
    hc = th.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=30.0)
    try:
        for name, version in [("gemm", ""), ("", ""), ("add", "0123456789abcdef"), ("gemm", rid)]:
            assert gc.is_model_ready(name, version) is False, (name, version)
            resp = stub.ModelReady(pb.ModelReadyRequest(name=name, version=version))
            assert resp.ready is False
            if name:
                assert hc.is_model_ready(name, version) is False, (name, version)
        assert gc.is_model_ready("add") and gc.is_model_ready("add", rid) and hc.is_model_ready("add", rid)
    finally:
        hc.close()

    async def aio() -> bool:
        async with tga.InferenceServerClient(server.grpc_url) as c:
            return bool(await c.is_model_ready("gemm"))

    assert asyncio.run(aio()) is False
    r = httpx.get(f"{server.url}/v2/models/gemm/ready")
    assert r.status_code == 404 and r.json()["error"].startswith("unknown model 'gemm': this release serves"), r.text
    r = httpx.get(f"{server.url}/v2/models/add/versions/0123456789abcdef/ready")
    assert r.status_code == 404 and "unknown version '0123456789abcdef' of model add" in r.json()["error"], r.text


def test_an_unload_whose_unload_dependents_is_not_a_bool_is_invalid_argument_and_unloads_nothing(cpu_release_build,
                                                                                                   tmp_path):
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    cfg = ServeConfig(source=cpu_release_build.path, grpc_port=0, diagnostics_dir=tmp_path / "diag",
                      log_stream=io.StringIO())
    with serving(cfg) as srv, grpc.insecure_channel(srv.grpc_url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        for kind, value in (("string_param", "yes"), ("int64_param", 1)):
            req = service_pb2.RepositoryModelUnloadRequest(model_name="add")
            setattr(req.parameters["unload_dependents"], kind, value)
            with pytest.raises(grpc.RpcError) as err:
                stub.RepositoryModelUnload(req)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"unload_dependents must be a bool_param (true or false), not {kind}" in err.value.details()
        assert tg.InferenceServerClient(srv.grpc_url).is_model_ready("add")


def test_unload_and_load_over_grpc(cpu_release_build, tmp_path):
    cfg = ServeConfig(source=cpu_release_build.path, grpc_port=0, diagnostics_dir=tmp_path / "diag",
                      log_stream=io.StringIO())
    a = np.arange(4, dtype=np.float32)
    with serving(cfg) as srv:
        c = tg.InferenceServerClient(srv.grpc_url)
        try:
            c.unload_model("add", unload_dependents=True)  # model_repository(unload_dependents), as claimed
            assert not c.is_model_ready("add") and c.is_model_ready("rmsnorm_cpu") and c.is_server_ready()
            _fails(lambda: c.infer("add", _inputs({"A": a, "B": a})), "NOT_FOUND", "model add is unloaded",
                   "RepositoryModelLoad")
            # one Service: REST sees the unload made over gRPC
            r = post(srv, "/v2/models/add/infer", json={"inputs": [
                {"name": "A", "shape": [1], "datatype": "FP32", "data": [1]},
                {"name": "B", "shape": [1], "datatype": "FP32", "data": [1]}]})
            assert r.status_code == 404 and "unloaded" in r.json()["error"]
            rows = {m["name"]: m for m in c.get_model_repository_index(as_json=True)["models"]}
            assert (rows["add"]["state"], rows["add"]["reason"]) == ("UNAVAILABLE", "unloaded")
            _fails(lambda: c.unload_model("nope"), "NOT_FOUND", "unknown model 'nope'")
            _fails(lambda: c.load_model("nope"), "NOT_FOUND", "unknown model 'nope'")
            _fails(lambda: c.load_model("add", config='{"max_batch_size": 8}'), "INVALID_ARGUMENT", "not supported")
            c.load_model("add")
            assert c.is_model_ready("add")
            assert c.infer("add", _inputs({"A": a, "B": a})).as_numpy("C").tolist() == [0, 2, 4, 6]
        finally:
            c.close()


def test_aio_client(server, cpu_release_build):
    async def main() -> None:
        c = tga.InferenceServerClient(server.grpc_url)
        try:
            assert await c.is_server_live() and await c.is_server_ready() and await c.is_model_ready("add")
            assert (await c.get_server_metadata()).extensions == EXTENSIONS
            assert (await c.get_model_metadata("add")).versions == [cpu_release_build.release_id]
            assert (await c.get_model_config("add")).config.name == "add"
            n = 257
            arrays = [np.full(n, i, dtype=np.float32) for i in range(8)]
            results = await asyncio.gather(*(c.infer("add", _inputs({"A": x, "B": x})) for x in arrays))
            for i, res in enumerate(results):
                assert res.as_numpy("C").tolist() == [2.0 * i] * n
            assert (await c.get_inference_statistics("add")).model_stats[0].inference_count >= 8
            assert [m.name for m in (await c.get_model_repository_index()).models] == ["add", "rmsnorm_cpu"]
            with pytest.raises(InferenceServerException) as e:
                await c.infer("add", _inputs({"A": arrays[0], "B": arrays[0][:4]}))
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "wrong shape" in e.value.message()
        finally:
            await c.close()

    asyncio.run(main())


# -- readiness, faults, deadlines ------------------------------------------------------------------

def test_not_ready_is_unavailable(tmp_path):
    cfg = ServeConfig(source=tmp_path / "missing", grpc_port=0, diagnostics_dir=tmp_path / "diag",
                      log_stream=io.StringIO())
    with serving(cfg, ready=False) as srv:
        deadline = time.monotonic() + 30
        while srv.service.holder.state == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        c = tg.InferenceServerClient(srv.grpc_url)
        try:
            assert c.is_server_live() and not c.is_server_ready() and not c.is_model_ready("add")
            a = np.ones(4, dtype=np.float32)
            _fails(lambda: c.infer("add", _inputs({"A": a, "B": a})), "UNAVAILABLE", "not ready")
            _fails(lambda: c.get_model_config("add"), "UNAVAILABLE", "not ready")
            _fails(lambda: c.get_inference_statistics(), "UNAVAILABLE", "not ready")
            rest = [(m["name"], m["state"]) for m in post(srv, "/v2/repository/index").json()]
            assert [
                (m["name"], m["state"]) for m in c.get_model_repository_index(as_json=True).get("models", [])
            ] == rest
        finally:
            c.close()


def test_a_bug_is_internal_naming_the_request_id_and_slow_calls_are_deadline_exceeded(tmp_path):
    def broken(x: torch.Tensor) -> torch.Tensor:
        if float(x[0]) > 0:
            time.sleep(float(x[0]))
            return x
        raise ZeroDivisionError("a bug in the reference")

    path, rel = fake_release(tmp_path, "f", {"broken": broken})
    with serving(fake_config(tmp_path, {"f": rel}, path, grpc_port=0, request_timeout_s=1.0)) as srv:
        c = tg.InferenceServerClient(srv.grpc_url)
        try:
            inp = tg.InferInput("X", [1], "FP32")
            inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
            msg = _fails(lambda: c.infer("broken", [inp], headers={"x-request-id": "bug-7"}), "INTERNAL",
                         "ZeroDivisionError", "request id bug-7")
            assert "Traceback" not in msg
            inp.set_data_from_numpy(np.full(1, 2.5, dtype=np.float32))
            _fails(lambda: c.infer("broken", [inp]), "DEADLINE_EXCEEDED", "did not finish within 1 s")
            # the client's own deadline: the server counts the cancelled request (499) and frees its slot
            inp.set_data_from_numpy(np.full(1, 0.5, dtype=np.float32))
            _fails(lambda: c.infer("broken", [inp], client_timeout=0.1), "DEADLINE_EXCEEDED")
        finally:
            c.close()
        deadline = time.monotonic() + 30
        while srv.service.slots.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "tileship_requests_total", model="broken", code="499") == 1
        assert metric(text, "tileship_inflight_requests") == 0
        assert metric(text, "tileship_requests_total", model="broken", code="500") == 1
        assert metric(text, "tileship_rejected_total", reason="timeout") == 1
        errors = [x for x in log_lines(srv.service.log._stream) if x["event"] == "error"]
        assert errors and errors[0]["request_id"] == "bug-7" and "ZeroDivisionError" in errors[0]["traceback"]


def test_a_sticky_device_error_over_grpc_is_unavailable_and_the_process_exits_3(tmp_path):
    def poisoned(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    path, rel = fake_release(tmp_path, "bad", {"boom": poisoned})
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    cfg = fake_config(tmp_path, {"bad": rel}, path, grpc_port=ports[1])
    seen: dict[str, Any] = {}

    def poke() -> None:
        c = tg.InferenceServerClient(f"127.0.0.1:{ports[1]}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(InferenceServerException):
                if c.is_server_ready():
                    break
            time.sleep(0.05)
        inp = tg.InferInput("X", [1], "FP32")
        inp.set_data_from_numpy(np.ones(1, dtype=np.float32))
        try:
            c.infer("boom", [inp])
        except InferenceServerException as exc:
            seen["infer"] = (exc.status(), exc.message())
        with contextlib.suppress(InferenceServerException):
            seen["ready"] = c.is_server_ready()
        c.close()

    t = threading.Thread(target=poke)
    t.start()
    code = run(cfg, port=ports[0], graceful_s=2)  # foreground, as `tileship serve --grpc-port` runs
    t.join()
    assert code == EXIT_FATAL
    assert seen["infer"][0] == "StatusCode.UNAVAILABLE" and "device failure" in seen["infer"][1], seen
    assert seen.get("ready") in (None, False)  # not ready, or the listener had closed


def test_a_connection_that_never_finishes_its_handshake_is_closed(tmp_path):
    path, rel = fake_release(tmp_path, "f", {"twice": lambda x: x * 2})
    with serving(fake_config(tmp_path, {"f": rel}, path, grpc_port=0, header_timeout_s=1.0)) as srv:
        for sent in (b"", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"):  # nothing; the preface but no SETTINGS
            with socket.create_connection(("127.0.0.1", srv.service.grpc_port), timeout=20) as s:
                s.sendall(sent)
                t0 = time.monotonic()
                while s.recv(65536):
                    pass
                assert time.monotonic() - t0 < 10, "the half-open connection was kept"
        c = tg.InferenceServerClient(srv.grpc_url)
        try:
            assert c.is_server_ready()  # a well-behaved client is unaffected
        finally:
            c.close()


def test_cli_serves_grpc_next_to_rest(cpu_release_build, tmp_path):
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    env = {**os.environ, "TILESHIP_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-c", "from tileship.cli import main; main()", "serve",
                             str(cpu_release_build.path), "--port", str(ports[0]), "--grpc-port", str(ports[1])],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        c = tg.InferenceServerClient(f"127.0.0.1:{ports[1]}")
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            with contextlib.suppress(InferenceServerException):
                if c.is_server_ready():
                    break
            assert time.monotonic() < deadline, "not ready over gRPC within 120 s"
            time.sleep(0.1)
        a = np.arange(4, dtype=np.float32)
        assert c.infer("add", _inputs({"A": a, "B": a})).as_numpy("C").tolist() == [0, 2, 4, 6]
        assert httpx.get(f"http://127.0.0.1:{ports[0]}/v2/health/ready").status_code == 200
        c.close()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    start = json.loads(err.splitlines()[0])
    assert start["event"] == "start" and start["grpc_port"] == ports[1]


def test_the_grpc_benchmark_runs(cpu_release_build, tmp_path):
    out = tmp_path / "grpc_load.json"
    root = Path(__file__).parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "serve_grpc_load.py"), "--release",
                           str(cpu_release_build.path), "--seq", "20", "--clients", "2", "--duration", "0.3", "--out",
                           str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    assert r["ok"] and r["compile_attempts"] == 0 and r["grpc_load"]["errors"] == 0
    assert r["grpc_sequential"]["n"] == 20 and r["grpc_echo_floor"]["p50_us"] > 0
