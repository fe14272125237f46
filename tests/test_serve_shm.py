"""Triton's system shared memory extension in `tileship serve` (issue 16, item 3): tritonclient's
own shared-memory helpers with tritonclient.http and tritonclient.grpc against a server on
127.0.0.1, and hostile registrations and requests that must get a 4xx naming the problem."""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import shm_regions
import torch
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from shm_regions import Shm
from test_serve import assert_close, log_lines, serving
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer, ServeConfig

N = 1000
NBYTES = N * 4


@pytest.fixture(scope="module")
def server(grpc_server: BackgroundServer) -> BackgroundServer:
    return grpc_server


@pytest.fixture
def hc(server) -> Iterator[th.InferenceServerClient]:
    c = th.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=30.0)
    yield c
    c.unregister_system_shared_memory()  # every region: tests start from none
    c.close()


@pytest.fixture
def gc(server) -> Iterator[tg.InferenceServerClient]:
    c = tg.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def regions() -> Iterator[Shm]:
    yield from shm_regions.regions("r")


def _ab(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    return g.standard_normal(N).astype(np.float32), g.standard_normal(N).astype(np.float32)


def _fds(key: str) -> int:
    """File descriptors this process (client and server both run in it) holds on /dev/shm/<key>."""
    path = "/dev/shm/" + key.lstrip("/")
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:  # closed while listing
            pass
    return n


# -- round trips ----------------------------------------------------------------------------------

def test_server_metadata_claims_system_shared_memory(hc, gc):
    assert "system_shared_memory" in hc.get_server_metadata()["extensions"]
    assert "system_shared_memory" in gc.get_server_metadata().extensions


def test_http_inputs_and_output_in_shared_memory(hc, regions, server):
    a, b = _ab(1)
    hin, in_name, in_key = regions.create(2 * NBYTES)
    hout, out_name, out_key = regions.create(NBYTES)
    shm.set_shared_memory_region(hin, [a, b])  # A at 0, B at NBYTES
    client_in, client_out = _fds(in_key), _fds(out_key)  # the client helper's own descriptors
    hc.register_system_shared_memory(in_name, in_key, 2 * NBYTES)
    hc.register_system_shared_memory(out_name, out_key, NBYTES)
    status = {r["name"]: r for r in hc.get_system_shared_memory_status()}
    assert status[in_name] == {"name": in_name, "key": in_key, "offset": 0, "byte_size": 2 * NBYTES}
    assert hc.get_system_shared_memory_status(out_name) == [{"name": out_name, "key": out_key, "offset": 0,
                                                              "byte_size": NBYTES}]

    inputs = [th.InferInput("A", [N], "FP32"), th.InferInput("B", [N], "FP32")]
    inputs[0].set_shared_memory(in_name, NBYTES)
    inputs[1].set_shared_memory(in_name, NBYTES, offset=NBYTES)
    out = th.InferRequestedOutput("C", binary_data=True)
    out.set_shared_memory(out_name, NBYTES)
    res = hc.infer("add", inputs, outputs=[out])
    line = [x for x in log_lines(server.service.config.log_stream) if x.get("event") == "infer"][-1]
    assert line["shm"] == "system" and "release_ms" in line["spans"], line  # the log line names the transport
    entry = res.get_output("C")
    assert "data" not in entry and res.get_response().get("outputs") == [entry]  # the data went to the region
    assert entry["shape"] == [N] and entry["datatype"] == "FP32"
    assert entry["parameters"] == {"shared_memory_region": out_name, "shared_memory_byte_size": NBYTES}
    assert res.get_response()["parameters"]["tileship_path"] == "kernel"
    got = shm.get_contents_as_numpy(hout, np.float32, [N])
    assert_close(got, torch.from_numpy(a) + torch.from_numpy(b), 1e-5, 1e-5)

    hc.unregister_system_shared_memory(in_name)
    assert [r["name"] for r in hc.get_system_shared_memory_status()] == [out_name]
    assert _fds(in_key) == client_in and _fds(out_key) == client_out + 1  # the server holds one, until unregistered
    hc.unregister_system_shared_memory()
    assert hc.get_system_shared_memory_status() == []
    assert _fds(out_key) == client_out


def test_grpc_inputs_and_output_in_shared_memory(gc, hc, regions):
    a, b = _ab(2)
    ha, a_name, a_key = regions.create(NBYTES)
    hb, b_name, b_key = regions.create(NBYTES + 64)
    hout, out_name, out_key = regions.create(NBYTES)
    shm.set_shared_memory_region(ha, [a])
    shm.set_shared_memory_region(hb, [b], offset=64)
    gc.register_system_shared_memory(a_name, a_key, NBYTES)
    gc.register_system_shared_memory(b_name, b_key, NBYTES + 64)
    gc.register_system_shared_memory(out_name, out_key, NBYTES)
    st = gc.get_system_shared_memory_status(b_name).regions
    assert list(st) == [b_name] and st[b_name].key == b_key and st[b_name].byte_size == NBYTES + 64
    assert set(gc.get_system_shared_memory_status().regions) == {a_name, b_name, out_name}
    assert {r["name"] for r in hc.get_system_shared_memory_status()} == {a_name, b_name, out_name}  # one registry

    inputs = [tg.InferInput("A", [N], "FP32"), tg.InferInput("B", [N], "FP32")]
    inputs[0].set_shared_memory(a_name, NBYTES)
    inputs[1].set_shared_memory(b_name, NBYTES, offset=64)
    out = tg.InferRequestedOutput("C")
    out.set_shared_memory(out_name, NBYTES)
    res = gc.infer("add", inputs, outputs=[out])
    resp = res.get_response()
    assert [o.name for o in resp.outputs] == ["C"] and list(resp.outputs[0].shape) == [N]
    assert resp.outputs[0].parameters["shared_memory_region"].string_param == out_name
    assert len(resp.raw_output_contents) == 0
    got = shm.get_contents_as_numpy(hout, np.float32, [N])
    assert_close(got, torch.from_numpy(a) + torch.from_numpy(b), 1e-5, 1e-5)

    gc.unregister_system_shared_memory(a_name)
    assert set(gc.get_system_shared_memory_status().regions) == {b_name, out_name}
    gc.unregister_system_shared_memory()
    assert len(gc.get_system_shared_memory_status().regions) == 0


def test_grpc_mixes_shared_memory_and_raw_inputs(gc, hc, regions):
    """raw_input_contents holds only the inputs not in shared memory, in order (as Triton)."""
    a, b = _ab(3)
    ha, name, key = regions.create(NBYTES)
    shm.set_shared_memory_region(ha, [a])
    gc.register_system_shared_memory(name, key, NBYTES)
    inputs = [tg.InferInput("A", [N], "FP32"), tg.InferInput("B", [N], "FP32")]
    inputs[0].set_shared_memory(name, NBYTES)
    inputs[1].set_data_from_numpy(b)
    res = gc.infer("add", inputs, outputs=[tg.InferRequestedOutput("C")])
    assert_close(res.as_numpy("C"), torch.from_numpy(a) + torch.from_numpy(b), 1e-5, 1e-5)


def test_a_registered_window_is_relative_to_its_offset(hc, regions):
    """Register [256, 256 + 2N*4) of a file: request offsets count from the window's start."""
    a, b = _ab(4)
    h, name, key = regions.create(256 + 2 * NBYTES)
    shm.set_shared_memory_region(h, [np.full(64, 7e9, np.float32)])  # junk before the window
    shm.set_shared_memory_region(h, [a, b], offset=256)
    hc.register_system_shared_memory(name, key, 2 * NBYTES, offset=256)
    inputs = [th.InferInput("A", [N], "FP32"), th.InferInput("B", [N], "FP32")]
    inputs[0].set_shared_memory(name, NBYTES)
    inputs[1].set_shared_memory(name, NBYTES, offset=NBYTES)
    res = hc.infer("add", inputs, outputs=[th.InferRequestedOutput("C", binary_data=True)])
    assert_close(res.as_numpy("C"), torch.from_numpy(a) + torch.from_numpy(b), 1e-5, 1e-5)


# -- hostile input ----------------------------------------------------------------------------------

def _post(server: BackgroundServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30.0)


def _infer_doc(a_params: dict[str, Any], out_params: dict[str, Any] | None = None,
               a_shape: list[int] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"inputs": [{"name": "A", "shape": a_shape or [N], "datatype": "FP32",
                                       "parameters": a_params},
                                      {"name": "B", "shape": a_shape or [N], "datatype": "FP32",
                                       "data": [1.0] * (a_shape or [N])[0]}]}
    if out_params is not None:
        doc["outputs"] = [{"name": "C", "parameters": out_params}]
    return doc


def _sm(region: str, byte_size: Any, offset: Any = None) -> dict[str, Any]:
    p = {"shared_memory_region": region, "shared_memory_byte_size": byte_size}
    return p if offset is None else p | {"shared_memory_offset": offset}


REG = "/v2/systemsharedmemory/region/{}/register"


@pytest.mark.parametrize("body,status,words", [
    ({"key": "/tileship_test_absent_{tag}", "offset": 0, "byte_size": 16}, 400, ["does not exist", "/dev/shm"]),
    ({"key": "/../../etc/passwd", "offset": 0, "byte_size": 16}, 400, ["not a POSIX shared-memory name"]),
    ({"key": "{key}", "offset": -1, "byte_size": 16}, 400, ["offset must be a non-negative integer", "-1"]),
    ({"key": "{key}", "offset": 0, "byte_size": -16}, 400, ["byte_size must be a non-negative integer"]),
    ({"key": "{key}", "offset": 0, "byte_size": 0}, 400, ["byte_size must be at least 1"]),
    ({"key": "{key}", "offset": 0, "byte_size": 4097}, 400, ["runs past the end", "holds 4096 bytes"]),
    ({"key": "{key}", "offset": 4000, "byte_size": 200}, 400, ["offset 4000 + byte_size 200 runs past the end"]),
    ({"key": "{key}", "offset": 0, "byte_size": 2 ** 64 - 1}, 400, ["runs past the end"]),
    ({"key": "{key}", "offset": 2 ** 63, "byte_size": 1}, 400, ["runs past the end"]),
    ({"key": "{key}", "offset": 0, "byte_size": "16"}, 400, ["byte_size must be a non-negative integer", "'16'"]),
    ({"key": "{key}", "offset": 0, "byte_size": True}, 400, ["byte_size must be a non-negative integer"]),
    ({"key": 5, "offset": 0, "byte_size": 16}, 400, ["not a POSIX shared-memory name"]),
    ({"key": "{key}"}, 400, ["must be a JSON object", "byte_size"]),
    ([1, 2], 400, ["must be a JSON object"]),
], ids=["absent-key", "path-escape", "negative-offset", "negative-size", "zero-size", "past-file", "offset-past-file",
        "huge-size", "huge-offset", "size-string", "size-bool", "key-int", "no-size", "not-object"])
def test_hostile_registrations_get_a_4xx_naming_the_problem(server, hc, regions, body, status, words):
    _, _, key = regions.create(4096)
    tag = uuid.uuid4().hex[:8]
    if isinstance(body, dict) and isinstance(body.get("key"), str):
        body = body | {"key": body["key"].format(key=key, tag=tag)}
    r = _post(server, REG.format("hostile"), body)
    assert r.status_code == status, r.text
    for w in words:
        assert w in r.json()["error"], (w, r.json())
    assert hc.get_system_shared_memory_status() == []
    assert hc.is_server_ready()


def test_huge_json_integers_and_bad_json_are_400(server, hc):
    r = httpx.post(server.url + REG.format("big"), content=b'{"key": "/k", "offset": 0, "byte_size": '
                   + b"9" * 400 + b"}", timeout=30.0)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"], r.text
    r = httpx.post(server.url + REG.format("big"), content=b"{nope", timeout=30.0)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"], r.text
    assert hc.is_server_ready()


def test_registry_errors_name_the_region(server, hc, gc, regions):
    _, name, key = regions.create(64)
    hc.register_system_shared_memory(name, key, 64)
    with pytest.raises(InferenceServerException) as e:
        hc.register_system_shared_memory(name, key, 64)
    assert e.value.status() == "409" and f"'{name}' is already registered" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        gc.register_system_shared_memory(name, key, 64)
    assert e.value.status() == "StatusCode.ALREADY_EXISTS" and "already registered" in e.value.message()

    for path, method in [("/v2/systemsharedmemory/region/nope/unregister", "POST"),
                         ("/v2/systemsharedmemory/region/nope/status", "GET")]:
        r = httpx.request(method, server.url + path, timeout=30.0)
        assert r.status_code == 404, r.text
        assert r.json()["error"] == f"unknown shared-memory region 'nope': registered: {name}"
    with pytest.raises(InferenceServerException) as e:
        gc.unregister_system_shared_memory("nope")
    assert e.value.status() == "StatusCode.NOT_FOUND" and "unknown shared-memory region 'nope'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        gc.register_system_shared_memory("x", "/tileship_test_absent", 8)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "does not exist" in e.value.message()
    assert [r["name"] for r in hc.get_system_shared_memory_status()] == [name]  # unchanged by the failures


@pytest.mark.parametrize("doc,status,words", [
    (_infer_doc(_sm("nope", NBYTES)), 404, ["input A: unknown shared-memory region 'nope'", "registered: {name}"]),
    (_infer_doc(_sm("{name}", NBYTES, offset=8)), 400,
     ["input A: shared_memory_offset 8 + shared_memory_byte_size 4000 runs past the end", "(4000 bytes)"]),
    (_infer_doc(_sm("{name}", NBYTES, offset=2 ** 63)), 400, ["input A", "runs past the end"]),
    (_infer_doc(_sm("{name}", NBYTES, offset=-4)), 400, ["input A: shared_memory_offset must be a non-negative"]),
    (_infer_doc(_sm("{name}", -1)), 400, ["input A: shared_memory_byte_size must be a non-negative"]),
    (_infer_doc(_sm("{name}", NBYTES - 4)), 400,
     ["byte size mismatch: input A has shared_memory_byte_size 3996 but shape [1000] x FP32 needs 4000"]),
    (_infer_doc(_sm("{name}", 2 ** 64 - 1)), 400, ["byte size mismatch: input A has shared_memory_byte_size 1844"]),
    (_infer_doc(_sm("{name}", 2 ** 70)), 400, ["input A: shared_memory_byte_size must be a non-negative integer"]),
    (_infer_doc({"shared_memory_region": "{name}"}), 400, ["input A", "needs shared_memory_byte_size"]),
    (_infer_doc({"shared_memory_byte_size": 8}), 400, ["input A: shared_memory_byte_size is given without"]),
    (_infer_doc(_sm("", NBYTES)), 400, ["input A: shared_memory_region must be a non-empty string"]),
    (_infer_doc(_sm("{name}", NBYTES), out_params=_sm("{name}", NBYTES - 4)), 400,
     ["byte size mismatch: output C is [1000] x float32 = 4000 bytes but shared_memory_byte_size is 3996"]),
    (_infer_doc(_sm("{name}", NBYTES), out_params=_sm("{name}", NBYTES, offset=4)), 400,
     ["output C: shared_memory_offset 4 + shared_memory_byte_size 4000 runs past the end"]),
    (_infer_doc(_sm("{name}", NBYTES), out_params=_sm("gone", NBYTES)), 404,
     ["output C: unknown shared-memory region 'gone'"]),
    ({**_infer_doc(_sm("{name}", NBYTES)), "parameters": {"shared_memory_region": "{name}"}}, 400,
     ["belongs to an input or an output, not to the request"]),
], ids=["unknown-region", "past-window", "huge-offset", "negative-offset", "negative-size", "size-vs-shape",
        "u64-size", "huge-size", "no-size", "size-without-region", "empty-region", "output-size-vs-shape",
        "output-past-window", "output-unknown-region", "request-level"])
def test_hostile_infer_requests_get_a_4xx_and_touch_nothing_outside(server, hc, regions, doc, status, words):
    h, name, key = regions.create(NBYTES)
    a, _ = _ab(5)
    shm.set_shared_memory_region(h, [a])
    hc.register_system_shared_memory(name, key, NBYTES)

    def fill(v: Any) -> Any:
        if isinstance(v, str):
            return v.format(name=name)
        if isinstance(v, dict):
            return {k: fill(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fill(x) for x in v]
        return v

    r = _post(server, "/v2/models/add/infer", fill(doc))
    assert r.status_code == status, r.text
    for w in words:
        assert fill(w) in r.json()["error"], (fill(w), r.json())
    assert (shm.get_contents_as_numpy(h, np.float32, [N]) == a).all()  # nothing written into the region
    assert hc.is_server_ready()
    ok = _post(server, "/v2/models/add/infer", fill(_infer_doc(_sm("{name}", NBYTES))))  # still serving from it
    assert ok.status_code == 200, ok.text
    assert_close(np.asarray(ok.json()["outputs"][0]["data"]), torch.from_numpy(a) + 1, 1e-5, 1e-5)


def test_grpc_hostile_infer_requests(gc, regions):
    h, name, key = regions.create(NBYTES)
    gc.register_system_shared_memory(name, key, NBYTES)
    cases: list[tuple[str, int, int, str, str]] = [
        ("nope", NBYTES, 0, "NOT_FOUND", "input A: unknown shared-memory region 'nope'"),
        (name, NBYTES, 4, "INVALID_ARGUMENT", "runs past the end of shared-memory region"),
        (name, 8, 0, "INVALID_ARGUMENT", "byte size mismatch: input A has shared_memory_byte_size 8"),
        (name, NBYTES, 2 ** 62, "INVALID_ARGUMENT", "runs past the end"),
    ]
    for region, size, offset, code, words in cases:
        inputs = [tg.InferInput("A", [N], "FP32"), tg.InferInput("B", [N], "FP32")]
        inputs[0].set_shared_memory(region, size, offset=offset)
        inputs[1].set_data_from_numpy(np.ones(N, np.float32))
        with pytest.raises(InferenceServerException) as e:
            gc.infer("add", inputs)
        assert e.value.status() == f"StatusCode.{code}", (region, e.value.message())
        assert words in e.value.message(), (words, e.value.message())
    assert gc.is_server_ready()
    gc.unregister_system_shared_memory()


def test_a_file_truncated_after_registration_is_refused_not_a_crash(hc, server, regions):
    h, name, key = regions.create(NBYTES)
    hc.register_system_shared_memory(name, key, NBYTES)
    os.truncate("/dev/shm/" + key.lstrip("/"), 16)  # a mapping touched past 16 bytes would SIGBUS the server
    r = _post(server, "/v2/models/add/infer", _infer_doc(_sm(name, NBYTES)))
    assert r.status_code == 400 and f"region '{name}' shrank to 16 bytes" in r.json()["error"], r.text
    assert hc.is_server_ready()


def test_stopping_the_server_closes_every_region(cpu_release_build, tmp_path, regions):
    _, name, key = regions.create(64)
    client = _fds(key)
    cfg = ServeConfig(source=cpu_release_build.path, diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO())
    with serving(cfg, ready=False) as srv:  # regions do not wait for the release
        r = _post(srv, REG.format(name), {"key": key, "offset": 0, "byte_size": 64})
        assert r.status_code == 200, r.text
        assert _fds(key) == client + 1
    assert _fds(key) == client


def test_inputs_are_copied_out_and_an_unregistered_region_is_404(regions):
    """The registry alone: a read returns a copy (later writes to the region do not change it),
    writes land in the window, and after unregister the name is 404 and its descriptor closed."""
    from tileship.serve import shm as server_shm
    from tileship.serve.validate import BadRequest

    h, name, key = regions.create(64)
    shm.set_shared_memory_region(h, [np.arange(16, dtype=np.float32)])
    client = _fds(key)
    reg = server_shm.Regions()
    reg.register(name, key, 0, 64)
    ref = server_shm.Ref(name, 16, 32)
    got = reg.read(ref, "input A")
    shm.set_shared_memory_region(h, [np.zeros(16, dtype=np.float32)])
    assert (np.frombuffer(got, np.float32) == np.arange(4, 12, dtype=np.float32)).all()
    reg.write(ref, np.full(8, 7, np.float32), "output C")
    assert (shm.get_contents_as_numpy(h, np.float32, [16]) == np.array([0] * 4 + [7] * 8 + [0] * 4)).all()
    reg.unregister(name)
    for call in (lambda: reg.read(ref, "input A"), lambda: reg.write(ref, b"x" * 32, "output C")):
        with pytest.raises(BadRequest) as e:
            call()
        assert e.value.status == 404 and "unknown shared-memory region" in e.value.message
    assert _fds(key) == client


def test_a_held_region_unregistered_stays_open_for_its_request_only(regions):
    """The registry alone: a request's output region (``Leases.hold``) unregistered before the output is
    written: the name is free at once (registered again, to another file), the held region is still written
    (not the new one), and its descriptor closes when the request gives it back."""
    from tileship.serve import shm as server_shm
    from tileship.serve.shm_requests import Leases
    from tileship.serve.validate import BadRequest

    h1, name, key1 = regions.create(64)
    h2, _, key2 = regions.create(64)
    client = _fds(key1)
    reg = server_shm.Regions()
    reg.register(name, key1, 0, 64)
    ref = server_shm.Ref(name, 0, 64)
    leases = Leases()
    held = leases.hold(reg.region(ref, "output C"), ref, "output C")
    reg.unregister(name)
    assert reg.status(None) == [] and _fds(key1) == client + 1  # gone by name, open for the request
    reg.register(name, key2, 0, 64)
    held.write(ref, np.full(16, 3, np.float32), "output C")
    assert (shm.get_contents_as_numpy(h1, np.float32, [16]) == 3).all()
    assert (shm.get_contents_as_numpy(h2, np.float32, [16]) == 0).all()
    leases.release()
    leases.release()  # idempotent
    assert _fds(key1) == client
    with pytest.raises(BadRequest) as e:
        held.write(ref, b"x" * 64, "output C")
    assert e.value.status == 404 and "unregistered" in e.value.message
    reg.close()


def test_a_file_truncated_under_a_registered_window_never_faults_a_read_or_write(regions):
    """Truncated at any point after registration: reads and writes give a 400 naming the region
    (pread/pwrite, no mapping), and a write never extends the client's file."""
    from tileship.serve import shm as server_shm
    from tileship.serve.validate import BadRequest

    _, name, key = regions.create(64)
    reg = server_shm.Regions()
    reg.register(name, key, 0, 64)
    path = "/dev/shm/" + key.lstrip("/")
    for size in (48, 16, 0):
        os.truncate(path, size)
        for call in (lambda: reg.read(server_shm.Ref(name, 0, 64), "input A"),
                     lambda: reg.write(server_shm.Ref(name, 0, 64), b"\0" * 64, "output C")):
            with pytest.raises(BadRequest) as e:
                call()
            assert e.value.status == 400 and f"shrank to {size} bytes" in e.value.message
        assert os.path.getsize(path) == size
    reg.close()


def test_docs_shm_example_runs(server, hc):
    text = (Path(__file__).parents[1] / "docs" / "serving.md").read_text()
    code = text.split("## System shared memory", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/serving.md", "exec"), {"URL": f"127.0.0.1:{server.port}"})  # asserts the result
    assert hc.get_system_shared_memory_status() == []
    assert not os.path.exists("/dev/shm/tileship_doc_in")


def test_worker_processes_read_and_write_shared_memory(cpu_release_build, regions):
    """--workers N: the call runs in another process; inputs are copied from the region, the
    output is written into it by the front-end."""
    from test_serve_workers import workers_server

    a, b = _ab(6)
    hin, in_name, in_key = regions.create(2 * NBYTES)
    hout, out_name, out_key = regions.create(NBYTES)
    shm.set_shared_memory_region(hin, [a, b])
    with workers_server(cpu_release_build.path, workers=1) as srv:
        c = th.InferenceServerClient(f"127.0.0.1:{srv.port}", network_timeout=30.0)
        c.register_system_shared_memory(in_name, in_key, 2 * NBYTES)
        c.register_system_shared_memory(out_name, out_key, NBYTES)
        inputs = [th.InferInput("A", [N], "FP32"), th.InferInput("B", [N], "FP32")]
        inputs[0].set_shared_memory(in_name, NBYTES)
        inputs[1].set_shared_memory(in_name, NBYTES, offset=NBYTES)
        out = th.InferRequestedOutput("C")
        out.set_shared_memory(out_name, NBYTES)
        c.infer("add", inputs, outputs=[out])
        c.close()
    assert_close(shm.get_contents_as_numpy(hout, np.float32, [N]), torch.from_numpy(a) + torch.from_numpy(b),
                 1e-5, 1e-5)


def test_large_inputs_are_read_into_pooled_blocks_given_back_after_the_call(hc, regions, server, monkeypatch):
    """System shared-memory inputs of at least a pooled block's size are copied into the server's reused body
    blocks (``serve.staging``), not fresh buffers, and every block goes back once the call has ended: after an
    answered request, and after one refused for an unknown output region (the inputs were read first)."""
    from tileship.serve import staging

    n = staging.MIN_BYTES // 4  # float32 elements: each input is exactly one pooled block's minimum
    g = np.random.default_rng(7)
    a, b = g.standard_normal(n).astype(np.float32), g.standard_normal(n).astype(np.float32)
    hin, in_name, in_key = regions.create(8 * n)
    shm.set_shared_memory_region(hin, [a, b])
    hc.register_system_shared_memory(in_name, in_key, 8 * n)
    pool = server.service.staging
    taken: list[int] = []
    take = pool.take
    monkeypatch.setattr(pool, "take", lambda nbytes: taken.append(nbytes) or take(nbytes))
    inputs = [th.InferInput("A", [n], "FP32"), th.InferInput("B", [n], "FP32")]
    inputs[0].set_shared_memory(in_name, 4 * n)
    inputs[1].set_shared_memory(in_name, 4 * n, offset=4 * n)
    res = hc.infer("add", inputs, outputs=[th.InferRequestedOutput("C", binary_data=True)])
    assert_close(res.as_numpy("C"), torch.from_numpy(a) + torch.from_numpy(b), 1e-5, 1e-5)
    assert [t for t in taken if t >= staging.MIN_BYTES] == [4 * n, 4 * n]  # a block per input (not the JSON body)
    stats = pool.stats()
    assert stats["out_bytes"] == 0 and stats["free_bytes"] >= 2 * staging.MIN_BYTES, stats  # back, kept for reuse

    out = th.InferRequestedOutput("C", binary_data=True)
    out.set_shared_memory("no_such_region", 4 * n)
    with pytest.raises(InferenceServerException) as e:
        hc.infer("add", inputs, outputs=[out])
    assert "no_such_region" in str(e.value) and "404" in str(e.value.status()), e.value
    assert sum(t >= staging.MIN_BYTES for t in taken) == 4 and pool.stats()["out_bytes"] == 0, (taken, pool.stats())
