"""`tileship serve --workers N` and the request parameter ``timeout`` (``serve.request_params``): the deadline also
bounds a request thread's wait for an idle worker process. A real server on 127.0.0.1 with the CPU "c" release and
one real worker process, held by a call from the event loop while the worker is stopped (SIGSTOP)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import time

import httpx
import numpy as np
from test_serve import metric
from test_serve_workers import add_binary, wait_workers, workers_server


def _held(srv: object) -> int:
    return sum(srv.service.workers.inflight.values())  # type: ignore[attr-defined]


def test_timeout_bounds_the_wait_for_a_worker_process(cpu_release_build):
    """With ``--workers 1`` and its one worker held by a small call (run from the event loop: no request thread),
    a request with ``timeout`` 0.2 s takes the request thread and waits there for the worker; past its timeout it
    is answered 504 naming ``parameters.timeout`` and "not run", counted as ``rejected{reason="timeout"}``, and
    never reaches the worker (answered while the only worker is still stopped); the held call is then served.
    The request waited for the worker, past its timeout, until the pool's ``wait_s`` (10 s): a 503."""
    with workers_server(cpu_release_build.path, workers=1, worker_timeout_s=30.0) as srv:
        victim = wait_workers(srv)["serving"][0]
        before = metric(httpx.get(srv.url + "/metrics").text, "tileship_rejected_total", reason="timeout")
        one = np.ones(8, np.float32)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        os.kill(victim, signal.SIGSTOP)  # alive, never answering until SIGCONT
        try:
            with httpx.Client() as held_client:
                held = pool.submit(add_binary, srv.url, held_client, one, one)  # small, no timeout: the loop's call
                deadline = time.monotonic() + 10
                while _held(srv) < 1 and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert _held(srv) == 1, "the small call never reached the worker"
                t0 = time.monotonic()
                r = httpx.post(srv.url + "/v2/models/add/infer", timeout=30, json={
                    "parameters": {"timeout": 200_000},
                    "inputs": [{"name": n, "shape": [8], "datatype": "FP32", "data": one.tolist()} for n in "AB"]})
                waited = time.monotonic() - t0
                assert r.status_code == 504, (r.status_code, r.text, waited)
                error = r.json()["error"]
                assert "parameters.timeout" in error and "worker process" in error and "not run" in error, error
                assert waited < 5, waited
                assert not held.done(), "the only worker answered while stopped"
                os.kill(victim, signal.SIGCONT)
                st, out = held.result(timeout=30)
                assert st == 200 and (out == 2).all(), (st, out)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
            pool.shutdown()
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "tileship_rejected_total", reason="timeout") == before + 1
        stats = httpx.get(srv.url + "/v2/models/add/stats").json()["model_stats"][0]["inference_stats"]
        assert (stats["success"]["count"], stats["fail"]["count"]) == (1, 1), stats
        assert _held(srv) == 0 and srv.service.workers.failures.get("wedged") is None
