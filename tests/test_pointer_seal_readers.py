"""The signed pointer (``release.pointer_seal``) checked by the readers beside ``tileship serve``: ``tileship
diagnose`` (the active release of a registry) refuses a pointer its trusted activator keys refuse; ``tileship
releases`` shows the seal (key id, generation, verified or refused or unsigned) and still lists; the Ray fleet's
controller (``serve.ray_fleet.FleetController``, driven here without Ray, as its actor runs it) rolls only to a
pointer that is sealed and not older than the one it follows, and moves the pointer back only from a pointer it
accepted. Real keys (``tileship keygen``) and real registries in tmp_path."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
import test_pointer_seal
from test_pointer_seal import _edit, _kid
from test_registry import fake_release
from typer.testing import CliRunner

from tileship.cli import app
from tileship.release import pointer_served
from tileship.release.registry import Registry
from tileship.serve.canary import CanaryPolicy
from tileship.serve.fleet_plan import FleetPolicy, release_of
from tileship.serve.jsonlog import JsonLog
from tileship.serve.ray_fleet import FleetController, raw_keys

keys, signed = test_pointer_seal.keys, test_pointer_seal.signed  # its fixtures
POLICY = FleetPolicy(CanaryPolicy(window_requests=10, window_seconds=1.0, min_samples=5))


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    return r.exit_code, " ".join(r.output.split())


# -- tileship diagnose -------------------------------------------------------------------------------

def test_diagnose_refuses_an_active_release_named_by_a_pointer_its_keys_refuse(signed, keys, tmp_path) -> None:
    reg, a, b = signed
    pub = str(keys["activator"][1])
    out = ["--out", str(tmp_path / "diag"), "--no-load", "--registry", str(reg.root)]
    code, text = _cli("diagnose", *out, "--trusted-activator-key", pub)
    assert code == 0 and "diagnostics" in text, text  # sealed: followed as before
    gen2 = reg.pointer.read_bytes()
    Registry(reg.root).rollback()  # written without the activator key: unsigned
    code, text = _cli("diagnose", *out, "--trusted-activator-key", pub)
    assert code == 1 and "the pointer is not signed, but activator keys are trusted" in text, text
    reg.pointer.write_bytes(gen2)
    _edit(reg, release_id=a)  # changed after sealing
    code, text = _cli("diagnose", *out, env={"TILESHIP_TRUSTED_ACTIVATOR_KEYS": pub})
    assert code == 1 and "does not verify" in text, text
    code, text = _cli("diagnose", *out)  # no trusted keys: nothing checked, as before
    assert code == 0, text
    code, text = _cli("diagnose", b, *out, "--trusted-activator-key", pub)  # a release named: no pointer followed
    assert code == 0, text


# -- tileship releases -------------------------------------------------------------------------------

def test_releases_shows_the_seal_and_what_the_trusted_keys_say_of_it(signed, keys) -> None:
    reg, a, b = signed
    kid, pub = _kid(keys["activator"][1]), str(keys["activator"][1])
    listing = ["releases", "--registry", str(reg.root)]
    code, text = _cli(*listing)
    assert code == 0 and f"pointer generation 2: sealed by activator key {kid} (not checked" in text, text
    code, text = _cli(*listing, "--trusted-activator-key", pub)
    assert code == 0 and f"generation 2: sealed by activator key {kid}; verified" in text, text
    code, text = _cli(*listing, "--trusted-activator-key", str(keys["other"][1]))
    assert code == 0 and "REFUSED" in text and "which is not trusted" in text and a in text, text
    _edit(reg, release_id=a)
    code, text = _cli(*listing, env={"TILESHIP_TRUSTED_ACTIVATOR_KEYS": pub})
    assert code == 0 and "REFUSED" in text and "does not verify" in text, text
    Registry(reg.root).rollback()
    code, text = _cli(*listing, "--trusted-activator-key", pub)
    assert code == 0 and "pointer generation 3: not signed; REFUSED" in text, text


# -- the Ray fleet's controller ------------------------------------------------------------------------

def _controller(reg: Registry, pubs: list[Path], **kw: Any) -> tuple[FleetController, io.StringIO]:
    ctrl = FleetController(str(reg.root), POLICY, 3600.0, raw_keys(pubs), **kw)
    ctrl.log = JsonLog(buf := io.StringIO())
    return ctrl, buf


def _events(buf: io.StringIO, name: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, buf.getvalue().splitlines()) if e["event"] == name]


async def _started(ctrl: FleetController) -> str | None:
    stable = await ctrl.start()
    assert ctrl.task is not None
    ctrl.task.cancel()  # the test steps the controller itself
    return stable


def test_the_fleet_controller_rolls_only_to_a_pointer_its_keys_accept(signed, keys, tmp_path) -> None:
    reg, a, b = signed
    c = reg.publish(fake_release(tmp_path, "c")[0])
    ctrl, log = _controller(reg, [keys["activator"][1]])

    async def scenario() -> None:
        assert await _started(ctrl) == b and ctrl.pointer is not None and ctrl.pointer.generation == 2
        gen2 = reg.pointer.read_bytes()
        Registry(reg.root).activate(c)  # unsigned (generation 3)
        await ctrl._step()
        assert ctrl.plan.roll is None and release_of(ctrl.plan.stable or "") == b, "an unsigned pointer is not rolled"
        await ctrl._step()
        refused = _events(log, "fleet_pointer_refused")
        assert len(refused) == 1 and "not signed" in refused[0]["error"] and refused[0]["following"] == b
        reg.activate(a)  # sealed, generation 4: rolled
        await ctrl._step()
        assert ctrl.plan.roll is not None and release_of(ctrl.plan.roll.target) == a and ctrl.pointer.generation == 4
        reg.pointer.write_bytes(gen2)  # an older sealed pointer put back: the registry moving on to B is refused
        await ctrl._step()
        assert ctrl.plan.roll is not None and release_of(ctrl.plan.roll.target) == a and ctrl.plan.rolls == []
        assert "generation 2 is older than generation 4" in _events(log, "fleet_pointer_refused")[-1]["error"]

    asyncio.run(scenario())


def test_the_fleet_controller_rolls_the_registry_back_only_from_an_accepted_pointer(
        signed, keys, tmp_path, monkeypatch) -> None:
    reg, a, b = signed
    c = reg.publish(fake_release(tmp_path, "c")[0])
    monkeypatch.setenv("TILESHIP_ACTIVATOR_KEY", str(keys["activator"][0]))  # the controller seals its rollback
    ctrl, log = _controller(reg, [keys["activator"][1]])

    async def refused_canary(release: str) -> None:
        """The registry names ``release``: a roll starts, and its canary replica cannot load it (replicas report
        versions, ``fleet_plan.version_of``)."""
        stable = ctrl.plan.stable or ""
        assert release_of(stable) == b
        await ctrl.sync("r1", {"version": stable})
        await ctrl.sync("r2", {"version": stable})
        await ctrl._step()
        assert ctrl.plan.roll is not None and release_of(ctrl.plan.roll.target) == release
        target = ctrl.plan.roll.target
        await ctrl.sync(ctrl.plan.roll.canary or "", {"version": stable, "failed": {target: "warmup: it disagrees"}})

    async def scenario() -> None:
        await _started(ctrl)
        reg.activate(c)  # generation 3
        await refused_canary(c)
        await ctrl._step()  # the plan rolls C back, and the registry with it: from the pointer it accepted
        back = _events(log, "fleet_registry_rollback")
        assert len(back) == 1 and back[0]["refused"] == c and reg.active().release_id == b, back
        await ctrl._step()
        assert ctrl.pointer is not None and ctrl.pointer.generation == 4 and ctrl.refused is None, \
            "its own rollback, sealed, is followed"
        reg.activate(c)  # generation 5
        await refused_canary(c)
        forged = json.loads(reg.pointer.read_text())
        forged["history"][0]["reference_only"] = True  # where a rollback would go, changed after sealing
        reg.pointer.write_text(json.dumps(forged))
        await ctrl._step()  # the plan rolls C back, but the pointer naming C is refused: not rolled back from
        assert release_of(ctrl.plan.stable or "") == b and ctrl.plan.roll is None
        assert json.loads(reg.pointer.read_text()) == forged, "the registry was rolled back from a forged pointer"
        assert len(_events(log, "fleet_registry_rollback")) == 1
        assert "does not verify" in _events(log, "fleet_pointer_refused")[-1]["error"]

    asyncio.run(scenario())


def test_the_fleet_controller_keeps_its_pointer_across_restarts(signed, keys, tmp_path) -> None:
    reg, a, b = signed
    state = tmp_path / "fleet-generation.json"
    gen2 = reg.pointer.read_bytes()
    reg.activate(a)  # generation 3
    ctrl, _ = _controller(reg, [keys["activator"][1]], generation_state=str(state))
    assert asyncio.run(_started(ctrl)) == a
    assert pointer_served.read_served(state) == ctrl.pointer and ctrl.pointer is not None
    reg.pointer.write_bytes(gen2)  # replayed while the controller was down
    again, _ = _controller(reg, [keys["activator"][1]], generation_state=str(state))
    with pytest.raises(Exception, match="generation 2 is older than generation 3"):
        asyncio.run(_started(again))


def test_the_fleet_controller_actor_on_a_local_ray_cluster_refuses_an_unsigned_pointer(signed, keys) -> None:
    """The controller as ``Fleet.start`` deploys it: a Ray actor given the keys as raw bytes, polling on its own."""
    import time

    from test_serve_ray import _ray

    ray = _ray()
    reg, a, b = signed
    opened = not ray.is_initialized()
    if opened:
        ray.init(num_cpus=1, include_dashboard=False, logging_level="warning", log_to_driver=False)
    try:
        ctrl = ray.remote(num_cpus=0)(FleetController).remote(str(reg.root), POLICY, 0.05,
                                                             raw_keys([keys["activator"][1]]))
        assert ray.get(ctrl.start.remote(), timeout=60) == b
        Registry(reg.root).activate(a)  # unsigned: never rolled
        time.sleep(0.5)
        assert [e["event"] for e in ray.get(ctrl.status.remote(), timeout=60)["events"]] == ["stable"]
        reg.activate(a, force=True)  # sealed by the activator key: rolled
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            events = ray.get(ctrl.status.remote(), timeout=60)["events"]
            if any(e["event"] == "roll_start" and e["release"] == a for e in events):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the sealed activation was not rolled: {events}")
        ray.kill(ctrl)
    finally:
        if opened:
            ray.shutdown()
