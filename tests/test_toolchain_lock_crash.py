"""`tileship toolchain lock` when pip-compile is killed while it writes its output file.

pip-compile wrote straight onto the hash-locked requirements file: killed mid-write (here a stand-in
``piptools`` module writes half a resolution and dies with SIGKILL, as an OOM kill would), the
previous, good file was left truncated. Now it writes a temporary renamed on success only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tileship.build.toolchain import check_hashed, compile_requirements
from tileship.errors import ToolchainError

GOOD = "six==1.16.0 \\\n    --hash=sha256:" + "c" * 64 + "\n"
_DYING = """
import os, signal, sys
out = sys.argv[sys.argv.index("--output-file") + 1]
with open(out, "w") as f:
    f.write("tqdm==4.70.1 \\\\\\n    --hash=sha256:ab")  # half a resolution
    f.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""
_RESOLVING = """
import sys
out = sys.argv[sys.argv.index("--output-file") + 1]
open(out, "w").write("tqdm==4.70.1 \\\\\\n    --hash=sha256:" + "a" * 64 + "\\n")
"""


def _fake_piptools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, main: str) -> None:
    pkg = tmp_path / "fake" / "piptools"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(main)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")]))


def test_a_killed_pip_compile_leaves_the_previous_lock_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "toolchain-cuda13.0.88.txt"
    out.write_text(GOOD)
    _fake_piptools(tmp_path, monkeypatch, _DYING)
    with pytest.raises(ToolchainError, match="pip-compile failed") as info:
        compile_requirements(["tqdm"], out)
    assert out.read_text() == GOOD and check_hashed(out.read_text()) == []
    assert "-9" in str(info.value)  # the exit status names the kill
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake", out.name], "a temporary was left"


def test_a_complete_resolution_replaces_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "toolchain-cuda13.0.88.txt"
    out.write_text(GOOD)
    _fake_piptools(tmp_path, monkeypatch, _RESOLVING)
    text = compile_requirements(["tqdm"], out)
    assert out.read_text() == text and text.startswith("tqdm==4.70.1") and check_hashed(text) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake", out.name]


def test_a_symlinked_lock_stays_a_link_and_keeps_its_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the resolution was renamed over the link (a regular file, with the temporary's mode)."""
    real = tmp_path / "locks" / "toolchain-cuda13.0.88.txt"
    real.parent.mkdir()
    real.write_text(GOOD)
    real.chmod(0o640)
    out = tmp_path / real.name
    out.symlink_to(real)
    _fake_piptools(tmp_path, monkeypatch, _RESOLVING)
    text = compile_requirements(["tqdm"], out)
    assert out.is_symlink() and real.read_text() == text and real.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake", "locks", out.name]
    assert sorted(p.name for p in real.parent.iterdir()) == [real.name]
