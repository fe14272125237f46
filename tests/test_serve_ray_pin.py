"""``tileship serve --ray``: a new copy of the active release (``publish --replace``) and then its re-pin (the same
release id, its evidence pinned by activating it again) reach the replicas, as they reach a server following the
registry (``holder.unchanged`` compares the whole target: copy and evidence pin included; ``test_serve``'s
``test_a_replaced_copy_of_the_active_release_is_loaded_on_reload``). A replica used to compare only the release id,
so it kept serving the first copy under the first pin until another release came."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import httpx
from test_serve_ray import _ray

from tileship.release.registry import Registry
from tileship.serve import ServeConfig
from tileship.verify.spec_check import VerifyOptions
from tileship.verify.verify import verify


def _verify(root: Path, seed: int) -> None:
    result = verify(root, VerifyOptions(seeds=(seed,), timing=False, grid=0, limit=256))
    assert result.ok, [v.failure for v in result.failed]


def _seal(url: str) -> tuple[str | None, bool]:
    """(pinned, stale) of the evidence seal the fleet's release serves under (``GET /v2``)."""
    seal = httpx.get(f"{url}/v2", timeout=30).json()["release"]["evidence"]
    return seal["pinned"], seal["stale"]


def _wait(url: str, want: tuple[str | None, bool], timeout: float = 60.0) -> tuple[str | None, bool]:
    """(pinned, stale) of the seal served, once it is ``want`` or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (got := _seal(url)) != want and time.monotonic() < deadline:
        time.sleep(0.25)
    return got


def _registry(cpu_release_build: Any, tmp: Path) -> tuple[Registry, str, Path]:
    """A registry with the CPU release active, pinned to the evidence of one verification; the copy it was
    published from."""
    src = tmp / cpu_release_build.release_id
    shutil.copytree(cpu_release_build.path, src)
    _verify(src, 0)
    reg = Registry(tmp / "registry")
    rid = reg.publish(src)
    reg.activate(rid)
    return reg, rid, src


def test_fleet_replicas_take_a_new_pin_of_the_same_release(cpu_release_build, tmp_path) -> None:
    from benchmarks.serve_load import free_port

    from tileship.serve.canary import CanaryPolicy
    from tileship.serve.fleet_plan import FleetPolicy
    from tileship.serve.ray_fleet import Fleet, FleetOptions

    ray = _ray()
    reg, rid, src = _registry(cpu_release_build, tmp_path)
    first = reg.active().evidence
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    try:
        f = Fleet(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "diagnostics"),
                  FleetOptions(replicas=1, replica_cpus=0.5,
                               policy=FleetPolicy(CanaryPolicy(window_requests=20, window_seconds=1.5))))
        f.start("127.0.0.1", free_port())
        try:
            assert _wait(f.url, (first, False)) == (first, False)
            _verify(src, 1)  # other seeds: other evidence
            assert reg.publish(src, replace=True) == rid  # a new copy of the active release, not yet pinned
            assert _wait(f.url, (first, True)) == (first, True)  # before: the first copy, for good
            reg.activate(rid)  # the deliberate step: its evidence pinned (the pointer names the same release)
            pin = reg.active().evidence
            assert reg.active().release_id == rid and pin not in (None, first)
            assert _wait(f.url, (pin, False)) == (pin, False)  # before: the first pin, for good
            st = f.status()
            assert st["stable"] == rid and {r["release"] for r in st["replicas"].values()} == {rid}
        finally:
            f.stop()
    finally:
        ray.shutdown()
