"""A pinned reference: the modules an operator's fallback runs from are hashed at build; at load,
verify and `tileship check`, a module that differs from its pin is blocking reference drift naming
the operator and the module (docs/verification.md, "A pinned reference")."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from tileship.build.builder import BuildOptions, build
from tileship.declare.project import Project, load_operators
from tileship.errors import LockMismatch, ReferenceDrift

OPS = '''
import tilelang.language as T

from pin_helpers import triple
from tileship.declare.spec import Operator, TensorArg


def scale3(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 64)) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < N:
                    B[bx * 64 + i] = A[bx * 64 + i] * 3

    return main


def pinned_reference(a):
    return triple(a)


pinned = Operator(name="pinned", factory=scale3, reference=pinned_reference, inputs=(TensorArg("A", ("N",)),),
                  outputs=(TensorArg("B", ("N",)),), dtypes=("float32",), targets=("c",), shapes=({"N": 64},))
'''
HELPERS = "def triple(a):\n    return a * 3\n"


@pytest.fixture(scope="module")
def pinned_build(tmp_path_factory):
    """(project dir, release) built from a project whose modules stay imported in this process."""
    proj_dir = tmp_path_factory.mktemp("pin_project")
    (proj_dir / "pin_ops.py").write_text(textwrap.dedent(OPS))
    (proj_dir / "pin_helpers.py").write_text(HELPERS)
    proj = Project(model="pins", model_version="1", operator_modules=("pin_ops",), targets=("c",), root=proj_dir)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("pin_releases"), BuildOptions(jobs=1))
    assert res.ok, [r.error for r in res.failed]
    yield proj_dir, res.path
    for name in ("pin_ops", "pin_helpers"):
        sys.modules.pop(name, None)
    if str(proj_dir) in sys.path:
        sys.path.remove(str(proj_dir))


@pytest.fixture
def edited_helper(pinned_build):
    """The imported helper module's file changed after the build (the fallback changed)."""
    proj_dir, _ = pinned_build
    helper = proj_dir / "pin_helpers.py"
    helper.write_text(HELPERS.replace("a * 3", "a * 3 + 0  # edited after verification"))
    yield helper
    helper.write_text(HELPERS)


def test_the_lock_pins_every_module_the_reference_runs_from(pinned_build):
    from tileship.build.lock import read_lock, sha256_file

    proj_dir, release = pinned_build
    lock = read_lock(release / "tileship.lock")
    pins = lock["reference_modules"]["pinned"]
    assert sorted(pins) == ["pin_helpers", "pin_ops"]
    manifest = json.loads((release / "manifest.json").read_text())
    for module in pins:  # the pin is the digest of the shipped copy, checked by the manifest
        assert pins[module] == manifest["files"][f"sources/{module}.py"] == sha256_file(proj_dir / f"{module}.py")
    assert json.loads((release / "release.json").read_text())["operators"]["pinned"]["reference_modules"] == pins


def test_unchanged_reference_loads(pinned_build):
    import tileship

    rel = tileship.load(pinned_build[1])
    assert not any("reference drift" in n for n in rel.notes)
    rel.close()


def test_changed_reference_module_is_blocking_drift_naming_operator_and_module(pinned_build, edited_helper):
    import tileship

    with pytest.raises(ReferenceDrift) as info:
        tileship.load(pinned_build[1])
    err = info.value
    assert isinstance(err, LockMismatch)  # blocking drift: whatever catches LockMismatch catches this
    assert (err.operator, err.module) == ("pinned", "pin_helpers")
    assert "operator 'pinned', module pin_helpers" in str(err) and str(edited_helper) in str(err)
    assert "the fallback changed since verification" in str(err)
    assert "TILESHIP_ALLOW_REFERENCE_DRIFT" in str(err)
    with pytest.raises(ReferenceDrift):  # under every drift policy: the fallback itself is what changed
        tileship.load(pinned_build[1], drift_policy="fallback")


def test_reference_drift_can_be_allowed_explicitly(pinned_build, edited_helper, monkeypatch):
    import tileship

    rel = tileship.load(pinned_build[1], allow_reference_drift=True)
    assert any(n.startswith("reference drift allowed (reference.pinned.pin_helpers)") for n in rel.notes), rel.notes
    rel.close()
    monkeypatch.setenv("TILESHIP_ALLOW_REFERENCE_DRIFT", "1")
    tileship.load(pinned_build[1]).close()


def test_check_reports_reference_drift(pinned_build, edited_helper):
    from tileship.cli import app

    res = CliRunner().invoke(app, ["check", str(pinned_build[1])])
    assert res.exit_code == 1, res.output
    assert "reference.pinned.pin_helpers" in res.output and "reference drift" in res.output


def test_verify_fails_the_operator_whose_reference_changed(pinned_build, edited_helper):
    """Before, verify raised ReferenceDrift for the whole run (tune failed only that operator's groups); now the
    operator's specializations fail naming the drift, nothing of them measured, as tune's groups do."""
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    result = verify(pinned_build[1], VerifyOptions(seeds=(0,), timing=False), write=False)
    (v,) = result.verdicts
    assert not v.passed and v.points == (), v
    assert v.failure.startswith("its reference changed since the build (pins.require: ReferenceDrift: reference "
                                "drift: operator 'pinned', module pin_helpers"), v.failure


def test_tune_fails_the_groups_of_the_operator_whose_reference_changed(pinned_build, edited_helper):
    from tileship.release import tuning
    from tileship.verify.tune import TuneOptions, tune_release

    data = tune_release(pinned_build[1], TuneOptions(seeds=(0,), budget_ms=1.0, rounds=2, confirm_rounds=0),
                        write=False)
    ((gid, failed),) = tuning.failures(data["tuning"]).items()
    assert failed["reason"].startswith("pins.require: ReferenceDrift: reference drift: operator 'pinned', module "
                                       "pin_helpers"), failed


def test_a_fresh_process_imports_the_pinned_copy_from_the_release(pinned_build, edited_helper):
    """The project's edited file is not on this host's path: the shipped copy is imported, and it matches."""
    code = textwrap.dedent(f"""
        import torch, tileship
        rel = tileship.load({str(pinned_build[1])!r})
        out, d = rel.op("pinned").call(torch.ones(64))
        import pin_helpers
        print(d.path, float(out.sum()), pin_helpers.__file__)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    path, total, where = out.stdout.split()
    assert (path, float(total)) == ("kernel", 192.0)
    assert "/sources/pin_helpers.py" in where


def _build_version(tmp_path_factory, factor: int):
    """A release of the same project (same module names) whose helper multiplies by ``factor``;
    the project directory is then gone and its modules forgotten, as on a serving host."""
    proj_dir = tmp_path_factory.mktemp(f"pin_v{factor}")
    (proj_dir / "pin_ops.py").write_text(textwrap.dedent(OPS))
    (proj_dir / "pin_helpers.py").write_text(HELPERS.replace("a * 3", f"a * {factor}"))
    for name in ("pin_ops", "pin_helpers"):
        sys.modules.pop(name, None)
    proj = Project(model="pins", model_version="1", operator_modules=("pin_ops",), targets=("c",), root=proj_dir)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp(f"pin_rel_v{factor}"), BuildOptions(jobs=1))
    assert res.ok, [r.error for r in res.failed]
    for name in ("pin_ops", "pin_helpers"):
        sys.modules.pop(name, None)
    sys.path.remove(str(proj_dir))
    return res.path


def test_a_new_version_of_the_same_project_loads_its_own_reference(tmp_path_factory):
    """Hot swap in one process: v2 ships other code under the same module names; its load imports its
    own copies (not v1's, already in sys.modules) and the pins agree; v1 keeps serving its own."""
    import torch

    import tileship

    v1, v2 = _build_version(tmp_path_factory, 3), _build_version(tmp_path_factory, 5)
    old = tileship.load(v1)
    new = tileship.load(v2)
    x = torch.ones(64)
    assert old.op("pinned").reference(x).sum().item() == 192.0
    assert new.op("pinned").reference(x).sum().item() == 320.0
    old.close()  # v1's snapshot is gone, its modules too: loading v2 again imports v2's copies again
    again = tileship.load(v2)
    assert again.op("pinned").reference(x).sum().item() == 320.0
    new.close()
    again.close()
