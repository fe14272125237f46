"""A real `tileship build` killed with SIGKILL at random instants (its compile workers run on, in
their own sessions), then the next build in the same directory: the release is there whole or not at
all after the kill, and the next build says what it recovered, succeeds, and leaves only its release
(and the lock of its renames)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tileship.build import outputs
from tileship.release import integrity

TESTS = Path(__file__).parent
TRIALS = 2


def _build(tmp_path: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tileship.cli", "build", "--project",
                             str(tmp_path / "tileship.toml"), "--out", str(out), "-j", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env={**os.environ, "COLUMNS": "200"})


def test_build_killed_at_random_instants_then_rebuilt(tmp_path: Path) -> None:
    shutil.copy(TESTS / "crash_ops.py", tmp_path / "crash_ops.py")
    (tmp_path / "tileship.toml").write_text('model = "m"\noperators = ["crash_ops"]\ntargets = ["c"]\n')
    rng = random.Random(1234)
    out = tmp_path / "builds"
    for trial in range(TRIALS):
        proc = _build(tmp_path, out)
        time.sleep(rng.uniform(0.5, 8.0))  # a build here takes 8 to 40 s: start-up, shipping, compiling
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
        for name in names:
            if not name.startswith("."):
                integrity.check(out / name, trusted_keys=[])  # a release in place is whole
        left = [n for n in names if n.startswith((outputs.STAGING, outputs.TRASH))]
        nxt = _build(tmp_path, out)
        said = nxt.communicate(timeout=300)[0]
        assert nxt.returncode == 0 and "Traceback" not in said, said
        assert not left or "recovered" in said, (trial, left, said)
        releases = [p for p in out.iterdir() if p.name != ".lock"]
        assert len(releases) == 1 and not releases[0].name.startswith("."), sorted(p.name for p in out.iterdir())
        integrity.check(releases[0], trusted_keys=[])
        shutil.rmtree(out)


def _workers_of(pid: int) -> list[int]:
    """The compile workers whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            ppid = int(next(ln for ln in (entry / "status").read_text().splitlines() if ln.startswith("PPid:"))
                       .split()[1])
        except (OSError, StopIteration, ValueError):
            continue
        if ppid == pid and b"tileship.build.worker" in cmd:
            found.append(int(entry.name))
    return found


def test_a_killed_build_takes_its_compile_worker_with_it(tmp_path: Path) -> None:
    """The worker runs in its own session; before, it compiled on as an orphan and then removed the cache
    directory a new build of the same specialization was using."""
    if not Path("/proc/self/status").is_file():
        pytest.skip("needs /proc (Linux)")
    shutil.copy(TESTS / "crash_ops.py", tmp_path / "crash_ops.py")
    (tmp_path / "tileship.toml").write_text('model = "m"\noperators = ["crash_ops"]\ntargets = ["c"]\n')
    proc = _build(tmp_path, tmp_path / "builds")
    deadline = time.monotonic() + 120
    workers: list[int] = []
    while not workers and proc.poll() is None and time.monotonic() < deadline:
        workers = _workers_of(proc.pid)
        time.sleep(0.02)
    assert workers, "no compile worker seen while the build ran"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    deadline = time.monotonic() + 2  # a worker left alone imports TileLang and compiles for 5 s or more here
    alive = list(workers)
    while alive and time.monotonic() < deadline:
        alive = [w for w in alive if Path(f"/proc/{w}").exists() and "State:\tZ" not in _status(w)]
        time.sleep(0.05)
    assert not alive, f"compile worker(s) {alive} outlived their build"


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "State:\tZ"
