"""``tileship serve --ray``: a new copy of the active release (``publish --replace``) and then its re-pin (the same
release id, its evidence pinned by activating it again) reach the replicas, as they reach a server following the
registry (``holder.unchanged`` compares the whole target: copy and evidence pin included; ``test_serve``'s
``test_a_replaced_copy_of_the_active_release_is_loaded_on_reload``). A replica used to compare only the release id,
so it kept serving the first copy under the first pin until another release came.

Such a change then reached every replica at once (the roll followed release ids only); it now rolls as a new
release does: the canary alone until it passed, then the rest; a canary that cannot load it keeps serving the
earlier pin and so do the others."""

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


def _until(f: Any, done: Any, seen: list[dict[str, Any]], timeout: float = 60.0) -> dict[str, Any]:
    """The fleet's status once ``done(status)`` or after ``timeout`` seconds; every status read is kept in ``seen``."""
    deadline = time.monotonic() + timeout
    while True:
        seen.append(st := f.status())
        if done(st) or time.monotonic() > deadline:
            return st
        time.sleep(0.1)


def _moved(st: dict[str, Any], old: str) -> set[str]:
    """The replicas that serve another version than ``old``."""
    return {k for k, r in st["replicas"].items() if r.get("version") != old}


def test_a_new_pin_rolls_canary_first_and_a_canary_that_cannot_load_it_keeps_the_fleet_on_the_old_pin(
        cpu_release_build, tmp_path) -> None:
    """Re-pinned in place (new evidence in the registry's copy, the release activated again): no replica but the
    canary reloads before the canary is promoted (an idle fleet keeps it in its judge phase: we watch there), the
    rest follow after traffic promoted it. Then a pin whose copy no longer passes its integrity check (forced): the
    canary's reload fails, the roll stops, both replicas keep serving the earlier pin, the registry's pointer is left
    as it is (it cannot name the earlier pin) and the refused pin is not tried again."""
    from benchmarks.fleet_roll import Load
    from benchmarks.serve_load import free_port

    from tileship.serve.canary import CanaryPolicy
    from tileship.serve.fleet_plan import FleetPolicy
    from tileship.serve.ray_fleet import Fleet, FleetOptions

    ray = _ray()
    reg, rid, _ = _registry(cpu_release_build, tmp_path)
    copy = reg.path_of(rid)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    try:
        f = Fleet(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "diagnostics"),
                  FleetOptions(replicas=2, replica_cpus=0.5, policy=FleetPolicy(
                      CanaryPolicy(window_requests=10, window_seconds=1.0, min_samples=5))))
        f.start("127.0.0.1", free_port())
        try:
            seen: list[dict[str, Any]] = []
            st = _until(f, lambda s: len(s["replicas"]) == 2 and not _moved(s, s.get("version")), seen)
            old = st.get("version")  # (``get``: before versions, the status had none, and the roll below never came)
            assert len(st["replicas"]) == 2 and not _moved(st, old), st
            _verify(copy, 1)  # other seeds: other evidence, in the copy the replicas were loaded from
            pin = reg.activate(rid).evidence  # re-pinned in place: the same release id and copy
            seen = []
            st = _until(f, lambda s: s["roll"] is not None and s["roll"]["phase"] == "judge", seen)
            roll = st["roll"]
            assert roll is not None and roll["phase"] == "judge", f"no canary roll for the new pin: {st}"
            new, canary = roll["version"], roll["canary"]
            v = st["versions"][new]
            assert roll["release"] == rid and new != old and v["evidence"] == pin, st
            assert (v["release"], Path(v["copy"])) == (rid, copy.resolve()), v
            _until(f, lambda s: False, seen, timeout=2.0)  # idle: the canary waits for traffic to judge it
            assert all(_moved(s, old) <= {canary} for s in seen), [s["replicas"] for s in seen]
            assert _moved(seen[-1], old) == {canary} and seen[-1]["roll"]["phase"] == "judge", seen[-1]
            with Load(f.url, clients=2, max_requests=3000) as load:
                st = _until(f, lambda s: s["roll"] is None, seen)
            s = load.summary()
            assert s["failed"] == 0 and s["wrong"] == 0, s
            assert st["rolls"][-1]["outcome"] == "rolled" and st["rolls"][-1]["version"] == new, st["rolls"]
            assert st["version"] == new and _moved(st, new) == set(), st["replicas"]
            promoted = next(i for i, x in enumerate(seen) if x["roll"] is None or x["roll"]["phase"] == "roll")
            assert all(_moved(x, old) <= {canary} for x in seen[:promoted]), "only the canary before promotion"

            _verify(copy, 2)
            (copy / "build-log.json").write_text("{}")  # the copy no longer passes its integrity check
            bad = reg.activate(rid, force=True).evidence
            st = _until(f, lambda s: len(s["rolls"]) > 1, seen)
            last = st["rolls"][-1]
            assert last["outcome"] == "rolled_back" and "could not load" in last["reason"], st["rolls"]
            assert last["release"] == rid and st["refused"] == last["version"] != new, st
            ev = next(e for e in reversed(st["events"]) if e["event"] == "rolled_back")
            assert ev["registry_rollback"] is False and ev["canary"] == canary, ev
            assert st["version"] == new and _moved(st, new) == set(), "every replica keeps the earlier pin"
            assert {_seal(f.url) for _ in range(6)} == {(pin, False)}, "answers still come from the earlier pin"
            active = reg.active()
            assert (active.release_id, active.evidence) == (rid, bad), "the registry's pointer is left as it is"
            st = _until(f, lambda s: False, seen, timeout=1.5)
            assert st["roll"] is None and len(st["rolls"]) == 2, "the refused pin is not tried again"
        finally:
            f.stop()
    finally:
        ray.shutdown()
