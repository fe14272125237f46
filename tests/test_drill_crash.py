"""The drill's report writer (``drill_report.write_report``) killed at every write boundary while it replaces an
earlier drill's report: ``drill.json``, ``drill.txt`` and ``metrics.txt`` each hold the old drill's bytes or the new
one's, whole, and the next write leaves no temporary beside them. Before: the three were written in place
(``Path.write_text``), so a kill left half a JSON file. (The whole drill needs a running server: the one real drill
run is in test_registry.py, which checks that it leaves no temporary.)"""

from __future__ import annotations

import json
from pathlib import Path

import crashpoints

NAMES = ("drill.json", "drill.txt", "metrics.txt")
REPORT = {"passed": True, "created": "2026-12-01T00:00:00Z", "server": "http://127.0.0.1:1", "server_ready": {},
          "release_new": "new", "release_old": "old", "compile_attempts": 0, "windows": [], "requests": [],
          "skipped_shapes": [], "totals": {"requests": 9, "ok": 9, "failed": 0, "dropped": 0, "mismatched": 0,
                                           "stale": 0}, "padding": "x" * 4000}
CODE = f"""
import sys
from pathlib import Path
from tileship.verify.drill_report import write_report
report = {REPORT!r}
arm()
write_report(Path(sys.argv[1]), metrics="# the new metrics\\n" * 200)
write_report(Path(sys.argv[1]), report=report)
"""


def test_drill_report_killed_at_every_write_boundary(tmp_path: Path) -> None:
    out = tmp_path / "report"
    old = {n: f"the old {n}\n".encode() * 50 for n in NAMES}
    seen: dict[str, set[str]] = {n: set() for n in NAMES}

    def fresh() -> None:
        out.mkdir(exist_ok=True)
        for p in out.iterdir():
            p.unlink()
        for n, body in old.items():
            (out / n).write_bytes(body)

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output[-2000:]
        for n in NAMES:
            body = (out / n).read_bytes()
            if body == old[n]:
                seen[n].add("old")
                continue
            if n == "drill.json":
                assert json.loads(body)["padding"] == REPORT["padding"], f"boundary {o.n}: a partial {n}"
            elif n == "drill.txt":
                assert body.startswith(b"tileship rollback drill: PASSED") and body.endswith(b"request shapes (0):\n")
            else:
                assert body == b"# the new metrics\n" * 200, f"boundary {o.n}: a partial {n}"
            seen[n].add("new")

    outcomes = list(crashpoints.sweep([str(out)], before=fresh, check=check, code=CODE))
    assert sum(o.killed for o in outcomes) >= 6 and all(s == {"old", "new"} for s in seen.values()), seen
    fresh()
    assert crashpoints.run([str(out)], len(outcomes) // 2, code=CODE).killed
    assert crashpoints.run([str(out)], 10**6, code=CODE).returncode == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(NAMES), "a killed writer's temporary was left"
