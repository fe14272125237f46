"""``tileship build --ray``: the build farm on a local Ray cluster (2 CPUs, "c" target).

A Ray build is the same release, byte for byte, as a local build; a compile failure is a value
recorded as locally and never retried; a task whose worker process dies is retried by Ray.
CI installs the ``tileship[ray]`` extra and sets TILESHIP_REQUIRE_RAY=1, so there these tests run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

if os.environ.get("TILESHIP_REQUIRE_RAY") == "1":
    import ray  # CI: a missing Ray fails here instead of skipping (setup.sh installs tileship[ray])
else:
    ray = pytest.importorskip("ray")

from tileship.build.builder import BuildOptions, build  # noqa: E402
from tileship.build.ray_farm import RayFarm, require_ray  # noqa: E402
from tileship.declare.project import Project, load_operators  # noqa: E402
from tileship.errors import BuildError  # noqa: E402

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    ray.shutdown()


def _project(root: Path, module: str, source: str) -> Project:
    """A project outside the git checkout (a stable kernel revision) with one operator module."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(source)
    return Project(model="ray", model_version="1", operator_modules=(module,), targets=("c",), root=root)


def _files(release: Path) -> dict[str, bytes]:
    return {p.relative_to(release).as_posix(): p.read_bytes() for p in sorted(release.rglob("*")) if p.is_file()}


def test_ray_build_equals_local_build(cluster, tmp_path):
    proj = _project(tmp_path / "proj", "ray_tuned_ops", (TESTS / "tuned_ops.py").read_text())
    ops = load_operators(proj)
    local = build(proj, ops, tmp_path / "local", BuildOptions(jobs=2))
    farm = build(proj, ops, tmp_path / "ray", BuildOptions(ray=RayFarm()))
    assert local.ok and farm.ok, [r.error for r in (*local.failed, *farm.failed)]
    assert len(farm.built) == 6  # (range, static shape) x 3 candidates
    assert farm.release_id == local.release_id
    a, b = _files(local.path), _files(farm.path)
    assert sorted(a) == sorted(b)
    # every file but the build log (timings) and the manifest that hashes it is byte-identical
    differ = [f for f in a if a[f] != b[f] and f not in ("build-log.json", "manifest.json")]
    assert not differ, f"{len(differ)} files differ between the local and the Ray build: {differ[:5]}"
    # the same compiler commands were recorded (same work paths on the node as locally)
    assert {r.spec.id: r.commands for r in farm.results} == {r.spec.id: r.commands for r in local.results}
    assert json.loads((farm.path / "build-log.json").read_text())["ray"] == "local"


def test_compile_failure_is_recorded_as_locally_and_not_retried(cluster, tmp_path):
    calls = tmp_path / "factory-calls"
    src = (TESTS / "broken_ops.py").read_text().replace('hang = _op("hang", "hang")\n', "")
    # the raising factory counts its calls: a retried compile would call it again
    src = src.replace('    if mode == "raise":\n',
                      f'    if mode == "raise":\n        open({str(calls)!r}, "a").write("call\\n")\n')
    proj = _project(tmp_path / "proj", "ray_broken_ops", src)
    ops = load_operators(proj)
    local = build(proj, ops, tmp_path / "local", BuildOptions(jobs=2))
    before = calls.read_text().count("call")
    farm = build(proj, ops, tmp_path / "ray", BuildOptions(ray=RayFarm()))
    assert calls.read_text().count("call") - before == 1, "the deterministic failure was compiled more than once"
    assert farm.release_id == local.release_id
    assert sorted(farm.built) == sorted(local.built) == ["good.float32.N1-1048576.c"]
    want = {r.spec.id: r.error for r in local.failed}
    got = {r.spec.id: r.error for r in farm.failed}
    assert got == want and len(got) == 2, got
    boom = next(r for r in farm.failed if r.spec.op == "boom")
    assert boom.error == "ValueError: deliberate failure in the kernel factory"
    assert "Traceback" in boom.log and "deliberate failure in the kernel factory" in boom.log
    crash = next(r for r in farm.failed if r.spec.op == "crash")
    assert crash.error == "compiler process died with exit status -11 (signal 11)"
    log = (farm.path / "build-log.json").read_text()
    assert "deliberate failure in the kernel factory" in log and "Traceback" in log


GOOD_OPS = '''
import tilelang.language as T
from tileship.declare.spec import Operator, TensorArg


def copy_kernel(N, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, 64)) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < N:
                    B[bx * 64 + i] = A[bx * 64 + i]

    return main


def copy_reference(a):
    return a.clone()


copy = Operator(name="copy", factory=copy_kernel, reference=copy_reference, inputs=(TensorArg("A", ("N",)),),
                outputs=(TensorArg("B", ("N",)),), dtypes=("float32",), targets=("c",), shapes=({"N": 256}, {"N": 512}))
'''


def test_killed_worker_task_is_retried_through_the_cli(cluster, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tileship.cli import app

    _project(tmp_path / "proj", "ray_good_ops", GOOD_OPS)
    (tmp_path / "proj" / "tileship.toml").write_text('model = "m"\noperators = ["ray_good_ops"]\ntargets = ["c"]\n')
    marker = tmp_path / "killed-once"
    monkeypatch.setenv("TILESHIP_RAY_FAULT_ONCE", str(marker))
    res = CliRunner().invoke(app, ["build", "--ray", "--project", str(tmp_path / "proj" / "tileship.toml"),
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert marker.is_file(), "no task process was killed"
    killed = marker.read_text()
    assert killed in ("copy.float32.N256.c", "copy.float32.N512.c")
    assert f"{killed} ok on" in res.output  # retried on a fresh worker and built
    assert "2 built, 0 failed" in res.output and "[ray] per node:" in res.output


def test_missing_ray_is_a_build_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(BuildError) as info:
        require_ray()
    assert "pip install 'tileship[ray]'" in str(info.value.hint)


def test_toolchain_and_ray_are_refused_together(tmp_path):
    proj = _project(tmp_path / "proj", "ray_good_ops_tc", GOOD_OPS)

    with pytest.raises(BuildError, match="--toolchain and --ray"):
        build(proj, load_operators(proj), tmp_path / "out", BuildOptions(ray=RayFarm(), toolchain=object()))
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_unreachable_cluster_is_a_build_error_not_a_hang():
    import socket

    from tileship.build.ray_farm import _check_reachable

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BuildError, match=f"cannot reach the Ray cluster at 127.0.0.1:{port}") as info:
        _check_reachable(f"127.0.0.1:{port}", timeout_s=2)
    assert "ray start --head" in str(info.value.hint)


def test_a_node_with_another_toolchain_fails_its_specializations(tmp_path):
    from tileship.build.builder import SpecResult
    from tileship.build.ray_farm import _node_fingerprint, _to_result
    from tileship.declare.spec import expand

    proj = _project(tmp_path / "proj", "ray_good_ops_fp", GOOD_OPS)
    spec = expand(load_operators(proj)["copy"])[0]
    local = _node_fingerprint()
    value = {"ok": True, "seconds": 1.0, "error": None, "log": "", "commands": [], "timed_out": False,
             "files": {"kernel_lib.so": b"x"}, "node": "10.0.0.7/abcd1234",
             "fingerprint": {**local, "tilelang": "0.0.1"}}
    r = _to_result(SpecResult, spec, value, tmp_path / "out", local)
    assert not r.ok and r.error == f"node 10.0.0.7/abcd1234 runs tilelang 0.0.1 (driver: {local['tilelang']})"
    assert not (tmp_path / "out").exists()  # its files were not written into the release
