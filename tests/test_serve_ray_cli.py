"""``tileship serve REGISTRY --ray`` as a user runs it: a child process that starts a local Ray
cluster, deploys the fleet, prints ``fleet_ready``, answers KServe v2 requests through Ray Serve's
proxy, follows an activation, and exits 0 on SIGINT. Runs where Ray is installed (always in CI:
TILESHIP_REQUIRE_RAY=1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
from test_serve import copy_release
from test_serve_ray import _ray

from tileship.release.registry import Registry


def test_serve_ray_cli_serves_rolls_and_exits_0_on_sigint(cpu_release_build, tmp_path) -> None:
    from benchmarks.serve_load import free_port

    _ray()
    reg = Registry(tmp_path / "registry")
    a = reg.publish(cpu_release_build.path)
    b = reg.publish(copy_release(cpu_release_build.path, tmp_path / "b", version="cli-b"))
    reg.activate(a)
    port = free_port()
    err = open(tmp_path / "stderr", "w+")
    env = {**os.environ, "RAY_ADDRESS": ""}  # a cluster of its own, whatever the caller's environment names
    proc = subprocess.Popen([sys.executable, "-c", "from tileship.cli import main; main()", "serve", str(reg.root),
                             "--ray", "--port", str(port), "--replicas", "1", "--canary-requests", "1",
                             "--canary-seconds", "0"], stdout=subprocess.DEVNULL, stderr=err, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    body = {"inputs": [{"name": n, "shape": [3], "datatype": "FP32", "data": [1, 2, 3]} for n in "AB"]}
    try:
        deadline = time.monotonic() + 100
        while '"event": "fleet_ready"' not in (tmp_path / "stderr").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()[-3000:]
            time.sleep(0.5)
        ready = next(json.loads(line) for line in (tmp_path / "stderr").read_text().splitlines()
                     if line.startswith('{"event": "fleet_ready"'))
        assert ready == {"event": "fleet_ready", "url": url, "release": a, "replicas": 1}
        r = httpx.post(url + "/v2/models/add/infer", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0], r.text
        assert r.headers["x-tileship-release"] == a
        reg.activate(b)  # one replica: it is its own canary; one request fills the window
        while r.headers.get("x-tileship-release") != b:
            assert time.monotonic() < deadline, httpx.get(url + "/v2/tileship/fleet", timeout=30).text
            r = httpx.post(url + "/v2/models/add/infer", json=body, timeout=30)
            assert r.status_code == 200, r.text
            time.sleep(0.1)
        fleet = httpx.get(url + "/v2/tileship/fleet", timeout=30).json()
        assert fleet["per_release"][a]["models"]["add"]["requests"] >= 1
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(60)
    assert code == 0, (tmp_path / "stderr").read_text()[-3000:]
