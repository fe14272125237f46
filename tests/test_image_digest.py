"""The server reports the image it runs in (TILESHIP_IMAGE_DIGEST) next to the one the release's
lock pins, in /v2 and in Prometheus, and warns when they differ (issue 18, item 3)."""

from __future__ import annotations

import io
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_serve import copy_release, serving

from tileship.build.lock import read_lock, write_lock
from tileship.release import bundle
from tileship.serve import ServeConfig

RUNNING = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def _pin(release, digest):
    """A copy of the release whose lock pins ``digest`` (a different release: the lock is hashed)."""
    lock_path = release / "tileship.lock"
    lock = read_lock(lock_path)
    lock["image_digest"] = digest
    write_lock(lock, lock_path)
    bundle.write_manifest(release)
    return release


def _metrics(srv) -> dict[str, dict]:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{srv.port}/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = {"labels": s.labels, "value": s.value}
    return out


@pytest.mark.parametrize("pinned, mismatch", [(RUNNING, False), (OTHER, True), (None, False)])
def test_server_reports_its_image_and_warns_on_a_mismatch(cpu_release_build, tmp_path, monkeypatch, pinned, mismatch):
    import httpx

    rel = copy_release(cpu_release_build.path, tmp_path / "rel")
    if pinned is not None:
        _pin(rel, pinned)
    monkeypatch.setenv("TILESHIP_IMAGE_DIGEST", RUNNING)
    logs = io.StringIO()
    with serving(ServeConfig(source=rel, diagnostics_dir=tmp_path / "diag", log_stream=logs)) as srv:
        meta = httpx.get(f"http://127.0.0.1:{srv.port}/v2", timeout=10).json()
        assert meta["image"] == {"running": RUNNING, "pinned": pinned, "mismatch": mismatch}
        m = _metrics(srv)
        assert m["tileship_release_info"]["labels"]["image_digest"] == RUNNING
        assert m["tileship_release_info"]["labels"]["release_image_digest"] == (pinned or "none")
        assert m["tileship_image_digest_mismatch"]["value"] == (1.0 if mismatch else 0.0)
    events = [json.loads(line) for line in logs.getvalue().splitlines() if line.startswith("{")]
    warned = [e for e in events if e.get("event") == "image_digest_mismatch"]
    assert bool(warned) is mismatch
    if mismatch:
        assert warned[0]["running"] == RUNNING and warned[0]["pinned"] == OTHER


def test_without_the_variable_nothing_is_claimed(cpu_release_build, tmp_path, monkeypatch):
    import httpx

    monkeypatch.delenv("TILESHIP_IMAGE_DIGEST", raising=False)
    rel = _pin(copy_release(cpu_release_build.path, tmp_path / "rel"), OTHER)
    with serving(ServeConfig(source=rel, diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO())) as srv:
        meta = httpx.get(f"http://127.0.0.1:{srv.port}/v2", timeout=10).json()
        assert meta["image"] == {"running": None, "pinned": OTHER, "mismatch": False}
