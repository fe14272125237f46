"""The public API: exactly the names in ``tileship.__all__``, all importable, and ``--help`` stays light."""

from __future__ import annotations

import subprocess
import sys

import tileship


def test_exported_members():
    exported = set(tileship.__all__)
    assert exported == {n for n in exported if hasattr(tileship, n)}, "every name in __all__ must exist"
    assert sorted(tileship.__all__) == list(tileship.__all__)
    for name in ("load", "Operator", "TensorArg", "ScalarArg", "DynamicRange", "Space", "Release", "Decision",
                 "TileshipError", "BundleIntegrityError"):
        assert name in exported
    assert issubclass(tileship.BundleIntegrityError, tileship.TileshipError)


def test_cli_help_does_not_import_torch_or_tilelang():
    code = "import sys; from tileship.cli import app; print('torch' in sys.modules, 'tilelang' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
