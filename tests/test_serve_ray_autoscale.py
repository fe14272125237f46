"""``tileship serve --ray --max-replicas``: the fleet grows on ongoing requests, within its
bounds, and a roll still goes through every replica with no failed request. A local Ray cluster
(``num_cpus=2``), "c"-target releases, a bounded loopback load; runs where Ray is installed
(always in CI: TILESHIP_REQUIRE_RAY=1)."""

from __future__ import annotations

import time

from test_serve import copy_release
from test_serve_ray import _ray

from tileship.release.registry import Registry
from tileship.serve import ServeConfig
from tileship.serve.canary import CanaryPolicy
from tileship.serve.fleet_plan import FleetPolicy
from tileship.serve.ray_fleet import Fleet, FleetOptions


def test_the_fleet_scales_up_under_load_and_rolls_every_replica(cpu_release_build, tmp_path) -> None:
    from benchmarks.fleet_roll import Load, roll_to
    from benchmarks.serve_load import free_port

    ray = _ray()
    reg = Registry(tmp_path / "registry")
    a = reg.publish(cpu_release_build.path)
    b = reg.publish(copy_release(cpu_release_build.path, tmp_path / "b", version="scale-b"))
    reg.activate(a)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    opts = FleetOptions(min_replicas=1, max_replicas=2, target_ongoing=1, upscale_delay_s=1.0, downscale_delay_s=600.0,
                        replica_cpus=0.5, policy=FleetPolicy(CanaryPolicy(window_requests=20, window_seconds=1.0)))
    fleet = Fleet(ServeConfig(source=reg.root), opts)
    try:
        fleet.start("127.0.0.1", free_port())
        assert len(fleet.status()["replicas"]) == 1, "starts at the floor"
        t0 = time.monotonic()
        with Load(fleet.url, clients=4, max_requests=20000) as load:
            while len(fleet.status()["replicas"]) < 2 and time.monotonic() - t0 < 60:
                time.sleep(0.5)
            grown_s = time.monotonic() - t0
            assert len(fleet.status()["replicas"]) == 2, f"no second replica within {grown_s:.0f} s of load"
            roll = roll_to(fleet, reg, b, timeout=60)
            time.sleep(0.5)
        s = load.summary()
        # every live replica: on this 2-core machine a replica starved past ``stale_s`` is dropped from the fleet
        # and comes back (or a new one starts) on the stable release, so the roll may count 1 or 2 (seen once)
        assert roll["outcome"] == "rolled" and roll["reason"] in {f"{n} replicas serve {b}" for n in (1, 2)}, roll
        assert s["failed"] == 0 and s["wrong"] == 0, s
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and {r["release"] for r in fleet.status()["replicas"].values()} != {b}:
            time.sleep(0.5)
        st = fleet.status()
        assert {r["release"] for r in st["replicas"].values()} == {b}, st["replicas"]
        assert len(st["replicas"]) <= 2, "never above --max-replicas"
        print(f"scaled 1 -> 2 replicas after {grown_s:.1f} s of load; roll {roll['seconds']:.2f} s")
    finally:
        fleet.stop()
        ray.shutdown()
