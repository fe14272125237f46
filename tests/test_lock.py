"""Lock determinism and drift classification."""

from __future__ import annotations

import copy

import pytest
from typer.testing import CliRunner

from tileship.build.lock import capture_environment, compare, dump_lock, make_lock, read_lock, write_lock
from tileship.cli import app
from tileship.errors import LockError

OPS = {"add": {"dtypes": ["float32"], "targets": ["c"], "shapes": [{"N": 4}], "ranges": [], "config": {},
               "tolerances": {"float32": {"atol": 1e-4, "rtol": 1e-4}}, "reference": "m.ref"}}


def _lock(env=None, **kw):
    return make_lock(env=env or capture_environment(), revision="abc1234", sources={"add": "sha256:00"}, operators=OPS,
                     targets=["c"], model={"name": "m", "version": "1"}, **kw)


def test_lock_has_review_fields_with_real_values():
    lk = _lock()
    for key in ("kernel_revision", "framework", "backend", "device_arch", "shapes", "fallback"):
        assert key in lk, key
    libs = lk["backend"]["tilelang_native_libs"]
    assert set(libs) == {"libtilelang.so", "libtvm_runtime.so", "libtvm_compiler.so"}
    assert all(v and v.startswith("sha256:") and len(v) == 71 for v in libs.values()), libs
    assert lk["backend"]["tilelang"] == "0.1.15"
    assert lk["framework"]["torch"].startswith("2.")
    assert lk["fallback"]["add"] == "tested-reference: m.ref"


def test_lock_is_byte_identical_for_the_same_environment(tmp_path):
    a, b = tmp_path / "a.lock", tmp_path / "b.lock"
    write_lock(_lock(), a)
    capture_environment(refresh=True)
    write_lock(_lock(), b)
    assert a.read_bytes() == b.read_bytes()
    text = a.read_text()
    keys = [line.split(":")[0] for line in text.splitlines() if line and not line.startswith(" ")]
    assert keys == sorted(keys), "top-level keys must be sorted"
    assert read_lock(a)["kernel_revision"] == "abc1234"


def test_image_digest_is_validated():
    assert _lock(image_digest="sha256:" + "a" * 64)["image_digest"] == "sha256:" + "a" * 64
    with pytest.raises(LockError, match="image digest"):
        _lock(image_digest="latest")


@pytest.mark.parametrize("path,value,blocking,field", [
    (("backend", "tilelang"), "0.1.99", True, "backend.tilelang"),
    (("backend", "tilelang_native_libs", "libtilelang.so"), "sha256:" + "0" * 64, True,
     "backend.tilelang_native_libs.libtilelang.so"),
    (("backend", "apache_tvm_ffi"), "9.9.9", True, "backend.apache_tvm_ffi"),
    (("backend", "nvcc"), "12.4.131", False, "backend.nvcc"),
    (("framework", "python"), "3.12.3", False, "framework.python"),
    (("framework", "torch"), "2.11.0+cu130", False, "framework.torch"),
    (("backend", "z3_solver"), "4.0", False, "backend.z3_solver"),
], ids=lambda v: str(v) if isinstance(v, bool) else None)
def test_drift_classification(path, value, blocking, field):
    env = capture_environment()
    lk = _lock(env)
    changed = copy.deepcopy(env)
    node = changed
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    report = compare(lk, changed)
    assert [d.field for d in report.differences] == [field]
    assert report.blocking is blocking
    if field.endswith("libtilelang.so"):
        assert (
            "libtilelang.so hash differs: compiled artifacts are not trusted; serving will use the reference"
            in report.differences[0].consequence
        )


def test_gpu_arch_drift_blocks_and_name_is_informational():
    env = capture_environment()
    gpu = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "driver": "580.159.04",
           "memory_mib": 143771}
    lk = _lock({**env, "gpu": gpu})
    assert not compare(lk, {**env, "gpu": dict(gpu)}).differences
    other = compare(lk, {**env, "gpu": {**gpu, "compute_capability": "8.0", "name": "NVIDIA A100"}})
    assert {d.field: d.blocking for d in other.differences} == {"gpu.compute_capability": True, "gpu.name": False}
    driver = compare(lk, {**env, "gpu": {**gpu, "driver": "590.1"}})
    assert not driver.blocking and driver.differences[0].field == "gpu.driver"


def test_check_cli_exit_codes(tmp_path):
    env = capture_environment()
    good = tmp_path / "good.lock"
    write_lock(_lock(env), good)
    runner = CliRunner()
    res = runner.invoke(app, ["check", str(good)])
    assert res.exit_code == 0, res.output
    assert "no drift" in res.output
    info = copy.deepcopy(env)
    info["framework"]["python"] = "3.12.3"
    p = tmp_path / "info.lock"
    write_lock(_lock(info), p)
    res = runner.invoke(app, ["check", str(p)])
    assert res.exit_code == 0 and "framework.python" in res.output and "informational" in res.output
    bad = copy.deepcopy(env)
    bad["backend"]["tilelang_native_libs"]["libtvm_runtime.so"] = "sha256:" + "1" * 64
    p = tmp_path / "bad.lock"
    write_lock(_lock(bad), p)
    res = runner.invoke(app, ["check", str(p)])
    assert res.exit_code == 1, res.output
    assert "libtvm_runtime.so hash differs" in res.output


def test_malformed_lock_is_refused(tmp_path):
    p = tmp_path / "x.lock"
    p.write_text("schema: 7\n")
    with pytest.raises(LockError, match="not a tileship lock"):
        read_lock(p)
    assert dump_lock({"b": 1, "a": 2}).startswith("a: 2")
