"""``tileship tune``'s summary line says what this run tuned, not what the merged evidence holds.

Before: ``tuned N groups, M buckets: a kernel wins K`` counted every group of the merged table, those an earlier tune
stored included, so a ``--only`` run of one group said it tuned all of them.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tileship.cli import app
from tileship.release import described, evidence, tuning

TUNE_FAST = ["--seeds", "0", "--budget-ms", "1", "--rounds", "2", "--confirm-rounds", "0", "--prune", "0",
             "--limit", "4", "--no-flush"]


def test_the_summary_counts_the_groups_of_this_run_not_those_kept_from_an_earlier_tune(cpu_release):
    rel = described.read(cpu_release / "release.json")
    first, second = [g for g, m in tuning.groups(rel).items() if m[0][2].dynamic_dim is None][:2]
    for gid in (first, second):
        res = CliRunner().invoke(app, ["tune", str(cpu_release), "--only", gid, *TUNE_FAST])
        assert res.exit_code == 0, res.output
    ev = json.loads((cpu_release / evidence.EVIDENCE).read_text())
    assert {first, second} <= set(ev["tuning"]), sorted(ev["tuning"])  # the earlier group is kept
    assert "tuned 1 groups, 1 buckets:" in " ".join(res.output.split()), res.output
