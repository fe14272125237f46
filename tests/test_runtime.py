"""Load -> dispatch: real TileLang "c"-target kernels, tamper, drift, no-JIT, undeclared shapes, threads."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from tileship.declare.inputs import make_inputs, sample_points
from tileship.errors import BundleIntegrityError, CallError, LockMismatch
from tileship.release import bundle
from tileship.runtime.loader import load


def _close(out, ref, what):
    err = (out.double() - ref.double()).abs()
    bad = int((err > 1e-5 + 1e-5 * ref.double().abs()).sum())
    assert bad == 0, f"{what}: {bad}/{out.numel()} elements off, max |err| {err.max().item():.3e}"


def test_every_declared_shape_runs_the_kernel_and_matches(cpu_release_build):
    rel = load(cpu_release_build.path)
    calls = 0
    for _name, runner in rel.ops.items():
        for entry in runner.entries:
            for dims in sample_points(entry.spec, limit=1 << 16):
                args = make_inputs(runner.shape.inputs, dims, entry.spec.dtype, "cpu", seed=calls)
                out, d = runner.call(*args)
                assert d.path == "kernel", (entry.spec.id, dims, d)
                _close(out, runner.reference(*[a.double() for a in args]), f"{entry.spec.id} {dims}")
                calls += 1
    assert calls >= 8
    assert sum(v for c in rel.counters().values() for k, v in c.items() if k == "kernel:kernel") == calls


def test_undeclared_shape_dtype_and_layout_go_to_reference_and_count(cpu_release_build):
    rel = load(cpu_release_build.path)
    op = rel.op("rmsnorm_cpu")
    x, w = torch.randn(3, 512), torch.randn(512)  # N=512 is not declared
    for _ in range(3):
        out, d = op.call(x, w)
        assert (d.path, d.reason) == ("reference", "undeclared_shape")
        _close(out, torch.nn.functional.rms_norm(x, (512,), w, 1e-6), "reference")
    out, d = op.call(torch.randn(4, 1024, dtype=torch.float64), torch.randn(1024, dtype=torch.float64))
    assert d.reason == "undeclared_dtype"
    xt = torch.randn(1024, 4).t()  # (4, 1024) but not contiguous
    out, d = op.call(xt, torch.randn(1024))
    assert d.reason == "non_contiguous"
    assert op(torch.randn(4, 1024), torch.randn(1024)).shape == (4, 1024)
    snap = op.snapshot()
    assert snap["reference:undeclared_shape"] == 3 and snap["reference:undeclared_dtype"] == 1
    assert snap["reference:non_contiguous"] == 1 and snap["kernel:kernel"] == 1


@pytest.mark.parametrize("args,argument,message", [
    (lambda: (torch.randn(4),), None, "expected 2 tensors"),
    (lambda: (torch.randn(4, 1024), torch.randn(2, 1024)), "W", "rank 2"),
    (lambda: (torch.randn(4, 1024), torch.randn(1000)), "W", "N=1000 disagrees with N=1024"),
    (lambda: (torch.randn(4, 1024), [1.0] * 1024), "W", "expected a torch.Tensor"),
    (lambda: (torch.randn(4, 1024), torch.randn(1024, device="meta")), "W", "is on meta"),
], ids=["arity", "rank", "dim-mismatch", "not-a-tensor", "mixed-devices"])
def test_unservable_arguments_raise_naming_the_argument(cpu_release_build, args, argument, message):
    op = load(cpu_release_build.path).op("rmsnorm_cpu")
    with pytest.raises(CallError) as info:
        op.call(*args())
    assert info.value.operator == "rmsnorm_cpu" and info.value.argument == argument
    assert message in str(info.value)


def test_unknown_operator_names_the_known_ones(cpu_release_build):
    with pytest.raises(CallError, match="this release has: add, rmsnorm_cpu"):
        load(cpu_release_build.path).op("gemm")


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("tamper,named", [
    (lambda r: _flip_byte(next(r.glob("specs/add.*/kernel_lib.so"))), "kernel_lib.so"),
    (lambda r: next(r.glob("specs/add.*/params.json")).unlink(), "params.json"),
    (lambda r: (r / "specs" / "extra.so").write_bytes(b"\x7fELF"), "extra.so"),
    (lambda r: (r / "tileship.lock").write_text((r / "tileship.lock").read_text().replace("0.1.15", "0.1.16")),
     "tileship.lock"),
    (lambda r: (r / "manifest.json").write_text(json.dumps({**json.loads((r / "manifest.json").read_text()),
                                                            "release_id": "0" * 16})),
     "manifest.json"),
], ids=["flipped-byte", "missing-file", "extra-file", "edited-lock", "edited-manifest"])
def test_tampered_release_is_refused_naming_the_file(cpu_release, tamper, named):
    tamper(cpu_release)
    with pytest.raises(BundleIntegrityError) as info:
        load(cpu_release)
    assert named in str(info.value) and named in info.value.path


def test_blocking_drift_serves_reference_and_strict_refuses(cpu_release_build, monkeypatch):
    import tileship.runtime.loader as loader_mod
    from tileship.build.lock import capture_environment

    env = copy.deepcopy(capture_environment())
    env["backend"]["tilelang_native_libs"]["libtilelang.so"] = "sha256:" + "f" * 64
    monkeypatch.setattr(loader_mod, "capture_environment", lambda: env)
    rel = load(cpu_release_build.path)
    assert rel.drift.blocking and "libtilelang.so" in rel.drift.reason
    assert all(e.kernel is None and e.decision.reason == "drift" for r in rel.ops.values() for e in r.entries)
    assert rel.status()["reference_only"] and any("blocking drift" in n for n in rel.notes)
    a, b = torch.randn(4096), torch.randn(4096)
    out, d = rel.op("add").call(a, b)
    assert (d.path, d.reason) == ("reference", "drift") and torch.equal(out, a + b)
    with pytest.raises(LockMismatch, match="libtilelang.so"):
        load(cpu_release_build.path, drift_policy="strict")


def test_informational_drift_keeps_kernels(cpu_release_build, monkeypatch):
    import tileship.runtime.loader as loader_mod
    from tileship.build.lock import capture_environment

    env = copy.deepcopy(capture_environment())
    env["framework"]["python"] = "3.12.3"
    env["backend"]["nvcc"] = "12.0.0"
    monkeypatch.setattr(loader_mod, "capture_environment", lambda: env)
    rel = load(cpu_release_build.path)
    assert not rel.drift.blocking and len(rel.drift.differences) == 2
    assert all(e.kernel is not None for r in rel.ops.values() for e in r.entries)


def test_reference_only_release(cpu_release_build):
    rel = load(cpu_release_build.path, reference_only=True)
    out, d = rel.op("add").call(torch.randn(4096), torch.randn(4096))
    assert (d.path, d.reason) == ("reference", "disabled_by_policy")


NO_JIT = textwrap.dedent("""
    import json, os, shutil, sys
    import torch, tilelang
    # nvcc is hidden; g++/c++/cc are shims that record any use and fail (TileLang's CPU launcher
    # asserts a C++ compiler is on PATH when it loads, but must never run it)
    assert shutil.which("nvcc") is None, os.environ["PATH"]
    from tileship.runtime import nojit
    from tileship.runtime.loader import load
    from tileship.declare.inputs import make_inputs, sample_points
    rel = load(sys.argv[1])
    paths = []
    for name, runner in rel.ops.items():
        for entry in runner.entries:
            for dims in sample_points(entry.spec, limit=1 << 16):
                args = make_inputs(runner.shape.inputs, dims, entry.spec.dtype, "cpu", 0)
                out, d = runner.call(*args)
                ref = runner.reference(*args)
                paths.append([entry.spec.id, d.path, bool(torch.allclose(out, ref, atol=1e-5, rtol=1e-5))])
    attempts_while_serving = nojit.attempts()
    import tilelang.language as T
    from tileship.catalog.cpu import vector_add
    try:
        tilelang.compile(vector_add(T.dynamic("n")), target="c")
        refused = False
    except Exception as exc:
        refused = type(exc).__name__
    print(json.dumps({"paths": paths, "attempts_while_serving": attempts_while_serving, "refused": refused,
                      "attempts_after": nojit.attempts(), "load_errors": rel.load_errors,
                      "cache_files": sorted(os.listdir(os.environ["TILELANG_CACHE_DIR"]))}))
""")


def test_no_jit_serves_every_declared_shape_without_compilers(cpu_release, tmp_path):
    before = bundle.read_manifest(cpu_release)
    cache = tmp_path / "tlcache"
    cache.mkdir()
    shims = tmp_path / "bin"
    shims.mkdir()
    marker = tmp_path / "compiler-was-run"
    for name in ("g++", "c++", "cc", "gcc", "clang++"):
        shim = shims / name
        # a version probe (the lock records the host compiler) is fine; anything else is a compile
        shim.write_text(
            f'#!/bin/sh\n[ "$1" = --version ] && {{ echo shim 0.0; exit 0; }}\necho "$0 $*" >> {marker}\nexit 1\n'
        )
        shim.chmod(0o755)
    env = {"PATH": str(shims), "TILELANG_CACHE_DIR": str(cache), "HOME": str(tmp_path),
           "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-c", NO_JIT, str(cpu_release)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not res["load_errors"], res["load_errors"]
    assert res["paths"] and all(p[1] == "kernel" and p[2] for p in res["paths"]), res["paths"]
    assert not marker.exists(), marker.read_text()
    assert res["attempts_while_serving"] == 0
    assert res["refused"] == "CompileForbidden" and res["attempts_after"] == 1
    assert bundle.check_integrity(cpu_release) == before  # nothing written into the release


def test_eight_threads_get_correct_answers(cpu_release_build):
    rel = load(cpu_release_build.path)
    add, norm = rel.op("add"), rel.op("rmsnorm_cpu")
    errors: list[str] = []
    per_thread = 40

    def worker(tid: int) -> None:
        g = torch.Generator().manual_seed(tid)
        for i in range(per_thread):
            n = int(torch.randint(1, 5000, (1,), generator=g))
            a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
            if not torch.equal(add(a, b), a + b):
                errors.append(f"add t{tid} i{i} n{n}")
            m = int(torch.randint(1, 64, (1,), generator=g))
            x, w = torch.randn(m, 1024, generator=g), torch.randn(1024, generator=g)
            if not torch.allclose(norm(x, w), torch.nn.functional.rms_norm(x, (1024,), w, 1e-6), atol=1e-5, rtol=1e-5):
                errors.append(f"norm t{tid} i{i} m{m}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    total = sum(sum(c.values()) for c in rel.counters().values())
    assert total == 8 * per_thread * 2


def test_load_does_not_use_tilelang_cache_dir(cpu_release_build, tmp_path, monkeypatch):
    before = (
        set(os.listdir(os.environ["TILELANG_CACHE_DIR"])) if os.path.isdir(os.environ["TILELANG_CACHE_DIR"]) else set()
    )
    rel = load(cpu_release_build.path)
    rel.op("add")(torch.randn(10), torch.randn(10))
    after = (
        set(os.listdir(os.environ["TILELANG_CACHE_DIR"])) if os.path.isdir(os.environ["TILELANG_CACHE_DIR"]) else set()
    )
    kernels = [p for p in Path(os.environ["TILELANG_CACHE_DIR"]).rglob("kernel_lib.so")]
    assert after == before or not kernels, kernels


def test_counter_counts_adds_across_threads_and_reads_do_not_count() -> None:
    import threading

    from tileship.runtime.counter import Counter

    c = Counter()
    assert c.value() == 0 and c.value() == 0

    def bump() -> None:
        for _ in range(10_000):
            c.add()
            if _ % 1000 == 0:
                c.value()

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.value() == 40_000 and repr(c) == "Counter(40000)"
