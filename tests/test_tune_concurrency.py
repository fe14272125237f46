"""Concurrent evidence writers of one release and ``tileship tune``: tune merges its table into the
evidence (read-modify-write). It read the evidence when it began and wrote its merge minutes later,
outside the release's writer lock: a ``verify`` or another ``tune`` that stored evidence in between
was overwritten by a merge made without it (a lost update). Now the evidence is read, merged and
written under the lock (``evidence_write.update``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tileship.release import evidence, integrity
from tileship.verify import tune as tune_mod
from tileship.verify.tune import TuneOptions, tune_release

SRC = Path(__file__).resolve().parents[1] / "src"

#: the cheapest tuning there is: static shapes, two rounds, ~1 ms a timing run
FAST = dict(seeds=(0,), budget_ms=1.0, warmup_ms=0.5, min_repeats=2, max_repeats=3, rounds=2, confirm_rounds=0,
            prune=0.0, limit=4, flush=False)


def _groups(root: Path) -> dict[str, Any]:
    return json.loads((root / evidence.EVIDENCE).read_text())["tuning"]


def _static_groups(root: Path) -> list[str]:
    from tileship.release import described, tuning

    rel = described.read(root / "release.json")
    return sorted(g for g, members in tuning.groups(rel).items() if members[0][2].dynamic_dim is None)


#: one tune in a process of its own: after measuring, it marks ``SYNC/<group>`` and waits for the other's mark
#: before it writes, so both have measured (and the old code had read the evidence) before either writes
_ONE_TUNE = """
import json, pathlib, sys, time
from tileship.verify import tune as m
root, gid, sync, fast = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), json.loads(sys.argv[4])
fast["seeds"] = tuple(fast["seeds"])
real = m.tune_group
def tune_group(*args, **kw):
    got = real(*args, **kw)
    (sync / gid).touch()
    deadline = time.monotonic() + 120
    while len(list(sync.iterdir())) < 2:
        if time.monotonic() > deadline:
            sys.exit("the other tune never measured")
        time.sleep(0.01)
    return got
m.tune_group = tune_group
m.tune_release(root, m.TuneOptions(only=(gid,), **fast))
"""


def test_two_tunes_at_once_both_keep_their_tables(cpu_release: Path, tmp_path: Path) -> None:
    """Two ``tune`` processes of one release, tuning different groups, both measuring before either
    writes: the evidence ends with both groups' tables. (Processes, as two operators' tunes would be:
    TileLang's module loading is not something two threads of one process should race on.)"""
    a, b = _static_groups(cpu_release)[:2]
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    fast = json.dumps({**FAST, "seeds": list(FAST["seeds"])})
    procs = [subprocess.Popen([sys.executable, "-c", _ONE_TUNE, str(cpu_release), g, str(sync), fast], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for g in (a, b)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert {a, b} <= set(_groups(cpu_release)), f"a tune's table was lost: {sorted(_groups(cpu_release))}"
    integrity.check(cpu_release, trusted_keys=[])


def test_evidence_stored_while_a_tune_measured_is_kept(cpu_release: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer (here an evidence update standing for a second tune or a verify) stores a table
    while a tune measures: the tune's merge keeps it."""
    a, b = _static_groups(cpu_release)[:2]
    first = tune_release(cpu_release, TuneOptions(only=(a,), **FAST), write=False)  # type: ignore[arg-type]
    real = tune_mod.tune_group

    def tune_group(*args: Any, **kw: Any) -> Any:
        got = real(*args, **kw)
        evidence.write(cpu_release, first)  # stored after the tune began
        return got

    monkeypatch.setattr(tune_mod, "tune_group", tune_group)
    data = tune_release(cpu_release, TuneOptions(only=(b,), **FAST))  # type: ignore[arg-type]
    assert {a, b} <= set(data["tuning"]) and {a, b} <= set(_groups(cpu_release)), sorted(_groups(cpu_release))
    assert data["tuning"][a] == first["tuning"][a]
