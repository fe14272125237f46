"""`tileship serve --workers N`: small calls talk to their worker from the event loop
(``serve.remote.execute_remote_async``), large ones from a request thread. Both give the same
answers, are admitted the same way, and a 504 on the loop keeps its slot until the worker's call
ends. Real servers on 127.0.0.1 with the CPU "c" release; the workers are real processes."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time
import warnings
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from test_serve import log_lines
from test_serve_workers import add_binary, server, wait_workers, workers_server  # noqa: F401 (fixture)
from traffic import ClosedLoop

from tileship.serve import call_plan, protocol, remote


def _plan(*inputs: protocol.InputTensor) -> call_plan.CallPlan:
    return call_plan.CallPlan(inputs=list(inputs), dtype="float32", dims={}, declared=True, outputs=[])


def test_on_loop_takes_only_small_calls_to_workers_without_cuda_windows():
    small = protocol.InputTensor("A", "FP32", (1000,))
    workers, in_process = SimpleNamespace(workers=object()), SimpleNamespace(workers=None)
    assert remote.on_loop(workers, _plan(small, small), {"C": 4000})
    assert not remote.on_loop(in_process, _plan(small, small), {"C": 4000})  # --workers 0: never
    n = remote.LOOP_BYTES // 4
    assert remote.on_loop(workers, _plan(protocol.InputTensor("A", "FP32", (n,))), {})
    assert not remote.on_loop(workers, _plan(protocol.InputTensor("A", "FP32", (n + 1,))), {})
    assert not remote.on_loop(workers, _plan(protocol.InputTensor("A", "FP64", (n // 2 + 1,))), {})
    assert not remote.on_loop(workers, _plan(small), {"C": remote.LOOP_BYTES})  # the outputs count too
    cuda = protocol.InputTensor("A", "FP32", (4,), fetch=lambda: None)
    assert not remote.on_loop(workers, _plan(cuda), {"C": 16})


def test_host_bytes_leave_out_what_stays_on_the_device():
    big = protocol.InputTensor("A", "FP16", (4096, 4096))
    window = protocol.InputTensor("B", "FP16", (4096, 4096), fetch=lambda: None)
    out = {"C": 4096 * 4096 * 2}
    assert remote.host_bytes(_plan(big, window), out) == 2 * 4096 * 4096 * 2
    assert remote.host_bytes(_plan(big, window), out, on_device={"C"}) == 4096 * 4096 * 2
    assert remote.host_bytes(_plan(window), out, on_device={"C"}) == 0


def test_small_calls_run_on_the_loop_and_large_ones_on_a_thread(server):  # noqa: F811
    stream = server.service.config.log_stream
    mark = len(log_lines(stream))
    rng = np.random.default_rng(1)
    with httpx.Client() as c:
        for n in (8, 1000, 5000, 20000):  # 3 x 4 x 5000 = 60 KiB: the loop; 3 x 4 x 20000: a thread
            a, b = rng.standard_normal((2, n), dtype=np.float32)
            st, out = add_binary(server.url, c, a, b)
            assert st == 200 and np.array_equal(out, a + b), (n, st)
    lines = [x for x in log_lines(stream)[mark:] if x.get("event") == "infer"]
    assert [x["on"] for x in lines] == ["loop", "loop", "loop", "thread"], lines


def test_two_workers_under_mixed_load_answer_every_call_right(cpu_release_build):
    """Loop and thread calls at once, on two workers: every answer is its own request's."""
    wrong: list[str] = []

    def call(url: str, rng: Any, c: httpx.Client) -> tuple[int, str]:
        n = int(rng.choice([3, 1000, 5000, 30000]))
        a, b = rng.standard_normal((2, n), dtype=np.float32)
        st, out = add_binary(url, c, a, b)
        if st == 200 and not np.array_equal(out, a + b):
            wrong.append(f"N={n}")
        return st, "" if st == 200 else str(out)

    with workers_server(cpu_release_build.path, workers=2) as srv:
        loop = ClosedLoop(call, clients=6)
        served, failures = loop.start(srv.url)
        deadline = time.monotonic() + 30
        while len(served) < 400 and time.monotonic() < deadline:
            time.sleep(0.05)
        loop.stop()
        on = {x["on"] for x in log_lines(srv.service.config.log_stream) if x.get("event") == "infer"}
    assert not failures, failures[:3]
    assert not wrong, wrong[:3]
    assert len(served) >= 400 and all(st == 200 for st, _ in served), [m for st, m in served if st != 200][:3]
    assert on == {"loop", "thread"}


def test_a_504_on_the_loop_keeps_its_slot_until_the_wedged_worker_is_replaced(cpu_release_build):
    with workers_server(cpu_release_build.path, workers=1, worker_timeout_s=2.0, request_timeout_s=0.3,
                        max_inflight=1) as srv:
        victim = wait_workers(srv)["serving"][0]
        os.kill(victim, signal.SIGSTOP)  # alive but never answering
        try:
            with httpx.Client() as c:
                one = np.ones(8, np.float32)
                st, msg = add_binary(srv.url, c, one, one)
                assert st == 504 and "timeout" in msg, (st, msg)
                st, msg = add_binary(srv.url, c, one, one)  # the first call still holds the only slot
                assert st == 503 and "overloaded: 1 requests in flight" in msg, (st, msg)
                ready = httpx.get(srv.url + "/v2/health/ready")
                assert ready.status_code == 503 and "wedged" in ready.json()["reason"]
                deadline = time.monotonic() + 15  # the pool's 2 s timeout replaces the worker, freeing the slot
                while srv.service.slots.inflight and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert srv.service.slots.inflight == 0
                st, out = add_binary(srv.url, c, one, one)
                assert st == 200 and (out == 2).all()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
        assert srv.service.workers.failures.get("wedged") == 1
        assert victim not in srv.service.workers.status()["serving"]


@pytest.mark.parametrize("n", [1000, 30000], ids=["loop", "thread"])
def test_a_worker_killed_between_calls_is_replaced_on_either_path(server, n):  # noqa: F811
    victim = wait_workers(server)["serving"][0]
    os.kill(victim, signal.SIGKILL)
    a, b = np.random.default_rng(n).standard_normal((2, n), dtype=np.float32)
    with httpx.Client() as c:
        st, out = add_binary(server.url, c, a, b)
    assert st == 200 and np.array_equal(out, a + b)
    assert victim not in server.service.workers.status()["serving"]


@pytest.mark.parametrize("fds", [True, False], ids=["recvmsg", "recv"])
def test_the_loop_read_waits_for_a_whole_frame_and_sees_the_peer_go(fds):
    import socket

    from tileship.serve import worker_wire as wire

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        reader = wire.Reader(b, fds=fds)
        assert reader.poll() is None                      # nothing yet: no wait, no frame
        body = b'{"id":7,"x":1}'
        frame = wire._LEN.pack(len(body)) + body
        a.sendall(frame[:3])
        assert reader.poll() is None                      # not even the length yet
        a.sendall(frame[3:-1])
        assert reader.poll() is None                      # the length, but not the whole body
        a.sendall(frame[-1:] + wire._LEN.pack(2) + b"{}")  # the rest, then a second frame at once
        assert reader.poll() == {"id": 7, "x": 1}
        assert reader.poll() == {}
        assert reader.poll() is None
        a.close()
        with pytest.raises(wire.PeerGone):
            reader.poll()
    finally:
        b.close()


def _ready_pool(build: Any) -> Any:
    """A started one-worker pool on ``build`` (log discarded), once it has a serving worker and a standby
    (at most 120 s)."""
    from tileship.serve.holder import Target
    from tileship.serve.worker_pool import WorkerPool

    class Log:
        def event(self, *a: Any, **k: Any) -> None:
            pass

    pool = WorkerPool(1, {"trusted_keys": None}, log=Log(), timeout_s=30.0)
    pool.start(Target(build.path, False), build.path.name)
    deadline = time.monotonic() + 120
    while not (pool.serving and pool.standby) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pool


def test_a_loop_call_cancelled_mid_flight_retires_its_worker(cpu_release_build):
    """A call cancelled while its worker still owes the answer (the server shutting down) must not
    give that worker back: its late answer would be read as the next call's."""
    import asyncio

    from tileship.serve.workers import Raw

    rid = cpu_release_build.path.name
    pool = _ready_pool(cpu_release_build)
    try:
        victim, standby = pool.serving[0], pool.standby
        x = np.ones(8, np.float32)
        args = [Raw(memoryview(x).cast("B"), [8], "float32")] * 2

        async def cancelled_call() -> None:
            os.kill(victim.pid, signal.SIGSTOP)  # it will not answer
            task = asyncio.ensure_future(pool.acall(rid, "add", args, 32))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled_call())
        deadline = time.monotonic() + 10
        while pool.failures.get("cancelled", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.failures.get("cancelled") == 1 and victim.dead
        assert pool.serving == [standby]                  # the standby took its place
        outs, decision = asyncio.run(pool.acall(rid, "add", args, 32))
        assert np.array_equal(outs[0].numpy(), x + x) and decision.path == "kernel"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.pid, signal.SIGCONT)
        pool.close()


def test_frame_after_returns_a_frame_that_comes_while_it_polls_or_after_it_sleeps():
    import socket
    import threading

    from tileship.serve import worker_wire as wire

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        reader = wire.Reader(b)

        def later(delay_s: float, msg: dict[str, Any]) -> threading.Timer:
            t = threading.Timer(delay_s, wire.send, (a, msg))
            t.start()
            return t

        later(0.002, {"id": 1})
        assert reader.frame_after(30.0) == {"id": 1}   # came while it polled
        t = later(0.2, {"id": 2})
        assert reader.frame_after(0.001) == {"id": 2}  # the poll ran out: it slept in recvmsg for the frame
        t.join()
        wire.send(a, {"id": 3})
        assert reader.frame_after(0.0) == {"id": 3}    # 0: no polling at all
        a.close()
        with pytest.raises(wire.PeerGone):
            reader.frame_after(5.0)                    # end-of-file seen while polling
    finally:
        b.close()


def test_the_loop_polls_for_an_answer_only_while_answers_come_soon():
    import socket
    import threading

    from tileship.serve import worker_wire as wire
    from tileship.serve.workers import Worker

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        w = Worker(proc=None, sock=b, buf=None, spin_s=30.0)  # type: ignore[arg-type]
        threading.Timer(0.002, wire.send, (a, {"id": 1})).start()
        assert w._spin(time.perf_counter()) == {"id": 1}   # the answer came while it polled
        w.quick = False                                    # the last answer took longer than twice the spin
        t = threading.Timer(0.05, wire.send, (a, {"id": 2}))
        t.start()
        assert w._spin(time.perf_counter()) is None        # no polling: the loop waits on the socket instead
        t.join()
        assert w._spin(time.perf_counter()) == {"id": 2}   # an answer already there is always taken
        w.quick, w.spin_s = True, 0.0
        assert w._spin(time.perf_counter()) is None        # 0 (--loop-spin-us 0): never polls
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("spin", [(300.0, 100.0), (0.0, 0.0)], ids=["polling", "no_polling"])
def test_workers_answer_alike_with_polling_on_and_off(cpu_release_build, spin):
    """Both wait modes, given explicitly: the default turns polling off below 4 usable CPUs (``default_spin_us``),
    so a CI machine of 2 would otherwise never run a polling server."""
    with workers_server(cpu_release_build.path, workers=1, worker_timeout_s=5.0, worker_spin_us=spin[0],
                        loop_spin_us=spin[1]) as srv, httpx.Client() as c:
        rng = np.random.default_rng(3)
        for n in (8, 1000, 40000):  # the last is past LOOP_BYTES: a request thread's call
            a, b = rng.standard_normal((2, n), dtype=np.float32)
            st, out = add_binary(srv.url, c, a, b)
            assert st == 200 and np.array_equal(out, a + b), out


def test_polling_is_on_by_default_only_with_four_cpus_or_more():
    """A process that polls holds a core: with fewer than 4 usable CPUs the waits sleep at once unless the flags
    say otherwise; a value given (0 included) is kept as given, the other one defaulted."""
    from pathlib import Path

    from tileship.serve.config import POLL_MIN_CPUS, ServeConfig, default_spin_us

    assert POLL_MIN_CPUS == 4
    assert default_spin_us(1) == default_spin_us(3) == (0.0, 0.0)
    assert default_spin_us(4) == default_spin_us(16) == (300.0, 100.0)
    assert default_spin_us() == default_spin_us(len(os.sched_getaffinity(0)))
    auto = default_spin_us()
    assert ServeConfig(source=Path("r")).spin_us() == auto
    assert ServeConfig(source=Path("r"), worker_spin_us=0.0).spin_us() == (0.0, auto[1])
    assert ServeConfig(source=Path("r"), loop_spin_us=7.0).spin_us() == (auto[0], 7.0)


def test_cli_refuses_a_negative_or_huge_spin(cpu_release_build):
    import subprocess
    import sys

    base = [sys.executable, "-m", "tileship.cli", "serve", str(cpu_release_build.path), "--port", "0", "--workers", "1"]
    for flag, value in (("--worker-spin-us", "-1"), ("--loop-spin-us", "2000000")):
        r = subprocess.run([*base, flag, value], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "--loop-spin-us 0 to 1000000" in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_thread_call_after_a_loop_call_that_waited_under_uvloop_is_answered(cpu_release_build):
    """uvloop's ``add_reader`` leaves the socket non-blocking; a request thread's blocking read on the same
    worker must still wait for the answer (it read EAGAIN at once: 'did not answer within 10 s', the worker
    killed as wedged and the request a 503)."""
    uvloop = pytest.importorskip("uvloop")
    import threading

    from tileship.serve.holder import Target
    from tileship.serve.workers import Raw, Worker

    w = Worker.spawn(Target(cpu_release_build.path, False), {"trusted_keys": None, "loop_spin_us": 0.0})
    try:
        w.wait_ready(120)
        x = np.arange(8, dtype=np.float32)
        args = [Raw(memoryview(x).cast("B"), [8], "float32")] * 2
        os.kill(w.pid, signal.SIGSTOP)  # the answer comes late: the loop waits on the socket (add_reader)
        threading.Timer(0.2, os.kill, (w.pid, signal.SIGCONT)).start()
        reply = uvloop.run(w.acall("add", args, 32, 10.0))
        assert reply.get("ok"), reply
        reply = w.call("add", args, 32, 10.0)  # a request thread's call on the same worker
        assert reply.get("ok"), reply
        assert np.array_equal(w.buf.view(reply["outs"][0], copy=True).numpy(), x + x)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.pid, signal.SIGCONT)
        w.stop()


def test_a_request_thread_waiting_for_a_worker_gets_the_one_given_back():
    """``Idle``: a thread waits for a worker on the pool's own lock; a worker given back wakes it, one retired
    while idle is skipped, and the request's own deadline still ends the wait (never run)."""
    import threading
    from types import SimpleNamespace

    from tileship.serve.handoff import QueueTimeout
    from tileship.serve.pool_calls import Idle
    from tileship.serve.validate import BadRequest
    from tileship.serve.worker_pool import WorkerPool

    pool = WorkerPool(1, {}, log=None, wait_s=5.0)
    pool.release_id, pool.idle["r"] = "r", Idle(pool.lock)
    w, dead, live = (SimpleNamespace(release="r", dead=False, busy=False) for _ in range(3))
    assert pool._take_now("r") is None                     # none free: no wait
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(pool._take("r")))
    t.start()
    time.sleep(0.1)
    assert not got and pool.idle["r"].waiting == 1        # it waits
    pool._give_back(w)  # type: ignore[arg-type]
    t.join(5)
    assert got == [w] and w.busy and pool.idle["r"].waiting == 0
    dead.dead = True
    with pool.lock:
        pool.idle["r"].put(dead)  # type: ignore[arg-type]
        pool.idle["r"].put(live)  # type: ignore[arg-type]
    assert pool._take_now("r") is live and not dead.busy   # the retired one is skipped
    t0 = time.monotonic()
    with pytest.raises(QueueTimeout):
        pool._take("r", time.monotonic() + 0.1)           # the request's timeout: never run
    assert 0.09 < time.monotonic() - t0 < 2
    pool.wait_s = 0.05
    with pytest.raises(BadRequest, match="no worker is ready") as e:
        pool._take("r")
    assert e.value.status == 503


class _FakeWorker:
    """A serving worker without a process: ``acall`` sends to it and it answers at once, with no outputs."""

    release, dead, busy, pid = "r", False, False, 1

    def _send(self, *args: Any) -> int:
        return 0

    async def answer(self, *args: Any) -> dict[str, Any]:
        return {"ok": True, "outs": [], "decision": ["kernel", "declared", None]}

    def kill(self) -> None:
        pass


@pytest.mark.parametrize("give_up", ["cancel", "wait_for_timeout", "cancel_after_the_thread_took_it"])
def test_a_loop_call_that_gives_up_waiting_for_a_worker_leaves_it_idle(give_up):
    """A loop call that finds no idle worker waits for one on a thread; when its caller gives up meanwhile (a
    cancelled task, ``asyncio.wait_for`` past its time), the worker given back later must stay idle for the
    next call: the waiting thread must not take it for nobody, which left it marked busy for good. Also when
    the thread has taken it already and the task is cancelled before it resumes."""
    import asyncio
    import concurrent.futures

    from tileship.serve.pool_calls import Idle
    from tileship.serve.worker_pool import WorkerPool

    pool = WorkerPool(1, {}, log=None, wait_s=5.0)
    pool.release_id, pool.idle["r"] = "r", Idle(pool.lock)
    w = _FakeWorker()
    w.busy = True                                                 # the first call runs on the only worker
    threads = concurrent.futures.ThreadPoolExecutor(2)

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(threads)
        task = asyncio.ensure_future(pool.acall("r", "add", [], 0))  # the second call: no worker idle
        while pool.idle["r"].waiting < 1:                            # its thread waits for one
            await asyncio.sleep(0.005)
        if give_up == "cancel_after_the_thread_took_it":
            pool._give_back(w)  # type: ignore[arg-type]            # the first call ends
            while not w.busy:                                        # the thread takes it; the loop is held,
                time.sleep(0.001)                                    # so the task has not resumed yet
        if give_up != "wait_for_timeout":
            task.cancel()
        with pytest.raises(TimeoutError if give_up == "wait_for_timeout" else asyncio.CancelledError):
            await (asyncio.wait_for(task, 0.01) if give_up == "wait_for_timeout" else task)
        if give_up != "cancel_after_the_thread_took_it":
            pool._give_back(w)  # type: ignore[arg-type]            # the first call ends
        threads.shutdown(wait=True)                                   # the waiting thread has finished
        assert not w.busy and list(pool.idle["r"].workers) == [w], "the worker leaked: busy for nobody"
        outs, decision = await pool.acall("r", "add", [], 0)         # the third call is served
        assert outs == [] and decision.path == "kernel"
        assert not w.busy and pool.inflight["r"] == 0

    asyncio.run(asyncio.wait_for(main(), 10))


@pytest.mark.parametrize("how", ["task_cancelled", "closed", "dropped"])
def test_a_loop_call_cancelled_before_its_first_step_retires_its_worker(how, monkeypatch):
    """``acall`` sends the call to an idle worker at once; the task that awaits the answer may be cancelled before
    it first runs (the server shutting down), the coroutine closed unawaited, or dropped without ever being awaited
    or closed (a caller's bug, or an exception between ``acall`` and its await). Then no code of the rest runs,
    which left the worker busy for nobody with an answer owed and ``inflight`` one too high. It must end as a
    call cancelled mid-flight does: the worker retired, the standby serving the next call."""
    import asyncio

    from tileship.serve.pool_calls import Idle
    from tileship.serve.worker_pool import WorkerPool

    class Log:
        def event(self, *a: Any, **k: Any) -> None:
            pass

    pool = WorkerPool(1, {}, log=Log(), wait_s=5.0)
    spawned: list[int] = []
    monkeypatch.setattr(pool, "_spawn", lambda attempt=1: spawned.append(attempt))  # no process: a new standby
    pool.release_id, pool.idle["r"] = "r", Idle(pool.lock)
    w, standby = _FakeWorker(), _FakeWorker()
    pool.serving, pool.standby = [w], standby  # type: ignore[list-item,assignment]
    pool._give_back(w)  # type: ignore[arg-type]

    async def main() -> None:
        rest = pool.acall("r", "add", [], 0)                        # sent to w now
        assert w.busy and pool.inflight["r"] == 1
        if how == "task_cancelled":
            task = asyncio.ensure_future(rest)
            task.cancel()                                           # before its first step
            with pytest.raises(asyncio.CancelledError):
                await task
        elif how == "closed":
            rest.close()
        else:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                del rest
                gc.collect()
            assert not [m for m in seen if "never awaited" in str(m.message)], [str(m.message) for m in seen]
        deadline = time.monotonic() + 5
        while not w.dead and time.monotonic() < deadline:       # retired on a thread, as mid-flight
            await asyncio.sleep(0.005)
        assert w.dead and pool.failures.get("cancelled") == 1, "the worker leaked: busy for nobody"
        assert pool.inflight["r"] == 0 and spawned == [1]
        assert pool.serving == [standby] and list(pool.idle["r"].workers) == [standby]
        outs, decision = await pool.acall("r", "add", [], 0)       # the next call is served, by the standby
        assert outs == [] and decision.path == "kernel"
        assert not standby.busy and pool.inflight["r"] == 0

    asyncio.run(asyncio.wait_for(main(), 10))

def test_a_thread_that_takes_a_worker_for_a_caller_gone_gives_it_back():
    """``Claim``: a thread that finds its caller gone takes no worker for it: the worker stays idle and not busy."""
    from tileship.serve.pool_calls import Claim, Idle
    from tileship.serve.validate import BadRequest
    from tileship.serve.worker_pool import WorkerPool

    pool = WorkerPool(1, {}, log=None, wait_s=5.0)
    pool.release_id, pool.idle["r"] = "r", Idle(pool.lock)
    w = _FakeWorker()
    pool._give_back(w)  # type: ignore[arg-type]
    claim = Claim()
    claim.gone = True
    t0 = time.monotonic()
    with pytest.raises(BadRequest):
        pool._take("r", None, claim)
    assert time.monotonic() - t0 < 1 and claim.worker is None
    assert not w.busy and list(pool.idle["r"].workers) == [w]
    live = Claim()
    assert pool._take("r", None, live) is w and live.worker is w and w.busy


def test_a_loop_call_goes_to_its_worker_before_its_task_first_runs(cpu_release_build):
    """``WorkerPool.acall`` sends the call to a worker idle now before it returns the coroutine of the rest, so
    the worker runs while the loop gets round to the task; a release not loaded is a 503 at once."""
    import asyncio
    import select

    from tileship.serve.validate import BadRequest
    from tileship.serve.workers import Raw

    rid = cpu_release_build.path.name
    pool = _ready_pool(cpu_release_build)
    try:
        w = pool.serving[0]
        x = np.arange(8, dtype=np.float32)
        args = [Raw(memoryview(x).cast("B"), [8], "float32")] * 2
        rest = pool.acall(rid, "add", args, 32)       # no loop runs yet
        assert w.busy and pool.inflight[rid] == 1
        assert select.select([w.sock], [], [], 10)[0]  # the worker has answered already
        outs, decision = asyncio.run(rest)
        assert np.array_equal(outs[0].numpy(), x + x) and decision.path == "kernel"
        assert not w.busy and pool.inflight[rid] == 0
        with pytest.raises(BadRequest, match="no longer loaded") as e:
            pool.acall("not-loaded", "add", args, 32)
        assert e.value.status == 503 and pool.inflight["not-loaded"] == 0
    finally:
        pool.close()


def test_admission_frees_the_slot_when_the_call_cannot_start():
    import asyncio
    from types import SimpleNamespace

    from tileship.serve.admission import Slots
    from tileship.serve.validate import BadRequest

    class Gauge:
        def inc(self, *a: Any) -> None:
            pass

        def dec(self, *a: Any) -> None:
            pass

        def labels(self, *a: Any) -> Any:
            return self

    slots = Slots(None, 1, 1, SimpleNamespace(inflight=Gauge(), rejected=Gauge()))  # type: ignore[arg-type]

    def start() -> Any:
        raise BadRequest(503, "release gone")

    async def main() -> None:
        with pytest.raises(BadRequest, match="release gone"):
            slots.admit(start)
        assert slots.inflight == 0

        async def one() -> int:
            return 1

        assert await slots.admit(one) == 1 and slots.inflight == 0

    asyncio.run(main())
