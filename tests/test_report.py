"""tileship report: the HTML page and PNG plots, checked in a real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tileship.errors import VerificationError
from tileship.release import evidence
from tileship.verify.report import write_report
from tileship.verify.report_plots import KERNEL_COLOR, REFERENCE_COLOR
from tileship.verify.spec_check import VerifyOptions
from tileship.verify.verify import verify

QUICK = VerifyOptions(seeds=(0, 1), limit=1024, grid=0, budget_ms=2.0, warmup_ms=1.0, min_repeats=3, max_repeats=5)


@pytest.fixture(scope="module")
def verified(cpu_release_build, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("report-release") / cpu_release_build.release_id
    shutil.copytree(cpu_release_build.path, dest)
    verify(dest, QUICK)
    return dest


@pytest.fixture(scope="module")
def page(verified, tmp_path_factory) -> Path:
    return write_report(verified, tmp_path_factory.mktemp("report") / "out")


def test_report_has_plots_paths_device_and_lock(verified, page):
    from PIL import Image

    from tileship.build.lock import lock_digest, read_lock

    text = page.read_text()
    ev = evidence.read(verified)
    assert f"release {ev['release_id']}" in text
    assert lock_digest(read_lock(verified / "tileship.lock")) in text
    assert "Device fingerprint" in text and ev["host"]["cpu_model"] in text
    for op in ("add", "rmsnorm_cpu"):
        assert f"<h2 id='{op}'>{op}</h2>" in text
        for kind in ("speedup", "error"):
            png = page.parent / f"{op}-{kind}.png"
            assert f"src='{op}-{kind}.png'" in text
            with Image.open(png) as im:
                assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 250
    # every verified shape of the dynamic add has a row with both policies' path and why
    for n in (1, 259, 512, 1024):
        assert f"<td class=''>N={n}</td>" in text
    entry = ev["specializations"]["add.float32.N1-16777216.c"]
    assert f"<b>{entry['route']}</b>: {entry['route_reason']}" in text
    assert "All 4 verified specializations passed." in text


def test_report_marks_failures_and_unverified_releases(cpu_release, tmp_path):
    index = write_report(cpu_release, tmp_path / "unverified")
    text = index.read_text()
    assert "This release has no verification evidence" in text
    assert "<b>kernel</b>: unverified (no evidence); CPU kernels run unverified" in text
    assert not list(index.parent.glob("*.png"))  # nothing measured: no plots

    doc = {"schema": 1, "release_id": json.loads((cpu_release / "manifest.json").read_text())["release_id"],
           "created": "now", "lock_digest": _digest(cpu_release), "device": None, "host": evidence.current_host(),
           "options": {}, "specializations": {"add.float32.N4096.c": {"device_type": "cpu", "dynamic_dim": None,
                                                                      "passed": False,
                                                       "failure": "at N=4096: 3 of 4096 elements never written",
                                                       "route": "reference", "route_reason": "failed verification",
                                                       "points": [{"dims": {"N": 4096}, "passed": False,
                                                                   "failure": "3 of 4096 elements never written",
                                                                   "timing": None, "tol_ratio": None}]}}}
    evidence.write(cpu_release, doc)
    text = write_report(cpu_release, tmp_path / "failed").read_text()
    assert "1 specialization(s) failed verification and serve the reference: add.float32.N4096.c" in text
    assert "<b>reference</b>: verification_failed: at N=4096: 3 of 4096 elements never written" in text


def _digest(root: Path) -> str:
    from tileship.build.lock import lock_digest, read_lock

    return lock_digest(read_lock(root / "tileship.lock"))


def test_report_refuses_to_write_inside_the_release(cpu_release):
    from tileship.release import bundle

    with pytest.raises(VerificationError, match="cannot go inside the release"):
        write_report(cpu_release, cpu_release / "report")
    bundle.check_integrity(cpu_release)


def test_cli_report(verified, tmp_path):
    from tileship.cli import app

    r = CliRunner().invoke(app, ["report", str(verified), "--out", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r" / "index.html").is_file() and (tmp_path / "r" / "add-speedup.png").is_file()


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _run_chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp / 'profile'}"]
    return subprocess.run([exe, *flags, *args], check=False, capture_output=True, text=True, timeout=120)


def test_report_renders_in_headless_chromium(page, tmp_path):
    # CI (``.ci/run`` sets TILESHIP_REQUIRE_BROWSER=1) must run this test: a missing browser fails there.
    if _chromium() is None:
        if os.environ.get("TILESHIP_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium is not installed but TILESHIP_REQUIRE_BROWSER=1 (CI): apt-get install -y chromium")
        pytest.skip("chromium is not installed (set TILESHIP_REQUIRE_BROWSER=1 to make this a failure, as CI does)")
    from PIL import Image

    exe = _chromium()
    shot = tmp_path / "shot.png"
    r = _run_chromium(exe, tmp_path, "--window-size=1400,2200", f"--screenshot={shot}", page.as_uri())
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    dom = _run_chromium(exe, tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<img ") == 6 and "Device fingerprint" in dom.stdout  # speedup, error, roofline x 2 ops
    # the plots really rendered: their bar colors fill many pixels of the screenshot (the page's
    # own CSS uses only light tints, so these colors can only come from the images)
    import numpy as np

    with Image.open(shot) as im:
        assert im.size == (1400, 2200)
        px = np.asarray(im.convert("RGB"), dtype=np.int32)
    hits = 0
    for color in (KERNEL_COLOR, REFERENCE_COLOR):
        target = np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)])
        hits += int((np.abs(px - target).sum(axis=-1) < 12).sum())
    assert hits > 2000, f"only {hits} pixels in the plots' bar colors: the images did not render"
