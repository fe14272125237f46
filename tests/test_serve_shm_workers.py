"""System shared memory with `tileship serve --workers 2` (a real CLI process: a front-end and worker processes):
register -> infer with inputs and outputs in regions (tritonclient.http and tritonclient.grpc, small calls on the
event loop and large ones on a request thread) -> status -> unregister; a region unregistered while a request that
uses it waits for a worker; an output region too small for the output."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import shm_regions
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from shm_regions import Shm
from test_serve import metric
from tritonclient.utils import InferenceServerException

N = 1000
NBYTES = N * 4


@dataclass
class Cli:
    proc: subprocess.Popen[bytes]
    http: str  # host:port
    grpc: str
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.http}"

    def workers(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/v2/health/ready", timeout=10).json()["workers"])

    def inflight(self) -> float:
        return metric(httpx.get(f"{self.url}/metrics", timeout=10).text, "tileship_inflight_requests")

    def fds_on(self, key: str) -> int:
        """Descriptors the front-end process holds on /dev/shm/<key>."""
        path, n = "/dev/shm/" + key.lstrip("/"), 0
        for fd in os.listdir(f"/proc/{self.proc.pid}/fd"):
            with contextlib.suppress(OSError):
                n += os.readlink(f"/proc/{self.proc.pid}/fd/{fd}") == path
        return n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(cpu_release_build, tmp_path_factory) -> Iterator[Cli]:
    tmp = tmp_path_factory.mktemp("shm_workers")
    port, gport = _free_port(), _free_port()
    log = tmp / "serve.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tileship.cli", "serve", str(cpu_release_build.path),
                                 "--port", str(port), "--grpc-port", str(gport), "--workers", "2",
                                 "--worker-timeout", "60"],
                                stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "TILESHIP_HOME": str(tmp)})
    srv = Cli(proc, f"127.0.0.1:{port}", f"127.0.0.1:{gport}", log)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                w = srv.workers()
                if len(w["serving"]) == 2 and w["standby"]:
                    break
            assert time.monotonic() < deadline, "2 workers and a standby not ready within 180 s"
            time.sleep(0.1)
        yield srv
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def hc(server) -> Iterator[th.InferenceServerClient]:
    c = th.InferenceServerClient(server.http, network_timeout=60.0)
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def gc(server) -> Iterator[tg.InferenceServerClient]:
    c = tg.InferenceServerClient(server.grpc)
    yield c
    c.close()


@pytest.fixture
def regions() -> Iterator[Shm]:
    yield from shm_regions.regions("w")


def _request(mod: Any, in_name: str, out_name: str, n: int = N, out_size: int | None = None) -> dict[str, Any]:
    """``infer``'s inputs and outputs: A, B at 0 and 4n of ``in_name``; C into ``out_name`` (``out_size`` bytes:
    4n unless given)."""
    inputs = [mod.InferInput("A", [n], "FP32"), mod.InferInput("B", [n], "FP32")]
    inputs[0].set_shared_memory(in_name, 4 * n)
    inputs[1].set_shared_memory(in_name, 4 * n, offset=4 * n)
    out = mod.InferRequestedOutput("C")
    out.set_shared_memory(out_name, 4 * n if out_size is None else out_size)
    return {"inputs": inputs, "outputs": [out]}


def _ab(seed: int, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    return g.standard_normal(n).astype(np.float32), g.standard_normal(n).astype(np.float32)


def _c(h: Any, n: int = N) -> np.ndarray:
    return shm.get_contents_as_numpy(h, np.float32, [n])


@pytest.mark.parametrize("n", [N, 1 << 18], ids=["loop-call", "thread-call-1MiB-inputs"])
def test_register_infer_status_unregister_over_http_and_grpc(server, hc, gc, regions, n):
    a, b = _ab(1, n)
    hin, in_name, in_key = regions.create(8 * n)
    hout, out_name, out_key = regions.create(4 * n)
    shm.set_shared_memory_region(hin, [a, b])
    hc.register_system_shared_memory(in_name, in_key, 8 * n)
    gc.register_system_shared_memory(out_name, out_key, 4 * n)  # one over each protocol: one registry
    assert {r["name"] for r in hc.get_system_shared_memory_status()} == {in_name, out_name}
    assert set(gc.get_system_shared_memory_status(as_json=True)["regions"]) == {in_name, out_name}
    assert server.fds_on(in_key) == 1 and server.fds_on(out_key) == 1

    res = hc.infer("add", **_request(th, in_name, out_name, n))
    assert res.get_output("C")["parameters"] == {"shared_memory_region": out_name, "shared_memory_byte_size": 4 * n}
    assert np.array_equal(_c(hout, n), a + b)
    shm.set_shared_memory_region(hin, [b, b])
    res = gc.infer("add", **_request(tg, in_name, out_name, n))
    assert res.get_output("C").parameters["shared_memory_region"].string_param == out_name
    assert np.array_equal(_c(hout, n), b + b)

    hc.unregister_system_shared_memory(in_name)
    gc.unregister_system_shared_memory(out_name)
    assert hc.get_system_shared_memory_status() == [] and server.fds_on(in_key) == server.fds_on(out_key) == 0
    with pytest.raises(InferenceServerException) as e:
        hc.infer("add", **_request(th, in_name, out_name, n))
    assert e.value.status() == "404" and f"input A: unknown shared-memory region '{in_name}'" in e.value.message()


def test_concurrent_requests_over_both_workers(server, hc, gc, regions):
    """Twelve requests at once, each with its own output region: every answer lands in its own region."""
    a, b = _ab(2)
    hin, in_name, in_key = regions.create(2 * NBYTES)
    shm.set_shared_memory_region(hin, [a, b])
    hc.register_system_shared_memory(in_name, in_key, 2 * NBYTES)
    outs = []
    for _ in range(12):
        h, name, key = regions.create(NBYTES)
        hc.register_system_shared_memory(name, key, NBYTES)
        outs.append((h, name))
    before = server.workers()

    def one(i: int) -> None:
        if i % 2:
            c = tg.InferenceServerClient(server.grpc)
            c.infer("add", **_request(tg, in_name, outs[i][1]))
        else:
            c = th.InferenceServerClient(server.http, network_timeout=60.0)
            c.infer("add", **_request(th, in_name, outs[i][1]))
        c.close()

    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        list(ex.map(one, range(12)))
    for h, _ in outs:
        assert np.array_equal(_c(h), a + b)
    assert server.workers()["serving"] == before["serving"]  # no failover


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_region_unregistered_while_its_request_waits_for_a_worker(server, hc, gc, regions, protocol):
    """Both workers busy (stopped mid-call), a shared-memory request admitted behind them (its inputs already
    copied out), then its input and output regions unregistered: unregister answers at once and the names are
    gone, the request still answers with its output written into the region it was admitted with (as Triton's
    deferred unregister), and the server closes the file once that request has ended."""
    a, b = _ab(3)
    hin, in_name, in_key = regions.create(2 * NBYTES)
    hout, out_name, out_key = regions.create(NBYTES)
    shm.set_shared_memory_region(hin, [a, b])
    hc.register_system_shared_memory(in_name, in_key, 2 * NBYTES)
    hc.register_system_shared_memory(out_name, out_key, NBYTES)
    pids = server.workers()["serving"]
    x = np.ones(4, np.float32).tolist()
    plain = {"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": x} for n in ("A", "B")]}
    mod = th if protocol == "http" else tg
    client = hc if protocol == "http" else gc

    def wait_inflight(k: int) -> None:
        deadline = time.monotonic() + 10
        while server.inflight() < k:
            assert time.monotonic() < deadline, f"not {k} requests in flight: {server.inflight()}"
            time.sleep(0.02)

    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            blockers = [ex.submit(httpx.post, f"{server.url}/v2/models/add/infer", json=plain, timeout=60)
                        for _ in pids]
            wait_inflight(2)
            other = (th if protocol == "http" else tg).InferenceServerClient(server.http if protocol == "http"
                                                                             else server.grpc)
            queued = ex.submit(other.infer, "add", **_request(mod, in_name, out_name))
            wait_inflight(3)
            shm.set_shared_memory_region(hin, [b, b])  # too late to matter: the inputs were read at admission
            client.unregister_system_shared_memory(in_name)
            client.unregister_system_shared_memory(out_name)
            assert hc.get_system_shared_memory_status() == []
            assert server.fds_on(in_key) == 0 and server.fds_on(out_key) == 1  # held by the queued request
            assert not queued.done()
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert [f.result().status_code for f in blockers] == [200, 200]
        res = queued.result(timeout=60)
        other.close()
    params = res.get_output("C")["parameters"] if protocol == "http" else \
        {k: v.string_param or v.int64_param for k, v in res.get_output("C").parameters.items()}
    assert params == {"shared_memory_region": out_name, "shared_memory_byte_size": NBYTES}
    assert np.array_equal(_c(hout), a + b)
    assert server.fds_on(out_key) == 0  # closed once the request ended
    assert server.workers()["serving"] == pids  # no failover
    with pytest.raises(InferenceServerException) as e:
        client.infer("add", **_request(mod, in_name, out_name))
    assert "unknown shared-memory region" in e.value.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_region_too_small_is_a_clear_400(server, hc, gc, regions, protocol):
    a, b = _ab(4)
    hin, in_name, in_key = regions.create(2 * NBYTES)
    hout, out_name, out_key = regions.create(NBYTES)
    shm.set_shared_memory_region(hin, [a, b])
    shm.set_shared_memory_region(hout, [np.full(N, 7, np.float32)])
    hc.register_system_shared_memory(in_name, in_key, 2 * NBYTES)
    hc.register_system_shared_memory(out_name, out_key, NBYTES - 4)  # the window: one element short
    mod, client = (th, hc) if protocol == "http" else (tg, gc)
    code = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    pids = server.workers()["serving"]
    cases = [(NBYTES, f"output C: shared_memory_offset 0 + shared_memory_byte_size {NBYTES} runs past the end of "
                      f"shared-memory region '{out_name}' ({NBYTES - 4} bytes)"),
             (NBYTES - 4, f"byte size mismatch: output C is [1000] x float32 = {NBYTES} bytes but "
                          f"shared_memory_byte_size is {NBYTES - 4}")]
    for size, words in cases:
        with pytest.raises(InferenceServerException) as e:
            client.infer("add", **_request(mod, in_name, out_name, out_size=size))
        assert e.value.status() == code and words in e.value.message(), (size, e.value.message())
    assert (_c(hout) == 7).all()  # nothing written
    assert server.workers()["serving"] == pids and hc.is_server_ready()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_region_of_the_wrong_size_is_refused_before_any_region_is_read(server, hc, gc, regions, protocol):
    """The declaration fixes C's size for this call (A's shape x float32): an output window of another size is a 400
    (INVALID_ARGUMENT) before the inputs are read or a worker runs the call, not after. The input region's file
    shrank since it was registered: reading it is a 400 of its own, which these answers are not."""
    hin, in_name, in_key = regions.create(2 * NBYTES)
    hout, out_name, out_key = regions.create(2 * NBYTES)
    hc.register_system_shared_memory(in_name, in_key, 2 * NBYTES)
    hc.register_system_shared_memory(out_name, out_key, 2 * NBYTES)
    os.truncate("/dev/shm/" + in_key.lstrip("/"), 0)
    mod, client = (th, hc) if protocol == "http" else (tg, gc)
    code = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    pids = server.workers()["serving"]
    for size in (NBYTES - 4, NBYTES + 4):
        with pytest.raises(InferenceServerException) as e:
            client.infer("add", **_request(mod, in_name, out_name, out_size=size))
        words = f"byte size mismatch: output C is [1000] x float32 = {NBYTES} bytes but shared_memory_byte_size is "
        words += str(size)
        assert e.value.status() == code and words in e.value.message(), (size, e.value.message())
    with pytest.raises(InferenceServerException) as e:  # the right size: now the inputs are read, and refused
        client.infer("add", **_request(mod, in_name, out_name))
    assert "shrank to 0 bytes since it was registered" in e.value.message(), e.value.message()
    assert server.workers()["serving"] == pids and hc.is_server_ready()
