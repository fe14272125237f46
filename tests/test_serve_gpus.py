"""`tileship serve --workers N --gpus LIST`: each worker process is pinned to one GPU through its
CUDA_VISIBLE_DEVICES, the workers spread evenly, and a replacement after kill -9 goes where a
worker is missing. On this machine (no GPU) the "c" release serves whatever the mapping says;
the test reads each worker's real environment from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from test_serve_workers import add_binary, wait_workers, workers_server

from tileship.errors import DeclarationError
from tileship.serve import gpu_map


def proc_env(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = [e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e]
    return {k.decode(): v.decode() for k, v in items}


def test_parse_reads_indices_and_names_a_bad_entry():
    assert gpu_map.parse("0,1, 3") == (0, 1, 3)
    assert gpu_map.parse(None) == () and gpu_map.parse(" ") == ()
    with pytest.raises(DeclarationError, match="'x' is not a GPU index"):
        gpu_map.parse("0,x")
    with pytest.raises(DeclarationError, match="'-1' is not a GPU index"):
        gpu_map.parse("-1")
    with pytest.raises(DeclarationError, match="GPU 1 is listed twice"):
        gpu_map.parse("1,0,1")


def test_pick_spreads_and_refills_the_missing_device():
    gpus = (2, 5)
    live: list[int | None] = []
    for _ in range(3):  # two serving workers and the standby
        live.append(gpu_map.pick(gpus, live))
    assert live == [2, 5, 2]
    live.remove(5)  # the worker on GPU 5 died: its replacement goes there
    assert gpu_map.pick(gpus, live) == 5
    assert gpu_map.pick((), live) is None and gpu_map.environment(None) is None
    assert gpu_map.environment(3)["CUDA_VISIBLE_DEVICES"] == "3"


def test_check_visible_refuses_a_device_past_the_count():
    gpu_map.check_visible((0, 1), 2)
    gpu_map.check_visible((7,), 0)  # no CUDA in this process: nothing to check against
    with pytest.raises(DeclarationError, match="names GPU 2 but this machine has 2 visible"):
        gpu_map.check_visible((0, 2), 2)


def test_cli_refuses_gpus_without_workers_and_a_bad_list(cpu_release_build):
    base = [sys.executable, "-m", "tileship.cli", "serve", str(cpu_release_build.path), "--port", "0"]
    for extra, says in ((["--gpus", "0,1"], "give --workers N too"), (["--workers", "1", "--gpus", "0,a"],
                                                                     "'a' is not a GPU index")):
        r = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0, r.stdout
        assert says in r.stdout + r.stderr


def test_workers_are_pinned_spread_and_replaced_on_the_missing_gpu(cpu_release_build):
    with workers_server(cpu_release_build.path, workers=2, gpus=(3, 5), worker_timeout_s=5.0) as srv:
        status = wait_workers(srv)
        pinned = {int(pid): gpu for pid, gpu in status["gpus"].items()}
        assert sorted(pinned.values()) == [3, 3, 5], status  # two serving + the standby over two GPUs
        for pid, gpu in pinned.items():
            assert proc_env(pid)["CUDA_VISIBLE_DEVICES"] == str(gpu)
        a, b = np.arange(8, dtype=np.float32), np.ones(8, dtype=np.float32)
        with httpx.Client() as c:
            code, out = add_binary(srv.url, c, a, b)
            assert code == 200 and np.array_equal(out, a + b), out
            # the one worker on GPU 5: serving or the standby, whichever finished starting last
            victim = next(pid for pid, gpu in pinned.items() if gpu == 5)
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                status = wait_workers(srv, not_pids=(status["standby"],))
                now = {int(pid): gpu for pid, gpu in status["gpus"].items()}
                if victim not in now and len(now) == 3:
                    break
                time.sleep(0.1)
            assert sorted(now.values()) == [3, 3, 5], status  # the new worker took GPU 5's place
            fresh = next(pid for pid, gpu in now.items() if gpu == 5)
            assert fresh != victim and proc_env(fresh)["CUDA_VISIBLE_DEVICES"] == "5"
            code, out = add_binary(srv.url, c, a, b)
            assert code == 200 and np.array_equal(out, a + b), out
