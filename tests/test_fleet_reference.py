"""``activate --reference`` reaches a Ray fleet (no Ray cluster needed here; the fleet itself: test_serve_ray).

Before: the fleet's versions named the release, its copy and its pin, not the mode, and a replica was told only the
copy's path, which it loaded as a plain release directory. A release activated reference-only (the way out of a
kernel's trouble) was the same version as the kernels': no replica switched, every one kept running the kernels.
Now the mode is part of the version, every replica is told it, and a switch to the reference skips the canary (a
latency window must not refuse the tested default).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tileship.release.registry import Registry
from tileship.runtime.loader import load
from tileship.serve import ServeConfig
from tileship.serve.canary import CanaryPolicy
from tileship.serve.fleet_plan import FleetPlan, FleetPolicy, is_reference, release_of, version_of
from tileship.serve.holder import ReleaseHolder
from tileship.serve.ray_fleet import FleetController
from tileship.serve.ray_replica import FleetReplica

POLICY = FleetPolicy(CanaryPolicy(window_requests=10, window_seconds=1.0, min_samples=5))


def _loader(path: Path, reference_only: bool, evidence: str | None) -> Any:
    return load(path, trusted_keys=[], reference_only=reference_only, expect_evidence_digest=evidence)


def _sync_all(plan: FleetPlan, serving: dict[str, str], now: float) -> dict[str, str | None]:
    return {r: plan.sync(r, {"version": v, "samples": []}, now) for r, v in serving.items()}


def test_a_reference_only_version_is_another_version_of_the_same_release() -> None:
    kernels, ref = version_of("A", "/reg/releases/A", "sha256:1"), version_of("A", "/reg/releases/A", "sha256:1", True)
    assert kernels != ref and release_of(ref) == "A" and is_reference(ref) and not is_reference(kernels)


def test_the_plan_switches_every_replica_to_the_reference_at_once_with_no_canary() -> None:
    kernels, ref = version_of("A", "/c", "p"), version_of("A", "/c", "p", True)
    plan = FleetPlan(POLICY)
    serving = {"r1": kernels, "r2": kernels, "r3": kernels}
    _sync_all(plan, serving, 0.0)
    plan.tick(kernels, 0.0)
    assert plan.tick(ref, 1.0) == []
    assert plan.roll is not None and (plan.roll.phase, plan.roll.canary) == ("roll", None)
    start = plan.events[-1]
    assert start["event"] == "roll_start" and start["canary"] is None and "no canary" in start["reason"]
    assert set(_sync_all(plan, serving, 1.1).values()) == {ref}, "every replica at once"
    serving = dict.fromkeys(serving, ref)
    _sync_all(plan, serving, 1.5)
    plan.tick(ref, 1.5)
    assert plan.stable == ref and plan.rolls[-1]["outcome"] == "rolled"
    # back to the kernels: a canary first, as for any other version
    plan.tick(kernels, 2.0)
    assert plan.roll is not None and plan.roll.phase == "canary" and plan.roll.canary == "r1"
    assert _sync_all(plan, serving, 2.1) == {"r1": kernels, "r2": ref, "r3": ref}


def test_the_controller_tells_replicas_the_mode_the_registry_activated(cpu_release: Path, tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(cpu_release)
    reg.activate(rid)
    ctl = FleetController(str(reg.root), POLICY, 1.0)
    ok, got = ctl._active()
    kernels = ctl._version(got)
    assert ok and got == rid and kernels is not None and not is_reference(kernels)
    reg.activate_reference()
    ok, got = ctl._active()
    ref = ctl._version(got)
    assert ok and got == rid and ref is not None and ref != kernels and is_reference(ref)
    ctl.plan.tick(ref, time.monotonic())
    want = asyncio.run(ctl.sync("replica-1", {"version": None, "samples": []}))
    assert want["release"] == rid and want["reference_only"] is True, want
    assert asyncio.run(ctl.status())["versions"][ref]["reference_only"] is True
    forced = FleetController(str(reg.root), POLICY, 1.0, force_reference=True)  # serve --ray --reference-only
    reg.activate(rid)
    _, got = forced._active()
    assert is_reference(str(forced._version(got))), "a --reference-only fleet serves every version on the reference"


def test_a_replica_told_reference_only_loads_the_release_on_its_references(cpu_release: Path,
                                                                         tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(cpu_release)
    reg.activate_reference(rid)
    copy = reg.path_of(rid)
    holder = ReleaseHolder(copy, _loader)
    holder.follow(copy, rid, reg.active().evidence, True)
    target = holder.resolve()
    assert target.reference_only and target.release_id == rid
    served = holder.prepare(target)
    try:
        assert served.release.status()["reference_only"] is True and served.release.status()["kernels"] == 0
    finally:
        served.release.close()
    holder.follow(copy, rid, reg.active().evidence, False)
    assert holder.resolve().reference_only is False


class _Service:
    """What ``FleetReplica._follow`` and ``_load`` use of a Service: its holder, reload and background tasks."""

    def __init__(self, holder: Any) -> None:
        self.holder, self.background, self.reloads = holder, set(), []

    async def reload(self, trigger: str) -> tuple[int, dict[str, Any]]:
        self.reloads.append(self.holder.resolve())
        return 200, {}


class _Current:
    def __init__(self, rid: str, target: Any) -> None:
        self.release_id, self.target = rid, target


def test_a_replica_reloads_when_only_the_mode_changes(cpu_release: Path, tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(cpu_release)
    reg.activate(rid)
    copy, pin = reg.path_of(rid), reg.active().evidence
    holder = ReleaseHolder(copy, _loader)
    holder.follow(copy, rid, pin)
    holder.current = _Current(rid, holder.resolve())  # serving the kernels
    replica = FleetReplica(ServeConfig(source=copy), 0.1)
    replica.service = _Service(holder)

    async def follow(reference_only: bool) -> None:
        replica._follow(rid, str(copy), pin, reference_only)
        await asyncio.gather(*replica.service.background)

    asyncio.run(follow(False))
    assert replica.service.reloads == [], "the same version: nothing to load"
    asyncio.run(follow(True))
    assert [t.reference_only for t in replica.service.reloads] == [True], "the mode alone changed: reloaded"
    assert replica._report()["version"] == version_of(rid, str(copy), pin), "what serves until the swap"
