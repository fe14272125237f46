"""Option B on the CPU, end to end through a canary (issue 13): a "c"-target operator with
candidates (``tests/tuned_ops.py``) is built, then ``tileship promote`` tunes it, publishes it
and promotes it through a canary in a running server; a release whose evidence routes every
bucket to the 64x-work candidate is slower and is rolled back by the server on its own."""

from __future__ import annotations

import io
import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from test_serve import copy_release, serving
from traffic import ClosedLoop
from typer.testing import CliRunner

from tileship.cli import app
from tileship.declare.project import Project, load_operators
from tileship.release import bundle
from tileship.release.registry import Registry
from tileship.serve import ServeConfig

TESTS = Path(__file__).parent
PROJECT = Project(model="tuned", model_version="1", operator_modules=("tuned_ops",), targets=("c",),
                  routing="evidence", root=TESTS)
N = 65536


@pytest.fixture(scope="module")
def untuned(tmp_path_factory) -> Path:
    """The tuned_ops release, built for "c", not tuned (read-only)."""
    pytest.importorskip("tileship.verify.tune")
    from tileship.build.builder import BuildOptions, build

    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    result = build(PROJECT, load_operators(PROJECT), tmp_path_factory.mktemp("optb"), BuildOptions(jobs=2))
    assert result.ok, [f.error for f in result.failed]
    return Path(result.path)


def poly(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return (((x * 0.5 + 1.0) * x - 2.0) * x + 0.25) * x + 3.0


def call_poly(url: str, rng: np.random.Generator, client: httpx.Client) -> httpx.Response:
    """One binary request at N=65536; checks the answer."""
    x = rng.standard_normal(N).astype(np.float32)
    header = json.dumps({"inputs": [{"name": "X", "shape": [N], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4 * N}}],
                         "outputs": [{"name": "Y", "parameters": {"binary_data": True}}]}).encode()
    r = client.post(url + "/v2/models/poly/infer", content=header + x.tobytes(), timeout=60.0,
                    headers={"inference-header-content-length": str(len(header))})
    assert r.status_code == 200, r.text
    skip = int(r.headers["inference-header-content-length"])
    y = np.frombuffer(r.content[skip:], dtype=np.float32)
    assert np.allclose(y, poly(x), atol=1e-3, rtol=1e-4), "wrong values"
    return r


@pytest.fixture
def traffic() -> Iterator[Any]:
    def call(url: str, rng: Any, c: httpx.Client) -> tuple[str, str]:
        r = call_poly(url, rng, c)
        return r.headers["x-tileship-release"], r.headers.get("x-tileship-spec", "")

    loop = ClosedLoop(call)
    yield loop.start
    loop.stop()


def force_winner(src: Path, dest: Path, candidate: str) -> str:
    """A copy of a tuned release (new id) whose evidence makes ``candidate`` win every bucket."""
    copy_release(src, dest, version="forced-" + candidate)
    rid = bundle.read_manifest(dest)["release_id"]
    ev_path = dest / "evidence" / "verification.json"
    ev = json.loads(ev_path.read_text())
    ev["release_id"] = rid
    for group in ev["tuning"].values():
        for p in group["points"]:
            p["winner"], p["why"] = candidate, "forced by the test"
    ev_path.write_text(json.dumps(ev, indent=1, sort_keys=True))
    bundle.write_manifest(dest)
    return rid


def test_build_tune_canary_promote_then_a_slower_canary_rolls_back(untuned, tmp_path, traffic):
    reg = Registry(tmp_path / "registry")
    reg.activate(id_a := reg.publish(untuned))
    candidate = copy_release(untuned, tmp_path / "candidate", version="2")
    with serving(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=io.StringIO())) as srv:
        served, failures = traffic(srv.url)
        r = CliRunner().invoke(app, ["promote", str(candidate), "--registry", str(reg.root), "--server", srv.url,
                                     "--canary", "0.5", "--window-requests", "12", "--max-p50-ratio", "1.5",
                                     "--no-verify", "--budget-ms", "5", "--timeout", "120"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert "tune" in r.output and "promote" in r.output and "poly: p50 active" in r.output, r.output
        id_t = reg.active().release_id
        assert id_t != id_a and srv.service.holder.current.release_id == id_t
        tuned = reg.path_of(id_t)
        table = json.loads((tuned / "evidence" / "verification.json").read_text())["tuning"]
        assert table["poly.float32.N65536.c"]["points"][0]["winner"] == "rounds1"
        # the wrong candidate failed verification but wins no bucket: the release counts as verified
        info = next(x for x in reg.releases() if x.release_id == id_t)
        assert info.verification == "passed" and "2 failed candidates never win" in info.verification_detail, info

        slow = tmp_path / "slow"
        id_s = force_winner(tuned, slow, "rounds64")
        r = CliRunner().invoke(app, ["promote", str(slow), "--registry", str(reg.root), "--server", srv.url,
                                     "--canary", "0.5", "--window-requests", "12", "--no-verify", "--no-tune",
                                     "--timeout", "120"], catch_exceptions=False)
        assert r.exit_code == 3, r.output
        assert "latency: poly" in r.output and "rolled_back" in r.output, r.output
        assert reg.active().release_id == id_t and srv.service.holder.current.release_id == id_t
        time.sleep(0.3)
        assert not failures, failures[:3]
        specs = {spec for rid, spec in served if rid == id_s}
        assert specs == {"poly.float32.N65536.c.rounds64"}, specs  # the canary really ran the slow candidate
        assert served[-1] == (id_t, "poly.float32.N65536.c.rounds1")
    shutil.rmtree(slow)
