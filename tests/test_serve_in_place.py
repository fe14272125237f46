"""Operators that update inputs in place (``Operator.mutates``) over the server: each mutated input comes back, after
the call, as an output named like the input, declared outputs first (``serve.in_place``), over REST (JSON and
binary), gRPC, in process and with ``--workers 1``; requested outputs, shared memory and model metadata know those
names; their bytes count against ``--max-output-mib`` and the gRPC message, and an output the declaration could not
size before the call is counted after it.

Was: ``"outputs": []`` for ``clip_`` (the server updated its own copy of the inputs and dropped it), a request for
``X`` a 400 "unknown output", no bytes of them counted, and an output of an untold size never counted at all."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import shm_regions
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

pytest.importorskip("tilelang")

from tileship.build.builder import BuildOptions, build  # noqa: E402
from tileship.declare.project import Project, load_operators  # noqa: E402
from tileship.serve import BackgroundServer, ServeConfig  # noqa: E402
from tileship.serve.validate import RequestLimits  # noqa: E402

TESTS = Path(__file__).parent
X = np.array([-3.0, 0.5, 2.0, -0.2, 5.0], np.float32)
CLIPPED = np.clip(X, -1.0, 1.0)
HALVE = np.arange(1, 9, dtype=np.float32)  # N=8: S=[10, 26], X halved


@pytest.fixture(scope="module")
def release_path(tmp_path_factory) -> Path:
    proj = Project(model="inplace", model_version="1", operator_modules=("served_in_place_ops",), targets=("c",),
                   root=TESTS)
    import served_in_place_ops  # noqa: F401 (on sys.path: the project's root)

    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("inplace"), BuildOptions(jobs=2))
    assert res.ok, [(r.spec.id, r.error) for r in res.failed]
    return res.path


def _serve(path: Path, **kw: Any) -> Iterator[BackgroundServer]:
    from test_serve_workers import wait_workers

    srv = BackgroundServer(ServeConfig(source=path, grpc_port=0, log_stream=io.StringIO(), **kw)).start()
    try:
        assert srv.wait_ready(), srv.service.holder.readiness()[1]
        if kw.get("workers"):
            wait_workers(srv)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module", params=[0, 1], ids=["in_process", "workers1"])
def server(request, release_path) -> Iterator[BackgroundServer]:
    """gRPC answers past 100 000 bytes are refused (``test_the_grpc_message_bound_counts_the_mutated_inputs``)."""
    yield from _serve(release_path, workers=request.param, grpc_max_message_bytes=100_000)


@pytest.fixture(scope="module", params=[0, 1], ids=["in_process", "workers1"])
def small(request, release_path) -> Iterator[BackgroundServer]:
    """A server whose calls may answer at most 48 bytes (``--max-output-mib``, in bytes)."""
    yield from _serve(release_path, workers=request.param, limits=RequestLimits(max_output_bytes=48))


def _clip_http(binary: bool, outputs: list[str] | None = None) -> list[Any]:
    x = th.InferInput("X", [len(X)], "FP32")
    x.set_data_from_numpy(X, binary_data=binary)
    lo, hi = th.InferInput("lo", [1], "FP32"), th.InferInput("hi", [1], "FP32")
    lo.set_data_from_numpy(np.array([-1.0], np.float32), binary_data=binary)
    hi.set_data_from_numpy(np.array([1.0], np.float32), binary_data=binary)
    hits = th.InferInput("hits", [1], "INT32")
    hits.set_data_from_numpy(np.array([7], np.int32), binary_data=binary)
    return [x, lo, hi, hits]


def _clip_json(n: int = len(X)) -> dict[str, Any]:
    x = np.resize(X, n)
    return {"inputs": [{"name": "X", "datatype": "FP32", "shape": [n], "data": x.tolist()},
                       {"name": "lo", "datatype": "FP32", "shape": [1], "data": [-1.0]},
                       {"name": "hi", "datatype": "FP32", "shape": [1], "data": [1.0]},
                       {"name": "hits", "datatype": "INT32", "shape": [1], "data": [7]}]}


@pytest.mark.parametrize("transport", ["json", "binary", "grpc"])
def test_an_operator_with_no_outputs_answers_the_inputs_it_updated(server, transport):
    if transport == "json":
        r = httpx.post(f"{server.url}/v2/models/clip_/infer", json=_clip_json(), timeout=30)
        assert r.status_code == 200, r.text
        outs = r.json()["outputs"]
        assert [(o["name"], o["datatype"], o["shape"]) for o in outs] == [("X", "FP32", [5]), ("hits", "INT32", [1])]
        got = {o["name"]: np.array(o["data"]) for o in outs}
    elif transport == "binary":
        with th.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=30.0) as c:
            res = c.infer("clip_", _clip_http(True), outputs=[th.InferRequestedOutput("X", binary_data=True),
                                                              th.InferRequestedOutput("hits", binary_data=True)])
        assert [o["name"] for o in res.get_response()["outputs"]] == ["X", "hits"]
        got = {n: res.as_numpy(n) for n in ("X", "hits")}
    else:
        with tg.InferenceServerClient(server.grpc_url) as c:
            ins = [tg.InferInput("X", [len(X)], "FP32"), tg.InferInput("lo", [1], "FP32"),
                   tg.InferInput("hi", [1], "FP32"), tg.InferInput("hits", [1], "INT32")]
            for i, a in zip(ins, [X, np.array([-1.0], np.float32), np.array([1.0], np.float32),
                                  np.array([7], np.int32)], strict=True):
                i.set_data_from_numpy(a)
            res = c.infer("clip_", ins)
        assert [(o.name, o.datatype, list(o.shape)) for o in res.get_response().outputs] == [
            ("X", "FP32", [5]), ("hits", "INT32", [1])]
        got = {n: res.as_numpy(n) for n in ("X", "hits")}
    np.testing.assert_array_equal(got["X"].astype(np.float32), CLIPPED)
    assert got["hits"].tolist() == [10]  # 7 + the three elements clipped


def test_declared_outputs_come_first_then_the_inputs_updated_in_place(server):
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [8], "data": HALVE.tolist()}]}
    r = httpx.post(f"{server.url}/v2/models/halve_/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    outs = r.json()["outputs"]
    assert [(o["name"], o["shape"]) for o in outs] == [("S", [2]), ("X", [8])], outs
    assert outs[0]["data"] == [10.0, 26.0] and outs[1]["data"] == (HALVE / 2).tolist()
    assert r.json()["parameters"]["tileship_path"] == "kernel"


def test_requested_outputs_name_the_inputs_updated_in_place(server):
    """One of them alone, binary or not; an unknown name is still a 400 listing every output."""
    body = _clip_json() | {"outputs": [{"name": "hits"}]}
    r = httpx.post(f"{server.url}/v2/models/clip_/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert [(o["name"], o["data"]) for o in r.json()["outputs"]] == [("hits", [10])]
    with th.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=30.0) as c:
        res = c.infer("clip_", _clip_http(False), outputs=[th.InferRequestedOutput("X", binary_data=True)])
        assert [o["name"] for o in res.get_response()["outputs"]] == ["X"]
        np.testing.assert_array_equal(res.as_numpy("X"), CLIPPED)
    body = _clip_json() | {"outputs": [{"name": "nope"}]}
    r = httpx.post(f"{server.url}/v2/models/clip_/infer", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"] == "unknown output 'nope': model clip_ produces X, hits", r.text


@pytest.fixture
def regions() -> Iterator[shm_regions.Shm]:
    yield from shm_regions.regions("inplace")


def test_an_input_updated_in_place_can_be_answered_into_system_shared_memory(server, regions):
    with th.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=30.0) as c:
        try:
            h, name, key = regions.create(X.nbytes)
            c.register_system_shared_memory(name, key, X.nbytes)
            out = th.InferRequestedOutput("X", binary_data=True)
            out.set_shared_memory(name, X.nbytes)
            res = c.infer("clip_", _clip_http(True), outputs=[out, th.InferRequestedOutput("hits")])
            entry = res.get_output("X")
            assert entry["parameters"] == {"shared_memory_region": name, "shared_memory_byte_size": X.nbytes}, entry
            np.testing.assert_array_equal(shm.get_contents_as_numpy(h, np.float32, [len(X)]), CLIPPED)
            assert res.as_numpy("hits").tolist() == [10]
            wrong = th.InferRequestedOutput("X", binary_data=True)
            wrong.set_shared_memory(name, X.nbytes - 4)
            with pytest.raises(InferenceServerException, match="byte size mismatch: output X is 20 bytes"):
                c.infer("clip_", _clip_http(True), outputs=[wrong])
        finally:
            c.unregister_system_shared_memory()


def test_model_metadata_lists_the_inputs_updated_in_place_under_outputs(server):
    meta = httpx.get(f"{server.url}/v2/models/clip_", timeout=10).json()
    assert meta["outputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1]},
                               {"name": "hits", "datatype": "INT32", "shape": [1]}], meta
    meta = httpx.get(f"{server.url}/v2/models/halve_", timeout=10).json()
    assert [o["name"] for o in meta["outputs"]] == ["S", "X"], meta
    config = httpx.get(f"{server.url}/v2/models/clip_/config", timeout=10).json()
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("X", "TYPE_FP32", [-1]), ("hits", "TYPE_INT32", [1])], config["output"]
    with tg.InferenceServerClient(server.grpc_url) as c:
        g = c.get_model_metadata("clip_")
    assert [(o.name, o.datatype, list(o.shape)) for o in g.outputs] == [("X", "FP32", [-1]), ("hits", "INT32", [1])]


def test_the_grpc_message_bound_counts_the_inputs_updated_in_place(server):
    """10 000 float32 (outside clip_'s range: its reference) come back in the answer: 40 004 bytes with the message's
    64 KiB of room is past this server's 100 000, refused before the call. Was: run, answered with no outputs."""
    with tg.InferenceServerClient(server.grpc_url) as c:
        ins = [tg.InferInput("X", [10_000], "FP32"), tg.InferInput("lo", [1], "FP32"),
               tg.InferInput("hi", [1], "FP32"), tg.InferInput("hits", [1], "INT32")]
        for i, a in zip(ins, [np.resize(X, 10_000), np.array([-1.0], np.float32), np.array([1.0], np.float32),
                              np.array([7], np.int32)], strict=True):
            i.set_data_from_numpy(a)
        with pytest.raises(InferenceServerException, match="a gRPC message carries at most 100000 bytes") as exc:
            c.infer("clip_", ins)
        assert "X=40000, hits=4" in str(exc.value)
        assert c.infer("clip_", ins, outputs=[tg.InferRequestedOutput("hits")]).as_numpy("hits").tolist() == [
            7 + 6_000]  # only hits asked for: it fits


def test_the_inputs_updated_in_place_count_against_max_output_mib(small):
    """clip_ at N=12 answers 52 bytes (X 48, hits 4): past 48, refused before it runs; N=11 (48 bytes) runs."""
    r = httpx.post(f"{small.url}/v2/models/clip_/infer", json=_clip_json(12), timeout=30)
    assert r.status_code == 413, r.text
    assert r.json()["error"] == ("model clip_: this call would produce 52 bytes of outputs (X=48, hits=4); the limit "
                                 "is 48 bytes (--max-output-mib)")
    r = httpx.post(f"{small.url}/v2/models/clip_/infer", json=_clip_json(11), timeout=30)
    assert r.status_code == 200 and [o["name"] for o in r.json()["outputs"]] == ["X", "hits"], r.text


def test_an_output_sized_only_by_the_call_is_counted_after_it(small):
    """halve_ at N=10 (4 does not divide it: S's size cannot be told before the call, the reference answers 3 sums)
    produced 52 bytes (S 12, X 40) past the 48 allowed: a 413 naming them, where before the answer went out
    uncounted. N=8 (40 bytes) is answered."""
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [10], "data": list(range(10))}]}
    r = httpx.post(f"{small.url}/v2/models/halve_/infer", json=body, timeout=30)
    assert r.status_code == 413, r.text
    assert r.json()["error"].startswith("model halve_: this call produced 52 bytes of outputs (S=12, X=40); the limit "
                                        "is 48 bytes (--max-output-mib)"), r.text
    with tg.InferenceServerClient(small.grpc_url) as c:  # over gRPC: RESOURCE_EXHAUSTED, the same words
        x = tg.InferInput("X", [10], "FP32")
        x.set_data_from_numpy(np.arange(10, dtype=np.float32))
        with pytest.raises(InferenceServerException, match="this call produced 52 bytes of outputs") as exc:
            c.infer("halve_", [x])
        assert exc.value.status() == "StatusCode.RESOURCE_EXHAUSTED", exc.value
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [8], "data": HALVE.tolist()}]}
    r = httpx.post(f"{small.url}/v2/models/halve_/infer", json=body, timeout=30)
    assert r.status_code == 200 and [o["name"] for o in r.json()["outputs"]] == ["S", "X"], r.text


@pytest.mark.parametrize("n", [len(X), 1 << 18], ids=["small", "pooled_1MiB"])
def test_an_input_updated_in_place_is_never_written_into_its_shared_memory_region(server, regions, n):
    """Triton's input regions are read-only for the server: ``clip_`` updates X in place, yet the client's input
    region still holds X after the call (a client reusing it for its next request sends what it meant), and the
    answer holds the clipped X: in the response, or in the output region the request names for it. 1 MiB is
    copied into a pooled block (``serve.staging``), a smaller one into a fresh buffer."""
    x = np.resize(X, n)
    with th.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=30.0) as c:
        try:
            h, name, key = regions.create(x.nbytes + 8)
            shm.set_shared_memory_region(h, [x], offset=8)
            c.register_system_shared_memory(name, key, x.nbytes + 8)

            def inputs() -> list[Any]:
                ins = _clip_http(True)
                ins[0] = th.InferInput("X", [n], "FP32")
                ins[0].set_shared_memory(name, x.nbytes, offset=8)
                return ins

            res = c.infer("clip_", inputs(), outputs=[th.InferRequestedOutput("X", binary_data=True),
                                                      th.InferRequestedOutput("hits")])
            np.testing.assert_array_equal(res.as_numpy("X"), np.clip(x, -1.0, 1.0))
            assert res.as_numpy("hits").tolist() == [7 + int((np.abs(x) > 1).sum())]
            np.testing.assert_array_equal(shm.get_contents_as_numpy(h, np.float32, [n], offset=8), x)
            oh, oname, okey = regions.create(x.nbytes)
            c.register_system_shared_memory(oname, okey, x.nbytes)
            out = th.InferRequestedOutput("X", binary_data=True)
            out.set_shared_memory(oname, x.nbytes)
            res = c.infer("clip_", inputs(), outputs=[out])
            assert res.get_output("X")["parameters"]["shared_memory_region"] == oname
            np.testing.assert_array_equal(shm.get_contents_as_numpy(oh, np.float32, [n]), np.clip(x, -1.0, 1.0))
            np.testing.assert_array_equal(shm.get_contents_as_numpy(h, np.float32, [n], offset=8), x)
        finally:
            c.unregister_system_shared_memory()
