"""``tileship promote``: verify -> tune -> publish -> activate, directly in the registry or
through a canary in a running server (promoted, or rolled back with exit 3)."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_canary_serve import call_add, loader_wrapping
from test_serve import copy_release, serving
from traffic import ClosedLoop
from typer.testing import CliRunner

from tileship.cli import app
from tileship.release.registry import Registry
from tileship.serve import ServeConfig


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture
def release_b(cpu_release_build, tmp_path):
    return copy_release(cpu_release_build.path, tmp_path / "b", version="promote-2")


def test_promote_without_server_verifies_tunes_publishes_and_activates(release_b, tmp_path):
    pytest.importorskip("tileship.verify.tune")
    reg = tmp_path / "registry"
    r = run("promote", str(release_b), "--registry", str(reg), "--budget-ms", "2")
    assert r.exit_code == 0, r.output
    for step in ("verify", "tune", "publish", "active"):
        assert step in r.output, r.output
    active = Registry(reg).active()
    assert active.path is not None and (release_b / "evidence" / "verification.json").is_file()
    assert "tuning" in (active.path / "evidence" / "verification.json").read_text()


@pytest.fixture
def traffic() -> Iterator[Any]:
    """Start closed-loop clients against a server URL; yields start(url) -> (served, failures)."""
    loop = ClosedLoop(lambda url, rng, c: call_add(url, rng).headers["x-tileship-release"])
    yield loop.start
    loop.stop()


def test_promote_through_a_canary_moves_server_and_registry(cpu_release_build, release_b, tmp_path, traffic):
    reg = Registry(tmp_path / "registry")
    reg.activate(id_a := reg.publish(cpu_release_build.path))
    with serving(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=io.StringIO())) as srv:
        served, failures = traffic(srv.url)
        r = run("promote", str(release_b), "--registry", str(reg.root), "--server", srv.url, "--canary", "0.3",
                "--window-requests", "15", "--max-p50-ratio", "1.5", "--no-verify", "--no-tune", "--timeout", "60")
        assert r.exit_code == 0, r.output
        assert "promote" in r.output and "p50 active" in r.output and "canary/active" in r.output
        id_b = reg.active().release_id
        assert id_b != id_a and reg.active().previous == id_a
        assert srv.service.holder.current.release_id == id_b
        time.sleep(0.3)
        assert not failures, failures[:3]
        assert served[-1] == id_b


def test_a_worse_canary_is_rolled_back_and_promote_exits_3(cpu_release_build, release_b, tmp_path, traffic):
    from tileship.release import bundle

    reg = Registry(tmp_path / "registry")
    reg.activate(id_a := reg.publish(cpu_release_build.path))
    id_b = bundle.read_manifest(release_b)["release_id"]

    def slow(kernel: Any) -> Any:
        def call(*args: Any) -> Any:
            time.sleep(0.004)
            return kernel(*args)

        return call

    cfg = ServeConfig(source=reg.root, loader=loader_wrapping(id_b, slow), diagnostics_dir=tmp_path / "d",
                      log_stream=io.StringIO())
    with serving(cfg) as srv:
        served, failures = traffic(srv.url)
        r = run("promote", str(release_b), "--registry", str(reg.root), "--server", srv.url, "--canary", "0.3",
                "--window-requests", "15", "--no-verify", "--no-tune", "--timeout", "60")
        assert r.exit_code == 3, r.output
        assert "rollback" in r.output and "rolled_back" in r.output and "latency: add" in r.output
        assert reg.active().release_id == id_a and srv.service.holder.current.release_id == id_a
        time.sleep(0.3)
        assert not failures, failures[:3]
        assert served[-1] == id_a
