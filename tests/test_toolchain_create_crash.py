"""`tileship toolchain create` over an existing toolchain: a failed, refused or killed create leaves the
old toolchain whole. It used to remove the old venv first and build the new one in its place, so a
failed install left no toolchain at all. Now the new venv is built beside it and swapped in once
complete (``toolchain_place``), and the next create settles what a killed one left.

No network: a tiny wheel made here, installed with ``PIP_NO_INDEX`` and ``PIP_FIND_LINKS``."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import crashpoints
import pytest

from tileship.build.toolchain import Toolchain, create
from tileship.errors import ToolchainError


def _wheel(where: Path, version: str) -> str:
    """A pure wheel of ``demo-pkg`` ``version`` (a module and a ``demo`` script) in ``where``; its sha256."""
    info = f"demo_pkg-{version}.dist-info"
    files = {
        "demo_pkg/__init__.py": f"def main():\n    print('demo {version}')\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: demo-pkg\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": b"[console_scripts]\ndemo = demo_pkg:main\n",
    }
    record = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}"
              for n, b in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = where / f"demo_pkg-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def reqs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Hash-locked requirements: ``v1`` and ``v2`` of the demo wheel, ``missing`` (not on the index)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    out = {}
    for name, pin, digest in (("v1", "demo-pkg==1.0", _wheel(wheels, "1.0")), ("v2", "demo-pkg==2.0",
                              _wheel(wheels, "2.0")), ("missing", "no-such-package==1.0", "a" * 64)):
        out[name] = tmp_path / f"{name}.txt"
        out[name].write_text(f"{pin} \\\n    --hash=sha256:{digest}\n")
    return out


def _usable(root: Path) -> str:
    """The demo version of the toolchain at ``root``, after checking that it is whole and runs there."""
    rec = Toolchain(root).record()
    assert rec is not None, f"no complete toolchain at {root}"
    prefix = subprocess.run([str(root / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert Path(prefix).resolve() == root.resolve(), prefix
    out = subprocess.run([str(root / "bin" / "demo")], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "demo" and rec["wheels"]["demo-pkg"]["version"] == out[1], (out, rec)
    recorded = (root / "pyvenv.cfg").read_text() + (root / "bin" / "demo").read_text()
    assert f".{root.name}.new-" not in recorded, recorded  # the staged path was rewritten to its own
    return out[1]


def _leftovers(root: Path) -> list[str]:
    """What creates left beside ``root`` (staged venvs, old ones renamed aside; the lock file stays)."""
    return sorted(p.name for p in root.parent.iterdir() if p.name.startswith(f".{root.name}.") and
                  not p.name.endswith(".lock"))


def test_a_failed_create_leaves_the_old_toolchain_whole(tmp_path: Path, reqs: dict[str, Path]) -> None:
    root = tmp_path / "tc" / "venv"
    create(root, reqs["v1"])
    assert _usable(root) == "1.0"
    with pytest.raises(ToolchainError, match="no-such-package"):
        create(root, reqs["missing"])
    assert _usable(root) == "1.0", "the old toolchain is gone or damaged"
    assert _leftovers(root) == [], "a failed create left its staged venv"


def test_a_killed_create_leaves_a_whole_toolchain_and_the_next_one_cleans_up(tmp_path: Path,
                                                                             reqs: dict[str, Path]) -> None:
    """Killed before the swap (building, relocating, writing the record), and while the old one is
    removed: the toolchain is the old one or the new one, whole and running where it is; what the
    kill left is removed by the next create's first step (``toolchain_place.staging``)."""
    from tileship.build import toolchain_place

    root = tmp_path / "venv"
    create(root, reqs["v1"])
    done = crashpoints.run(["toolchain", "create", "-r", str(reqs["v2"]), "--dir", str(root)], 10**6)
    total = crashpoints.boundaries(done)
    assert _usable(root) == "2.0" and _leftovers(root) == []  # complete: replaced, runs at its own path
    seen = set()
    for n in (1, 5, total // 2, total - 1):  # back to v1: before the swap v2 stays, after it v1 is there
        got = crashpoints.run(["toolchain", "create", "-r", str(reqs["v1"]), "--dir", str(root)], n)
        assert got.killed, got.output
        seen.add(_usable(root))
        assert not toolchain_place.staging(root).exists()
        assert _leftovers(root) == [], f"killed at {n}/{total}: {_leftovers(root)}"
    assert seen == {"1.0", "2.0"}, seen


def test_an_old_toolchain_renamed_aside_by_a_killed_create_is_put_back(tmp_path: Path,
                                                                       reqs: dict[str, Path]) -> None:
    from tileship.build import toolchain_place

    root = tmp_path / "venv"
    create(root, reqs["v1"])
    aside = tmp_path / f".venv.old-{2**22 + 1}-0000abcd"
    os.replace(root, aside)  # killed between renaming the old one aside and the new one in
    staged = toolchain_place.staging(root)
    assert not staged.exists() and staged.parent == root.parent
    assert _usable(root) == "1.0" and _leftovers(root) == []
