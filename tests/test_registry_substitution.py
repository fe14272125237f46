"""A registry copy that holds another release than the id it is named by is refused, never served as that id.

``releases/<A>`` whose files are a whole, valid (even signed) release B passes every hash: without a check of
the id, ``activate A`` (or a rollback to A) recorded A while a server following the registry loaded and
served B, only with a note.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_registry import fake_release

from tileship.errors import BundleIntegrityError, RegistryError
from tileship.release import bundle
from tileship.release.registry import Registry
from tileship.runtime.loader import load
from tileship.serve.holder import ReleaseHolder


def _swap_contents(reg: Registry, rid: str, other: str) -> Path:
    """``releases/<rid>`` replaced by a copy of release ``other`` (every file whole and hashed)."""
    where = reg.path_of(rid)
    shutil.rmtree(where)
    shutil.copytree(reg.path_of(other), where)
    return where


def test_activate_and_rollback_refuse_a_copy_holding_another_release(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    a = reg.publish(fake_release(tmp_path, "a")[0])
    b = reg.publish(fake_release(tmp_path, "b")[0])
    reg.activate(a)
    reg.activate(b)
    where = _swap_contents(reg, a, b)
    with pytest.raises(RegistryError) as info:
        reg.activate(a)
    assert f"{where} holds release {b}, not {a}" in info.value.message, info.value.message
    with pytest.raises(RegistryError) as info:
        reg.rollback()
    assert f"holds release {b}, not {a}" in info.value.message, info.value.message
    assert reg.active().release_id == b  # nothing changed
    listed = {r.release_id: r for r in reg.releases()}
    assert not listed[a].integrity_ok and listed[b].integrity_ok


def test_a_server_refuses_a_registry_copy_holding_another_release(cpu_release: Path, tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    real = reg.publish(cpu_release)
    fake = "0123456789abcdef"
    shutil.copytree(reg.path_of(real), reg.releases_dir / fake)
    reg.activate(fake, force=True)  # or activated when whole, then replaced: the pointer names fake
    holder = ReleaseHolder(reg.root, lambda p, r, e: load(p, trusted_keys=[], reference_only=r,
                                                          expect_evidence_digest=e))
    with pytest.raises(BundleIntegrityError) as info:
        holder.prepare(holder.resolve())
    assert f"holds release {real}, not {fake}" in info.value.message and info.value.path == str(
        reg.releases_dir / fake)
    reg.activate(real)  # the real one still serves
    assert holder.prepare(holder.resolve()).release_id == real


def test_a_renamed_copy_is_refused_by_the_listing(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "reg")
    a = reg.publish(fake_release(tmp_path, "a")[0])
    (reg.releases_dir / a).rename(reg.releases_dir / "fedcba9876543210")
    row = next(r for r in reg.releases() if r.release_id == "fedcba9876543210")
    assert not row.integrity_ok and f"holds release {a}" in (row.integrity_error or "")
    assert json.loads((reg.releases_dir / "fedcba9876543210" / bundle.MANIFEST).read_text())["release_id"] == a


def _diagnose(*args: str) -> tuple[Any, dict[str, Any]]:
    from typer.testing import CliRunner

    from tileship.cli import app

    out = Path(args[args.index("--out") + 1])
    r = CliRunner().invoke(app, ["diagnose", *args], catch_exceptions=False)
    [d] = [p for p in out.iterdir() if p.is_dir()]
    return r, json.loads((d / "summary.json").read_text())


def test_diagnose_reports_a_copy_holding_another_release(cpu_release: Path, tmp_path: Path) -> None:
    """``tileship diagnose`` of the active release (loading it) and of a release named by id (not loading it),
    where the registry's copy holds another release: the bundle's finding names both ids. It used to load the
    copy as the release it holds and record a healthy on-demand bundle."""
    reg = Registry(tmp_path / "reg")
    real = reg.publish(cpu_release)
    fake = "0123456789abcdef"
    shutil.copytree(reg.path_of(real), reg.releases_dir / fake)
    reg.activate(fake, force=True)
    for n, args in enumerate([(), (fake[:6], "--no-load")]):
        r, summary = _diagnose(*args, "--registry", str(reg.root), "--out", str(tmp_path / f"diag{n}"))
        assert r.exit_code == 0, r.output
        assert f"holds release {real}, not {fake}" in r.output.replace("\n", ""), r.output
        assert summary["reason"] == "wrong_release", summary
        assert summary["exception"]["type"] == "BundleIntegrityError", summary
        assert f"holds release {real}, not {fake}" in summary["exception"]["message"], summary
    r, summary = _diagnose(real, "--no-load", "--registry", str(reg.root), "--out", str(tmp_path / "diag_ok"))
    assert summary["reason"] == "on_demand" and summary.get("exception") is None, summary
