"""`tileship serve --workers N`: calls run in worker processes (tensors in shared memory), a warm
standby takes over when a worker is killed or wedges, and readiness stays up. Real servers on
127.0.0.1 with the CPU "c" release; the workers are real processes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from test_serve import assert_close, client, copy_release, infer, metric, point
from traffic import ClosedLoop

from tileship.release import bundle
from tileship.serve import BackgroundServer, ServeConfig


def wait_workers(srv: BackgroundServer, *, standby: bool = True, timeout: float = 120.0,
                 not_pids: tuple[int, ...] = ()) -> dict[str, Any]:
    """Poll /v2/health/ready until ready with a serving worker (and a standby whose pid is not in ``not_pids``)."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        r = httpx.get(f"{srv.url}/v2/health/ready", timeout=10)
        body = r.json()
        w = body.get("workers") or {}
        if (
            r.status_code == 200
            and w.get("serving")
            and (not standby or (w.get("standby") and w["standby"] not in not_pids))
        ):
            return w
        time.sleep(0.05)
    raise AssertionError(f"workers not ready within {timeout} s: {body}")


def wait_gone(pids: list[int], timeout: float = 15.0) -> bool:
    """True once none of ``pids`` is a process any more (they were stopped and reaped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def workers_server(source: Any, **kw: Any) -> Iterator[BackgroundServer]:
    logs = io.StringIO()
    srv = BackgroundServer(ServeConfig(source=source, log_stream=logs, **kw)).start()
    srv.logs = logs  # type: ignore[attr-defined]
    try:
        wait_workers(srv)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server(cpu_release_build) -> Iterator[BackgroundServer]:
    with workers_server(cpu_release_build.path, workers=1, worker_timeout_s=3.0) as srv:
        yield srv


def add_binary(url: str, c: httpx.Client, a: np.ndarray, b: np.ndarray) -> tuple[int, Any]:
    """POST add with binary tensors; (status, C as an array) or (status, error message)."""
    head = json.dumps({"inputs": [{"name": n, "shape": [len(x)], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}} for n, x in (("A", a), ("B", b))],
                       "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}).encode()
    r = c.post(f"{url}/v2/models/add/infer", content=head + a.tobytes() + b.tobytes(), timeout=30,
               headers={"inference-header-content-length": str(len(head)), "content-type": "application/octet-stream"})
    if r.status_code != 200:
        return r.status_code, r.json()["error"]
    hl = int(r.headers["inference-header-content-length"])
    return 200, np.frombuffer(r.content[hl:], dtype=np.float32)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("model,dims", [("add", {"N": 1000}), ("add", {"N": 4096}),
                                        ("rmsnorm_cpu", {"M": 5, "N": 1024}), ("rmsnorm_cpu", {"M": 64, "N": 256})],
                                        ids=["add-dyn", "add-static", "rms-dyn", "rms-static"])
def test_workers_answer_like_the_in_process_server(server, cpu_release_build, model, dims, binary):
    rel = server.service.holder.current.release
    runner = rel.ops[model]
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn([dims[d] for d in ds], generator=g) for _, ds in runner.shape.inputs]
    out_name = rel.declarations[model]["outputs"][0][0]
    c = client(server)
    try:
        res = infer(c, model, {n: t.numpy() for (n, _), t in zip(runner.shape.inputs, tensors, strict=True)},
                    binary=binary, out=out_name)
    finally:
        c.close()
    assert_close(res.as_numpy(out_name), runner.reference(*[t.double() for t in tensors]), 1e-4, 1e-4)
    p = res.get_response()["parameters"]
    assert p["tileship_release"] == cpu_release_build.release_id
    assert (p["tileship_path"], p["tileship_reason"]) == ("kernel", "kernel")
    w = server.service.workers.status()
    assert w["serving"] and w["standby"] and os.getpid() not in [*w["serving"], w["standby"]]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_a_duplicate_output_through_a_worker(server, algorithm):
    a, b = np.arange(5000, dtype=np.float32), np.full(5000, 0.5, dtype=np.float32)
    c = client(server)
    try:  # 5000 floats: the worker's buffer path, not the event loop's (remote.LOOP_BYTES)
        res = infer(c, "add", {"A": a, "B": b}, binary=True, out="C", request_compression_algorithm=algorithm)
    finally:
        c.close()
    np.testing.assert_array_equal(res.as_numpy("C"), a + b)
    r = httpx.post(f"{server.url}/v2/models/add/infer", json={"inputs": [
        {"name": "A", "shape": [1], "datatype": "FP32", "data": [1]},
        {"name": "B", "shape": [1], "datatype": "FP32", "data": [2]}], "outputs": [{"name": "C"}, {"name": "C"}]})
    assert r.status_code == 400 and r.json()["error"] == "output C is requested twice", r.text


def test_undeclared_shape_and_bad_calls_through_a_worker(server):
    with httpx.Client() as c:
        st, out = add_binary(server.url, c, np.ones(3, np.float32), np.full(3, 2, np.float32))
        assert st == 200 and (out == 3).all()
        r = c.post(f"{server.url}/v2/models/add/infer", json={"inputs": [
            {"name": "A", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]},
            {"name": "B", "shape": [3], "datatype": "FP32", "data": [1, 1, 1]}]})
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 3, 4]
        bad = c.post(f"{server.url}/v2/models/add/infer", json={"inputs": [
            {"name": "A", "shape": [3], "datatype": "FP64", "data": [1, 2, 3]},
            {"name": "B", "shape": [3], "datatype": "FP32", "data": [1, 1, 1]}]})
        assert bad.status_code == 400 and "wrong datatype" in bad.json()["error"]


def test_undeclared_shape_goes_to_the_reference_in_the_worker(server):
    x, w = torch.randn(3, 100), torch.randn(100)
    c = client(server)
    try:
        res = infer(c, "rmsnorm_cpu", {"X": x.numpy(), "W": w.numpy()}, binary=True, out="Y")
    finally:
        c.close()
    p = res.get_response()["parameters"]
    assert (p["tileship_path"], p["tileship_reason"]) == ("reference", "undeclared_shape")
    assert_close(res.as_numpy("Y"), torch.nn.functional.rms_norm(x.double(), (100,), w.double(), 1e-6), 1e-5, 1e-5)


def test_a_call_larger_than_the_buffer_grows_it(server):
    n = 1 << 19  # 2 MiB per input: more than the worker's first 1 MiB buffer
    a, b = np.random.default_rng(0).standard_normal((2, n), dtype=np.float32)
    with httpx.Client() as c:
        st, out = add_binary(server.url, c, a, b)
    assert st == 200 and np.array_equal(out, a + b)


def test_kill_9_under_load_loses_no_answer_and_a_new_standby_appears(server):
    """Kill the serving worker repeatedly under a closed loop: 0 wrong answers, every failure counted."""
    wrong: list[str] = []

    def call(url: str, rng: Any, c: httpx.Client) -> tuple[int, str]:
        n = int(rng.choice([17, 1000, 4096, 20000]))  # the last one runs on a request thread, the rest on the loop
        a, b = rng.standard_normal((2, n), dtype=np.float32)
        st, out = add_binary(url, c, a, b)
        if st == 200 and not np.array_equal(out, a + b):
            wrong.append(f"N={n}: {np.abs(out - (a + b)).max()}")
        return st, "" if st == 200 else str(out)

    kills, seen = int(os.environ.get("TILESHIP_WORKER_KILLS", "5")), set()
    pool = server.service.workers
    retries0, failures0 = pool.retries, dict(pool.failures)
    loop = ClosedLoop(call, clients=4)
    served, failures = loop.start(server.url)
    try:
        for _ in range(kills):
            w = wait_workers(server, not_pids=tuple(seen))
            victim = w["serving"][0]
            seen.update([victim, w["standby"]])
            before = len(served)
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while len(served) < before + 20 and time.monotonic() < deadline:
                time.sleep(0.01)  # the standby answers at once
            assert len(served) >= before + 20, f"no answers after killing {victim}"
    finally:
        loop.stop()
    w = wait_workers(server, not_pids=tuple(seen))  # a new standby, not one seen before
    assert not failures, failures[:3]                # every request got an HTTP answer
    assert not wrong, wrong[:3]
    errors = [(st, msg) for st, msg in served if st != 200]
    assert all(st == 503 and "worker failure" in msg for st, msg in errors), errors[:3]
    died = (
        pool.failures.get("died", 0)
        + pool.failures.get("exited", 0)
        - failures0.get("died", 0)
        - failures0.get("exited", 0)
    )
    assert died == kills
    # a request on a killed worker is retried once; only a second death in a row makes a 503
    assert len(errors) <= kills and pool.retries - retries0 <= kills
    print(f"\n{kills} kills, {len(served)} answers, {len(errors)} 503s, {pool.retries - retries0} retried, 0 wrong")
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    text = httpx.get(f"{server.url}/metrics").text
    assert metric(text, "tileship_workers", state="standby") == 1
    assert metric(text, "tileship_worker_retries_total") == pool.retries


def test_a_wedged_worker_is_killed_and_the_standby_answers(server):
    w = wait_workers(server)
    victim = w["serving"][0]
    os.kill(victim, signal.SIGSTOP)  # alive but never answering
    try:
        with httpx.Client() as c:
            t0 = time.monotonic()
            st, msg = add_binary(server.url, c, np.ones(8, np.float32), np.ones(8, np.float32))
            assert st == 503 and "did not answer within 3 s" in msg, (st, msg)
            assert time.monotonic() - t0 < 10
            st, out = add_binary(server.url, c, np.ones(8, np.float32), np.ones(8, np.float32))
            assert st == 200 and (out == 2).all()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    assert victim not in server.service.workers.status()["serving"]
    assert server.service.workers.failures.get("wedged", 0) >= 1
    wait_workers(server, not_pids=(victim, w["standby"]))


def test_hot_swap_rolls_the_workers_under_load_with_no_failed_request(cpu_release_build, tmp_path):
    """Reload to release B under a closed loop: B's workers start (standby first) while A's serve, then
    traffic moves; 0 failed or wrong answers, late requests name B, A's workers stop. A bad release is a
    409 that leaves B's workers in place."""
    a = copy_release(cpu_release_build.path, tmp_path / "a")
    b = copy_release(cpu_release_build.path, tmp_path / "b", version="2")
    bad = copy_release(cpu_release_build.path, tmp_path / "bad", version="3")
    (bad / "release.json").write_text((bad / "release.json").read_text() + " ")
    id_a, id_b = bundle.read_manifest(a)["release_id"], bundle.read_manifest(b)["release_id"]
    link = tmp_path / "current"
    point(link, a)
    wrong: list[str] = []

    def call(url: str, rng: Any, c: httpx.Client) -> tuple[float, int, str]:
        x, y = rng.standard_normal((2, 257), dtype=np.float32)
        sent = time.monotonic()
        r = c.post(f"{url}/v2/models/add/infer", timeout=30, json={"inputs": [
            {"name": "A", "shape": [257], "datatype": "FP32", "data": x.tolist()},
            {"name": "B", "shape": [257], "datatype": "FP32", "data": y.tolist()}]})
        if r.status_code != 200:
            return sent, r.status_code, r.text
        if not np.array_equal(np.array(r.json()["outputs"][0]["data"], dtype=np.float32), x + y):
            wrong.append("wrong values")
        return sent, 200, r.headers["x-tileship-release"]

    with workers_server(link, workers=1) as srv:
        pool = srv.service.workers
        pool.grace_s = 0.5
        old = pool.status()
        loop = ClosedLoop(call, clients=3)
        served, failures = loop.start(srv.url)
        try:
            point(link, b)
            r = httpx.post(f"{srv.url}/v2/repository/reload", timeout=300)
            swapped_at = time.monotonic()
            assert r.status_code == 200, r.text
            assert (r.json()["result"], r.json()["release"], r.json()["previous"]) == ("swapped", id_b, id_a)
            time.sleep(1.0)
        finally:
            loop.stop()
        assert not failures and not wrong, (failures[:3], wrong[:3])
        errors = [x for x in served if x[1] != 200]
        assert not errors, errors[:3]
        assert {rid for _, _, rid in served} == {id_a, id_b}
        late = {rid for sent, _, rid in served if sent > swapped_at + 0.05}
        assert late == {id_b}
        new = wait_workers(srv)
        assert new["release"] == id_b and not set([*new["serving"], new["standby"]]) & set(
            [*old["serving"], old["standby"]]
        )
        deadline = time.monotonic() + 10
        while pool.status()["draining"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pool.status()["draining"]
        assert wait_gone([*old["serving"], old["standby"]]), "A's workers still run"
        point(link, bad)
        r = httpx.post(f"{srv.url}/v2/repository/reload", timeout=300)
        assert r.status_code == 409 and r.json()["serving"] == id_b
        assert pool.status()["serving"] == new["serving"]
        with httpx.Client() as c:
            st, out = add_binary(srv.url, c, np.ones(8, np.float32), np.ones(8, np.float32))
        assert st == 200 and (out == 2).all()


def test_workers_stop_with_the_server(cpu_release_build):
    with workers_server(cpu_release_build.path, workers=2) as srv:
        w = srv.service.workers.status()
        assert len(w["serving"]) == 2
        pids = [*w["serving"], w["standby"]]
    assert wait_gone(pids)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "bool", "uint8"])
def test_the_shared_buffer_round_trips_every_dtype(dtype):
    from tileship.serve import worker_wire as wire

    buf = wire.Buffer.create(1 << 16)
    try:
        t = (torch.arange(24) % 5).reshape(2, 3, 4).to(getattr(torch, dtype))
        d = buf.put(wire.ALIGN * 3, t.transpose(0, 2))  # non-contiguous on purpose
        got = buf.view(d, copy=True)
        assert got.dtype == t.dtype and torch.equal(got, t.transpose(0, 2))
        raw = memoryview(bytearray(t.view(torch.uint8).numpy().tobytes()) if dtype != "bool" else t.numpy().tobytes())
        d2 = buf.put_raw(0, raw, [2, 3, 4], dtype)
        assert torch.equal(buf.view(d2), t)
    finally:
        buf.close()


def test_the_shared_buffer_keeps_its_arrays_per_slot_but_never_a_stale_value():
    """``put`` and ``view`` build a slot's array once; each call's values still go through, and a copy out
    is the caller's own (the next call's outputs, written to the same slot, do not reach it)."""
    from tileship.serve import worker_wire as wire

    buf = wire.Buffer.create(1 << 12)
    try:
        d1 = buf.put(64, torch.ones(4))
        first = buf.view(d1, copy=True)
        d2 = buf.put(64, torch.full((4,), 2.0))
        assert d2 is d1 and len(buf.slots) == 1                 # the same slot: built once
        assert torch.equal(first, torch.ones(4))                 # the copy kept its own values
        assert torch.equal(buf.view(d2, copy=True), torch.full((4,), 2.0))
        assert torch.equal(buf.view(d2), torch.full((4,), 2.0))  # the view sees the buffer as it is now
        buf.put(64, torch.full((4,), 3.0))
        assert torch.equal(buf.view(d2), torch.full((4,), 3.0))
        with pytest.raises(ValueError, match="past the buffer"):
            buf.put((1 << 12) - 8, torch.ones(4))                # 16 bytes at 8 from the end
        with pytest.raises(ValueError):
            buf.view({"off": (1 << 12) - 8, "shape": [4], "dtype": "float32"})
        with pytest.raises(ValueError, match="past the buffer"):
            buf.view({"off": (1 << 12) - 2, "shape": [2], "dtype": "bfloat16"})
    finally:
        buf.close()


def test_a_sticky_fault_in_a_worker_call_is_a_fatal_reply(tmp_path):
    """The worker answers a sticky device error with ``fatal`` (then exits 3); other errors are 400/500."""
    from types import SimpleNamespace

    from tileship.errors import CallError
    from tileship.serve import worker
    from tileship.serve import worker_wire as wire

    def runner(exc: Exception) -> Any:
        def call(*args: Any) -> Any:
            raise exc
        return SimpleNamespace(call=call)

    ops = {"poisoned": runner(RuntimeError("CUDA error: an illegal memory access was encountered")),
           "wrong": runner(CallError("wrong rank", operator="wrong", argument="A")), "bug": runner(ValueError("oops"))}
    served = SimpleNamespace(release=SimpleNamespace(ops=ops), devices=dict.fromkeys(ops, "cpu"))
    buf = wire.Buffer.create(1 << 12)
    try:
        arg = buf.put(0, torch.ones(4))
        reply = {n: worker._call(served, buf, {"id": 1, "name": n, "args": [arg], "out": [64, 1024]}) for n in ops}
    finally:
        buf.close()
    assert reply["poisoned"]["fatal"] and reply["poisoned"]["status"] == 503
    assert "illegal memory access" in reply["poisoned"]["error"]
    assert reply["wrong"] == {"id": 1, "status": 400, "error": "wrong(A): wrong rank"}
    assert reply["bug"]["status"] == 500 and "ValueError: oops" in reply["bug"]["error"]


def test_worker_start_up_is_timed_in_parts(server):
    """issue 16's standby target is 'imports + under 2 s': the imports are timed apart from the load."""
    ready = [json.loads(line) for line in server.logs.getvalue().splitlines()  # type: ignore[attr-defined]
             if line.startswith("{") and '"worker_ready"' in line]
    assert ready, server.logs.getvalue()[-2000:]  # type: ignore[attr-defined]
    for e in ready:
        assert e["import_s"] > 0 and e["load_s"] > 0 and e["warmup_s"] >= 0
        assert e["start_s"] >= e["import_s"] + e["load_s"], e  # the parts fit inside the whole start
