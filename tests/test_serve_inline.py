"""In process, a small call a kernel served quickly runs on the event loop (``serve.handoff``),
not a request thread; references, slow calls and calls that failed with a bug go to a thread.
``handoff.outcome`` waits for a thread's call or a task with one future and a timer. Real servers
on 127.0.0.1 with the CPU "c" release."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from test_serve import log_lines
from test_serve_workers import add_binary

from tileship.runtime.decision import Decision
from tileship.serve import BackgroundServer, ServeConfig, handoff
from tileship.serve.call_plan import CallPlan

KERNEL = Decision("kernel", "kernel", "add.float32.N8.c")
REFERENCE = Decision("reference", "undeclared_shape", None)


def _plan(n: int) -> CallPlan:
    return CallPlan(inputs=[], dtype="float32", dims={"N": n}, declared=True, outputs=[])


# -- the policy -------------------------------------------------------------------------------------

def test_inline_keeps_only_keys_a_kernel_served_within_the_limit():
    il = handoff.Inline(limit_s=200e-6)
    k = il.key("rel", "add", _plan(8))
    assert k == il.key("rel", "add", _plan(8)) and k != il.key("rel", "add", _plan(9))
    assert not il.fits(k)                       # never seen: a thread
    il.record(k, 50e-6, KERNEL)
    assert il.fits(k)
    il.record(k, 300e-6, KERNEL)                # one slow call: back to a thread
    assert not il.fits(k)
    il.record(k, 10e-6, REFERENCE)              # a reference, however fast: never inline
    assert not il.fits(k)
    il.record(k, 10e-6, KERNEL)
    il.drop(k)                                  # a bug in its call
    assert not il.fits(k)
    il.record(k, None, KERNEL)                  # no time measured
    assert not il.fits(k)


def test_inline_forgets_everything_past_its_key_limit():
    il = handoff.Inline(limit_s=1.0, max_keys=3)
    keys = [il.key("rel", "add", _plan(n)) for n in range(4)]
    for k in keys[:3]:
        il.record(k, 1e-6, KERNEL)
    il.record(keys[3], 1e-6, KERNEL)
    assert [il.fits(k) for k in keys] == [False, False, False, True]


# -- waiting ----------------------------------------------------------------------------------------

def test_outcome_returns_raises_and_times_out_without_cancelling_a_running_call():
    pool = concurrent.futures.ThreadPoolExecutor(1)
    release = threading.Event()

    async def main() -> None:
        assert await handoff.outcome(pool.submit(lambda: 7), 5) == 7
        with pytest.raises(ZeroDivisionError):
            await handoff.outcome(pool.submit(lambda: 1 / 0), 5)
        running = pool.submit(release.wait, 10)
        queued = pool.submit(lambda: "never")   # behind ``running`` on the one thread
        with pytest.raises(TimeoutError):
            await handoff.outcome(queued, 0.05)
        assert queued.cancelled()               # not started: dropped
        with pytest.raises(TimeoutError):
            await handoff.outcome(running, 0.05)
        assert not running.cancelled()          # started: it runs on
        release.set()
        assert running.result(5) is True
        task = asyncio.ensure_future(asyncio.sleep(0.01, result="task"))
        assert await handoff.outcome(task, 5) == "task"
        slow = asyncio.ensure_future(asyncio.sleep(0.5, result="late"))
        with pytest.raises(TimeoutError):
            await handoff.outcome(slow, 0.05)
        assert await slow == "late"              # a task is never cancelled by its request's timeout

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()


def test_outcome_takes_an_answer_the_task_sets_itself_a_turn_sooner():
    """``Timed.wrap(answered)`` sets ``answered`` as soon as the job's result is in: ``outcome`` waiting on it
    resumes before the task's own done callbacks run. Errors still come through the task, and a timeout still
    leaves the task running."""
    from tileship.serve.canary_stats import Timed

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def job() -> str:
            await asyncio.sleep(0.01)
            return "ok"

        timed, answered, seen = Timed(job), loop.create_future(), []
        task = asyncio.ensure_future(timed.wrap(answered))
        task.add_done_callback(lambda _t: seen.append("done callbacks"))
        assert await handoff.outcome(task, 5, 0.0, answered) == "ok"
        assert seen == [] and task.done() and timed.seconds is not None  # resumed before the done callbacks

        async def bad() -> None:
            raise ZeroDivisionError

        answered = loop.create_future()
        with pytest.raises(ZeroDivisionError):
            await handoff.outcome(asyncio.ensure_future(Timed(bad).wrap(answered)), 5, 0.0, answered)

        async def slow() -> str:
            await asyncio.sleep(0.3)
            return "late"

        answered = loop.create_future()
        task = asyncio.ensure_future(Timed(slow).wrap(answered))
        with pytest.raises(TimeoutError):
            await handoff.outcome(task, 0.05, 0.0, answered)
        assert await task == "late"                # it ran on, and left the answered future as the timeout set it

    asyncio.run(main())


# -- the server -------------------------------------------------------------------------------------

@contextlib.contextmanager
def _server(source: Any, **kw: Any) -> Iterator[BackgroundServer]:
    srv = BackgroundServer(ServeConfig(source=source, log_stream=io.StringIO(), **kw)).start()
    try:
        assert srv.wait_ready(), srv.service.holder.readiness()[1]
        yield srv
    finally:
        srv.stop()


def _ways(srv: BackgroundServer, mark: int) -> list[str]:
    return [x["on"] for x in log_lines(srv.service.config.log_stream)[mark:]
            if x.get("event") == "infer" and x.get("status") == 200]


def test_repeated_small_kernel_calls_run_inline_with_the_same_answers(cpu_release_build):
    rng = np.random.default_rng(0)
    # a generous limit: in this test the client shares the server's process (and its GIL), which
    # stretches every call's measured time; the limit itself is checked in the unit tests above
    with _server(cpu_release_build.path, inline_us=50_000) as srv, httpx.Client() as c:
        for _ in range(5):
            a, b = rng.standard_normal((2, 1000), dtype=np.float32)
            st, out = add_binary(srv.url, c, a, b)
            assert st == 200 and np.array_equal(out, a + b)
        a, b = rng.standard_normal((2, 30000), dtype=np.float32)  # 360 KB through the host: never inline
        assert add_binary(srv.url, c, a, b)[0] == 200
        assert add_binary(srv.url, c, a, b)[0] == 200
        ways = _ways(srv, 0)
        assert ways[:5] == ["thread"] + ["inline"] * 4, ways
        assert ways[5:] == ["thread", "thread"], ways
        assert srv.service.slots.inflight == 0


def test_inline_us_0_sends_every_call_to_a_thread(cpu_release_build):
    with _server(cpu_release_build.path, inline_us=0) as srv, httpx.Client() as c:
        for _ in range(3):
            assert add_binary(srv.url, c, np.ones(8, np.float32), np.ones(8, np.float32))[0] == 200
        assert _ways(srv, 0) == ["thread"] * 3


def test_a_bug_in_an_inline_call_is_a_500_and_sends_its_key_back_to_a_thread(cpu_release_build, monkeypatch):
    one = np.ones(8, np.float32)
    with _server(cpu_release_build.path, inline_us=50_000) as srv, httpx.Client() as c:
        assert add_binary(srv.url, c, one, one)[0] == 200
        assert add_binary(srv.url, c, one, one)[0] == 200        # inline now
        runner = srv.service.holder.current.release.ops["add"]

        def broken(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("a bug in the call path")

        monkeypatch.setattr(runner, "call", broken)
        st, msg = add_binary(srv.url, c, one, one)
        assert st == 500 and "request id" in msg, (st, msg)
        monkeypatch.undo()
        st, out = add_binary(srv.url, c, one, one)
        assert st == 200 and (out == 2).all()
        assert _ways(srv, 0) == ["thread", "inline", "thread"], _ways(srv, 0)  # the 500 has no infer line
        assert add_binary(srv.url, c, one, one)[0] == 200
        assert _ways(srv, 0)[-1] == "inline"


def test_a_slow_reference_is_never_inline_and_still_gets_its_504(tmp_path):
    from test_serve_limits import hostile_server, post

    def slow(x: Any) -> Any:
        time.sleep(float(x[0]))
        return x

    with hostile_server(tmp_path, extra={"slow": slow}, request_timeout_s=0.3) as srv:
        def call(seconds: float) -> httpx.Response:
            return post(srv, "/v2/models/slow/infer",
                        b'{"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [%f]}]}' % seconds)

        for _ in range(3):
            assert call(0.0).status_code == 200
        assert call(1.0).status_code == 504   # a thread: the 504 comes at 0.3 s, not after the call
        assert set(_ways(srv, 0)) == {"thread"}
