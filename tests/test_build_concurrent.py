"""Two `tileship build` at once into one output directory (same project, so the same release id):
both finish, and the directory holds that one release, whole, and nothing else but the lock of its
renames (``build/outputs``: one exchange under a filelock; staging directories are per process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tileship.release import integrity

TESTS = Path(__file__).parent


def test_two_builds_at_once_into_one_directory(tmp_path: Path) -> None:
    shutil.copy(TESTS / "crash_ops.py", tmp_path / "crash_ops.py")
    (tmp_path / "tileship.toml").write_text('model = "m"\noperators = ["crash_ops"]\ntargets = ["c"]\n')
    out = tmp_path / "builds"
    cmd = [sys.executable, "-m", "tileship.cli", "build", "--project", str(tmp_path / "tileship.toml"),
           "--out", str(out), "-j", "1"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                              env={**os.environ, "COLUMNS": "200"}) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, text in zip(procs, outputs, strict=True):
        assert p.returncode == 0 and "1 built, 0 failed" in text and "Traceback" not in text, text
    releases = [p for p in out.iterdir() if p.name != ".lock"]
    assert len(releases) == 1, sorted(p.name for p in out.iterdir())
    checked = integrity.check(releases[0], trusted_keys=[])
    assert checked.release_id == releases[0].name and (releases[0] / "specs" / "add_one.float32.N256.c").is_dir()
