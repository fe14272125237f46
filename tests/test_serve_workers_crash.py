"""`tileship serve --workers N` when a worker dies during a call: killed from outside, the request is
retried once on the standby; crashed by itself (a poisoned input makes the kernel fault), it is a 503
naming the worker and the signal, not retried, so the standby survives the poison. Real servers on
127.0.0.1 with the fault-injection release built for "c" (``benchmarks/fault_kernel.py``: SIGSEGV)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from test_serve import metric
from test_serve_workers import wait_workers, workers_server

from tileship.serve import BackgroundServer
from tileship.serve.workers import Ending, ending

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"  # fault_kernel.py: not in the wheel
POISON = -12345.0  # fault_kernel.POISON (importing it here would import tilelang before the fixture)


def child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)


def killed(sig: int) -> subprocess.Popen[bytes]:
    proc = child("import time; time.sleep(60)")
    time.sleep(0.2)
    proc.send_signal(sig)
    return proc


ENDINGS = {
    "segv": (lambda: child("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), Ending(True, "SIGSEGV")),
    "abort": (lambda: child("import os; os.abort()"), Ending(True, "SIGABRT")),
    "fpe": (lambda: child("import os, signal; os.kill(os.getpid(), signal.SIGFPE)"), Ending(True, "SIGFPE")),
    "exit-1": (lambda: child("raise SystemExit(1)"), Ending(True, "exit status 1")),
    "exit-0": (lambda: child("pass"), Ending(False, "exit status 0")),
    "kill-9": (lambda: killed(signal.SIGKILL), Ending(False, "SIGKILL")),
    "sigterm": (lambda: killed(signal.SIGTERM), Ending(False, "SIGTERM")),
    "sigint": (lambda: child("import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                             "os.kill(os.getpid(), signal.SIGINT)"), Ending(False, "SIGINT")),
    "usr1": (lambda: killed(signal.SIGUSR1), Ending(False, "SIGUSR1")),
}


@pytest.mark.parametrize("case", ENDINGS, ids=list(ENDINGS))
def test_ending_tells_a_crash_from_a_kill(case):
    start, expected = ENDINGS[case]
    proc = start()
    got = ending(proc, wait_s=30)
    assert got == expected, f"{case}: returncode {proc.returncode} read as {got}, expected {expected}"


def test_ending_of_a_process_still_running_is_not_a_crash():
    proc = child("import time; time.sleep(60)")
    try:
        t0 = time.monotonic()
        assert ending(proc, wait_s=0.2) == Ending(False, "no exit status within 0.2 s")
        assert time.monotonic() - t0 < 2
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    """``--workers 1`` on a release holding ``fault_copy`` (a copy; ``X[0] == POISON``: a SIGSEGV)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCH))  # the front-end and the workers import fault_kernel (its reference)
        mp.setenv("PYTHONPATH", os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")]))
        from tileship.build.builder import BuildOptions, build
        from tileship.declare.project import Project, load_operators

        proj = Project(model="faults", model_version="1", operator_modules=("fault_kernel",), targets=("c",),
                       root=BENCH)
        result = build(proj, load_operators(proj), tmp_path_factory.mktemp("faults"), BuildOptions(jobs=1))
        assert result.ok, result.failed
        with workers_server(result.path, workers=1, worker_timeout_s=20.0) as srv:
            yield srv


def copy(srv: BackgroundServer, x: np.ndarray) -> tuple[int, Any]:
    """POST fault_copy; (200, Y as an array) or (status, the error message)."""
    r = httpx.post(f"{srv.url}/v2/models/fault_copy/infer", timeout=60, json={"inputs": [
        {"name": "X", "shape": [len(x)], "datatype": "FP32", "data": x.tolist()}]})
    if r.status_code != 200:
        return r.status_code, r.json()["error"]
    return 200, np.array(r.json()["outputs"][0]["data"], dtype=np.float32)


def good(n: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def failed_events(srv: BackgroundServer) -> list[dict[str, Any]]:
    lines = srv.logs.getvalue().splitlines()  # type: ignore[attr-defined]
    return [e for e in (json.loads(ln) for ln in lines if ln.startswith("{")) if e.get("event") == "worker_failed"]


def test_a_request_that_crashes_its_worker_is_a_503_and_not_retried(fault_server):
    srv, pool = fault_server, fault_server.service.workers
    w = wait_workers(srv)
    victim, standby = w["serving"][0], w["standby"]
    retries0, crashed0 = pool.retries, pool.failures.get("crashed", 0)
    x = good()
    st, out = copy(srv, x)
    assert st == 200 and np.array_equal(out, x), (st, out)
    x[0] = POISON
    st, msg = copy(srv, x)
    assert st == 503, (st, msg)
    assert f"worker {victim} crashed (SIGSEGV)" in msg and "not retried" in msg, msg
    # the poison ran once: the standby took over and is alive, nothing was retried
    assert pool.retries == retries0 and pool.failures.get("crashed", 0) == crashed0 + 1
    assert pool.status()["serving"] == [standby] and alive(standby) and not alive(victim)
    st, out = copy(srv, good(seed=1))
    assert st == 200 and np.array_equal(out, good(seed=1)), (st, out)
    assert httpx.get(f"{srv.url}/v2/health/ready").status_code == 200
    text = httpx.get(f"{srv.url}/metrics").text
    assert metric(text, "tileship_worker_failures_total", reason="crashed") == crashed0 + 1
    assert metric(text, "tileship_worker_retries_total") == retries0 == 0
    ev = [e for e in failed_events(srv) if e["pid"] == victim]
    assert len(ev) == 1 and ev[0]["reason"] == "crashed" and "SIGSEGV" in ev[0]["detail"], ev
    assert pool.last_failover["promoted"] == standby
    wait_workers(srv, not_pids=(victim, standby))  # and a new standby starts


def test_a_worker_killed_mid_request_has_the_request_retried(fault_server):
    srv, pool = fault_server, fault_server.service.workers
    w = wait_workers(srv)
    victim, standby = w["serving"][0], w["standby"]
    retries0, died0 = pool.retries, pool.failures.get("died", 0)
    worker = next(x for x in pool.serving if x.pid == victim)
    os.kill(victim, signal.SIGSTOP)  # so the request is surely in flight on it when it is killed
    x, answer = good(4096, seed=2), {}
    t = threading.Thread(target=lambda: answer.update(r=copy(srv, x)))
    t.start()
    deadline = time.monotonic() + 10
    while not worker.busy and time.monotonic() < deadline:
        time.sleep(0.005)
    assert worker.busy, "the request never reached the worker"
    os.kill(victim, signal.SIGKILL)
    t.join(30)
    st, out = answer["r"]
    assert st == 200 and np.array_equal(out, x), (st, out)
    assert pool.retries == retries0 + 1 and pool.failures.get("died", 0) == died0 + 1
    ev = [e for e in failed_events(srv) if e["pid"] == victim]
    assert len(ev) == 1 and ev[0]["reason"] == "died" and "SIGKILL" in ev[0]["detail"], ev
    assert pool.status()["serving"] == [standby]
    text = httpx.get(f"{srv.url}/metrics").text
    assert metric(text, "tileship_worker_retries_total") == pool.retries
    wait_workers(srv, not_pids=(victim, standby))
