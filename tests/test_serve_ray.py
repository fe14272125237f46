"""``tileship serve --ray``: rolling activation across a Ray Serve fleet.

The plan (``serve.fleet_plan``) is tested with a fake clock and no Ray: promote, rollback on a
load failure or an error excess, abort when the registry moves during the canary. The fleet
(``serve.ray_fleet``) runs on a local Ray cluster (``num_cpus=2``) with "c"-target releases
and a bounded loopback load (``benchmarks/fleet_roll.py``'s): three rolls lose no request and
serve no wrong answer; a release whose kernel disagrees with its reference (caught at warm-up) and
one whose kernel returns NaN only under traffic (caught by the error rule) are rolled back on their
own, the registry's pointer with them. CI installs the ``tileship[ray]`` extra and sets
TILESHIP_REQUIRE_RAY=1, so there the Ray tests run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from test_serve import copy_release

from tileship.errors import DeclarationError, RegistryError
from tileship.release.registry import Registry
from tileship.serve import ServeConfig
from tileship.serve.canary import CanaryPolicy
from tileship.serve.fleet_plan import FleetPlan, FleetPolicy
from tileship.serve.ray_fleet import Fleet, FleetOptions

POLICY = FleetPolicy(CanaryPolicy(window_requests=10, window_seconds=1.0, min_samples=5))


def _samples(release: str, n: int, seconds: float = 0.002, errors: int = 0) -> list[list[Any]]:
    return [["add", release, seconds * (1 + 0.01 * (i % 5)), i < errors] for i in range(n)]


def _fleet(plan: FleetPlan, serving: dict[str, str], now: float, **samples: list[list[Any]]) -> dict[str, str | None]:
    """Every replica syncs once (reporting what ``serving`` says and its samples); their assignments."""
    return {r: plan.sync(r, {"version": rel, "samples": samples.get(r, [])}, now) for r, rel in serving.items()}


def test_plan_rolls_canary_first_then_the_rest() -> None:
    plan = FleetPlan(POLICY)
    serving = {"r1": "A", "r2": "A", "r3": "A"}
    _fleet(plan, serving, 0.0)
    assert plan.tick("A", 0.0) == [] and plan.stable == "A"
    plan.tick("B", 1.0)  # the registry moved to B
    assert _fleet(plan, serving, 1.1) == {"r1": "B", "r2": "A", "r3": "A"}, "one canary replica first"
    serving["r1"] = "B"
    _fleet(plan, serving, 2.0)
    plan.tick("B", 2.0)
    assert plan.roll is not None and plan.roll.phase == "judge"
    for t in (2.5, 3.0, 3.5):
        _fleet(plan, serving, t, r1=_samples("B", 5), r2=_samples("A", 5), r3=_samples("A", 5))
        plan.tick("B", t)
    assert plan.roll is not None and plan.roll.phase == "roll"
    assert set(_fleet(plan, serving, 3.6).values()) == {"B"}, "after the canary, every replica"
    serving.update(r2="B", r3="B")
    _fleet(plan, serving, 4.0)
    plan.tick("B", 4.0)
    assert plan.stable == "B" and plan.roll is None
    assert plan.rolls == [{"release": "B", "version": "B", "previous": "A", "previous_version": "A",
                           "outcome": "rolled", "seconds": 3.0, "reason": "3 replicas serve B"}]
    st = plan.status(4.0)
    assert st["per_release"]["A"]["requests"] == 30 and st["per_release"]["B"]["requests"] == 15
    assert st["per_release"]["B"]["models"]["add"]["p50_ms"] == pytest.approx(2.04, abs=0.05)
    assert [e["event"] for e in st["events"]] == ["stable", "roll_start", "canary_serving", "canary_promoted", "rolled"]


def test_plan_rolls_back_a_canary_that_cannot_load_and_does_not_retry_it() -> None:
    plan = FleetPlan(POLICY)
    serving = {"r1": "A", "r2": "A"}
    _fleet(plan, serving, 0.0)
    plan.tick("A", 0.0)
    plan.tick("BAD", 1.0)
    plan.sync("r1", {"version": "A", "failed": {"BAD": "warmup: warm-up failed for 1 specializations"}}, 1.5)
    actions = plan.tick("BAD", 1.5)
    assert actions == [("registry_rollback", "BAD", "canary replica r1 could not load BAD: warmup: warm-up failed "
                                                    "for 1 specializations")]
    assert plan.roll is None and plan.stable == "A" and set(_fleet(plan, serving, 1.6).values()) == {"A"}
    assert plan.tick("BAD", 2.0) == [] and plan.roll is None, "a refused release is not tried again"
    plan.tick("A", 3.0)  # the pointer went back; a later activation of another release rolls
    plan.tick("C", 4.0)
    assert plan.roll is not None and plan.roll.target == "C"


def test_plan_rolls_back_a_canary_with_more_errors() -> None:
    plan = FleetPlan(POLICY)
    serving = {"r1": "A", "r2": "A"}
    _fleet(plan, serving, 0.0)
    plan.tick("A", 0.0)
    plan.tick("B", 1.0)
    serving["r1"] = "B"
    _fleet(plan, serving, 1.5)
    plan.tick("B", 1.5)
    _fleet(plan, serving, 1.8, r1=_samples("B", 5, errors=2), r2=_samples("A", 5))
    (action, release, reason), = plan.tick("B", 1.8)
    assert (action, release) == ("registry_rollback", "B")
    assert reason.startswith("errors: the canary had 2 in 5 requests"), reason
    assert plan.rolls[-1]["outcome"] == "rolled_back" and plan.stable == "A"


def test_plan_aborts_the_canary_when_the_registry_moves_on() -> None:
    plan = FleetPlan(POLICY)
    _fleet(plan, {"r1": "A", "r2": "A"}, 0.0)
    plan.tick("A", 0.0)
    plan.tick("B", 1.0)
    assert plan.tick("C", 1.2) == []
    assert plan.rolls[-1]["outcome"] == "aborted" and "became C" in plan.rolls[-1]["reason"]
    plan.tick("C", 1.3)
    assert plan.roll is not None and plan.roll.target == "C"


def test_plan_rolls_a_new_pin_or_copy_of_the_same_release_canary_first() -> None:
    """A re-pin (the same release activated again) or a new copy (``publish --replace``) reached every replica at
    once: the plan followed release ids only. It is now another version, rolled like another release; a refused
    one leaves the registry's pointer alone (it cannot name the earlier pin) and is not tried again."""
    from tileship.serve.fleet_plan import release_of, version_of

    old, repin = version_of("A", "/reg/releases/A", "sha256:1"), version_of("A", "/reg/releases/A", "sha256:2")
    copy = version_of("A", "/reg/releases/A@1", "sha256:1")
    assert len({old, repin, copy}) == 3 and {release_of(v) for v in (old, repin, copy)} == {"A"}
    plan = FleetPlan(POLICY)
    serving = {"r1": old, "r2": old, "r3": old}
    _fleet(plan, serving, 0.0)
    plan.tick(old, 0.0)
    plan.tick(repin, 1.0)
    assert _fleet(plan, serving, 1.1) == {"r1": repin, "r2": old, "r3": old}, "the canary first"
    serving["r1"] = repin
    _fleet(plan, serving, 1.5)
    plan.tick(repin, 1.5)
    assert plan.roll is not None and plan.roll.phase == "judge"
    for t in (2.0, 2.5, 3.0):  # samples name the release id: the canary's and the others' by the replica
        _fleet(plan, serving, t, r1=_samples("A", 5), r2=_samples("A", 5), r3=_samples("A", 5))
        assert plan.tick(repin, t) == []
    assert plan.roll is not None and plan.roll.phase == "roll"
    assert set(_fleet(plan, serving, 3.1).values()) == {repin}
    serving.update(r2=repin, r3=repin)
    _fleet(plan, serving, 3.5)
    plan.tick(repin, 3.5)
    assert plan.stable == repin and plan.rolls[-1]["outcome"] == "rolled"
    assert plan.rolls[-1]["reason"] == f"3 replicas serve {repin}", "the version: the release id alone is both"
    assert plan.status(3.5)["stable"] == "A" and plan.status(3.5)["version"] == repin
    plan.tick(copy, 4.0)
    plan.sync("r1", {"version": repin, "failed": {copy: "load: integrity check failed"}}, 4.2)
    assert plan.tick(copy, 4.2) == [], "no registry rollback: the pointer cannot name the earlier pin"
    assert plan.rolls[-1]["outcome"] == "rolled_back" and plan.events[-1]["registry_rollback"] is False
    assert plan.rolls[-1]["reason"] == f"canary replica r1 could not load {copy}: load: integrity check failed"
    assert set(_fleet(plan, serving, 4.3).values()) == {repin}, "every replica keeps the version it served"
    assert plan.tick(copy, 5.0) == [] and plan.roll is None, "a refused version is not tried again"


def test_deployment_options_fixed_or_autoscaled() -> None:
    assert FleetOptions(replicas=3).deployment_options(64, 1)["num_replicas"] == 3
    auto = FleetOptions(min_replicas=2, max_replicas=6, target_ongoing=8).deployment_options(64, 0)
    assert auto["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 8,
                                          "upscale_delay_s": 10.0, "downscale_delay_s": 60.0}
    assert "num_replicas" not in auto and auto["ray_actor_options"]["num_gpus"] == 0
    with pytest.raises(DeclarationError, match="--min-replicas"):
        FleetOptions(min_replicas=4, max_replicas=2).deployment_options(64, 0)


def test_the_fleet_serves_a_registry_not_a_release(cpu_release: Path, tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="serves a registry directory"):
        Fleet(ServeConfig(source=cpu_release))
    with pytest.raises(RegistryError, match="has no active release"):
        Registry(tmp_path / "empty").publish(cpu_release)
        Fleet(ServeConfig(source=tmp_path / "empty"))


# -- on a local Ray cluster ------------------------------------------------------------------------

def _ray() -> Any:
    if os.environ.get("TILESHIP_REQUIRE_RAY") == "1":
        import ray  # CI: a missing Ray fails here instead of skipping (setup.sh installs tileship[ray])
        from ray import serve  # noqa: F401
    else:
        ray = pytest.importorskip("ray")
        pytest.importorskip("ray.serve")
    return ray


@pytest.fixture(scope="module")
def fleet(cpu_release_build, tmp_path_factory):
    """A fleet of 2 replicas on a registry with A active and B, C (same kernels), BAD (refused at
    warm-up) and FAULTY (NaN from N = 1024 on: faults only under traffic) published."""
    from benchmarks.fleet_roll import FAULTY_OPS, build_bad_release
    from benchmarks.serve_load import free_port

    ray = _ray()
    tmp = tmp_path_factory.mktemp("fleet")
    reg = Registry(tmp / "registry")
    ids = [reg.publish(cpu_release_build.path)] + [
        reg.publish(copy_release(cpu_release_build.path, tmp / v, version=v)) for v in ("fleet-b", "fleet-c")]
    bad = reg.publish(build_bad_release(tmp / "bad"))
    faulty = reg.publish(build_bad_release(tmp / "faulty", FAULTY_OPS, "fleet_faulty_ops"))
    reg.activate(ids[0])
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    policy = FleetPolicy(CanaryPolicy(window_requests=20, window_seconds=1.5))
    f = Fleet(ServeConfig(source=reg.root, diagnostics_dir=tmp / "diagnostics"),
              FleetOptions(replicas=2, replica_cpus=0.5, policy=policy))
    f.start("127.0.0.1", free_port())
    yield f, reg, ids, bad, faulty
    f.stop()
    ray.shutdown()


def test_three_rolls_under_load_lose_no_request_and_serve_no_wrong_answer(fleet) -> None:
    import httpx
    from benchmarks.fleet_roll import Load, roll_to

    f, reg, ids, _, _ = fleet
    st = httpx.get(f.url + "/v2/tileship/fleet", timeout=30).json()
    assert st["stable"] == ids[0] and len(st["replicas"]) == 2
    t0 = time.monotonic()
    with Load(f.url, clients=3, max_requests=5000) as load:
        time.sleep(1.0)
        rolls = [roll_to(f, reg, rid, timeout=60) for rid in (ids[1], ids[2], ids[0])]
        time.sleep(0.5)
    s = load.summary()
    assert [r["outcome"] for r in rolls] == ["rolled"] * 3, rolls
    assert s["failed"] == 0, f"{s['failed']} of {s['sent']} requests failed during the rolls: {s['failures']}"
    assert s["wrong"] == 0, f"{s['wrong']} wrong answers: {s['wrong_examples']}"
    assert set(s["by_release"]) == set(ids), s["by_release"]  # every release answered some of them
    assert s["ok"] >= 50 and time.monotonic() - t0 < 100
    st = f.status()
    assert st["stable"] == ids[0] and {r["release"] for r in st["replicas"].values()} == {ids[0]}
    assert {k for k, v in st["per_release"].items() if v["requests"]} == set(ids)
    assert sum(v["errors"] for v in st["per_release"].values()) == 0
    print("time to fully rolled (s):", [r["seconds"] for r in rolls])


def test_a_bad_canary_is_rolled_back_with_the_registry_and_no_request_fails(fleet) -> None:
    from benchmarks.fleet_roll import Load, roll_to

    f, reg, ids, bad, _ = fleet
    before = reg.active().release_id
    with Load(f.url, clients=2, max_requests=2000) as load:
        time.sleep(0.5)
        r = roll_to(f, reg, bad, timeout=60)
        time.sleep(1.0)
    assert r["outcome"] == "rolled_back", r
    assert "could not load" in r["reason"] and "warm-up failed" in r["reason"], r["reason"]
    assert reg.active().release_id == before, "the registry's pointer went back to the release before"
    s = load.summary()
    assert s["failed"] == 0 and s["wrong"] == 0 and bad not in s["by_release"], s
    st = f.status()
    assert st["stable"] == before and all(x["release"] == before for x in st["replicas"].values())
    assert any(e["event"] == "rolled_back" and e["release"] == bad for e in st["events"])


def test_a_canary_whose_kernel_faults_under_traffic_is_rolled_back_on_its_errors(fleet) -> None:
    from benchmarks.fleet_roll import Load, roll_to

    f, reg, ids, _, faulty = fleet
    before = reg.active().release_id
    with Load(f.url, clients=2, n=2048, max_requests=2000) as load:  # N = 2048: the kernel returns NaN
        time.sleep(0.5)
        r = roll_to(f, reg, faulty, timeout=60)
        time.sleep(1.0)
    assert r["outcome"] == "rolled_back", r
    assert r["reason"].startswith("errors: the canary had "), r["reason"]
    assert reg.active().release_id == before
    s = load.summary()  # the faulting calls were answered by the reference: right values, status 200
    assert s["failed"] == 0 and s["wrong"] == 0, s
    st = f.status()
    assert st["per_release"][faulty]["errors"] >= 1 and st["stable"] == before
    assert all(x["release"] == before for x in st["replicas"].values())
    ev = next(e for e in st["events"] if e["event"] == "rolled_back" and e["release"] == faulty)
    assert ev["verdict"]["numbers"]["errors"]["canary"] >= 1


def test_activate_reference_switches_every_replica_to_the_references_and_back(fleet) -> None:
    """``activate --reference`` of the release the fleet serves: every replica serves the references (no canary),
    then activating the release again brings the kernels back through a canary; no request fails. Before, the mode
    was not part of a fleet's version: no replica switched."""
    import httpx
    from benchmarks.fleet_roll import Load, roll_to

    f, reg, *_ = fleet
    rid = reg.active().release_id
    with Load(f.url, clients=2, max_requests=3000) as load:
        time.sleep(0.5)
        before = len(f.status()["rolls"])
        reg.activate_reference()
        deadline = time.monotonic() + 60
        while len(f.status()["rolls"]) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        st = f.status()
        assert st["rolls"][before]["outcome"] == "rolled", st["rolls"][before:]
        assert st["version"].endswith("+reference") and st["stable"] == rid
        start = [e for e in st["events"] if e["event"] == "roll_start"][-1]
        assert start["canary"] is None and "no canary" in start["reason"], start
        assert all(r["version"] == st["version"] for r in st["replicas"].values()), st["replicas"]
        paths = set()
        with httpx.Client(timeout=30) as c:
            for _ in range(20):  # both replicas answer some: each on the reference, by policy
                body = {"inputs": [{"name": k, "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
                                   for k in ("A", "B")]}
                r = c.post(f.url + "/v2/models/add/infer", json=body)
                assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
                paths.add((r.headers["x-tileship-path"], r.headers["x-tileship-reason"]))
        assert paths == {("reference", "disabled_by_policy")}, paths
        back = roll_to(f, reg, rid, timeout=60)
        time.sleep(0.5)
    assert back["outcome"] == "rolled", back
    assert not f.status()["version"].endswith("+reference")
    s = load.summary()
    assert s["failed"] == 0 and s["wrong"] == 0, s


def test_a_second_fleet_on_the_same_cluster_is_refused(fleet) -> None:
    from tileship.errors import TileshipError

    f, reg, *_ = fleet
    with pytest.raises(TileshipError, match="a tileship fleet already runs on this Ray cluster"):
        Fleet(ServeConfig(source=reg.root)).start("127.0.0.1", 0)
    assert f.status()["stable"] == reg.active().release_id  # the running fleet is untouched


def test_cli_refuses_what_a_fleet_cannot_honour_before_starting_ray(cpu_release: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tileship.cli import app

    reg = Registry(tmp_path / "registry")
    reg.activate(reg.publish(cpu_release))
    res = CliRunner().invoke(app, ["serve", str(reg.root), "--ray", "--workers", "2"])
    assert res.exit_code == 1 and "--workers cannot be combined with --ray yet" in res.output, res.output
    res = CliRunner().invoke(app, ["serve", str(reg.root), "--ray", "--min-replicas", "3", "--max-replicas", "2"])
    assert res.exit_code == 1 and "need 1 <= --min-replicas (3) <= --max-replicas (2)" in res.output, res.output
    res = CliRunner().invoke(app, ["serve", str(cpu_release), "--ray"])
    assert res.exit_code == 1 and "serves a registry directory" in res.output, res.output


def test_missing_ray_serve_names_the_extra(monkeypatch) -> None:
    import sys

    from tileship.errors import TileshipError
    from tileship.serve.ray_fleet import require_serve

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(TileshipError, match="needs Ray Serve") as info:
        require_serve()
    assert "pip install 'tileship[ray]'" in str(info.value.hint)
