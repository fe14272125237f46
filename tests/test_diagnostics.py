"""Diagnostics bundles: what a bundle holds for each failure path, and ``tileship diagnose``."""

from __future__ import annotations

import json
import os
import stat
import tarfile
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from tileship.release import bundle, diagnostics
from tileship.runtime.loader import load

TESTS = Path(__file__).resolve().parent


def a_spec(release_dir: Path) -> str:
    return sorted(p.name for p in (release_dir / "specs").iterdir())[0]


def failing_call(release: object, args: tuple[torch.Tensor, ...], out: Path,
                 **kw: object) -> diagnostics.DiagnosticsRef:
    try:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
    except RuntimeError:
        # exc: the one being handled
        return diagnostics.capture(release, call=args, out_dir=out, reason="serve_error", **kw)


def test_bundle_contents_for_a_failing_call(cpu_release: Path, tmp_path: Path) -> None:
    release = load(cpu_release)
    sid = a_spec(cpu_release)
    args = (torch.randn(64, 256), torch.randn(256))
    ref = failing_call(release, args, tmp_path, spec_id=sid)
    root = ref.path
    assert ref.id.startswith("diag-") and root == tmp_path / ref.id
    s = json.loads((root / "summary.json").read_text())
    assert (s["release_id"], s["spec_ids"], s["reason"]) == (release.release_id, [sid], "serve_error")
    assert s["exception"] == {"type": "RuntimeError",
                              "message": "CUDA error: an illegal memory access was encountered (simulated)"}
    assert "in failing_call" in (root / "traceback.txt").read_text()
    call = json.loads((root / "call.json").read_text())
    assert [(c["shape"], c["dtype"], c["device"], c["contiguous"]) for c in call] == \
        [([64, 256], "torch.float32", "cpu", True), ([256], "torch.float32", "cpu", True)]
    assert s["data_included"] is False and not (root / "call_data.pt").exists()
    for name in ("device_kernel.cu", "host_kernel.cu"):
        assert (root / "specs" / sid / name).read_bytes() == (cpu_release / "specs" / sid / name).read_bytes()
    build = json.loads((root / "specs" / sid / "build.json").read_text())
    assert build["build"]["commands"], "the compiler command lines are missing"
    assert "log" in build["build"] and build["release_status"]["status"] == "built"
    assert yaml.safe_load((root / "environment" / "lock.yaml").read_text()) == yaml.safe_load(
        (cpu_release / "tileship.lock").read_text()
    )
    assert yaml.safe_load((root / "environment" / "current.yaml").read_text())["backend"]["tilelang"] == "0.1.15"
    side = (root / "environment" / "side_by_side.txt").read_text()
    assert "backend.tilelang" in side and "framework.torch" in side and "blocking drift: False" in side
    smi = (root / "nvidia-smi.txt").read_text()
    assert ("not on PATH" in smi) if s["tools"]["nvidia-smi"] is None else smi.startswith("$ ")
    assert any(f"{sid}: no kernel.cubin" in n for n in s["notes"])  # a "c" target has no SASS, and says so
    runtime = json.loads((root / "runtime.json").read_text())
    assert runtime["status"]["release_id"] == release.release_id and sid.split(".")[0] in runtime["decisions"]
    with tarfile.open(ref.archive) as tar:
        in_tar = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert in_tar == sorted(f"{ref.id}/{f}" for f in s["files"])


def test_tensor_data_only_when_opted_in(cpu_release: Path, tmp_path: Path) -> None:
    args = (torch.randn(5), torch.randn(5))
    ref = failing_call(cpu_release, args, tmp_path, include_data=True)
    saved = torch.load(ref.path / "call_data.pt")
    assert all(torch.equal(x, y) for x, y in zip(saved, args, strict=True))
    assert json.loads((ref.path / "summary.json").read_text())["data_included"] is True


def test_build_failure_bundle_has_the_compiler_log(tmp_path: Path) -> None:
    import broken_ops

    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import Project

    proj = Project(model="broken", model_version="1", operator_modules=("broken_ops",), targets=("c",), root=TESTS)
    result = build(proj, {"good": broken_ops.good, "boom": broken_ops.boom}, tmp_path / "out", BuildOptions(jobs=2))
    [failed] = result.failed
    ref = diagnostics.capture_build(result.path, out_dir=tmp_path / "diag")
    assert ref is not None
    s = json.loads((ref.path / "summary.json").read_text())
    assert s["reason"] == "build_failed" and s["spec_ids"] == [failed.spec.id]
    b = json.loads((ref.path / "specs" / failed.spec.id / "build.json").read_text())
    assert "deliberate failure in the kernel factory" in b["build"]["error"]
    assert "ValueError" in b["build"]["log"] and b["release_status"]["status"] == "failed"


def test_build_without_failures_writes_nothing(cpu_release: Path, tmp_path: Path) -> None:
    assert diagnostics.capture_build(cpu_release, out_dir=tmp_path / "diag") is None
    assert not (tmp_path / "diag").exists()


def test_artifact_load_failure_bundle(cpu_release: Path, tmp_path: Path) -> None:
    sid = a_spec(cpu_release)
    lib = next(p for p in (cpu_release / "specs" / sid).iterdir() if p.suffix == ".so")
    lib.write_bytes(b"\x7fELF but not really")
    bundle.write_manifest(cpu_release)  # intact by its manifest; broken as a library
    release = load(cpu_release)
    assert sid in release.load_errors
    ref = diagnostics.check_release(release, out_dir=tmp_path)
    assert ref is not None
    s = json.loads((ref.path / "summary.json").read_text())
    assert "load_failed" in s["reason"] and sid in s["spec_ids"] and sid in s["detail"]
    b = json.loads((ref.path / "specs" / sid / "build.json").read_text())
    assert b["load_error"] and b["decision"] == "reference:load_failed"


def test_drift_bundle_shows_lock_and_environment_side_by_side(cpu_release: Path, tmp_path: Path) -> None:
    lock = yaml.safe_load((cpu_release / "tileship.lock").read_text())
    lock["backend"]["tilelang"] = "0.0.0-other"
    (cpu_release / "tileship.lock").write_text(yaml.safe_dump(lock, sort_keys=True))
    bundle.write_manifest(cpu_release)
    release = load(cpu_release)
    assert release.drift.blocking
    ref = diagnostics.check_release(release, out_dir=tmp_path)
    assert ref is not None
    assert json.loads((ref.path / "summary.json").read_text())["reason"] == "drift"
    side = (ref.path / "environment" / "side_by_side.txt").read_text()
    [line] = [ln for ln in side.splitlines() if ln.startswith("backend.tilelang ")]
    assert "'0.0.0-other'" in line and "'0.1.15'" in line and "<-- differs" in line
    assert "blocking drift: True (backend.tilelang)" in side


def test_healthy_release_writes_nothing(cpu_release: Path, tmp_path: Path) -> None:
    assert diagnostics.check_release(load(cpu_release), out_dir=tmp_path) is None


def test_sass_and_ptx_come_from_cuobjdump_when_present(cpu_release: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    sid = a_spec(cpu_release)
    (cpu_release / "specs" / sid / "kernel.cubin").write_bytes(b"fake cubin")
    tools = tmp_path / "bin"
    tools.mkdir()
    fake = tools / "cuobjdump"
    fake.write_text('#!/bin/sh\necho "cuobjdump called with: $*"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    ref = diagnostics.capture(cpu_release, spec_id=sid, out_dir=tmp_path / "diag")
    sass = (ref.path / "specs" / sid / "sass.txt").read_text()
    assert f"cuobjdump called with: -sass {cpu_release / 'specs' / sid / 'kernel.cubin'}" in sass
    assert "-ptx" in (ref.path / "specs" / sid / "ptx.txt").read_text()


def test_capture_without_a_release_still_records_the_environment(tmp_path: Path) -> None:
    ref = diagnostics.capture(None, exc=ValueError("boom"), out_dir=tmp_path)
    s = json.loads((ref.path / "summary.json").read_text())
    assert s["release_id"] is None and s["exception"]["type"] == "ValueError"
    assert (ref.path / "environment" / "current.yaml").is_file()
    assert "no release lock" in (ref.path / "environment" / "side_by_side.txt").read_text()


def test_diagnose_command(cpu_release: Path, tmp_path: Path) -> None:
    from tileship.cli import app

    sid = a_spec(cpu_release)
    out = tmp_path / "diag"
    r = CliRunner().invoke(app, ["diagnose", str(cpu_release), "--spec", sid, "--out", str(out)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    [d] = [p for p in out.iterdir() if p.is_dir()]
    assert d.name in r.output and (out / f"{d.name}.tar.gz").is_file()
    s = json.loads((d / "summary.json").read_text())
    assert s["reason"] == "on_demand" and s["spec_ids"] == [sid] and (d / "runtime.json").is_file()


def test_diagnose_command_records_a_release_that_will_not_load(cpu_release: Path, tmp_path: Path) -> None:
    from tileship.cli import app

    (cpu_release / "release.json").write_text("{}")
    out = tmp_path / "diag"
    r = CliRunner().invoke(app, ["diagnose", str(cpu_release), "--out", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    [d] = [p for p in out.iterdir() if p.is_dir()]
    s = json.loads((d / "summary.json").read_text())
    assert (
        s["reason"] == "load_refused"
        and s["exception"]["type"] == "BundleIntegrityError"
        and "release.json" in s["exception"]["message"]
    )


def test_build_command_writes_a_bundle_for_failed_specializations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tileship.cli import app

    (tmp_path / "tileship.toml").write_text('model = "broken"\noperators = ["broken_ops"]\ntargets = ["c"]\n')
    monkeypatch.setenv("TILESHIP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    r = CliRunner().invoke(app, ["build", "--project", str(tmp_path / "tileship.toml"), "--out", str(tmp_path / "out"),
                                 "-j", "2", "--timeout", "20"], catch_exceptions=False)
    assert r.exit_code == 2, r.output  # some built, some failed
    [d] = [p for p in (tmp_path / "home" / "diagnostics").iterdir() if p.is_dir()]
    assert f"diagnostics {d.name}" in r.output
    s = json.loads((d / "summary.json").read_text())
    assert s["reason"] == "build_failed" and sorted(x.split(".")[0] for x in s["spec_ids"]) == ["boom", "crash", "hang"]
    hang = json.loads((d / "specs" / next(x for x in s["spec_ids"] if x.startswith("hang")) / "build.json").read_text())
    assert "timed out" in hang["build"]["error"]
