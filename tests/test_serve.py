"""`tileship serve`: KServe v2 over HTTP with tritonclient as the client, readiness, metrics,
logs, bad input, overload, hot swap. Servers listen on a free 127.0.0.1 port."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tileship.build.lock import DriftReport, read_lock, write_lock
from tileship.release import bundle
from tileship.runtime.dispatch import OpRunner, OpShape, Release
from tileship.serve import EXIT_FATAL, BackgroundServer, ServeConfig, run

# -- helpers ----------------------------------------------------------------------------------

@contextlib.contextmanager
def serving(config: ServeConfig, *, ready: bool = True) -> Iterator[BackgroundServer]:
    srv = BackgroundServer(config).start()
    try:
        if ready:
            assert srv.wait_ready(), srv.service.holder.readiness()[1]
        yield srv
    finally:
        srv.stop()


def client(srv: BackgroundServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(f"127.0.0.1:{srv.port}", network_timeout=30.0)


def infer(c: triton.InferenceServerClient, model: str, arrays: dict[str, np.ndarray], *, binary: bool, out: str,
          **kw: Any) -> triton.InferResult:
    inputs = []
    for name, a in arrays.items():
        dt = "BF16" if a.dtype.name == "bfloat16" else {"float32": "FP32", "float16": "FP16",
                                                        "float64": "FP64"}[a.dtype.name]
        i = triton.InferInput(name, list(a.shape), dt)
        i.set_data_from_numpy(a, binary_data=binary)
        inputs.append(i)
    return c.infer(model, inputs, outputs=[triton.InferRequestedOutput(out, binary_data=binary)], **kw)


def assert_close(got: np.ndarray, want: torch.Tensor, atol: float, rtol: float) -> None:
    g = torch.from_numpy(np.asarray(got, dtype=np.float64))
    w = want.double()
    assert g.shape == w.shape, f"shape {tuple(g.shape)} != {tuple(w.shape)}"
    err = (g - w).abs()
    bad = err > atol + rtol * w.abs()
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} elements mismatch, max |err| {float(err.max()):.3g}"


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the first sample ``name{labels...}`` in a Prometheus exposition (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0


def log_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]  # every line must parse


def copy_release(src: Path, dest: Path, *, version: str | None = None) -> Path:
    """A copy of a release; with ``version``, a different release (new id) of the same kernels."""
    shutil.copytree(src, dest)
    if version is not None:
        rel = json.loads((dest / "release.json").read_text())
        rel["model"]["version"] = version
        (dest / "release.json").write_text(json.dumps(rel, indent=1, sort_keys=True))
        bundle.write_manifest(dest)
    return dest


def point(link: Path, target: Path) -> None:
    """Atomically repoint a symlink (how a release directory is switched under a server)."""
    tmp = link.with_name(link.name + ".new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def fake_release(root: Path, release_id: str, ops: dict[str, Callable[..., Any]], *,
                 dtypes: tuple[str, ...] = ("float32",)) -> tuple[Path, Release]:
    """A release whose operators (X[N] -> Y[N]) run only a Python reference: for protocol
    paths the CPU catalog cannot reach (FP16/BF16, slow calls, device faults)."""
    path = root / release_id
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"release_id": release_id}))
    decl = {"inputs": [["X", ["N"]]], "outputs": [["Y", ["N"]]], "dtypes": list(dtypes), "shapes": [],
            "ranges": [{"dim": "N", "min": 1, "max": 1 << 20, "fixed": {}}],
            "tolerances": {d: {"atol": 1e-2, "rtol": 1e-2} for d in dtypes}}
    runners = {name: OpRunner(OpShape(name, (("X", ("N",)),), 1), fn, []) for name, fn in ops.items()}
    rel = Release(release_id=release_id, path=path, kernel_revision="fakerev", model={"name": "fake", "version": "1"},
                  lock={}, lock_digest="sha256:fake", drift=DriftReport(()), ops=runners,
                  declarations={n: decl for n in ops})
    return path, rel


def fake_config(tmp_path: Path, releases: dict[str, Release], source: Path, **kw: Any) -> ServeConfig:
    return ServeConfig(source=source, loader=lambda p, ref: releases[Path(p).resolve().name],
                       diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO(), **kw)


def post(srv: BackgroundServer, path: str, **kw: Any) -> httpx.Response:
    return httpx.post(srv.url + path, timeout=30.0, **kw)


# -- the module server: the real CPU catalog release -------------------------------------------

@pytest.fixture(scope="module")
def server(cpu_release_build, tmp_path_factory) -> Iterator[BackgroundServer]:
    logs = io.StringIO()
    cfg = ServeConfig(source=cpu_release_build.path, max_body_bytes=1 << 20,
                      diagnostics_dir=tmp_path_factory.mktemp("diag"), log_stream=logs)
    with serving(cfg) as srv:
        yield srv


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("model,dims", [("add", {"N": 1000}), ("add", {"N": 4096}),
                                        ("rmsnorm_cpu", {"M": 5, "N": 1024}), ("rmsnorm_cpu", {"M": 64, "N": 256})],
                                        ids=["add-dyn", "add-static", "rms-dyn", "rms-static"])
def test_tritonclient_round_trip_runs_the_kernel(server, cpu_release_build, model, dims, binary):
    rel = server.service.holder.current.release
    runner = rel.ops[model]
    g = torch.Generator().manual_seed(1)
    tensors = [torch.randn([dims[d] for d in ds], generator=g) for _, ds in runner.shape.inputs]
    c = client(server)
    try:
        res = infer(c, model, {n: t.numpy() for (n, _), t in zip(runner.shape.inputs, tensors, strict=True)},
                    binary=binary, out=rel.declarations[model]["outputs"][0][0])
    finally:
        c.close()
    out_name = rel.declarations[model]["outputs"][0][0]
    assert_close(res.as_numpy(out_name), runner.reference(*[t.double() for t in tensors]), 1e-4, 1e-4)
    p = res.get_response()["parameters"]
    assert p["tileship_release"] == cpu_release_build.release_id
    assert p["tileship_kernel_revision"] == rel.kernel_revision
    assert (p["tileship_path"], p["tileship_reason"]) == ("kernel", "kernel")
    assert p["tileship_spec"].startswith(f"{model}.float32.")
    assert res.get_response()["model_version"] == cpu_release_build.release_id


def test_headers_name_release_path_and_request_id(server, cpu_release_build):
    body = {"inputs": [{"name": "A", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]},
                       {"name": "B", "shape": [3], "datatype": "FP32", "data": [10, 20, 30]}], "id": "kserve-7"}
    r = post(server, f"/v2/models/add/versions/{cpu_release_build.release_id}/infer", json=body,
             headers={"x-request-id": "req-abc-123"})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [11, 22, 33] and r.json()["id"] == "kserve-7"
    assert r.headers["x-tileship-release"] == cpu_release_build.release_id
    assert r.headers["x-tileship-kernel-revision"] == server.service.holder.current.release.kernel_revision
    assert (r.headers["x-tileship-path"], r.headers["x-tileship-reason"]) == ("kernel", "kernel")
    assert r.headers["x-request-id"] == "req-abc-123"
    for path in ("/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/add", "/metrics"):
        h = httpx.get(server.url + path).headers
        assert h["x-tileship-release"] == cpu_release_build.release_id and len(h["x-request-id"]) == 32, path
    line = [x for x in log_lines(server.service.log._stream) if x.get("request_id") == "req-abc-123"]
    assert len(line) == 1 and line[0]["event"] == "infer" and line[0]["path"] == "kernel" and line[0]["status"] == 200
    assert line[0]["model"] == "add" and line[0]["id"] == "kserve-7"


def test_health_and_metadata(server, cpu_release_build):
    c = client(server)
    try:
        assert c.is_server_live() and c.is_server_ready()
        assert c.is_model_ready("add") and c.is_model_ready("add", cpu_release_build.release_id)
        assert not c.is_model_ready("add", "0123456789abcdef")
        meta = c.get_model_metadata("rmsnorm_cpu")
        assert meta["versions"] == [cpu_release_build.release_id]
        assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, -1]},
                                  {"name": "W", "datatype": "FP32", "shape": [-1]}]
        assert meta["outputs"] == [{"name": "Y", "datatype": "FP32", "shape": [-1, -1]}]
        assert "M=1..4096,N=1024" in meta["parameters"]["declared_shapes"]
        assert {"binary_tensor_data", "model_repository"} <= set(c.get_server_metadata()["extensions"])
        with pytest.raises(InferenceServerException) as e:
            c.get_model_metadata("gemm")
        assert (
            e.value.status() == "404"
            and "unknown model 'gemm'" in e.value.message()
            and "add, rmsnorm_cpu" in e.value.message()
        )
    finally:
        c.close()


def test_undeclared_shape_goes_to_the_reference_and_is_counted(server):
    x, w = torch.randn(3, 100), torch.randn(100)
    before = metric(httpx.get(server.url + "/metrics").text, "tileship_fallbacks_total", model="rmsnorm_cpu",
                    reason="undeclared_shape")
    c = client(server)
    try:
        res = infer(c, "rmsnorm_cpu", {"X": x.numpy(), "W": w.numpy()}, binary=True, out="Y")
    finally:
        c.close()
    p = res.get_response()["parameters"]
    assert (p["tileship_path"], p["tileship_reason"]) == ("reference", "undeclared_shape")
    assert_close(res.as_numpy("Y"), torch.nn.functional.rms_norm(x.double(), (100,), w.double(), 1e-6), 1e-5, 1e-5)
    after = metric(httpx.get(server.url + "/metrics").text, "tileship_fallbacks_total", model="rmsnorm_cpu",
                   reason="undeclared_shape")
    assert after == before + 1


def _json(inputs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"content": json.dumps({"inputs": inputs, **extra}).encode(),
            "headers": {"content-type": "application/json"}}


def _a(shape: list[int], data: list[Any] | None = None, dt: str = "FP32", name: str = "A") -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": dt,
            "data": data if data is not None else [1.0] * int(np.prod(shape))}


def _binary(header: dict[str, Any], blob: bytes, claimed: int | None = None) -> dict[str, Any]:
    h = json.dumps(header).encode()
    return {"content": h + blob,
            "headers": {"inference-header-content-length": str(len(h) if claimed is None else claimed)}}


_GOOD_B = _a([4], name="B")
_BIN_IN = [{"name": "A", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
           {"name": "B", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]

MALFORMED = [
    # id, method, path, request kwargs, status, words the message must contain
    ("unknown-model", "POST", "/v2/models/nope/infer", _json([_a([4]), _GOOD_B]), 404, "unknown model 'nope'"),
    ("unknown-version", "POST", "/v2/models/add/versions/feedface/infer", _json([_a([4]), _GOOD_B]), 404,
     "unknown version 'feedface'"),
    ("malformed-json", "POST", "/v2/models/add/infer", {"content": b'{"inputs": [', "headers": {}}, 400,
     "malformed JSON"),
    ("json-not-object", "POST", "/v2/models/add/infer", {"content": b"[1, 2]", "headers": {}}, 400,
     "must be a JSON object"),
    ("no-inputs", "POST", "/v2/models/add/infer", _json([]), 400, "'inputs' must be a non-empty list"),
    ("wrong-dtype", "POST", "/v2/models/add/infer", _json([_a([4], dt="FP64"), _a([4], dt="FP64", name="B")]), 400,
     "wrong datatype: input A is FP64; model add accepts FP32"),
    ("unknown-dtype", "POST", "/v2/models/add/infer", _json([_a([4], dt="FLOAT"), _GOOD_B]), 400,
     "unsupported datatype 'FLOAT'"),
    ("mixed-dtypes", "POST", "/v2/models/add/infer", _json([_a([4]), _a([4], dt="INT32", name="B", data=[1] * 4)]), 400,
     "wrong datatype: input B is INT32"),
    ("wrong-rank", "POST", "/v2/models/add/infer", _json([_a([2, 2]), _GOOD_B]), 400,
     "wrong rank: input A has shape [2, 2] (rank 2); model add declares A as (N)"),
    ("dims-disagree", "POST", "/v2/models/add/infer", _json([_a([4]), _a([5], name="B")]), 400,
     "dim N is 4 in input A but 5 in input B"),
    ("zero-dim", "POST", "/v2/models/add/infer", _json([_a([0], data=[]), _a([0], data=[], name="B")]), 400, "N=0"),
    ("missing-input", "POST", "/v2/models/add/infer", _json([_a([4])]), 400, "missing input B: model add takes A, B"),
    ("unknown-input", "POST", "/v2/models/add/infer", _json([_a([4]), _GOOD_B, _a([4], name="Z")]), 400,
     "unknown input 'Z'"),
    ("duplicate-input", "POST", "/v2/models/add/infer", _json([_a([4]), _a([4])]), 400, "input A is given twice"),
    ("json-count-mismatch", "POST", "/v2/models/add/infer", _json([_a([4], data=[1, 2, 3]), _GOOD_B]), 400,
     "byte size mismatch: input A has shape [4] (4 elements) but 'data' holds 3"),
    ("json-not-numbers", "POST", "/v2/models/add/infer", _json([_a([2], data=["x", "y"]), _a([2], name="B")]), 400,
     "wrong dtype: input A"),
    ("negative-dim", "POST", "/v2/models/add/infer", _json([_a([-4], data=[]), _GOOD_B]), 400, "negative dimension"),
    ("unknown-output", "POST", "/v2/models/add/infer", _json([_a([4]), _GOOD_B], outputs=[{"name": "Q"}]), 400,
     "unknown output 'Q': model add produces C"),
    ("binary-size-vs-shape", "POST", "/v2/models/add/infer",
     _binary({"inputs": [{**_BIN_IN[0], "parameters": {"binary_data_size": 12}}, _BIN_IN[1]]}, b"\0" * 28), 400,
     "byte size mismatch: input A has binary_data_size 12 but shape [4] x FP32 needs 16 bytes"),
    ("binary-header-longer-than-body", "POST", "/v2/models/add/infer",
     _binary({"inputs": _BIN_IN}, b"\0" * 32, claimed=10_000), 400,
     "Inference-Header-Content-Length is 10000 but the body has"),
    ("binary-header-not-int", "POST", "/v2/models/add/infer",
     {"content": b"{}", "headers": {"inference-header-content-length": "ten"}}, 400,
     "must be an integer"),
    ("binary-short-body", "POST", "/v2/models/add/infer", _binary({"inputs": _BIN_IN}, b"\0" * 20), 400,
     "byte size mismatch: input B needs bytes 16..32"),
    ("binary-extra-bytes", "POST", "/v2/models/add/infer", _binary({"inputs": _BIN_IN}, b"\0" * 40), 400,
     "declare 32 bytes of binary data but the body carries 40"),
    ("binary-without-header", "POST", "/v2/models/add/infer",
     {"content": json.dumps({"inputs": _BIN_IN}).encode(), "headers": {}}, 400,
     "no Inference-Header-Content-Length header"),
    ("body-over-limit", "POST", "/v2/models/add/infer", {"content": b"x" * ((1 << 20) + 1), "headers": {}}, 413,
     "the limit is 1048576 bytes"),
    ("chunked-over-limit", "POST", "/v2/models/add/infer", {"content": iter([b"x" * (1 << 19)] * 3), "headers": {}},
     413, "exceeds the limit of 1048576 bytes"),
    ("get-on-infer", "GET", "/v2/models/add/infer", {}, 405, "Method Not Allowed: GET /v2/models/add/infer"),
    ("unknown-route", "GET", "/v3/whatever", {}, 404, "Not Found: GET /v3/whatever"),
    ("metadata-unknown-version", "GET", "/v2/models/add/versions/feedface", {}, 404, "unknown version 'feedface'"),
]


@pytest.mark.parametrize("method,path,kw,status,words", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_requests_get_a_4xx_naming_the_problem(server, method, path, kw, status, words):
    r = httpx.request(method, server.url + path, timeout=30.0, **kw)
    assert r.status_code == status, r.text
    assert words in r.json()["error"], r.json()["error"]
    assert r.headers["x-tileship-release"] == server.service.holder.current.release_id
    ok = post(server, "/v2/models/add/infer", **_json([_a([4]), _GOOD_B]))  # and the server still serves
    assert ok.status_code == 200 and ok.json()["outputs"][0]["data"] == [2.0] * 4


def test_metrics_report_requests_fallbacks_load_and_zero_compiles(server, cpu_release_build):
    post(server, "/v2/models/add/infer", **_json([_a([4]), _GOOD_B]))
    post(server, "/v2/models/add/infer", **_json([_a([4], dt="FP64"), _a([4], dt="FP64", name="B")]))
    text = httpx.get(server.url + "/metrics").text
    rid = cpu_release_build.release_id
    assert metric(text, "tileship_requests_total", model="add", version=rid, path="kernel", code="200") >= 1
    assert metric(text, "tileship_requests_total", model="add", version=rid, path="none", code="400") >= 1
    assert metric(text, "tileship_request_seconds_count", model="add", version=rid, path="kernel") >= 1
    assert metric(text, "tileship_request_seconds_bucket", model="add", version=rid, path="kernel", le="+Inf") >= 1
    assert metric(text, "tileship_release_load_seconds") > 0 and metric(text, "tileship_release_warmup_seconds") > 0
    assert metric(text, "tileship_serve_compile_attempts") == 0
    assert metric(text, "tileship_ready") == 1
    lock_digest = server.service.holder.current.release.lock_digest
    assert metric(text, "tileship_release_info", release_id=rid, lock_digest=lock_digest, device="cpu") == 1
    assert f'kernel_revision="{server.service.holder.current.release.kernel_revision}"' in text
    assert metric(text, "tileship_release_load_failures_total", stage="load") == 0
    assert httpx.get(server.url + "/metrics").headers["content-type"].startswith("text/plain")


def test_docs_example_runs(server, capsys):
    text = (Path(__file__).parents[1] / "docs" / "serving.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/serving.md", "exec"), {"URL": f"127.0.0.1:{server.port}"})
    printed = capsys.readouterr().out.split()
    assert printed[0] == server.service.holder.current.release_id and printed[2:] == ["kernel", "kernel"]


def test_strict_shapes_refuse_undeclared_shapes(cpu_release_build, tmp_path):
    cfg = ServeConfig(source=cpu_release_build.path, strict_shapes=True, diagnostics_dir=tmp_path,
                      log_stream=io.StringIO())
    with serving(cfg) as srv:
        body = _json([_a([3, 100], name="X"), _a([100], name="W")])
        r = post(srv, "/v2/models/rmsnorm_cpu/infer", **body)
        assert r.status_code == 400
        assert (
            "shape outside the declared set: M=3, N=100 (declared: M=64,N=256; M=1..4096,N=1024)" in r.json()["error"]
        )
        assert post(srv, "/v2/models/rmsnorm_cpu/infer",
                    **_json([_a([3, 1024], name="X"), _a([1024], name="W")])).status_code == 200


def test_ready_only_after_load_and_one_warm_call_per_kernel(cpu_release_build, tmp_path):
    from tileship.runtime.loader import load

    gate = threading.Event()
    calls: dict[str, int] = {}

    def slow_counting_load(path: Path, reference_only: bool) -> Release:
        gate.wait(30)
        rel = load(path, reference_only=reference_only)
        for runner in rel.ops.values():
            for e in runner.entries:
                if e.kernel is not None:
                    def counted(*a: Any, _k: Any = e.kernel, _id: str = e.spec.id) -> Any:
                        calls[_id] = calls.get(_id, 0) + 1
                        return _k(*a)
                    e.kernel = counted
        return rel

    cfg = ServeConfig(source=cpu_release_build.path, loader=slow_counting_load, diagnostics_dir=tmp_path,
                      log_stream=io.StringIO())
    with serving(cfg, ready=False) as srv:
        assert httpx.get(srv.url + "/v2/health/live").status_code == 200
        r = httpx.get(srv.url + "/v2/health/ready")
        assert r.status_code == 503 and r.json()["ready"] is False and "loading and warming" in r.json()["reason"]
        r = post(srv, "/v2/models/add/infer", **_json([_a([4]), _GOOD_B]))
        assert r.status_code == 503 and "not ready" in r.json()["error"] and r.headers["retry-after"] == "1"
        assert "tileship_ready 0.0" in httpx.get(srv.url + "/metrics").text
        gate.set()
        assert srv.wait_ready()
        r = httpx.get(srv.url + "/v2/health/ready")
        assert (
            r.status_code == 200
            and r.json()["ready"] is True
            and r.json()["reason"] == "ready: 4 kernel specializations loaded and warmed"
        )
        specs = {e.spec.id for rn in srv.service.holder.current.release.ops.values() for e in rn.entries}
        assert calls == {s: 1 for s in specs}, "warm-up must call each kernel specialization exactly once before ready"


def test_failed_startup_load_is_live_not_ready_and_names_the_file(cpu_release, tmp_path):
    victim = next((cpu_release / "specs").iterdir()) / "device_kernel.cu"
    victim.write_text(victim.read_text() + "// tampered\n")
    cfg = ServeConfig(source=cpu_release, diagnostics_dir=tmp_path, log_stream=io.StringIO())
    with serving(cfg, ready=False) as srv:
        assert not srv.wait_ready(60)
        assert httpx.get(srv.url + "/v2/health/live").status_code == 200
        r = httpx.get(srv.url + "/v2/health/ready")
        assert r.status_code == 503 and "device_kernel.cu" in r.json()["reason"] and r.json()["state"] == "failed"
        idx = post(srv, "/v2/repository/index").json()
        assert idx[0]["state"] == "UNAVAILABLE" and "device_kernel.cu" in idx[0]["reason"]
        assert metric(httpx.get(srv.url + "/metrics").text, "tileship_release_load_failures_total", stage="load") == 1


@pytest.mark.parametrize("policy", ["fallback", "strict"])
def test_blocking_drift_readiness_follows_the_policy(cpu_release, tmp_path, policy):
    lock = read_lock(cpu_release / "tileship.lock")
    lock["backend"]["tilelang"] = "0.0.1"
    write_lock(lock, cpu_release / "tileship.lock")
    bundle.write_manifest(cpu_release)
    cfg = ServeConfig(source=cpu_release, drift_policy=policy, diagnostics_dir=tmp_path, log_stream=io.StringIO())
    with serving(cfg, ready=False) as srv:
        srv.wait_ready(60)
        r = httpx.get(srv.url + "/v2/health/ready")
        if policy == "strict":
            assert (
                r.status_code == 503
                and "blocking drift" in r.json()["reason"]
                and "backend.tilelang" in r.json()["reason"]
            )
            return
        assert r.status_code == 200 and r.json()["reason"].startswith("ready: blocking drift (backend.tilelang)")
        res = post(srv, "/v2/models/add/infer", **_json([_a([4]), _GOOD_B]))
        assert (res.headers["x-tileship-path"], res.headers["x-tileship-reason"]) == ("reference", "drift")
        assert res.json()["outputs"][0]["data"] == [2.0] * 4


def test_fp16_and_bf16_tensors(tmp_path):
    path, rel = fake_release(tmp_path, "fake16", {"twice": lambda x: x * 2}, dtypes=("float16", "bfloat16"))
    with serving(fake_config(tmp_path, {"fake16": rel}, path)) as srv:
        c = client(srv)
        try:
            x = np.linspace(-3, 3, 37).astype(np.float16)
            for binary in (True, False):
                res = infer(c, "twice", {"X": x}, binary=binary, out="Y")
                assert res.as_numpy("Y").dtype == np.float16 and np.array_equal(res.as_numpy("Y"), x * 2)
            import ml_dtypes

            xb = np.linspace(-3, 3, 37).astype(ml_dtypes.bfloat16)
            res = infer(c, "twice", {"X": xb}, binary=True, out="Y")
            assert res.get_output("Y")["datatype"] == "BF16"
            assert np.array_equal(res.as_numpy("Y").astype(np.float32), xb.astype(np.float32) * 2)
            with pytest.raises(InferenceServerException) as e:
                infer(c, "twice", {"X": x.astype(np.float32)}, binary=True, out="Y")
            assert e.value.status() == "400" and "accepts FP16, BF16" in e.value.message()
        finally:
            c.close()


def test_overload_is_503_and_a_slow_call_is_504(tmp_path):
    def slow(x: torch.Tensor) -> torch.Tensor:
        time.sleep(float(x[0]))
        return x

    path, rel = fake_release(tmp_path, "slow", {"slow": slow})
    cfg = fake_config(tmp_path, {"slow": rel}, path, max_inflight=2, request_timeout_s=2.0)
    with serving(cfg) as srv:
        results: list[httpx.Response] = []
        body = _json([{"name": "X", "shape": [1], "datatype": "FP32", "data": [0.6]}])

        def call() -> None:
            results.append(post(srv, "/v2/models/slow/infer", **body))

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
            time.sleep(0.02)
        for t in threads:
            t.join()
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 200, 503, 503, 503, 503], [r.text for r in results]
        busy = next(r for r in results if r.status_code == 503)
        assert (
            "overloaded: 2 requests in flight (limit 2)" in busy.json()["error"] and busy.headers["retry-after"] == "1"
        )
        r = post(srv, "/v2/models/slow/infer", **_json([{"name": "X", "shape": [1], "datatype": "FP32",
                                                         "data": [3.0]}]))
        assert r.status_code == 504 and "did not finish within 2 s" in r.json()["error"]
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "tileship_rejected_total", reason="overloaded") == 4 and metric(text,
                                                                                            "tileship_rejected_total",
                                                                                            reason="timeout") == 1


def test_slow_body_is_408(tmp_path):
    path, rel = fake_release(tmp_path, "f", {"twice": lambda x: x * 2})
    with serving(fake_config(tmp_path, {"f": rel}, path, body_timeout_s=0.5)) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST /v2/models/twice/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"inputs\":")
            reply = b""
            while b"received)" not in reply:  # the status line and the body may come in separate segments
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
        reply = reply.decode()
        assert reply.startswith("HTTP/1.1 408") and "did not arrive within 0.5 s (10 of 100 bytes received)" in reply


def test_sticky_device_error_turns_unready_and_exits_nonzero(tmp_path):
    def poisoned(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    path, rel = fake_release(tmp_path, "bad", {"boom": poisoned})
    cfg = fake_config(tmp_path, {"bad": rel}, path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen: dict[str, Any] = {}

    def poke() -> None:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        seen["infer"] = httpx.post(base + "/v2/models/boom/infer",
                                   **_json([{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]))
        with contextlib.suppress(httpx.TransportError):
            seen["ready"] = httpx.get(base + "/v2/health/ready")

    t = threading.Thread(target=poke)
    t.start()
    code = run(cfg, port=port, graceful_s=2)  # foreground, as `tileship serve` runs
    t.join()
    assert code == EXIT_FATAL
    assert seen["infer"].status_code == 503 and "illegal memory access" in seen["infer"].json()["error"]
    if "ready" in seen:  # answered before the listener closed
        assert seen["ready"].status_code == 503 and "poisoned" in seen["ready"].json()["reason"]
    events = [x["event"] for x in log_lines(cfg.log_stream)]
    assert "fatal" in events


def test_in_flight_requests_finish_on_the_old_release(tmp_path):
    def slow_twice(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.5)
        return x * 2

    a_path, a = fake_release(tmp_path, "rel_a", {"op": slow_twice})
    b_path, b = fake_release(tmp_path, "rel_b", {"op": lambda x: x * 2})
    link = tmp_path / "current"
    point(link, a_path)
    with serving(fake_config(tmp_path, {"rel_a": a, "rel_b": b}, link)) as srv:
        slow: dict[str, httpx.Response] = {}
        body = _json([{"name": "X", "shape": [2], "datatype": "FP32", "data": [1, 2]}])
        t = threading.Thread(target=lambda: slow.update(r=post(srv, "/v2/models/op/infer", **body)))
        t.start()
        time.sleep(0.15)
        point(link, b_path)
        swap = post(srv, "/v2/repository/reload")
        assert swap.status_code == 200 and swap.json()["result"] == "swapped" and swap.json()["previous"] == "rel_a"
        fresh = post(srv, "/v2/models/op/infer", **body)
        t.join()
        assert fresh.headers["x-tileship-release"] == "rel_b"
        assert slow["r"].status_code == 200 and slow["r"].headers["x-tileship-release"] == "rel_a"
        assert slow["r"].json()["model_version"] == "rel_a" and slow["r"].json()["outputs"][0]["data"] == [2, 4]
        again = post(srv, "/v2/repository/reload")
        assert again.status_code == 200 and again.json()["result"] == "unchanged"


def test_hot_swap_under_load_drops_nothing_and_a_bad_release_keeps_the_old(cpu_release_build, tmp_path):
    a = copy_release(cpu_release_build.path, tmp_path / "a")
    b = copy_release(cpu_release_build.path, tmp_path / "b", version="2")
    bad = copy_release(cpu_release_build.path, tmp_path / "bad", version="3")
    (bad / "release.json").write_text((bad / "release.json").read_text() + " ")
    id_a, id_b = bundle.read_manifest(a)["release_id"], bundle.read_manifest(b)["release_id"]
    assert id_a != id_b
    link = tmp_path / "current"
    point(link, a)
    logs = io.StringIO()
    cfg = ServeConfig(source=link, diagnostics_dir=tmp_path / "diag", log_stream=logs)
    with serving(cfg) as srv:
        stop = threading.Event()
        records: list[tuple[float, str]] = []
        failures: list[str] = []

        def load(seed: int) -> None:
            c = client(srv)
            rng = np.random.default_rng(seed)
            try:
                while not stop.is_set():
                    x, y = rng.standard_normal(257).astype(np.float32), rng.standard_normal(257).astype(np.float32)
                    sent = time.monotonic()
                    try:
                        res = infer(c, "add", {"A": x, "B": y}, binary=True, out="C")
                        if not np.allclose(res.as_numpy("C"), x + y, atol=1e-6):
                            failures.append("wrong values")
                        records.append((sent, res.get_response()["parameters"]["tileship_release"]))
                    except Exception as exc:
                        failures.append(repr(exc))
            finally:
                c.close()

        threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.7)
        point(link, b)
        r = post(srv, "/v2/repository/reload")
        swapped_at = time.monotonic()
        assert r.status_code == 200 and (r.json()["result"], r.json()["release"],
                                         r.json()["previous"]) == ("swapped", id_b, id_a)
        time.sleep(0.7)
        point(link, bad)
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 409 and r.json()["serving"] == id_b and "release.json" in r.json()["error"]
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join()
        assert not failures, failures[:5]
        assert {rid for _, rid in records} == {id_a, id_b}
        late = [rid for sent, rid in records if sent > swapped_at]
        assert late and set(late) == {id_b}, "a request sent after the swap was answered by the old release"
        ready = httpx.get(srv.url + "/v2/health/ready").json()
        assert ready["ready"] and ready["release"] == id_b and "release.json" in ready["last_failure"]["error"]
        idx = post(srv, "/v2/repository/index").json()
        assert {(x["name"], x["version"], x["state"]) for x in idx if x["name"] != "*"} == {
            ("add", id_b, "READY"),
            ("rmsnorm_cpu", id_b, "READY"),
        }
        assert all("last reload from" in x["reason"] for x in idx if x["name"] != "*")
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "tileship_reloads_total",
                      result="swapped") == 2 and metric(text, "tileship_reloads_total", result="failed") == 1
        assert metric(text, "tileship_release_info", release_id=id_b) == 1
        assert [x["event"] for x in log_lines(logs) if x["event"] in ("ready", "swap", "load_failed")] == [
            "ready",
            "swap",
            "load_failed",
        ]


def test_a_release_whose_warm_up_fails_is_not_swapped_in(cpu_release_build, tmp_path):
    from tileship.runtime.loader import load

    a = copy_release(cpu_release_build.path, tmp_path / "a")
    b = copy_release(cpu_release_build.path, tmp_path / "b", version="2")

    def load_b_broken(path: Path, reference_only: bool) -> Release:
        rel = load(path, reference_only=reference_only)
        if Path(path).resolve() == b.resolve():
            entry = rel.ops["add"].entries[0]
            entry.kernel = lambda x, y: torch.full_like(x, float("nan"))
        return rel

    link = tmp_path / "current"
    point(link, a)
    with serving(ServeConfig(source=link, loader=load_b_broken, diagnostics_dir=tmp_path / "d",
                             log_stream=io.StringIO())) as srv:
        id_a = srv.service.holder.current.release_id
        point(link, b)
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 409 and r.json()["stage"] == "warmup" and "non-finite output" in r.json()["error"]
        assert srv.service.holder.current.release_id == id_a
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "tileship_warmup_failures_total", model="add") == 1
        assert metric(text, "tileship_release_load_failures_total", stage="warmup") == 1


def test_a_kernel_failing_at_serve_time_is_answered_by_the_reference_and_counted(cpu_release_build, tmp_path):
    from tileship.runtime.loader import load

    def load_flaky(path: Path, reference_only: bool) -> Release:
        rel = load(path, reference_only=reference_only)
        entry = next(e for e in rel.ops["add"].entries if e.spec.dynamic_dim)
        real, calls = entry.kernel, []

        def flaky(*args: Any) -> Any:  # fine for the warm-up call, then raises
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("deliberate kernel fault")
            return real(*args)

        entry.kernel = flaky
        return rel

    logs = io.StringIO()
    with serving(ServeConfig(source=cpu_release_build.path, loader=load_flaky, diagnostics_dir=tmp_path / "d",
                             log_stream=logs)) as srv:
        r = post(srv, "/v2/models/add/infer", **_json([_a([5], data=[1, 2, 3, 4, 5]), _a([5], data=[1] * 5, name="B")]))
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 3, 4, 5, 6]
        assert (r.headers["x-tileship-path"], r.headers["x-tileship-reason"]) == ("reference", "circuit_open")
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "tileship_circuit_open_total", model="add") == 1
        assert metric(text, "tileship_fallbacks_total", model="add", reason="circuit_open") == 1
        line = next(x for x in log_lines(logs) if x["event"] == "circuit_open")
        assert "deliberate kernel fault" in line["detail"] and line["spec"].startswith("add.float32.N1-")


def test_serving_a_registry_follows_activation_and_reference_only(cpu_release_build, tmp_path):
    from tileship.release.registry import Registry

    b = copy_release(cpu_release_build.path, tmp_path / "b", version="2")
    reg = Registry(tmp_path / "registry")
    id_a = reg.publish(cpu_release_build.path)
    id_b = reg.publish(b)
    reg.activate(id_a)
    with serving(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=io.StringIO())) as srv:
        assert srv.service.holder.current.release_id == id_a
        reg.activate(id_b)
        assert post(srv, "/v2/repository/models/add/load").json()["release"] == id_b
        reg.activate_reference()
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["reference_only"] is True
        ready = httpx.get(srv.url + "/v2/health/ready").json()
        assert (
            ready["ready"] and ready["reference_only"] and ready["reason"].startswith("ready: reference-only by policy")
        )
        res = post(srv, "/v2/models/add/infer", **_json([_a([4]), _GOOD_B]))
        assert (res.headers["x-tileship-path"], res.headers["x-tileship-reason"]) == ("reference", "disabled_by_policy")


def test_a_replaced_copy_of_the_active_release_is_loaded_on_reload(cpu_release_build, tmp_path):
    """``publish --replace`` of the active id (new evidence, same release id) makes a new copy
    (``<id>@1``): a reload loads it, rather than answer "unchanged" for the same id (found by a probe).
    Its new evidence is used once the release is activated again, which re-pins it (docs/releases.md,
    "Evidence freshness"); until then the copy serves on the reference."""
    from tileship.build.lock import lock_digest, read_lock
    from tileship.release import evidence
    from tileship.release.registry import Registry

    reg = Registry(tmp_path / "registry")
    rid = reg.publish(cpu_release_build.path)
    reg.activate(rid)
    with serving(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=io.StringIO())) as srv:
        before = post(srv, "/v2/models/add/infer", **_json([_a([4]), _GOOD_B]))
        assert before.headers["x-tileship-path"] == "kernel", before.headers
        failed = tmp_path / "failed" / rid
        shutil.copytree(cpu_release_build.path, failed)
        spec = before.headers["x-tileship-spec"]
        evidence.write(failed, {"schema": 1, "release_id": rid,
                                "lock_digest": lock_digest(read_lock(failed / "tileship.lock")),
                                "specializations": {spec: {"passed": False, "failure": "a failed check"}}})
        reg.publish(failed, replace=True)
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["result"] == "swapped", r.text
        waiting = post(srv, "/v2/models/add/infer", **_json([_a([4]), _GOOD_B]))  # not the evidence pinned
        assert (waiting.headers["x-tileship-path"], waiting.headers["x-tileship-reason"]) == ("reference", "unverified")
        reg.activate(rid)  # the deliberate step: the new evidence is pinned
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["result"] == "swapped", r.text
        after = post(srv, "/v2/models/add/infer", **_json([_a([4]), _GOOD_B]))
        assert (after.headers["x-tileship-path"], after.headers["x-tileship-reason"]) == ("reference",
                                                                                        "verification_failed")
        assert post(srv, "/v2/repository/reload").json()["result"] == "unchanged"


def test_cli_serves_reloads_on_sighup_and_stops_on_sigterm(cpu_release_build, tmp_path):
    b = copy_release(cpu_release_build.path, tmp_path / "b", version="2")
    id_b = bundle.read_manifest(b)["release_id"]
    link = tmp_path / "current"
    point(link, cpu_release_build.path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TILESHIP_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-c", "from tileship.cli import main; main()", "serve", str(link),
                             "--port", str(port)],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(base + "/v2/health/ready").status_code == 200:
                    break
            assert time.monotonic() < deadline, "not ready within 120 s"
            time.sleep(0.1)
        assert httpx.get(base + "/v2/health/ready").json()["release"] == cpu_release_build.release_id
        point(link, b)
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while httpx.get(base + "/v2/health/ready").json().get("release") != id_b:
            assert time.monotonic() < deadline, "SIGHUP did not swap the release"
            time.sleep(0.05)
        r = httpx.post(base + "/v2/models/add/infer", **_json([_a([4]), _GOOD_B]))
        assert r.status_code == 200 and r.headers["x-tileship-release"] == id_b
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    events = [json.loads(line)["event"] for line in err.splitlines() if line.strip()]  # every stderr line is JSON
    assert events[0] == "start" and "ready" in events and "swap" in events and events[-1] == "stop"
