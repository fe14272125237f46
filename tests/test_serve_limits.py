"""The server against hostile input (issue 15): the corpus of tests/serve_corpus.py gets 4xx
with short messages, never a 5xx; bounds before allocation; Content-Type; NaN/Infinity; the
catch-all 500; connection limits; admission after the body; diagnostics off the loop."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from tests.serve_corpus import CASES, JSON

from tileship.build.lock import DriftReport
from tileship.release.diagnostics_queue import CaptureQueue
from tileship.runtime.dispatch import OpRunner, OpShape, Release
from tileship.serve import BackgroundServer, ServeConfig


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name{labels...}`` in a Prometheus exposition."""
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if line.startswith("#") or head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def _decl(inputs: list[tuple[str, list[str]]], outputs: list[tuple[str, list[str]]],
          dims: tuple[str, ...]) -> dict[str, Any]:
    return {"inputs": [[n, d] for n, d in inputs], "outputs": [[n, d] for n, d in outputs], "dtypes": ["float32"],
            "shapes": [], "ranges": [{"dim": d, "min": 1, "max": 1 << 40, "fixed": {}} for d in dims[:1]],
            "tolerances": {"float32": {"atol": 1e-2, "rtol": 1e-2}}}


def hostile_release(root: Path, release_id: str = "hostile",
                    extra: dict[str, Callable[..., Any]] | None = None) -> tuple[Path, Release]:
    """``add`` X[N] + Y[N] -> Z[N]; ``outer`` X[N], W[M] -> Y[N, M]; ``extra`` ops X[N] -> Y[N]; references only."""
    path = root / release_id
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"release_id": release_id}))
    runners = {"add": OpRunner(OpShape("add", (("X", ("N",)), ("Y", ("N",))), 1), lambda x, y: x + y, []),
               "outer": OpRunner(OpShape("outer", (("X", ("N",)), ("W", ("M",))), 1), torch.outer, [])}
    decls = {"add": _decl([("X", ["N"]), ("Y", ["N"])], [("Z", ["N"])], ("N",)),
             "outer": _decl([("X", ["N"]), ("W", ["M"])], [("Y", ["N", "M"])], ("N", "M"))}
    for name, fn in (extra or {}).items():
        runners[name] = OpRunner(OpShape(name, (("X", ("N",)),), 1), fn, [])
        decls[name] = _decl([("X", ["N"])], [("Y", ["N"])], ("N",))
    rel = Release(release_id=release_id, path=path, kernel_revision="fakerev", model={"name": "fake", "version": "1"},
                  lock={}, lock_digest="sha256:fake", drift=DriftReport(()), ops=runners, declarations=decls)
    return path, rel


@contextlib.contextmanager
def hostile_server(tmp_path: Path, extra: dict[str, Callable[..., Any]] | None = None,
                   **kw: Any) -> Iterator[BackgroundServer]:
    path, rel = hostile_release(tmp_path, extra=extra)
    cfg = ServeConfig(source=path, loader=lambda p, ref: rel, diagnostics_dir=tmp_path / "diag",
                      log_stream=io.StringIO(), **kw)
    srv = BackgroundServer(cfg).start()
    try:
        assert srv.wait_ready(), srv.service.holder.readiness()[1]
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with hostile_server(tmp_path_factory.mktemp("hostile")) as srv:
        yield srv


def post(srv: BackgroundServer, path: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(srv.url + path, content=body, headers=headers or JSON, timeout=30.0)


_GOOD = json.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "data": [1, 2]},
                               {"name": "Y", "shape": [2], "datatype": "FP32", "data": [3, 4]}]}).encode()


@pytest.mark.parametrize("method,path,body,headers,status,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_corpus_gets_a_short_4xx_naming_the_problem(server, method, path, body, headers, status, words):
    r = httpx.request(method, server.url + path, content=body, headers=headers, timeout=30.0)
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert words in err, err[:500]
    assert len(err) < 600, f"the message echoes the input: {len(err)} chars"
    assert post(server, "/v2/models/add/infer", _GOOD).json()["outputs"][0]["data"] == [4.0, 6.0]


def test_corpus_never_reaches_the_500_path_or_writes_diagnostics(server):
    for _, method, path, body, headers, _, _ in CASES:
        assert httpx.request(method, server.url + path, content=body, headers=headers, timeout=30.0).status_code < 500
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "tileship_requests_total", code="500") == 0
    assert not (server.service.config.diagnostics_dir or Path("/nonexistent")).exists()
    assert server.service.slots.inflight == 0 and metric(text, "tileship_inflight_requests") == 0


def test_nonfinite_tokens_pass_when_the_request_allows_them(server):
    body = (b'{"parameters":{"allow_nonfinite":true},'
            b'"inputs":[{"name":"X","shape":[3],"datatype":"FP32","data":[NaN,Infinity,1]},'
            b'{"name":"Y","shape":[3],"datatype":"FP32","data":[1,1,1]}]}')
    r = post(server, "/v2/models/add/infer", body)
    assert r.status_code == 200, r.text
    assert '"data":[NaN,Infinity,2.0]' in r.text


def test_json_without_content_type_and_charset_parameter_are_accepted(server):
    assert post(server, "/v2/models/add/infer", _GOOD, {}).status_code == 200
    assert post(server, "/v2/models/add/infer", _GOOD,
                {"content-type": "application/json; charset=utf-8"}).status_code == 200


def test_an_unexpected_exception_is_a_logged_500_with_a_request_id_and_one_bundle_per_reason(tmp_path):
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("a bug in a reference")

    with hostile_server(tmp_path, extra={"broken": broken}) as srv:
        body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode()
        r1 = post(srv, "/v2/models/broken/infer", body, {**JSON, "x-request-id": "req-1"})
        r2 = post(srv, "/v2/models/broken/infer", body, {**JSON, "x-request-id": "req-2"})
        assert (
            r1.status_code == 500
            and "request id req-1" in r1.json()["error"]
            and "a bug in a reference" in r1.json()["error"]
        )
        assert r2.status_code == 500 and "request id req-2" in r2.json()["error"]
        diag = r1.json()["diagnostics_id"]
        assert "diagnostics_id" not in r2.json()  # the same reason within a minute: no second bundle
        srv.service.diagnostics.wait(30)
        assert (tmp_path / "diag" / diag / "summary.json").is_file()
        assert [p.name for p in (tmp_path / "diag").iterdir() if p.is_dir()] == [diag]
        assert srv.service.diagnostics.suppressed == {"serve_error:ValueError": 1}
        events = [json.loads(line) for line in srv.service.config.log_stream.getvalue().splitlines()]
        assert [e["request_id"] for e in events if e["event"] == "error"] == ["req-1", "req-2"]


def test_the_catch_all_answers_a_json_500_outside_inference(tmp_path, monkeypatch):
    with hostile_server(tmp_path) as srv:
        def boom() -> Any:
            raise KeyError("index broke")

        monkeypatch.setattr(srv.service.holder, "index", boom)
        r = httpx.post(srv.url + "/v2/repository/index", headers={"x-request-id": "idx-1"}, timeout=30)
        assert r.status_code == 500 and "request id idx-1" in r.json()["error"] and "index broke" in r.json()["error"]
        assert r.headers["x-request-id"] == "idx-1"
        assert httpx.get(srv.url + "/v2/health/ready").status_code == 200


def test_a_504_keeps_its_slot_until_the_call_ends_and_a_wedged_server_is_not_ready(tmp_path):
    def slow(x: torch.Tensor) -> torch.Tensor:
        time.sleep(float(x[0]))
        return x

    with hostile_server(tmp_path, extra={"slow": slow}, max_inflight=1, request_timeout_s=0.3) as srv:
        def call(seconds: float) -> httpx.Response:
            return post(srv, "/v2/models/slow/infer",
                        json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32",
                                                "data": [seconds]}]}).encode())

        assert call(1.5).status_code == 504
        busy = call(0.0)
        assert busy.status_code == 503 and "overloaded: 1 requests in flight" in busy.json()["error"]
        ready = httpx.get(srv.url + "/v2/health/ready")
        assert ready.status_code == 503 and "wedged" in ready.json()["reason"]
        deadline = time.monotonic() + 10
        while srv.service.slots.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(srv.url + "/v2/health/ready").status_code == 200
        assert call(0.0).status_code == 200


def test_a_slow_body_holds_no_inference_slot(tmp_path):
    with hostile_server(tmp_path, max_inflight=1, body_timeout_s=3.0) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"inputs\":")
            time.sleep(0.2)
            assert post(srv, "/v2/models/add/infer", _GOOD).status_code == 200  # the only slot is free


def test_headers_that_never_finish_are_cut_off(tmp_path):
    with hostile_server(tmp_path, header_timeout_s=0.5) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            t0 = time.monotonic()
            s.sendall(b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\n")
            assert s.recv(1024) == b""  # closed by the server
            assert time.monotonic() - t0 < 5
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:  # also after a first request
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in s.recv(65536)
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and s.recv(65536):
                pass
            assert time.monotonic() < deadline


def test_the_header_deadline_moves_with_each_request_on_a_kept_connection(tmp_path):
    """One timer per connection checks the header deadline: a request whose headers complete in time
    is never cut off by the timer an earlier request armed, and a later stalled head still is, counted
    from its own first byte."""
    with hostile_server(tmp_path, header_timeout_s=0.6) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")  # the timer armed at connect: 0.6 s
            assert b"200 OK" in s.recv(65536)
            time.sleep(0.4)
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
            time.sleep(0.4)  # past the connect timer's time, within this head's own deadline
            s.sendall(b"\r\n")
            assert b"200 OK" in s.recv(65536)
            t0 = time.monotonic()
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\n")  # never finished
            while s.recv(65536):
                pass
            waited = time.monotonic() - t0
            assert 0.45 < waited < 5, waited


def test_connections_past_the_limit_get_503(tmp_path):
    with hostile_server(tmp_path, max_connections=2) as srv:
        held = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(2)]
        try:
            time.sleep(0.1)
            r = httpx.get(srv.url + "/v2/health/live", timeout=10)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.headers["content-type"] == "application/json" and "connection limit" in r.json()["error"]
        finally:
            for s in held:
                s.close()
        time.sleep(0.1)
        assert httpx.get(srv.url + "/v2/health/live", timeout=10).status_code == 200
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        assert 'tileship_rejected_total{reason="connection_limit"} 1.0' in metrics


def test_capture_queue_rate_limits_per_reason_and_prunes(tmp_path):
    now = [0.0]
    q = CaptureQueue(tmp_path, per_reason_s=60, keep=2, keep_bytes=1 << 30, clock=lambda: now[0])
    try:
        a = q.submit("r1", detail="first")
        assert a is not None and q.submit("r1") is None and q.suppressed == {"r1": 1}
        b = q.submit("r2")
        now[0] = 61.0
        c = q.submit("r1")
        assert b is not None and c is not None
        q.wait(60)
        kept = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
        assert len(kept) == 2 and a not in kept  # the oldest went
        q.keep_bytes = 1
        assert len(q.prune()) == 2 and not any(tmp_path.iterdir())
    finally:
        q.close()


def test_body_buffer_waits_for_the_bytes(tmp_path):
    """A Content-Length of 60 MiB with no body allocates nothing: many such requests leave the server fine."""
    with hostile_server(tmp_path, body_timeout_s=1.0) as srv:
        socks = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 62914560\r\n\r\n")
            socks.append(s)
        try:
            assert post(srv, "/v2/models/add/infer", _GOOD).status_code == 200
        finally:
            for s in socks:
                s.close()



def test_device_probe_decides_stickiness_not_the_message_alone():
    """The probe itself needs a GPU; here a fake probe stands in (the H200 drill is not run by this suite)."""
    from tileship.runtime.device_faults import is_sticky_fault, probe_device

    odd = RuntimeError("CUDA error: something no list names")
    assert is_sticky_fault(odd, "cuda:0", probe=lambda d: "AcceleratorError: unspecified launch failure")
    assert not is_sticky_fault(odd, "cuda:0", probe=lambda d: None)
    assert not is_sticky_fault(odd, "cpu", probe=lambda d: pytest.fail("a CPU device is never probed"))
    assert is_sticky_fault(RuntimeError("operation not supported on global/shared address space"), "cpu")
    assert probe_device("cpu") is None
    if not torch.cuda.is_available():
        assert probe_device("cuda") is not None  # no device: the probe fails, it does not raise


# -- found by a hostile-client probe (2026-12-02): a stall, unbounded control bodies, long echoes ------------
def test_a_canary_naming_a_fifo_manifest_never_stalls_the_server(tmp_path):
    """The canary's id is read on the event loop: a FIFO (or a device) as manifest.json must not
    block it, then or at any later readiness check."""
    import os

    bad = tmp_path / "fifo-release"
    bad.mkdir()
    os.mkfifo(bad / "manifest.json")
    with hostile_server(tmp_path / "srv") as srv:
        r = httpx.post(srv.url + "/v2/tileship/canary", json={"release": str(bad)}, timeout=10.0)
        assert 400 <= r.status_code < 500, r.text
        for path in ("/v2/health/live", "/v2/health/ready", "/v2/tileship/canary", "/metrics"):
            assert httpx.get(srv.url + path, timeout=5.0).status_code == 200, path
        assert post(srv, "/v2/models/add/infer", _GOOD).json()["outputs"][0]["data"] == [4.0, 6.0]


def test_control_routes_time_out_a_stalled_body_and_a_disconnect_is_no_500(tmp_path):
    with hostile_server(tmp_path, body_timeout_s=1.0) as srv:
        for route in ("/v2/repository/models/add/unload", "/v2/repository/models/add/load", "/v2/tileship/canary"):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                t0 = time.monotonic()
                s.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{".encode())
                head = s.recv(65536)
                assert head.startswith(b"HTTP/1.1 408"), (route, head[:200])
                assert time.monotonic() - t0 < 8, route
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:  # gone mid-body
                s.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{".encode())
                time.sleep(0.2)
        time.sleep(0.5)
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "tileship_requests_total", code="500") == 0
        assert not (tmp_path / "diag").exists(), "a disconnect wrote diagnostics"
        assert "add" not in srv.service.unloaded, "a refused unload took effect"


def test_an_unknown_region_lists_a_few_registered_names_not_all(tmp_path):
    from multiprocessing import shared_memory

    made = [shared_memory.SharedMemory(create=True, size=64) for _ in range(12)]
    try:
        with hostile_server(tmp_path) as srv:
            for i, m in enumerate(made):
                r = httpx.post(srv.url + f"/v2/systemsharedmemory/region/{'n' * 250}{i:03d}/register",
                               json={"key": "/" + m.name, "offset": 0, "byte_size": 64}, timeout=10.0)
                assert r.status_code == 200, r.text
            r = httpx.get(srv.url + "/v2/systemsharedmemory/region/nothing/status", timeout=10.0)
            assert r.status_code == 404
            err = r.json()["error"]
            assert "and 4 more" in err and len(err) < 1000, err[:300]
            httpx.post(srv.url + "/v2/systemsharedmemory/unregister", timeout=10.0)
    finally:
        for m in made:
            m.close()
            m.unlink()


def test_grpc_rpcs_past_the_limit_are_refused_and_counted(tmp_path):
    """At most ``max_connections`` RPCs run at once; the next one is RESOURCE_EXHAUSTED, counted as
    REST's connection-limit 503s are, and a slot frees when its RPC ends."""
    import threading

    import numpy as np
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    def slow(x: torch.Tensor) -> torch.Tensor:
        time.sleep(float(x[0]))
        return x

    with hostile_server(tmp_path, extra={"slow": slow}, max_connections=2, max_inflight=8, grpc_port=0) as srv:
        def infer(seconds: float) -> Any:
            c = tg.InferenceServerClient(srv.grpc_url)
            try:
                inp = tg.InferInput("X", [1], "FP32")
                inp.set_data_from_numpy(np.full(1, seconds, dtype=np.float32))
                return c.infer("slow", [inp])
            except InferenceServerException as exc:
                return exc
            finally:
                c.close()

        held = [threading.Thread(target=infer, args=(2.0,)) for _ in range(2)]
        for t in held:
            t.start()
        time.sleep(0.7)  # both slow RPCs are running
        refused = infer(0.0)
        for t in held:
            t.join()
        assert isinstance(refused, InferenceServerException), refused
        assert "RESOURCE_EXHAUSTED" in str(refused.status()) and "limit of 2 concurrent RPCs" in refused.message()
        assert not isinstance(infer(0.0), InferenceServerException)  # the slots are free again
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        assert 'tileship_rejected_total{reason="connection_limit"} 1.0' in metrics


def test_a_grpc_message_over_the_body_limit_is_refused_named_and_counted(tmp_path):
    """A ModelInfer message over ``max_body_bytes`` is RESOURCE_EXHAUSTED naming its size and the limit,
    counted as REST's 413s are (``body_too_large``), never parsed; one under the limit is served."""
    import numpy as np
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    with hostile_server(tmp_path, max_body_bytes=1 << 16, grpc_port=0) as srv:
        c = tg.InferenceServerClient(srv.grpc_url)
        try:
            def add(n: int) -> Any:
                a, b = tg.InferInput("X", [n], "FP32"), tg.InferInput("Y", [n], "FP32")
                a.set_data_from_numpy(np.ones(n, dtype=np.float32))
                b.set_data_from_numpy(np.ones(n, dtype=np.float32))
                try:
                    return c.infer("add", [a, b])
                except InferenceServerException as exc:
                    return exc

            refused = add(1 << 13)  # 2 x 32 KiB of tensor bytes and the header: over the limit, under the backstop (2x)
            assert isinstance(refused, InferenceServerException), refused
            assert "RESOURCE_EXHAUSTED" in str(refused.status()), refused.status()
            assert "over the server's limit of 65536 bytes" in refused.message(), refused.message()
            assert "inference.ModelInferRequest of 655" in refused.message(), refused.message()
            served = add(1 << 10)
            assert not isinstance(served, InferenceServerException), served
            assert np.array_equal(served.as_numpy("Z"), np.full(1 << 10, 2.0, dtype=np.float32))
        finally:
            c.close()
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        assert metric(metrics, "tileship_rejected_total", reason="body_too_large") == 1
        assert metric(metrics, "tileship_requests_total", code="500") == 0


@pytest.mark.parametrize("args", [["--port", "99999"], ["--port", "-1"], ["--grpc-port", "70000"]])
def test_a_port_outside_0_to_65535_is_refused_before_anything_loads(args, tmp_path):
    """--port 99999 used to listen on 34463 (the number wrapped at 16 bits) and report ready there."""
    from typer.testing import CliRunner

    from tileship.cli import app

    res = CliRunner().invoke(app, ["serve", str(tmp_path / "no-release"), *args])
    assert res.exit_code in (1, 2), res.output
    assert args[0] in res.output and "load" not in res.output.lower(), res.output
