"""Canary promotion in a running server (``serve.rollout``, ``/v2/tileship/canary``): the
counter-based split, a faulty or slower canary rolled back on its own with every request
answered, a good canary promoted with the registry's pointer moved, a canary that fails to
load. Real CPU-catalog releases, a real server on 127.0.0.1."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from test_serve import copy_release, log_lines, metric, post, serving

from tileship.release.registry import Registry
from tileship.runtime.dispatch import Release
from tileship.serve import ServeConfig
from tileship.serve.holder import release_id_at


def add_body(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    import json

    inputs = [{"name": n, "shape": [len(a)], "datatype": "FP32", "data": a.tolist()} for n, a in (("A", x), ("B", y))]
    return {"content": json.dumps({"inputs": inputs}).encode(), "headers": {"content-type": "application/json"}}


def call_add(url: str, rng: np.random.Generator, client: httpx.Client | None = None) -> httpx.Response:
    x, y = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    r = (client or httpx).post(url + "/v2/models/add/infer", timeout=30.0, **add_body(x, y))
    assert r.status_code == 200, r.text
    got = np.asarray(r.json()["outputs"][0]["data"], dtype=np.float32)
    assert np.allclose(got, x + y, atol=1e-6), "wrong values"
    return r


def wait_state(url: str, states: set[str], timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        st = httpx.get(url + "/v2/tileship/canary", timeout=10.0).json()
        if st["state"] in states or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


@pytest.fixture
def registry(cpu_release_build, tmp_path) -> tuple[Registry, str, str, Path]:
    """A registry with A active and B (same kernels, another id) published."""
    b = copy_release(cpu_release_build.path, tmp_path / "b", version="canary-2")
    reg = Registry(tmp_path / "registry")
    id_a, id_b = reg.publish(cpu_release_build.path), reg.publish(b)
    reg.activate(id_a)
    return reg, id_a, id_b, b


def loader_wrapping(release_id: str, wrap: Any) -> Any:
    """A loader that loads releases for real and wraps every kernel of ``release_id`` with ``wrap``."""
    from tileship.runtime.loader import load

    def loader(path: Path, reference_only: bool) -> Release:
        rel = load(path, reference_only=reference_only)
        if release_id_at(Path(path)) == release_id:
            for runner in rel.ops.values():
                for e in runner.entries:
                    if e.kernel is not None:
                        e.kernel = wrap(e.kernel)
        return rel

    return loader


def test_good_canary_gets_its_exact_share_and_is_promoted_in_server_and_registry(registry, tmp_path):
    reg, id_a, id_b, _ = registry
    logs = io.StringIO()
    with serving(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=logs)) as srv:
        r = post(srv, "/v2/tileship/canary", json={"release": id_b[:10], "fraction": 0.25, "window_requests": 20,
                                                    "max_p50_ratio": 1.5})
        assert r.status_code == 200 and r.json()["result"] == "started" and r.json()["canary"] == id_b, r.text
        ready = httpx.get(srv.url + "/v2/health/ready").json()
        assert (
            ready["release"] == id_a and ready["canary"]["state"] == "running" and ready["canary"]["fraction"] == 0.25
        )
        rng = np.random.default_rng(0)
        served = [call_add(srv.url, rng).headers["x-tileship-release"] for _ in range(80)]
        # request n goes to the canary when floor(n/4) steps: exactly every 4th one
        assert [i + 1 for i, s in enumerate(served) if s == id_b] == list(range(4, 81, 4))
        st = wait_state(srv.url, {"promoted", "rolled_back", "aborted"})
        assert st["state"] == "promoted", st
        assert st["routed"]["canary"]["requests"] == 20 and st["routed"]["active"]["requests"] == 60
        last = st["last_decision"]
        assert last["action"] == "promote" and last["numbers"]["models"]["add"]["compared"]
        assert last["numbers"]["models"]["add"]["p50_canary_ms"] > 0 and "ratio" in last["numbers"]["models"]["add"]
        assert reg.active().release_id == id_b and reg.active().previous == id_a
        assert st["outcome"]["registry"]["active"] == id_b
        assert srv.service.holder.current.release_id == id_b
        assert {call_add(srv.url, rng).headers["x-tileship-release"] for _ in range(5)} == {id_b}
        assert post(srv, "/v2/repository/reload").json()["result"] == "unchanged"  # server and registry agree
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "tileship_canary_requests_total", release="canary", model="add", outcome="ok") == 20
        assert metric(text, "tileship_canary_requests_total", release="active", model="add", outcome="ok") == 60
        assert metric(text, "tileship_canary_decisions_total", action="promote") == 1
        assert metric(text, "tileship_release_info", release_id=id_b) == 1
        events = log_lines(logs)
        promote = [x for x in events if x["event"] == "canary_decision" and x["action"] == "promote"]
        assert len(promote) == 1 and promote[0]["numbers"]["requests"] == {"active": 60, "canary": 20}
        assert any(x["event"] == "canary_end" and x["state"] == "promoted" for x in events)


def _load_under_canary(srv: Any, body: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """Start a canary with 3 clients running; return its final status, releases served, failures."""
    stop, served, failures = threading.Event(), [], []

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with httpx.Client() as c:
            while not stop.is_set():
                try:
                    served.append(call_add(srv.url, rng, c).headers["x-tileship-release"])
                except Exception as exc:  # a failed request during the canary is what the tests forbid
                    failures.append(repr(exc))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        r = post(srv, "/v2/tileship/canary", json=body)
        assert r.status_code == 200, r.text
        st = wait_state(srv.url, {"promoted", "rolled_back", "aborted", "failed"})
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join()
    return st, served, failures


def test_faulting_canary_is_rolled_back_and_every_request_is_answered(registry, tmp_path):
    reg, id_a, id_b, _ = registry

    def faulty(kernel: Any) -> Any:
        calls = []

        def run(*args: Any) -> Any:  # fine for the warm-up call, then raises: the breaker serves the reference
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("deliberate canary kernel fault")
            return kernel(*args)

        return run

    logs = io.StringIO()
    cfg = ServeConfig(source=reg.root, loader=loader_wrapping(id_b, faulty), diagnostics_dir=tmp_path / "d",
                      log_stream=logs)
    with serving(cfg) as srv:
        st, served, failures = _load_under_canary(srv, {"release": id_b, "fraction": 0.2, "window_requests": 1000})
        assert not failures, failures[:3]
        assert st["state"] == "rolled_back", st
        assert st["last_decision"]["action"] == "rollback" and "errors" in st["last_decision"]["reasons"][0]
        assert st["routed"]["canary"]["errors"] >= 1 and st["routed"]["active"]["errors"] == 0
        assert reg.active().release_id == id_a and reg.active().previous is None  # the registry untouched
        assert srv.service.holder.current.release_id == id_a
        assert served[-1] == id_a and id_b in served
        ready = httpx.get(srv.url + "/v2/health/ready").json()
        assert ready["ready"] and ready["release"] == id_a and ready["canary"]["state"] == "rolled_back"
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "tileship_canary_requests_total", release="canary", model="add", outcome="error") >= 1
        assert metric(text, "tileship_canary_fraction") == 0
        assert any(x["event"] == "canary_decision" and x["action"] == "rollback" for x in log_lines(logs))


def test_slower_canary_is_rolled_back_on_latency(registry, tmp_path):
    reg, id_a, id_b, _ = registry

    def slow(kernel: Any) -> Any:
        def run(*args: Any) -> Any:
            time.sleep(0.02)  # far above what a loaded machine adds to the active release's p50
            return kernel(*args)

        return run

    cfg = ServeConfig(source=reg.root, loader=loader_wrapping(id_b, slow), diagnostics_dir=tmp_path / "d",
                      log_stream=io.StringIO())
    with serving(cfg) as srv:
        st, served, failures = _load_under_canary(srv, {"release": id_b, "fraction": 0.3, "window_requests": 20,
                                                        "max_p50_ratio": 1.1})
        assert not failures, failures[:3]
        assert st["state"] == "rolled_back", st
        row = st["last_decision"]["numbers"]["models"]["add"]
        assert row["ratio"] > 1.5 and row["slower"] and "latency: add" in st["last_decision"]["reasons"][0], row
        assert reg.active().release_id == id_a and srv.service.holder.current.release_id == id_a


def test_canary_that_fails_to_load_leaves_the_active_release_serving(registry, cpu_release_build, tmp_path):
    reg, id_a, _, _ = registry
    bad = copy_release(cpu_release_build.path, tmp_path / "bad", version="3")
    (bad / "release.json").write_text((bad / "release.json").read_text() + " ")
    with serving(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=io.StringIO())) as srv:
        r = post(srv, "/v2/tileship/canary", json={"release": str(bad), "fraction": 0.5})
        assert r.status_code == 409 and r.json()["stage"] == "load" and "release.json" in r.json()["error"]
        assert r.json()["serving"] == id_a
        st = httpx.get(srv.url + "/v2/tileship/canary").json()
        assert st["state"] == "failed" and "release.json" in st["failure"]["error"]
        ready = httpx.get(srv.url + "/v2/health/ready").json()
        assert ready["ready"] and ready["release"] == id_a and ready["canary"]["state"] == "failed"
        rng = np.random.default_rng(1)
        assert {call_add(srv.url, rng).headers["x-tileship-release"] for _ in range(10)} == {id_a}
        r = post(srv, "/v2/tileship/canary", json={"release": "nope-not-there", "fraction": 0.5})
        assert r.status_code == 409 and r.json()["stage"] == "resolve" and "nope-not-there" in r.json()["error"]
        assert reg.active().release_id == id_a


def test_bad_requests_and_abort(registry, tmp_path):
    reg, id_a, id_b, _ = registry
    with serving(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=io.StringIO())) as srv:
        for body, words in (({"fraction": 0.1}, "'release' is required"),
                            ({"release": id_b, "fraction": 2}, "fraction"),
                            ({"release": id_b, "window_requests": 1.5}, "window_requests"),
                            ({"release": id_b, "colour": 1}, "unknown field 'colour'")):
            r = post(srv, "/v2/tileship/canary", json=body)
            assert r.status_code == 400 and words in r.json()["error"], (body, r.text)
        assert post(srv, "/v2/tileship/canary", json={"release": id_b, "fraction": 0.5}).status_code == 200
        again = post(srv, "/v2/tileship/canary", json={"release": id_b, "fraction": 0.5})
        assert again.status_code == 409 and "already running" in again.json()["error"]
        r = httpx.delete(srv.url + "/v2/tileship/canary")
        assert r.status_code == 200 and r.json()["state"] == "aborted"
        rng = np.random.default_rng(2)
        assert {call_add(srv.url, rng).headers["x-tileship-release"] for _ in range(6)} == {id_a}
        assert reg.active().release_id == id_a


def test_release_directory_server_promotes_itself_and_a_reload_aborts_a_running_canary(cpu_release_build, tmp_path):
    from test_serve import point

    from tileship.release import bundle

    a = copy_release(cpu_release_build.path, tmp_path / "a")
    b = copy_release(cpu_release_build.path, tmp_path / "b", version="dir-2")
    c = copy_release(cpu_release_build.path, tmp_path / "c", version="dir-3")
    id_a, id_b, id_c = (bundle.read_manifest(p)["release_id"] for p in (a, b, c))
    link = tmp_path / "current"
    point(link, a)
    with serving(ServeConfig(source=link, diagnostics_dir=tmp_path / "d", log_stream=io.StringIO())) as srv:
        r = post(srv, "/v2/tileship/canary", json={"release": str(b), "fraction": 0.5, "window_requests": 12,
                                                    "max_p50_ratio": 1.5})
        assert r.status_code == 200, r.text
        rng = np.random.default_rng(3)
        served = [call_add(srv.url, rng).headers["x-tileship-release"] for _ in range(24)]
        assert served.count(id_b) == 12 and served[1::2] == [id_b] * 12
        st = wait_state(srv.url, {"promoted", "rolled_back", "aborted"})
        assert st["state"] == "promoted" and st["outcome"]["registry"] is None, st
        assert srv.service.holder.current.release_id == id_b
        # a canary whose baseline is swapped away by a reload is aborted
        assert post(srv, "/v2/tileship/canary", json={"release": str(c), "fraction": 0.5}).status_code == 200
        point(link, a)
        assert post(srv, "/v2/repository/reload").json()["release"] == id_a
        call_add(srv.url, rng)
        st = wait_state(srv.url, {"promoted", "rolled_back", "aborted"})
        assert st["state"] == "aborted" and "reload" in st["outcome"]["reason"], st
        assert {call_add(srv.url, rng).headers["x-tileship-release"] for _ in range(6)} == {id_a}
        assert id_c not in {call_add(srv.url, rng).headers["x-tileship-release"] for _ in range(4)}


def test_canary_missing_a_model_the_active_serves_is_refused(registry, tmp_path):
    from tileship.runtime.loader import load

    reg, id_a, id_b, _ = registry

    def loader(path: Path, reference_only: bool) -> Release:
        rel = load(path, reference_only=reference_only)
        if release_id_at(Path(path)) == id_b:
            del rel.ops["rmsnorm_cpu"]
        return rel

    with serving(ServeConfig(source=reg.root, loader=loader, diagnostics_dir=tmp_path / "d",
                             log_stream=io.StringIO())) as srv:
        r = post(srv, "/v2/tileship/canary", json={"release": id_b, "fraction": 0.5})
        assert r.status_code == 409 and "does not serve rmsnorm_cpu" in r.json()["error"], r.text
        assert srv.service.holder.current.release_id == id_a


def test_the_canary_compares_the_operator_time_not_the_copies_around_it():
    """A call whose ``execute`` recorded its spans is judged on its launch and device wait alone (what a release
    changes); without them (worker processes, a whole model) on the whole job's time."""
    from types import SimpleNamespace

    from tileship.serve.canary_stats import op_seconds

    plan = SimpleNamespace(spans={"args_ms": 40.0, "call_ms": 0.5, "sync_ms": 1.5, "host_ms": 30.0, "encode_ms": 2.0})
    assert op_seconds(plan, 0.074) == pytest.approx(0.002)
    plan.spans["device_ms"] = 0.25  # CUDA events around the call, recorded while a canary runs (a GPU)
    assert op_seconds(plan, 0.074) == pytest.approx(0.00025)
    assert op_seconds(SimpleNamespace(spans={}), 0.074) == 0.074
    assert op_seconds(None, 0.074) == 0.074 and op_seconds(None, None) is None


def test_a_stalled_device_span_is_no_sample_rather_than_host_time():
    """While a canary runs on a GPU, a call whose launches took longer to queue than the device was held
    (``DeviceSpan``: the events would hold the host's delay) is left out of the window, not judged on the
    job's time; ``DeviceSpan`` off (no canary, or the CPU) records nothing. The gate follows the recent
    queuing times, within its bounds."""
    from types import SimpleNamespace

    from tileship.serve import canary_stats
    from tileship.serve.canary_stats import GATE_US, DeviceSpan, gate_us, op_seconds

    plan = SimpleNamespace(spans={"call_ms": 0.5, "sync_ms": 1.5, "device_stalled_ms": 0.9})
    assert op_seconds(plan, 0.074) is None
    off = DeviceSpan(False)
    off.start()
    off.stop()
    spans: dict[str, float] = {}
    off.note(spans)
    assert spans == {} and off.ms() is None and not off.stalled
    late = DeviceSpan(False)
    late.queued_s = late.gate_us / 1e6  # queued for the whole gate: the device may have idled inside the span
    assert late.stalled and late.ms() is None
    late.note(spans)
    assert spans == {"device_stalled_ms": round(late.gate_us / 1e3, 3)}
    late.queued_s = late.gate_us / 4e6
    assert not late.stalled
    saved = list(canary_stats._queued)
    try:
        canary_stats._queued.clear()
        assert gate_us() == GATE_US[0]
        canary_stats._queued.extend([300.0] * 9 + [5000.0] * 7)  # the host slowed after idling: the gate widens
        assert gate_us() == 600.0
        canary_stats._queued.extend([5000.0] * 16)
        assert gate_us() == GATE_US[1]
        canary_stats._queued.extend([20.0] * 16)  # busy again: never under the lower bound
        assert gate_us() == GATE_US[0]
    finally:
        canary_stats._queued.clear()
        canary_stats._queued.extend(saved)


def test_a_span_that_cannot_gate_is_no_span_never_an_error():
    """``DeviceSpan`` on where the device cannot be gated (this CPU build of torch has no CUDA events or spin;
    a torch without its private ``_sleep``): start and stop do nothing and the call is judged on its launch
    and wait, as without a canary span."""
    import torch

    from tileship.serve.canary_stats import DeviceSpan

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the gate works here")
    span = DeviceSpan(True)
    span.start()
    span.stop()
    spans: dict[str, float] = {}
    span.note(spans)
    assert span.events is None and span.ms() is None and not span.stalled and spans == {}
