"""The Triton extensions of `tileship serve` (issue 15, item 5): statistics, model configuration,
repository unload/load, checked with tritonclient.http against servers on 127.0.0.1."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from test_serve import client, copy_release, fake_config, fake_release, infer, point, post, serving
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer, ServeConfig
from tileship.serve.extensions import EXTENSIONS

BUCKETS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@pytest.fixture(scope="module")
def server(cpu_release_build, tmp_path_factory) -> Iterator[BackgroundServer]:
    cfg = ServeConfig(source=cpu_release_build.path, diagnostics_dir=tmp_path_factory.mktemp("diag"),
                      log_stream=io.StringIO())
    with serving(cfg) as srv:
        yield srv


@pytest.fixture
def c(server) -> Iterator[triton.InferenceServerClient]:
    cl = client(server)
    yield cl
    cl.close()


def _add(cl: triton.InferenceServerClient, n: int = 8) -> triton.InferResult:
    a = np.arange(n, dtype=np.float32)
    return infer(cl, "add", {"A": a, "B": a}, binary=True, out="C")


def _stat(cl: triton.InferenceServerClient, model: str, version: str = "") -> dict:
    rows = cl.get_inference_statistics(model, version)["model_stats"]
    assert len(rows) == 1, rows
    return rows[0]


def test_server_metadata_claims_the_extensions(c):
    ext = c.get_server_metadata()["extensions"]
    assert ext == EXTENSIONS
    assert {"statistics", "model_configuration", "model_repository"} <= set(ext)


def test_statistics_count_successes_failures_and_times(server, c, cpu_release_build):
    rid = cpu_release_build.release_id
    before = _stat(c, "add")
    assert before["name"] == "add" and before["version"] == rid
    assert set(before["inference_stats"]) >= set(BUCKETS)
    t0 = int(time.time() * 1000)
    for _ in range(3):
        _add(c)
    bad = {"inputs": [{"name": "A", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]},
                      {"name": "B", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    r = post(server, "/v2/models/add/infer", json=bad)
    assert r.status_code == 400, r.text
    after = _stat(c, "add", rid)
    s0, s1 = before["inference_stats"], after["inference_stats"]
    assert after["inference_count"] == before["inference_count"] + 3
    assert after["execution_count"] == before["execution_count"] + 3
    assert s1["success"]["count"] == s0["success"]["count"] + 3
    assert s1["fail"]["count"] == s0["fail"]["count"] + 1
    assert s1["fail"]["ns"] > s0["fail"]["ns"]
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert s1[k]["count"] == s0[k]["count"] + 3, k
    assert s1["compute_infer"]["ns"] > s0["compute_infer"]["ns"]
    # the parts lie inside the whole: summed per-bucket time never exceeds the requests' total
    parts = sum(s1[k]["ns"] - s0[k]["ns"] for k in ("queue", "compute_input", "compute_infer", "compute_output"))
    assert 0 < parts <= s1["success"]["ns"] - s0["success"]["ns"]
    assert t0 - 1000 <= after["last_inference"] <= int(time.time() * 1000) + 1000
    # the other model did not move; /v2/models/stats lists every model (and is not read as a model named "stats")
    every = {row["name"]: row for row in c.get_inference_statistics()["model_stats"]}
    assert set(every) == {"add", "rmsnorm_cpu"}
    assert every["add"]["inference_count"] == after["inference_count"]
    assert every["rmsnorm_cpu"]["inference_stats"]["fail"]["count"] == 0


def test_statistics_of_unknown_models_and_versions_are_404(c):
    with pytest.raises(InferenceServerException) as e:
        c.get_inference_statistics("gemm")
    assert (
        e.value.status() == "404"
        and "unknown model 'gemm'" in e.value.message()
        and "add, rmsnorm_cpu" in e.value.message()
    )
    with pytest.raises(InferenceServerException) as e:
        c.get_inference_statistics("add", "0123456789abcdef")
    assert e.value.status() == "404" and "unknown version" in e.value.message()


def test_config_follows_the_declaration(server, c, cpu_release_build):
    rel = server.service.holder.current.release
    for name in ("add", "rmsnorm_cpu"):
        cfg = c.get_model_config(name, cpu_release_build.release_id)
        decl = rel.declarations[name]
        assert cfg["name"] == name and cfg["backend"] == "tileship" and cfg["platform"] == "tileship"
        assert cfg["max_batch_size"] == 0 and cfg["version_policy"] == {"latest": {"num_versions": 1}}
        assert [i["name"] for i in cfg["input"]] == [n for n, _ in decl["inputs"]]
        assert [o["name"] for o in cfg["output"]] == [n for n, _ in decl["outputs"]]
        assert {t["data_type"] for t in cfg["input"] + cfg["output"]} == {"TYPE_FP32"}
        assert cfg["parameters"]["release"]["string_value"] == cpu_release_build.release_id
    rms = c.get_model_config("rmsnorm_cpu")
    # M varies (1..4096), N is 1024 in the range and other values in the static shapes: both -1
    assert [(i["name"], i["dims"]) for i in rms["input"]] == [("X", [-1, -1]), ("W", [-1])]
    assert rms["output"][0]["dims"] == [-1, -1]
    assert "M=1..4096,N=1024" in rms["parameters"]["declared_shapes"]["string_value"]
    with pytest.raises(InferenceServerException) as e:
        c.get_model_config("gemm")
    assert e.value.status() == "404" and "unknown model 'gemm'" in e.value.message()


def test_config_of_fp16_and_static_dims(tmp_path):
    path, rel = fake_release(tmp_path, "r-fp16", {"neg": lambda x: -x}, dtypes=("float16", "float32"))
    rel.declarations["neg"] = {**rel.declarations["neg"], "shapes": [{"N": 64}], "ranges": []}
    with serving(fake_config(tmp_path, {"r-fp16": rel}, path)) as srv:
        cl = client(srv)
        try:
            cfg = cl.get_model_config("neg")
        finally:
            cl.close()
    assert cfg["input"] == [{"name": "X", "data_type": "TYPE_FP16", "dims": [64], "format": "FORMAT_NONE",
                             "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False}]
    assert cfg["output"][0]["data_type"] == "TYPE_FP16" and cfg["output"][0]["dims"] == [64]
    assert cfg["parameters"]["datatypes"]["string_value"] == "FP16,FP32"


def test_unload_refuses_inference_until_load(cpu_release_build, tmp_path):
    cfg = ServeConfig(source=cpu_release_build.path, diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO())
    with serving(cfg) as srv:
        cl = client(srv)
        try:
            assert _add(cl).as_numpy("C")[3] == 6
            cl.unload_model("add")
            assert not cl.is_model_ready("add") and cl.is_model_ready("rmsnorm_cpu") and cl.is_server_ready()
            with pytest.raises(InferenceServerException) as e:
                _add(cl)
            assert e.value.status() == "404"  # as Triton: no version of the model is available
            assert (
                "model add is unloaded" in e.value.message() and "/v2/repository/models/add/load" in e.value.message()
            )
            r = httpx.get(srv.url + "/v2/models/add/ready")
            assert r.status_code == 503 and r.json()["ready"] is False and "unloaded" in r.json()["reason"]
            ready = httpx.get(srv.url + "/v2/health/ready").json()
            assert ready["ready"] is True and ready["unloaded"] == ["add"]
            rows = {row["name"]: row for row in cl.get_model_repository_index()}
            assert (rows["add"]["state"], rows["add"]["reason"]) == ("UNAVAILABLE", "unloaded")
            assert rows["rmsnorm_cpu"]["state"] == "READY"
            with pytest.raises(InferenceServerException) as e:
                _stat(cl, "add")  # as its metadata: no version available (the counters are kept, below)
            assert e.value.status() == "404" and "unloaded" in e.value.message()
            # unknown names: a 404 naming the model, for unload and load alike
            for call in (cl.unload_model, cl.load_model):
                with pytest.raises(InferenceServerException) as e:
                    call("nope")
                assert e.value.status() == "404" and "unknown model 'nope'" in e.value.message()
            with pytest.raises(InferenceServerException) as e:
                cl.load_model("add", config='{"max_batch_size": 8}')
            assert e.value.status() == "400" and "not supported" in e.value.message()
            assert not cl.is_model_ready("add")
            cl.load_model("add")
            assert cl.is_model_ready("add")
            assert _add(cl).as_numpy("C")[3] == 6
            assert "unloaded" not in httpx.get(srv.url + "/v2/health/ready").json()
            st = _stat(cl, "add")
            assert st["inference_count"] == 2 and st["inference_stats"]["fail"]["count"] == 1
        finally:
            cl.close()


def test_unload_and_extensions_while_not_ready_are_clear_errors(tmp_path):
    cfg = ServeConfig(source=tmp_path / "missing", diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO())
    with serving(cfg, ready=False) as srv:
        deadline = time.monotonic() + 30
        while srv.service.holder.state == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        for method, path in (("POST", "/v2/repository/models/add/unload"), ("GET", "/v2/models/stats"),
                             ("GET", "/v2/models/add/config"), ("GET", "/v2/models/add/stats")):
            r = httpx.request(method, srv.url + path, timeout=30.0)
            assert r.status_code == 503 and r.json()["error"].startswith("not ready: "), (path, r.text)


def test_unload_survives_a_hot_swap_and_stats_follow_the_version(cpu_release_build, tmp_path):
    a = copy_release(cpu_release_build.path, tmp_path / "a")
    b = copy_release(cpu_release_build.path, tmp_path / "b", version="2")
    link = tmp_path / "current"
    point(link, a)
    cfg = ServeConfig(source=link, diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO())
    with serving(cfg) as srv:
        cl = client(srv)
        try:
            id_a = srv.service.holder.current.release_id
            _add(cl)
            cl.unload_model("add")
            point(link, b)
            swap = post(srv, "/v2/repository/reload").json()
            assert swap["result"] == "swapped" and swap["previous"] == id_a
            id_b = swap["release"]
            assert not cl.is_model_ready("add") and cl.is_model_ready("rmsnorm_cpu")
            with pytest.raises(InferenceServerException) as e:
                _add(cl)
            assert e.value.status() == "404" and "unloaded" in e.value.message()
            cl.load_model("add")
            _add(cl)
            st = _stat(cl, "add")
            assert st["version"] == id_b and st["inference_count"] == 1 and st["inference_stats"]["fail"]["count"] == 1
            assert cl.get_model_config("add")["parameters"]["release"]["string_value"] == id_b
            with pytest.raises(InferenceServerException) as e:
                cl.get_inference_statistics("add", id_a)
            assert e.value.status() == "404"
        finally:
            cl.close()


@pytest.mark.parametrize("body,words", [
    (b'{"parameters": {"unload_dependents": "yes"}}', "unload_dependents must be true or false, not 'yes'"),
    (b'{"parameters": {"unload_dependents": 1}}', "unload_dependents must be true or false, not 1"),
    (b'{"parameters": {"unload_dependents": null}}', "unload_dependents must be true or false, not None"),
    (b'{"parameters": {"unload_dependents": false, "unload_dependents": true}}',
     "key 'unload_dependents' appears twice in one object"),
    (b'{"parameters": {}, "parameters": {"unload_dependents": true}}', "key 'parameters' appears twice"),
], ids=["str", "int", "null", "key-twice", "parameters-twice"])
def test_an_unload_body_that_is_wrong_is_a_400_naming_the_key_and_unloads_nothing(tmp_path, body, words):
    from tests.test_serve_limits import hostile_server

    with hostile_server(tmp_path) as srv:
        r = httpx.post(srv.url + "/v2/repository/models/add/unload", content=body, timeout=30.0,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and words in r.json()["error"], r.text
        assert httpx.get(srv.url + "/v2/models/add/ready", timeout=30.0).status_code == 200
        r = httpx.post(srv.url + "/v2/repository/models/add/unload", timeout=30.0,
                       json={"parameters": {"unload_dependents": True}})
        assert r.status_code == 200 and r.json() == {}, r.text
        assert httpx.get(srv.url + "/v2/models/add/ready", timeout=30.0).status_code == 503
