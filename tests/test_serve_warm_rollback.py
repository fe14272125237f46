"""The warm rollback standby (issue 16, instant rollback): a server following a registry keeps the
state `tileship rollback` returns to loaded and warmed, and swaps it in on rollback without
loading; releases swapped out stay warm for rolling forward again; a standby that fails to load
changes nothing; ``warm_rollback=False`` loads on every switch as before. CPU "c" releases, a real
server on 127.0.0.1, the real loader (counted)."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_serve import _GOOD_B, _a, _json, copy_release, log_lines, post, serving

from tileship.release.registry import Registry
from tileship.runtime.loader import load
from tileship.serve import ServeConfig
from tileship.serve.holder import release_id_at


class CountingLoader:
    """The real loader, recording what it loaded; ``fail`` names release ids it refuses to load."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.loaded: list[str | None] = []
        self.fail = fail

    def __call__(self, path: Path, reference_only: bool) -> Any:
        rid = release_id_at(Path(path))
        self.loaded.append(rid)
        if rid in self.fail:
            raise RuntimeError(f"test loader refuses {rid}")
        return load(path, reference_only=reference_only)


@pytest.fixture
def registry(cpu_release_build, tmp_path) -> tuple[Registry, str, str]:
    """A registry where A was active, then B (rollback returns to A)."""
    b = copy_release(cpu_release_build.path, tmp_path / "b", version="warm-2")
    reg = Registry(tmp_path / "registry")
    id_a, id_b = reg.publish(cpu_release_build.path), reg.publish(b)
    reg.activate(id_a)
    reg.activate(id_b)
    return reg, id_a, id_b


def wait_for(cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def served_by(srv: Any) -> str:
    r = post(srv, "/v2/models/add/infer", **_json([_a([4]), _GOOD_B]))
    assert r.status_code == 200, r.text
    return r.headers["x-tileship-release"]


def test_rollback_swaps_the_warm_standby_without_loading(registry, tmp_path):
    reg, id_a, id_b = registry
    loader, logs = CountingLoader(), io.StringIO()
    with serving(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=logs, loader=loader)) as srv:
        h = srv.service.holder
        wait_for(lambda: h.standby is not None)
        assert loader.loaded == [id_b, id_a] and h.standby.release_id == id_a and served_by(srv) == id_b
        assert any(e["event"] == "standby_ready" and e["release"] == id_a for e in log_lines(logs))

        reg.rollback()
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["warm"] is True and r.json()["release"] == id_a, r.text
        assert r.json()["load_seconds"] == 0.0 and loader.loaded == [id_b, id_a]  # nothing loaded
        assert served_by(srv) == id_a and h.standby is None

        reg.activate(id_b)  # forward again: B was swapped out and is still warm
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["warm"] is True and r.json()["release"] == id_b, r.text
        assert served_by(srv) == id_b
        wait_for(lambda: srv.service.prewarming is None)
        assert loader.loaded == [id_b, id_a]  # A is retired warm: the rollback target needed no load either

        reg.activate_reference(id_a)  # another mode of A: not the warm kernel-mode A, so it loads
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["warm"] is False and r.json()["reference_only"] is True
        assert loader.loaded[-1] == id_a and len(loader.loaded) == 3
        swaps = [e for e in log_lines(logs) if e["event"] == "swap"]
        assert [s["warm"] for s in swaps] == [True, True, False]


def test_a_standby_that_fails_to_load_changes_nothing(registry, tmp_path):
    reg, id_a, id_b = registry
    loader, logs = CountingLoader(fail=(id_a,)), io.StringIO()
    with serving(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=logs, loader=loader)) as srv:
        wait_for(lambda: any(e["event"] == "standby_failed" for e in log_lines(logs)))
        failed = next(e for e in log_lines(logs) if e["event"] == "standby_failed")
        assert failed["stage"] == "load" and f"refuses {id_a}" in failed["error"]
        assert srv.service.holder.standby is None
        assert httpx.get(srv.url + "/v2/health/ready").json()["ready"] is True and served_by(srv) == id_b
        reg.rollback()
        r = post(srv, "/v2/repository/reload")  # loads A for real, and that fails: B keeps serving
        assert r.status_code == 409 and r.json()["serving"] == id_b, r.text
        assert served_by(srv) == id_b


def test_with_warm_rollback_off_every_switch_loads(registry, tmp_path):
    reg, id_a, id_b = registry
    loader = CountingLoader()
    cfg = ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=io.StringIO(), loader=loader,
                      warm_rollback=False)
    with serving(cfg) as srv:
        time.sleep(0.5)
        assert loader.loaded == [id_b] and srv.service.holder.standby is None
        reg.rollback()
        r = post(srv, "/v2/repository/reload")
        assert r.status_code == 200 and r.json()["warm"] is False and loader.loaded == [id_b, id_a]
        reg.activate(id_b)
        r = post(srv, "/v2/repository/reload")  # B is retired warm: a switch to it needs no load even when off
        assert r.json()["warm"] is True and loader.loaded == [id_b, id_a]
