"""Triton's CUDA shared memory extension on a GPU (issue 16, item 3), run on the H200 host:

    python3 -m pytest -m gpu tests/test_serve_cuda_shm_gpu.py

tritonclient's own ``tritonclient.utils.cuda_shared_memory`` helpers (cuda-python) export device
buffers from this process; `tileship serve` runs as a child process (CUDA refuses to open an IPC
handle in the process that exported it) and answers tritonclient.grpc and plain REST. Checked: the
round trips (inputs from and outputs into CUDA regions, numpy and DLPack writes), and the
hostile registrations and requests, each a 4xx naming the problem, after which the server still
answers correctly: a size past the allocation, a handle whose process has exited, bytes that are
no handle, a window past the region's end, one allocation under two names."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

N = 1 << 16
NB = N * 4


@pytest.fixture(scope="module")
def cudashm() -> Any:
    return pytest.importorskip("tritonclient.utils.cuda_shared_memory", reason="needs cuda-python (cuda.bindings)")


@pytest.fixture(scope="module")
def server(cpu_release_build, tmp_path_factory) -> Iterator[SimpleNamespace]:
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    log = open(tmp_path_factory.mktemp("serve") / "serve.log", "w+b")  # noqa: SIM115 (closed below)
    env = {**os.environ, "TILESHIP_HOME": str(tmp_path_factory.mktemp("home"))}
    proc = subprocess.Popen([sys.executable, "-c", "from tileship.cli import main; main()", "serve",
                             str(cpu_release_build.path), "--port", str(ports[0]), "--grpc-port", str(ports[1])],
                            stdout=log, stderr=log, env=env)
    url = f"http://127.0.0.1:{ports[0]}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, "the server exited"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "not ready within 180 s"
            time.sleep(0.2)
        yield SimpleNamespace(url=url, grpc=f"127.0.0.1:{ports[1]}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.seek(0)
        print(log.read().decode(errors="replace")[-4000:])  # shown when a test failed
        log.close()


@pytest.fixture
def rest(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60.0) as c:
        yield c
        c.post("/v2/cudasharedmemory/unregister")


@pytest.fixture
def made(cudashm) -> Iterator[list[Any]]:
    handles: list[Any] = []
    yield handles
    for h in handles:
        cudashm.destroy_shared_memory_region(h)


def _region(cudashm: Any, made: list[Any], nbytes: int) -> tuple[Any, str]:
    name = f"c_{uuid.uuid4().hex[:10]}"
    h = cudashm.create_shared_memory_region(name, nbytes, 0)
    made.append(h)
    return h, name


def _register(rest: httpx.Client, name: str, handle: bytes, nbytes: int) -> httpx.Response:
    return rest.post(f"/v2/cudasharedmemory/region/{name}/register",
                     json={"raw_handle": {"b64": handle.decode()}, "device_id": 0, "byte_size": nbytes})


def _infer(rest: httpx.Client, a_ref: dict[str, Any], b_ref: dict[str, Any], c_ref: dict[str, Any]) -> httpx.Response:
    def t(name: str, ref: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "shape": [N], "datatype": "FP32", "parameters": ref}

    return rest.post("/v2/models/add/infer", json={"inputs": [t("A", a_ref), t("B", b_ref)],
                                                   "outputs": [{"name": "C", "parameters": c_ref}]})


def _ref(name: str, offset: int = 0, nbytes: int = NB) -> dict[str, Any]:
    return {"shared_memory_region": name, "shared_memory_offset": offset, "shared_memory_byte_size": nbytes}


def _ab(seed: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    return g.standard_normal(N).astype(np.float32), g.standard_normal(N).astype(np.float32)


def test_metadata_claims_the_extension(rest):
    assert "cuda_shared_memory" in rest.get("/v2").json()["extensions"]


def test_grpc_round_trip_with_tritonclient(made, cudashm, server):
    import tritonclient.grpc as tg

    a, b = _ab(1)
    hin, in_name = _region(cudashm, made, 2 * NB)
    hout, out_name = _region(cudashm, made, NB)
    cudashm.set_shared_memory_region(hin, [a, b])
    gc = tg.InferenceServerClient(server.grpc)
    try:
        gc.register_cuda_shared_memory(in_name, cudashm.get_raw_handle(hin), 0, 2 * NB)
        gc.register_cuda_shared_memory(out_name, cudashm.get_raw_handle(hout), 0, NB)
        status = gc.get_cuda_shared_memory_status().regions
        assert {k: (v.device_id, v.byte_size) for k, v in status.items()} == {in_name: (0, 2 * NB),
                                                                              out_name: (0, NB)}
        inputs = [tg.InferInput("A", [N], "FP32"), tg.InferInput("B", [N], "FP32")]
        inputs[0].set_shared_memory(in_name, NB)
        inputs[1].set_shared_memory(in_name, NB, offset=NB)
        out = tg.InferRequestedOutput("C")
        out.set_shared_memory(out_name, NB)
        res = gc.infer("add", inputs, outputs=[out])
        entry = res.get_output("C")  # the bytes went to the region, not into the response
        assert entry.parameters["shared_memory_region"].string_param == out_name
        assert len(res.get_response().raw_output_contents) == 0
        np.testing.assert_allclose(cudashm.get_contents_as_numpy(hout, np.float32, [N]), a + b, rtol=1e-6)
        gc.unregister_cuda_shared_memory()
        assert len(gc.get_cuda_shared_memory_status().regions) == 0
    finally:
        gc.unregister_cuda_shared_memory()  # before ``made`` frees the allocations
        gc.close()


def test_rest_round_trip_with_dlpack_tensors(made, cudashm, rest):  # rest unregisters before made frees
    a = torch.randn(N, device="cuda")
    b = torch.randn(N, device="cuda")
    ha, a_name = _region(cudashm, made, NB)
    hb, b_name = _region(cudashm, made, NB + 256)
    hout, out_name = _region(cudashm, made, NB)
    cudashm.set_shared_memory_region_from_dlpack(ha, [a])
    cudashm.set_shared_memory_region_from_dlpack(hb, [torch.zeros(64, device="cuda"), b])  # b at byte 256
    for h, name, nbytes in ((ha, a_name, NB), (hb, b_name, NB + 256), (hout, out_name, NB)):
        assert _register(rest, name, cudashm.get_raw_handle(h), nbytes).status_code == 200
    assert sorted(r["name"] for r in rest.get("/v2/cudasharedmemory/status").json()) == sorted(
        [a_name, b_name, out_name])
    r = _infer(rest, _ref(a_name), _ref(b_name, 256), _ref(out_name))
    assert r.status_code == 200, r.text
    entry = r.json()["outputs"][0]
    assert "data" not in entry and entry["parameters"]["shared_memory_region"] == out_name
    got = torch.from_numpy(cudashm.get_contents_as_numpy(hout, np.float32, [N]))
    torch.testing.assert_close(got, (a + b).cpu())


def test_hostile_registrations_and_windows_get_4xx_and_the_server_keeps_answering(made, cudashm, rest):
    a, b = _ab(3)
    hin, in_name = _region(cudashm, made, 2 * NB)
    hout, out_name = _region(cudashm, made, NB)
    cudashm.set_shared_memory_region(hin, [a, b])
    raw = cudashm.get_raw_handle(hin)

    r = _register(rest, "too_big", raw, 2 * NB + (1 << 30))  # a window past the allocation
    assert r.status_code == 400 and "runs past the end of the CUDA allocation" in r.json()["error"], r.text
    r = _register(rest, "noise", base64.b64encode(os.urandom(64)), 16)  # 64 bytes that are no handle
    assert r.status_code == 400 and "cannot be opened" in r.json()["error"], r.text
    gone = subprocess.run([sys.executable, "-c", "import tritonclient.utils.cuda_shared_memory as c\n"
                           "h = c.create_shared_memory_region('gone', 4096, 0)\nprint(c.get_raw_handle(h).decode())"],
                          capture_output=True, text=True, timeout=120)
    assert gone.returncode == 0, gone.stderr
    r = _register(rest, "gone", gone.stdout.strip().encode(), 4096)  # its process has exited
    assert r.status_code == 400 and "cannot be opened" in r.json()["error"], r.text
    r = rest.post("/v2/cudasharedmemory/region/x/register", json={"raw_handle": {"b64": raw.decode()},
                                                                  "device_id": torch.cuda.device_count(),
                                                                  "byte_size": 16})
    assert r.status_code == 400 and "does not exist" in r.json()["error"], r.text
    assert rest.get("/v2/cudasharedmemory/status").json() == []

    assert _register(rest, in_name, raw, 2 * NB).status_code == 200
    assert _register(rest, "alias", raw, NB).status_code == 200  # the same allocation under a second name
    assert _register(rest, out_name, cudashm.get_raw_handle(hout), NB).status_code == 200
    r = _register(rest, out_name, cudashm.get_raw_handle(hout), NB)
    assert r.status_code == 409, r.text
    r = _infer(rest, _ref(in_name, NB + 4), _ref(in_name, NB), _ref(out_name))  # A's window runs past the end
    assert r.status_code == 400 and "runs past the end of CUDA shared-memory region" in r.json()["error"], r.text
    r = _infer(rest, _ref("alias", 0), _ref("alias", NB), _ref(out_name))  # "alias" holds NB bytes only
    assert r.status_code == 400 and "alias" in r.json()["error"], r.text
    assert rest.post(f"/v2/cudasharedmemory/region/{in_name}/unregister").status_code == 200
    r = _infer(rest, _ref("alias", 0), _ref(in_name, NB), _ref(out_name))  # unregistered: 404
    assert r.status_code == 404, r.text

    # the alias still maps the allocation after its twin was unregistered; the server still answers
    assert _register(rest, in_name, raw, 2 * NB).status_code == 200
    r = _infer(rest, _ref("alias", 0), _ref(in_name, NB), _ref(out_name))
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(cudashm.get_contents_as_numpy(hout, np.float32, [N]), a + b, rtol=1e-6)
    plain = rest.post("/v2/models/add/infer", json={"inputs": [
        {"name": "A", "shape": [2], "datatype": "FP32", "data": [1, 2]},
        {"name": "B", "shape": [2], "datatype": "FP32", "data": [3, 4]}]})
    assert plain.status_code == 200 and plain.json()["outputs"][0]["data"] == [4, 6]
    assert rest.get("/v2/health/ready").status_code == 200
