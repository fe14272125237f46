"""The private snapshot of a process killed with SIGKILL is removed by the next snapshot; a live process's is not.

Before: ``integrity.snapshot`` removed its copy only in an ``atexit`` handler, which a killed process never runs
(SIGKILL, the OOM killer, a serving worker's ``os._exit`` after a fatal device fault): each such process left a
full copy of its release in the temp directory for good (hundreds of them on a host whose servers were restarted).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_registry import fake_release

from tileship.release import integrity

PREFIX = "tileship-snapshot-"
SRC = str(Path(__file__).resolve().parent.parent / "src")
CHILD = """
import os, signal, sys, time
from tileship.release import integrity
integrity.snapshot(sys.argv[1], trusted_keys=[])
print("ready", flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""


def _child(release: Path, where: Path, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(where), "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(release), mode], env=env, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _snapshots(where: Path) -> set[str]:
    return {p.name for p in where.iterdir() if p.name.startswith(PREFIX)}


def test_a_killed_process_snapshot_is_reclaimed_a_live_one_is_kept(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    release, _ = fake_release(tmp_path, "a")
    where = tmp_path / "tmp"
    where.mkdir()
    dead = _child(release, where, "die")
    assert dead.wait(30) == -signal.SIGKILL
    killed = _snapshots(where)
    assert len(killed) == 1, "the killed process left its snapshot (what this test reclaims)"
    live = _child(release, where, "live")
    try:
        alive = _snapshots(where) - killed
        older = where / (PREFIX + "older")  # made by an earlier tileship (no .held): never taken
        (older / "release").mkdir(parents=True)
        monkeypatch.setattr(tempfile, "tempdir", str(where))
        checked = integrity.snapshot(release, trusted_keys=[])
        assert checked.snapshot is not None
        left = _snapshots(where)
        assert not killed & left, "the killed process's snapshot was kept"
        assert alive <= left and older.name in left and checked.snapshot.parent.name in left
        assert (checked.snapshot / "release.json").is_file()
    finally:
        live.kill()
        live.wait(30)
    from tileship.release import snapshot_dirs

    snapshot_dirs.remove(checked.snapshot.parent)
    assert snapshot_dirs.reclaim(where) == [where / n for n in alive]
    assert _snapshots(where) == {older.name}
