"""A reference that travels: the operator module and its local imports ship in the release, the
serving host imports them from there, and a missing third-party module is named at load."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from tileship.build.builder import BuildOptions, build
from tileship.declare.project import Project, load_operators
from tileship.errors import ArtifactLoadError

OPS = '''
import tilelang.language as T
import yaml  # a third-party import the reference needs (recorded in the lock with its version)

from travel_helpers import double
from tileship.declare.spec import Operator, TensorArg


def copy2(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 64)) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < N:
                    B[bx * 64 + i] = A[bx * 64 + i] * 2

    return main


def travel_reference(a):
    assert yaml is not None
    return double(a)


travel = Operator(name="travel", factory=copy2, reference=travel_reference, inputs=(TensorArg("A", ("N",)),),
                  outputs=(TensorArg("B", ("N",)),), dtypes=("float32",), targets=("c",), shapes=({"N": 64},))
'''


@pytest.fixture(scope="module")
def travelled(tmp_path_factory):
    """A release built from a project directory that is then deleted."""
    proj_dir = tmp_path_factory.mktemp("travel_project")
    (proj_dir / "travel_ops.py").write_text(textwrap.dedent(OPS))
    (proj_dir / "travel_helpers.py").write_text("def double(a):\n    return a * 2\n")
    proj = Project(model="travel", model_version="1", operator_modules=("travel_ops",), targets=("c",), root=proj_dir)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("travel_releases"), BuildOptions(jobs=1))
    assert res.ok, [r.error for r in res.failed]
    for name in ("travel_ops", "travel_helpers"):
        sys.modules.pop(name, None)
    sys.path.remove(str(proj_dir))
    shutil.rmtree(proj_dir)
    return res.path


def test_release_ships_sources_and_locks_third_party_imports(travelled):
    assert sorted(p.name for p in (travelled / "sources").iterdir()) == ["travel_helpers.py", "travel_ops.py"]
    rel = json.loads((travelled / "release.json").read_text())
    assert rel["operators"]["travel"]["sources"] == ["travel_helpers.py", "travel_ops.py"]
    lock = (travelled / "tileship.lock").read_text()
    assert "yaml: PyYAML==" in lock and "tilelang: tilelang==" in lock
    manifest = json.loads((travelled / "manifest.json").read_text())
    assert "sources/travel_ops.py" in json.dumps(manifest)


def test_serving_host_imports_the_reference_from_the_release(travelled):
    code = textwrap.dedent(f"""
        import sys, torch, tileship
        rel = tileship.load({str(travelled)!r})
        out, d = rel.op("travel").call(torch.ones(64))
        import travel_ops
        print(d.path, float(out.sum()), travel_ops.__file__)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert r.returncode == 0, r.stderr
    path, total, file = r.stdout.split()
    # imported from the private snapshot of the release that load hashed, never from the release directory itself
    assert path == "kernel" and float(total) == 128.0
    assert file.endswith(f"/{travelled.name}/sources/travel_ops.py") and not file.startswith(str(travelled))


def test_missing_third_party_module_is_named_with_the_path_looked_in(travelled, monkeypatch):
    from tileship.runtime.loader import load

    monkeypatch.setattr(sys, "path", list(sys.path))  # load puts the release's sources on it
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed here
    for name in ("travel_ops", "travel_helpers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ArtifactLoadError) as info:
        load(travelled)
    msg = str(info.value)
    assert ("cannot import the reference travel_ops.travel_reference: third-party module 'yaml' "
            "is not installed on this host") in msg
    assert f"/{travelled.name}/sources" in msg and "looked in" in msg and "hint: pip install PyYAML==" in msg
