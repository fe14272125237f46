"""`tileship report` killed at every write boundary while it replaces an earlier report: the output folder holds
the old report or the new one, each whole (the page, and every plot it shows a complete PNG), and the next run
writes it with no staging directory left beside it. Before: the page and plots were written in place, so a kill
left a truncated ``index.html``, or an old page beside half a plot. A folder holding other files keeps them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import crashpoints
import pytest

from tileship.verify.spec_check import VerifyOptions
from tileship.verify.verify import verify

QUICK = VerifyOptions(seeds=(0,), limit=256, grid=0, budget_ms=1.0, warmup_ms=0.5, min_repeats=3, max_repeats=3)
OLD = {"index.html": b"<!DOCTYPE html><html>the old report</html>\n", "add-speedup.png": b"old plot"}
#: the report command, with matplotlib imported before the boundaries count (it writes its caches)
CODE = """
import matplotlib.pyplot
import tileship.verify.report
from tileship.cli import main
arm()
main()
"""


def _whole_new(out: Path) -> bool:
    page = (out / "index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>\n"), "a truncated page"
    for img in re.findall(r"<img src='([^']+)'", page):
        png = (out / img).read_bytes()
        assert png.startswith(b"\x89PNG") and png.endswith(b"IEND\xaeB`\x82"), f"{img}: not a whole PNG"
    return "the old report" not in page


@pytest.mark.parametrize("foreign", [False, True], ids=["own-folder", "shared-folder"])
def test_report_killed_at_every_write_boundary(cpu_release: Path, tmp_path: Path, foreign: bool) -> None:
    verify(cpu_release, QUICK)
    out = tmp_path / "out"
    args = ["report", str(cpu_release), "--out", str(out)]
    seen: set[str] = set()

    def fresh() -> None:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        for name, body in OLD.items():
            (out / name).write_bytes(body)
        if foreign:
            (out / "notes.txt").write_text("mine")

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output[-2000:]
        if _whole_new(out):
            seen.add("new")
        else:
            if not foreign:  # the old folder whole (shared: the old page, its plots replaced one by one, each whole)
                assert {p.name: p.read_bytes() for p in out.iterdir()} == OLD, f"boundary {o.n}: not the old report"
            seen.add("old")
        assert not foreign or (out / "notes.txt").read_text() == "mine"

    total = crashpoints.boundaries(crashpoints.run(args, 10**6, code=CODE))
    step = max(1, total // (6 if foreign else 10))
    outcomes = list(crashpoints.sweep(args, before=fresh, check=check, code=CODE, step=step))
    assert sum(o.killed for o in outcomes) >= 3 and seen == {"old", "new"}, seen
    fresh()
    crashpoints.run(args, total // 2, code=CODE)  # a killed run's staging folder, then the next run
    assert crashpoints.run(args, 10**6, code=CODE).returncode == 0 and _whole_new(out)
    assert not list(tmp_path.glob(".out.tmp*")), "a killed run's staging folder was left"


def test_a_report_onto_a_file_is_refused_and_the_file_kept(cpu_release: Path, tmp_path: Path) -> None:
    (tmp_path / "out").write_text("mine")
    r = crashpoints.run(["report", str(cpu_release), "--out", str(tmp_path / "out")], 10**6)
    assert r.returncode == 1 and f"{tmp_path / 'out'}: exists and is not a directory" in " ".join(r.output.split())
    assert (tmp_path / "out").read_text() == "mine" and not list(tmp_path.glob(".out.tmp*"))
