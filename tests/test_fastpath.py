"""The kernel call at the launch limit (issue 14): the fast launcher, ``out=``, layout safety,
wrong devices, many threads, and the circuit breaker on both call paths. Real TileLang "c"-target
kernels from the CPU catalog, plus in-process stand-ins where a behaviour needs one."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from threads import together

from tileship.declare.spec import Specialization
from tileship.errors import CallError
from tileship.runtime.dispatch import KERNEL, REFERENCE, Decision, Entry, OpRunner, OpShape
from tileship.runtime.loader import load


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)


@pytest.fixture
def release(cpu_release_build):
    return load(cpu_release_build.path)


def _kernel_entries(runner: OpRunner) -> list[Entry]:
    return [e for e in runner.entries if e.kernel is not None]


# -- the fast launcher -------------------------------------------------------------------------
def test_the_fast_launcher_serves_every_catalog_kernel_and_matches(release):
    add, norm = release.op("add"), release.op("rmsnorm_cpu")
    for n in (1, 7, 4096, 100_003):
        a, b = torch.randn(n), torch.randn(n)
        out, d = add.call(a, b)
        assert d.path == KERNEL and torch.equal(out, a + b), (n, d)
        assert torch.equal(add(a, b), a + b)
    for m, n in ((1, 1024), (33, 1024), (64, 256)):
        x, w = torch.randn(m, n), torch.randn(n)
        out, d = norm.call(x, w)
        assert d.path == KERNEL
        torch.testing.assert_close(out, rms(x, w), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(norm(x, w), rms(x, w), atol=1e-5, rtol=1e-5)
    for runner in (add, norm):
        launchers = runner.launchers()
        assert launchers and set(launchers.values()) == {"ctypes"}, launchers
        for e in runner.entries:
            assert e.fast_calls.value() == e.calls.value() > 0, (e.spec.id, e.fast_calls, e.calls)


def test_a_swapped_kernel_is_never_bypassed_and_the_adapter_fallback_says_why(release):
    add = release.op("add")
    a, b = torch.randn(4096), torch.randn(4096)
    add(a, b)  # memoized with the fast launcher
    entry = next(e for e in add.entries if e.spec.id == "add.float32.N4096.c")
    real, seen = entry.kernel, []

    def counted(*args):
        seen.append(len(args))
        return real(*args)

    entry.kernel = counted
    assert torch.equal(add(a, b), a + b) and torch.equal(add.call(a, b)[0], a + b)
    assert seen == [2, 2], "the swapped-in kernel was bypassed by the fast launcher"
    add.forget()
    add(a, b)
    assert add.launchers() == {"add.float32.N4096.c [4096 4096]": "adapter: not a TileLang kernel (function)"}
    assert entry.fast_calls.value() == 1 and entry.calls.value() == 4


# -- out= ----------------------------------------------------------------------------------------
def test_out_is_written_on_the_kernel_and_the_reference_path(release):
    add, norm = release.op("add"), release.op("rmsnorm_cpu")
    a, b, c = torch.randn(4096), torch.randn(4096), torch.full((4096,), float("nan"))
    assert add(a, b, out=c) is c and torch.equal(c, a + b)
    c.fill_(float("nan"))
    got, d = add.call(a, b, out=c)
    assert got is c and d.path == KERNEL and torch.equal(c, a + b)
    entry = next(e for e in add.entries if e.spec.id == "add.float32.N4096.c")
    assert entry.fast_calls.value() == 2, "out= did not go through the fast launcher"
    x, w = torch.randn(3, 512), torch.randn(512)  # N=512: the reference serves it
    y = torch.empty(3, 512)
    got, d = norm.call(x, w, out=y)
    assert got is y and (d.path, d.reason) == (REFERENCE, "undeclared_shape")
    torch.testing.assert_close(y, rms(x, w))
    assert norm(x, w, out=[y]) is y  # a sequence of one for the one output: the tensor back, as without out=


@pytest.mark.parametrize("out,message", [
    (lambda: torch.empty(4095), r"out is \(4095,\) torch.float32, this call needs \(4096,\) torch.float32"),
    (lambda: torch.empty(4096, dtype=torch.float64), "this call needs"),
    (lambda: torch.empty(4096, device="meta"), "out is on meta, the inputs on cpu"),
    (lambda: torch.empty(8192)[::2], "out is not contiguous"),
    (lambda: [torch.empty(4096), torch.empty(4096)], "expected a tensor, got list"),
    (lambda: "c", "expected a tensor, got str"),
], ids=["shape", "dtype", "device", "non-contiguous", "count", "not-a-tensor"])
def test_a_wrong_out_is_a_call_error_naming_out(release, out, message):
    add = release.op("add")
    a, b = torch.randn(4096), torch.randn(4096)
    for call in (lambda o: add(a, b, out=o), lambda o: add.call(a, b, out=o)):
        with pytest.raises(CallError, match=message) as info:
            call(out())
        assert info.value.argument == "out"
    assert add.snapshot() == {}, "a refused call was counted"


def test_the_torch_custom_op_has_an_out_form(release):
    from tileship.torchops.custom_ops import register

    ops = register(release)
    a, b, c = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    assert ops.out("add")(a, b, c) is None and torch.equal(c, a + b)
    x, w, y = torch.randn(5, 1024), torch.randn(1024), torch.empty(5, 1024)
    getattr(torch.ops, ops.namespace).rmsnorm_cpu_out(x, w, out=y)
    torch.testing.assert_close(y, rms(x, w), atol=1e-5, rtol=1e-5)
    with pytest.raises(CallError, match=r"add\(out\): out is \(3,\)"):
        ops.out("add")(a, b, torch.empty(3))
    compiled = torch.compile(lambda a, b, c: ops.out("add")(a, b, c), fullgraph=True)
    c2 = torch.empty(4096)
    compiled(a, b, c2)
    assert torch.equal(c2, a + b)


# -- layout and devices ------------------------------------------------------------------------
def test_a_misaligned_view_goes_to_the_reference(release):
    add = release.op("add")
    base = torch.randn(4097)
    a = base[1:]  # contiguous, 4 bytes past a 16-byte boundary
    assert a.is_contiguous() and a.data_ptr() % 16 == 4
    out, d = add.call(a, a)
    assert (d.path, d.reason, d.spec_id) == (REFERENCE, "misaligned", "add.float32.N4096.c")
    assert torch.equal(out, a + a) and torch.equal(add(a, a), a + a)
    c = torch.empty(4097)[1:]  # an out the kernel would write through a misaligned pointer
    _, d = add.call(torch.randn(4096), torch.randn(4096), out=c)
    assert d.reason == "misaligned"
    assert add.snapshot() == {"reference:misaligned": 3}
    aligned = torch.randn(4100)[4:]  # 16 bytes in: aligned, the kernel serves it
    assert add.call(aligned, aligned)[1].path == KERNEL


def test_an_input_that_requires_grad_goes_to_the_reference_so_autograd_records_it(release):
    """Grad mode on and an input requires grad: the reference serves (``requires_grad``) on both the
    compiled table's path and ``call``, and the gradient is right; under no_grad the kernel serves."""
    add = release.op("add")
    a, b = torch.randn(4096, requires_grad=True), torch.randn(4096)
    assert add.call(a.detach(), b)[1].path == KERNEL  # the key is memoized, the table has its row
    out, d = add.call(a, b)
    assert (d.path, d.reason, d.spec_id) == (REFERENCE, "requires_grad", "add.float32.N4096.c")
    y = add(a, b)
    assert y.grad_fn is not None and out.grad_fn is not None
    (2 * y).sum().backward()
    assert torch.equal(a.grad, torch.full((4096,), 2.0))
    with torch.no_grad():
        assert add.call(a, b)[1].path == KERNEL and add(a, b).grad_fn is None
    with pytest.raises(CallError, match="requires grad") as e:
        add(a, b, out=torch.empty(4096))
    assert e.value.argument == "out"
    assert add.snapshot() == {"kernel:kernel": 3, "reference:requires_grad": 2}


def test_meta_tensors_go_to_the_reference_with_the_device_reason(release):
    norm = release.op("rmsnorm_cpu")
    x, w = torch.randn(4, 1024, device="meta"), torch.randn(1024, device="meta")
    out, d = norm.call(x, w)
    assert (d.path, d.reason) == (REFERENCE, "device_not_covered") and out.device.type == "meta"


class Refuses:
    """A kernel that must never run (a cuda-only specialization handed CPU tensors)."""

    def __call__(self, *args):
        raise AssertionError("a cuda specialization was launched with CPU tensors")


def test_a_cpu_tensor_never_reaches_a_cuda_only_kernel():
    spec = Specialization("double", "float16", (("N", (1, 1 << 20)),), "cuda-sm90a")
    entry = Entry(spec, Refuses(), Decision(KERNEL, KERNEL, spec.id))
    op = OpRunner(OpShape("double", (("A", ("N",)),), 1, outputs=(("C", ("N",)),)), lambda a: a * 2, [entry],
                  device_reasons={"cpu": "device_not_covered"})
    a = torch.randn(64, dtype=torch.float16)
    for _ in range(2):
        out, d = op.call(a)
        assert (d.path, d.reason) == (REFERENCE, "device_not_covered") and torch.equal(out, a * 2)
        assert torch.equal(op(a), a * 2)
    assert op.snapshot() == {"reference:device_not_covered": 4}


# -- threads -----------------------------------------------------------------------------------
def test_many_threads_at_once_count_exactly(release):
    add, norm = release.op("add"), release.op("rmsnorm_cpu")
    errors: list[str] = []
    per_thread, n_threads = 60, 16

    def worker(tid: int) -> None:
        g = torch.Generator().manual_seed(tid)
        for i in range(per_thread):
            n = (1, 64, 4096, 5000)[i % 4]
            a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
            c = add(a, b) if i % 3 else add.call(a, b, out=torch.empty(n))[0]
            if not torch.equal(c, a + b):
                errors.append(f"add t{tid} i{i}")
            x = torch.randn(1 + i % 5, 1024, generator=g)
            w = torch.randn(1024, generator=g)
            if not torch.allclose(norm(x, w), rms(x, w), atol=1e-5, rtol=1e-5):
                errors.append(f"norm t{tid} i{i}")

    together(n_threads, worker)
    assert not errors, errors[:5]
    assert release.counters() == {"add": {"kernel:kernel": n_threads * per_thread},
                                  "rmsnorm_cpu": {"kernel:kernel": n_threads * per_thread}}
    for runner in (add, norm):
        assert sum(e.fast_calls.value() for e in runner.entries) == n_threads * per_thread


def test_threads_on_the_reference_route_count_every_call_once_while_its_reason_changes():
    """The reference route bumps one counter per call (its telemetry row); the counts by reason are
    those rows summed. A decision change racing the calls moves later calls to the new reason's row
    and never loses or double-counts one."""
    spec = Specialization("double", "float32", (("N", (1, 1 << 20)),), "c")
    entry = Entry(spec, None, Decision(REFERENCE, "slower_than_reference", spec.id))
    op = OpRunner(OpShape("double", (("A", ("N",)),), 1), lambda a: a * 2, [entry])
    per_thread, n_threads = 400, 8
    start = threading.Barrier(n_threads + 1)
    errors: list[str] = []

    def worker(tid: int) -> None:
        a = torch.full((64,), float(tid))
        start.wait()
        for i in range(per_thread):
            out = op(a) if i % 2 else op.call(a)[0]
            if not torch.equal(out, a * 2):
                errors.append(f"t{tid} i{i}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    start.wait()
    op.disable(entry, "disabled_by_policy")  # while the workers run
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    counts = op.snapshot()
    assert set(counts) <= {"reference:slower_than_reference", "reference:disabled_by_policy"}, counts
    assert sum(counts.values()) == n_threads * per_thread, counts
    assert op(torch.randn(64)) is not None and op.call(torch.randn(64))[1].reason == "disabled_by_policy"
    assert op.snapshot().get("reference:disabled_by_policy", 0) == counts.get("reference:disabled_by_policy", 0) + 2
    (row_json,) = [r for r in op.telemetry.to_json(0)["rows"] if r["reason"] == "disabled_by_policy"]
    assert row_json["calls"] == op.snapshot()["reference:disabled_by_policy"]


def test_call_samples_the_reference_route_as_op_name_does(monkeypatch):
    """``.call`` (what the torch custom ops use) serves a memoized reference key as ``op(name)(...)``
    does: every call counted, one in SAMPLE timed, not all of them."""
    import time

    import tileship.runtime.dispatch as dispatch

    spec = Specialization("double", "float32", (("N", (1, 1 << 20)),), "c")
    entry = Entry(spec, None, Decision(REFERENCE, "slower_than_reference", spec.id))
    op = OpRunner(OpShape("double", (("A", ("N",)),), 1), lambda a: a * 2, [entry])
    a = torch.randn(64)
    assert op.call(a)[1] == entry.decision  # memoized; the row's first call is timed
    stamps: list[int] = []
    real = time.perf_counter_ns
    monkeypatch.setattr(dispatch.time, "perf_counter_ns", lambda: stamps.append(1) or real())
    for _ in range(2 * dispatch.SAMPLE - 1):
        out, d = op.call(a)
        assert torch.equal(out, a * 2) and d == entry.decision
    monkeypatch.undo()
    assert len(stamps) == 2, "one call in SAMPLE is timed (two clock reads)"
    assert op.snapshot() == {"reference:slower_than_reference": 2 * dispatch.SAMPLE}
    (row,) = op.telemetry.to_json(0)["rows"]
    assert row["calls"] == 2 * dispatch.SAMPLE and row["seconds"] > 0


def test_kernel_calls_split_into_fast_and_adapter_calls(release):
    add = release.op("add")
    a, b = torch.randn(4096), torch.randn(4096)
    for _ in range(3):
        add(a, b)  # the fast launcher
    entry = next(e for e in add.entries if e.spec.id == "add.float32.N4096.c")
    real = entry.kernel
    entry.kernel = lambda *args: real(*args)  # the adapter path: not the kernel the launcher was resolved from
    add(a, b)
    add.call(a, b)
    assert (entry.kernel_calls(), entry.adapter_calls.value(), entry.fast_calls.value()) == (5, 2, 3)
    assert add.snapshot() == {"kernel:kernel": 5}


# -- the circuit breaker on both paths ------------------------------------------------------------
class Flaky:
    """Runs (x * 2) until ``fail`` is set, then raises like a failed launch."""

    def __init__(self) -> None:
        self.fail = False

    def __call__(self, a: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("CUDA error: unspecified launch failure (simulated)")
        return a * 2


@pytest.mark.parametrize("path", ["op(name)(...)", ".call(...)"])
def test_the_breaker_fires_on_an_already_seen_shape(path, caplog):
    spec = Specialization("double", "float32", (("N", (1, 1 << 20)),), "c")
    kernel = Flaky()
    entry = Entry(spec, kernel, Decision(KERNEL, KERNEL, spec.id))
    hooked: list[tuple[str, str]] = []
    op = OpRunner(OpShape("double", (("A", ("N",)),), 1), lambda a: a * 2, [entry],
                  on_fault=lambda e, reason, detail: hooked.append((e.decision.spec_id, reason)))
    call = op if path == "op(name)(...)" else (lambda a: op.call(a)[0])
    a = torch.randn(64)
    assert torch.equal(call(a), a * 2)  # the key is now memoized, served by the kernel
    kernel.fail = True
    with caplog.at_level(logging.WARNING, logger="tileship.runtime.dispatch"):
        assert torch.equal(call(a), a * 2)
    assert hooked == [(spec.id, "circuit_open")], "the hook did not fire"
    assert op.faults == {"kernel_raised": 1}
    assert any("circuit open" in r.getMessage() for r in caplog.records), "no log line"
    assert entry.kernel is None and "unspecified launch failure" in entry.detail
    assert op.snapshot() == {"kernel:kernel": 1, "reference:circuit_open": 1}


@pytest.mark.parametrize("path", ["op(name)(...)", ".call(...)"])
def test_a_fast_launch_that_fails_opens_the_circuit(release, path):
    add = release.op("add")
    hooked: list[str] = []
    add.on_fault = lambda e, reason, detail: hooked.append(detail)
    a, b = torch.randn(4096), torch.randn(4096)
    add(a, b)
    route = next(iter(add._memo.values()))
    assert route.launcher == "ctypes"

    def boom(args, out):
        raise RuntimeError("kernel call failed (-1): simulated")

    route.launch = boom
    call = add if path == "op(name)(...)" else (lambda *x: add.call(*x)[0])
    assert torch.equal(call(a, b), a + b)
    assert len(hooked) == 1 and "simulated" in hooked[0] and add.faults == {"kernel_raised": 1}
    assert add.call(a, b)[1] == Decision(REFERENCE, "circuit_open", "add.float32.N4096.c")


# -- the tvm-ffi launcher (CUDA's backend; TileLang 0.1.15 cannot build tvm-ffi for "c": a stand-in) ----
class _Param:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def torch_dtype(self) -> torch.dtype:
        return torch.float32


class _Exe:
    entry_name = "main"

    def __init__(self, fn) -> None:
        self.fn = fn

    def get_function(self, name: str):
        return self.fn if name == "main" else None


def _ffi_kernel(callee: bool, result_idx: list[int]):
    adapter = type("TVMFFIKernelAdapter", (), {})()
    adapter.params, adapter.result_idx = [_Param((8,))] * 3, result_idx
    adapter._ffi_callee_allocated_output_abi = callee
    calls: list[tuple] = []

    def main(*args):
        calls.append(args)
        if callee:  # main(A, B, anchor) -> C, allocated by the callee
            return args[0] + args[1]
        ins = [t for i, t in enumerate(args) if i not in result_idx]
        args[result_idx[0]].copy_(ins[0] + ins[1])

    adapter._get_executable = lambda: _Exe(main)
    return type("K", (), {"adapter": adapter})(), calls


@pytest.mark.parametrize("callee,result_idx", [(False, [2]), (False, [0]), (True, [2])],
                         ids=["caller-alloc", "output-first", "callee-alloc"])
def test_the_tvm_ffi_launcher_passes_tensors_straight_through(callee, result_idx):
    from tileship.runtime.launch import resolve

    kernel, calls = _ffi_kernel(callee, result_idx)
    a, b = torch.randn(8), torch.randn(8)
    launcher = resolve(kernel, (((8,), torch.float32),), (a, b), a.device)
    assert launcher.fn is not None and launcher.kind == ("tvm_ffi_callee_alloc" if callee else "tvm_ffi")
    assert torch.equal(launcher.fn((a, b), None), a + b)
    c = torch.empty(8)
    assert launcher.fn((a, b), [c]) is c and torch.equal(c, a + b)
    want = {(False, 2): (a, b, c), (False, 0): (c, a, b), (True, 2): (a, b, a)}[(callee, result_idx[0])]
    assert all(x is y for x, y in zip(calls[-1], want, strict=True)), "not passed straight through in place"
    assert launcher.writes_out is (not callee)
    assert resolve(kernel, (((9,), torch.float32),), (a, b), a.device).why.startswith("output 0 (parameter ")


@pytest.mark.parametrize("value, fast", [(None, True), ("cuda", True), ("off", False), ("adapter", False),
                                         ("cpu", False)])
def test_cuda_kernels_take_the_fast_launcher_unless_opted_out(monkeypatch, value, fast):
    """The tvm-ffi launcher served every catalog CUDA kernel correctly on the H200 (benchmarks/gpu_launch.sh):
    it is the default; TILESHIP_FAST_LAUNCH=off keeps CUDA on TileLang's adapter."""
    from tileship.runtime.launch import resolve

    kernel, _ = _ffi_kernel(False, [2])
    a, b = torch.randn(8), torch.randn(8)
    cuda = torch.device("cuda", 0)
    if value is None:
        monkeypatch.delenv("TILESHIP_FAST_LAUNCH", raising=False)
    else:
        monkeypatch.setenv("TILESHIP_FAST_LAUNCH", value)
    got = resolve(kernel, (((8,), torch.float32),), (a, b), cuda)
    if fast:
        assert got.kind == "tvm_ffi"
    else:
        assert got.fn is None and "TILESHIP_FAST_LAUNCH" in got.why
