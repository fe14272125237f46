"""Faults: the circuit breaker (a kernel that raises or returns NaN/Inf is switched to the
reference, the wrong answer is never returned, hooks and diagnostics fire) and the
fault-injection kernel's deliberate out-of-bounds write."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tileship.declare.spec import Specialization
from tileship.release import diagnostics
from tileship.runtime.dispatch import KERNEL, REFERENCE, Decision, Entry, OpRunner, OpShape, fault_args

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"  # fault_kernel.py, the fault-injection operator module (not in the wheel)
SPEC = Specialization("double", "float32", (("N", (1, 1 << 20)),), "c")


class FakeKernel:
    """Stands in for a compiled kernel: ``mode`` ok | raise | nan | inf | -inf; counts calls."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0

    def __call__(self, a: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.mode == "raise":
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
        out = a * 2
        if self.mode != "ok":
            out[3] = float(self.mode)
        return out


def runner(kernel: FakeKernel, **kw: object) -> tuple[OpRunner, Entry]:
    entry = Entry(SPEC, kernel, Decision(KERNEL, KERNEL, SPEC.id))
    return OpRunner(OpShape("double", (("A", ("N",)),), 1), lambda a: a * 2, [entry], **kw), entry  # type: ignore[arg-type]


class Hook:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, object, object]] = []

    def __call__(self, entry: Entry, reason: str, detail: str) -> None:
        self.seen.append((entry.decision.spec_id or "", reason, detail, fault_args(), sys.exc_info()[0]))


def test_kernel_that_raises_opens_the_circuit_and_reports_the_call() -> None:
    hook = Hook()
    kernel = FakeKernel("raise")
    op, entry = runner(kernel, on_fault=hook)
    a = torch.arange(8, dtype=torch.float32)
    out, d = op.call(a)
    assert torch.equal(out, a * 2)
    assert d == Decision(REFERENCE, "circuit_open", SPEC.id)
    out2, d2 = op.call(a)
    assert kernel.calls == 1, "the disabled kernel ran again"
    assert d2.reason == "circuit_open" and torch.equal(out2, a * 2)
    assert entry.kernel is None and "illegal memory access" in entry.detail
    assert op.faults == {"kernel_raised": 1}
    assert op.snapshot() == {"reference:circuit_open": 2}
    [(sid, reason, detail, args, exc_type)] = hook.seen
    assert (sid, reason, exc_type) == (SPEC.id, "circuit_open", RuntimeError)
    assert "RuntimeError" in detail and args is not None and args[0] is a
    assert fault_args() is None  # only inside the hook


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_non_finite_output_is_replaced_by_the_reference_when_checked(bad: str) -> None:
    hook = Hook()
    kernel = FakeKernel(bad)
    op, entry = runner(kernel, check_finite=True, on_fault=hook)
    a = torch.arange(8, dtype=torch.float32)
    out, d = op.call(a)
    assert bool(torch.isfinite(out).all()) and torch.equal(out, a * 2), "the non-finite kernel answer was returned"
    assert d == Decision(REFERENCE, "circuit_open", SPEC.id)
    assert entry.decision.reason == "circuit_open" and "NaN/Inf" in entry.detail
    out2, d2 = op.call(a)
    assert kernel.calls == 1 and d2.path == REFERENCE and torch.equal(out2, a * 2)
    assert op.faults == {"non_finite": 1}
    assert op.snapshot() == {"kernel:kernel": 1, "reference:circuit_open": 2}
    assert [(s, r) for s, r, *_ in hook.seen] == [(SPEC.id, "circuit_open")]
    assert hook.seen[0][3][0] is a  # type: ignore[index]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_finiteness_check_sees_every_non_finite_element_and_not_an_overflowing_sum(dtype: torch.dtype) -> None:
    """``all_finite`` sums first: a finite sum proves every element finite; a sum that overflows
    (all elements finite) or cancels (Inf and -Inf) must still get the right answer."""
    from tileship.runtime.route import all_finite

    ones = torch.ones(4096, dtype=dtype)
    assert all_finite(ones) and all_finite(None) and all_finite(torch.empty(0, dtype=dtype))
    assert all_finite(torch.full((4096,), torch.finfo(dtype).max, dtype=dtype))  # the sum overflows
    assert all_finite(torch.arange(8, dtype=torch.int32))  # not floating: not checked
    for bad in ([float("nan")], [float("inf")], [-float("inf")], [float("inf"), -float("inf")]):
        t = ones.clone()
        t[5:5 + len(bad)] = torch.tensor(bad, dtype=dtype)
        assert not all_finite(t) and not all_finite((ones, t)) and not all_finite([t, ones])


def test_check_off_is_the_default_and_leaves_the_call_path_alone() -> None:
    kernel = FakeKernel("nan")
    op, entry = runner(kernel)
    assert op.check_finite is False
    out, d = op.call(torch.ones(8))
    assert d.path == KERNEL and math.isnan(float(out[3]))  # unchecked by request: the kernel's output as is
    op.check_finite = True
    assert op.check_finite is True
    out, d = op.call(torch.ones(8))
    assert d.reason == "circuit_open" and bool(torch.isfinite(out).all())
    op.check_finite = False
    out, d = op.call(torch.ones(8))
    assert d.reason == "circuit_open"  # the circuit stays open once tripped


def test_non_finite_on_both_paths_keeps_the_kernel() -> None:
    kernel = FakeKernel("ok")
    op, entry = runner(kernel, check_finite=True)
    a = torch.tensor([1.0, float("inf"), 3.0, 4.0])
    out, d = op.call(a)
    assert d.path == KERNEL and math.isinf(float(out[1]))
    assert entry.kernel is kernel and op.faults == {}


def test_a_hook_that_raises_does_not_break_the_call() -> None:
    def bad_hook(entry: Entry, reason: str, detail: str) -> None:
        raise ValueError("hook bug")

    op, _ = runner(FakeKernel("raise"), on_fault=bad_hook)
    out, d = op.call(torch.ones(4))
    assert d.reason == "circuit_open" and torch.equal(out, torch.full((4,), 2.0))


def test_watch_on_a_real_release_writes_diagnostics_for_a_nan_kernel(cpu_release: Path, tmp_path: Path) -> None:
    from tileship.declare.inputs import make_inputs, sample_points
    from tileship.runtime.loader import load

    release = load(cpu_release)
    op, entry = next((r, e) for r in release.ops.values() for e in r.entries if e.kernel is not None)
    real = entry.kernel
    sid = entry.decision.spec_id
    assert real is not None and sid is not None and entry.spec is not None

    def broken(*args: torch.Tensor) -> torch.Tensor:
        out = real(*args)
        out.view(-1)[0] = float("nan")
        return out

    entry.kernel = broken
    seen: list[str] = []
    recorder = diagnostics.watch(release, out_dir=tmp_path / "diag", also=lambda e, r, d, ref: seen.append(ref.id))
    dims = sample_points(entry.spec)[0]
    args = make_inputs(op.shape.inputs, dims, entry.spec.dtype, "cpu", seed=1)
    out, d = op.call(*args)
    assert d == Decision(REFERENCE, "circuit_open", sid)
    assert torch.equal(out, op.reference(*args)) and bool(torch.isfinite(out).all())
    recorder.wait(60)
    ref = recorder.refs[sid]
    assert seen == [ref.id] and ref.archive.is_file()
    summary = json.loads((ref.path / "summary.json").read_text())
    assert summary["reason"] == "circuit_open" and summary["spec_ids"] == [sid]
    assert [(c["name"], c["shape"], c["dtype"]) for c in summary["call"]] == \
        [(n, list(a.shape), "torch.float32") for (n, _), a in zip(op.shape.inputs, args, strict=True)]
    assert (ref.path / "specs" / sid / "device_kernel.cu").read_bytes() == (
        cpu_release / "specs" / sid / "device_kernel.cu"
    ).read_bytes()
    runtime = json.loads((ref.path / "runtime.json").read_text())
    assert runtime["faults"][op.name] == {"non_finite": 1}


# -- the fault-injection kernel --------------------------------------------------------------

@pytest.fixture(scope="module")
def fault_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import Project, load_operators

    proj = Project(model="faults", model_version="1", operator_modules=("fault_kernel",), targets=("c",), root=BENCH)
    result = build(proj, load_operators(proj), tmp_path_factory.mktemp("faults"), BuildOptions(jobs=1))
    assert result.ok, result.failed
    return result.path


FAULT_CHILD = textwrap.dedent("""
    import sys, torch
    from tileship.runtime.loader import load
    from fault_kernel import POISON
    op = load(sys.argv[1]).op("fault_copy")
    x = torch.randn(1000)
    y, d = op.call(x)
    print("normal", d.path, bool(torch.equal(x, y)), flush=True)
    x[0] = POISON
    y, d = op.call(x)
    print("poisoned call returned", flush=True)
""")


def test_fault_kernel_copies_normally_and_writes_out_of_bounds_when_poisoned(fault_release: Path) -> None:
    src = json.loads((next((fault_release / "specs").iterdir()) / "artifact.json").read_text())
    assert src["pass_configs"] == {"tl.disable_safe_memory_legalize": True}
    proc = subprocess.run([sys.executable, "-c", FAULT_CHILD, str(fault_release)], capture_output=True, text=True,
                          timeout=300, env={**os.environ,
                                            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(BENCH)])})
    assert "normal kernel True" in proc.stdout, proc.stdout + proc.stderr
    assert "poisoned call returned" not in proc.stdout
    assert proc.returncode == -11, (
        f"expected death by SIGSEGV (an out-of-bounds write), got {proc.returncode}: {proc.stderr[-2000:]}"
    )


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_fault_recovery_script(tmp_path: Path) -> None:
    """On the GPU host: the illegal address poisons the worker, readiness goes false, a fresh worker is ready."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_fault_recovery.py"), "--out", str(tmp_path),
                           "--restarts", "2"],
                          capture_output=True, text=True, timeout=1200)
    report = json.loads((tmp_path / "fault_recovery.json").read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["fault"]["readiness_after_fault"] is False and report["passed"] is True


class Span:
    """A canary span that logs its ``start``/``stop`` beside the kernel's calls and the finiteness checks."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def start(self) -> None:
        self.log.append("start")

    def stop(self) -> None:
        self.log.append("stop")


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("mode", ["ok", "raise", "nan"])
def test_a_span_brackets_the_launch_and_never_the_finiteness_check(monkeypatch, checked: bool, mode: str) -> None:
    """The server's canary timer (``DeviceSpan``) is started before the call's routing and launch and stopped
    right after them: the non-finite check (which synchronizes with the device) and a raising kernel's
    reference rerun for NaN stay outside; a kernel that raises still stops it."""
    import tileship.runtime.route as rt

    log: list[str] = []
    kernel = FakeKernel(mode)
    real_kernel_call = kernel.__call__

    def logged(a: torch.Tensor) -> torch.Tensor:
        log.append("kernel")
        return real_kernel_call(a)

    op, _ = runner(logged, check_finite=checked)  # type: ignore[arg-type]
    real_finite = rt.all_finite
    monkeypatch.setattr(rt, "all_finite", lambda t: log.append("finite") or real_finite(t))
    a = torch.arange(8, dtype=torch.float32)
    out, d = op.call(a, span=Span(log))
    assert torch.equal(out, a * 2) if (checked or mode != "nan") else not bool(torch.isfinite(out).all())
    assert log[0] == "start" and log.count("stop") == 1 and "kernel" in log[:log.index("stop")]
    assert ("finite" in log) == (checked and mode != "raise")  # the reference's answer after a raise: unchecked
    if "finite" in log:
        assert log.index("finite") > log.index("stop"), log
    plain, _ = op.call(a)  # without a span: the same answer, nothing logged around it
    assert log.count("start") == 1 and torch.allclose(plain, out, equal_nan=True)
