"""The dispatcher's compiled table (issue 14: the hot path in compiled code), on the CPU.

The library is compiled here with the C compiler against this environment's tvm-ffi, as
``tileship build`` does, and loaded through tvm-ffi. Its self-test kernel has TileLang's
callee-allocated output ABI (inputs, then an allocator anchor; the output allocated through the
caller's allocator), so the table and the dispatcher run the same protocol as with a CUDA kernel.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from threads import together

from tileship.declare.spec import Specialization
from tileship.runtime import native
from tileship.runtime.dispatch import KERNEL, Decision, Entry, OpRunner, OpShape

tvm_ffi = pytest.importorskip("tvm_ffi")


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("native") / native.LIBRARY
    built = native.compile_library(out)
    assert built.ok, built.error
    return native.load_module(out)


def test_the_library_builds_the_same_bytes_twice_and_states_its_abi(tmp_path: Path, module: Any) -> None:
    a, b = native.compile_library(tmp_path / "a" / "fastcall.so"), native.compile_library(tmp_path / "b.so")
    assert a.ok and b.ok and a.to_json()["source"].startswith("sha256:") and a.compiler
    assert (tmp_path / "a" / "fastcall.so").read_bytes() == (tmp_path / "b.so").read_bytes()
    assert module.get_function("fastcall_abi")() == native.ABI
    assert not list(tmp_path.rglob("*.tmp")), "a temporary file was left"


def test_a_failed_compile_is_a_value_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    built = native.compile_library(tmp_path / "x.so")
    assert not built.ok and "no-such-compiler" in built.error and not list(tmp_path.iterdir())


def test_the_table_launches_rows_and_answers_everything_else_with_a_code(module: Any) -> None:
    kernel = module.get_function("fastcall_selftest_add")
    table = native.NativeTable(module, 2, 3)
    a, b = torch.randn(1000), torch.randn(1000)
    assert table.call(a, b) == native.MISS and table.size() == 0
    table.put_kernel(1, kernel, True, (a, b))
    out = table.call(a, b)
    assert isinstance(out, torch.Tensor) and torch.equal(out, a + b) and out.data_ptr() not in (a.data_ptr(),)
    assert table.count(1) == 1 and table.count(0) == 0
    assert table.call(a[:999], b[:999]) == native.MISS  # another shape: another key
    assert table.call(a.double(), b.double()) == native.MISS  # another dtype
    assert table.call(torch.randn(2000)[::2], b) == native.NON_CONTIGUOUS
    assert table.call(torch.randn(1001)[1:], b) == native.MISALIGNED  # contiguous, 4 bytes past 16
    assert table.call(a, 3) == native.MISS and table.call(a) == native.MISS  # not a tensor; another arity
    table.put_reference(7, (a[:5], b[:5]))
    assert table.call(a[:5], b[:5]) == 7 and table.size() == 2
    assert table.count(1) == 1, "a code or a reference row counted a kernel call"
    table.clear()
    assert table.size() == 0 and table.call(a, b) == native.MISS and table.count(1) == 1


def test_bad_control_calls_are_errors_that_name_the_problem(module: Any) -> None:
    table = native.NativeTable(module, 2, 3)
    a = torch.randn(4)
    with pytest.raises(Exception, match="slot out of range"):
        table.put_kernel(3, module.get_function("fastcall_selftest_add"), True, (a, a))
    with pytest.raises(Exception, match="PUT takes"):
        table.call(1, 0, "not a function", 1, a, a)
    with pytest.raises(Exception, match="COUNT takes"):
        table.count(-1)
    with pytest.raises(Exception, match="n_args must be"):
        module.get_function("fastcall_table")(0, 1)


def test_a_kernel_error_reaches_python_as_an_exception(module: Any) -> None:
    table = native.NativeTable(module, 2, 1)
    a = torch.randn(8)
    table.put_kernel(0, module.get_function("fastcall_selftest_add"), False, (a, a))  # no anchor: 2 arguments
    with pytest.raises(Exception, match="selftest_add takes"):
        table.call(a, a)
    assert table.count(0) == 0


# -- the dispatcher with a table -----------------------------------------------------------------
class FfiKernel:
    """A stand-in for a kernel TileLang's tvm_ffi backend built: the adapter interface ``runtime.launch``
    reads, over the library's self-test kernel. ``calls`` counts the Python-side launches."""

    def __init__(self, module: Any, fn: Any = None) -> None:
        fn = fn if fn is not None else module.get_function("fastcall_selftest_add")
        param = SimpleNamespace(torch_dtype=lambda: torch.float32, shape=["n"])
        exe = SimpleNamespace(entry_name="main", get_function=lambda name: fn)
        self.adapter = SimpleNamespace(backend="tvm_ffi", result_idx=[2], params=[param] * 3,
                                       _ffi_callee_allocated_output_abi=True, _get_executable=lambda: exe)

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def ffi_runner(module: Any, fn: Any = None) -> tuple[OpRunner, Entry]:
    spec = Specialization("add", "float32", (("N", (1, 1 << 20)),), "c")  # CPU tensors: the "c" target
    entry = Entry(spec, FfiKernel(module, fn), Decision(KERNEL, KERNEL, spec.id))
    shape = OpShape("add", (("A", ("N",)), ("B", ("N",))), 1, outputs=(("C", ("N",)),))
    op = OpRunner(shape, lambda a, b: a + b, [entry])
    op.use_native(native.NativeTable(module, 2, 1))
    return op, entry


def test_the_dispatcher_writes_rows_and_the_table_serves_them(module: Any) -> None:
    op, entry = ffi_runner(module)
    a, b = torch.randn(4096), torch.randn(4096)
    for _ in range(5):
        assert torch.equal(op(a, b), a + b)
    assert op.launchers() == {"add.float32.N1-1048576.c [4096 4096]": "tvm_ffi_callee_alloc"}
    assert op._table.size() == 1, "the memoized kernel key has no row"
    assert entry.kernel_calls() == 5 and entry.fast_calls.value() == 5
    # the first call resolves the key, the second writes its row (and launches from Python), the rest are the table's
    assert op._table.count(0) == 3, "the table did not serve the calls after the row was written"
    assert op.snapshot() == {"kernel:kernel": 5}


def test_undeclared_shapes_misaligned_and_strided_views_go_to_the_reference_with_their_reason(module: Any) -> None:
    op, _ = ffi_runner(module)
    big = torch.randn(1 << 21)  # past the declared range: a reference row after its first call
    for _ in range(3):
        assert torch.equal(op(big, big), big + big)
    a = torch.randn(4097)[1:]
    b = torch.randn(4096)
    op(b, b)
    op(b, b)  # the kernel row of this key is written
    assert torch.equal(op(a, b), a + b)
    s = torch.randn(8192)[::2]
    assert torch.equal(op(s, b), s + b)
    assert op.snapshot() == {"kernel:kernel": 2, "reference:misaligned": 1, "reference:non_contiguous": 1,
                             "reference:undeclared_shape": 3}


def test_disable_and_the_breaker_drop_the_rows(module: Any) -> None:
    op, entry = ffi_runner(module)
    a = torch.randn(64)
    op(a, a)
    op(a, a)
    assert op._table.size() == 1
    op.disable(entry, "disabled_by_policy", "test")
    assert op._table.size() == 0
    for _ in range(3):
        assert torch.equal(op(a, a), a + a)
    assert entry.kernel_calls() == 2 and op.snapshot()["reference:disabled_by_policy"] == 3
    assert op._table.size() == 1, "the reference row was not written"


def test_a_raising_kernel_in_the_table_opens_the_circuit(module: Any) -> None:
    def faulting(*args: Any) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    op, entry = ffi_runner(module, tvm_ffi.convert(faulting))
    seen: list[str] = []
    op.on_fault = lambda e, reason, detail: seen.append(detail)
    a = torch.randn(64)
    assert torch.equal(op(a, a), a + a)  # first call: the Python path launches, the kernel raises
    assert entry.kernel is None and entry.decision.reason == "circuit_open" and op.faults == {"kernel_raised": 1}
    for _ in range(3):
        assert torch.equal(op(a, a), a + a)
    assert len(seen) == 1 and "illegal memory access" in seen[0]
    assert op.snapshot() == {"reference:circuit_open": 4} and op._table.count(0) == 0


def test_a_kernel_that_raises_only_in_the_table_is_retried_on_the_python_path(module: Any) -> None:
    calls: list[int] = []

    def flaky(*args: Any) -> Any:
        calls.append(len(args))
        if len(calls) > 2:  # the table's calls: raise (as a kernel that faults once launched from there)
            raise RuntimeError("launch failed")
        return args[0]

    op, entry = ffi_runner(module, tvm_ffi.convert(flaky))
    a = torch.randn(64)
    op(a, a)
    op(a, a)  # row written
    op(a, a)  # the table's launch raises; the Python path launches again, which raises too: the circuit opens
    assert entry.kernel is None and op.faults == {"kernel_raised": 1} and len(calls) == 4
    assert torch.equal(op(a, a), a + a)


def test_check_finite_bypasses_the_table(module: Any) -> None:
    op, entry = ffi_runner(module)
    a = torch.randn(64)
    op(a, a)
    op(a, a)
    before = op._table.count(0)
    op.check_finite = True
    assert torch.equal(op(a, a), a + a) and op._table.count(0) == before
    c = torch.empty(64)
    assert op(a, a, out=c) is c and torch.equal(c, a + a) and op._table.count(0) == before
    op.check_finite = False
    assert torch.equal(op(a, a), a + a) and op._table.count(0) == before + 1


def test_out_is_written_by_the_kernel_itself_through_the_table(module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import tileship.runtime.dispatch as dispatch

    op, entry = ffi_runner(module)
    a, b = torch.randn(64), torch.randn(64)
    op(a, b)
    op(a, b)  # the key's second call writes its row
    assert op._table.size() == 1
    before = op._table.count(0)
    c = torch.full((64,), float("nan"))
    ptr = c.data_ptr()
    monkeypatch.setattr(dispatch, "fill_out", lambda *a: pytest.fail("out= was served by a copy"))
    assert op(a, b, out=c) is c and c.data_ptr() == ptr and torch.equal(c, a + b)
    assert op._table.count(0) == before + 1 and entry.kernel.adapter is not None  # one launch, in the table
    # the table keeps allocating for calls without out=: the allocator swap ended with the call
    d = op(a, b)
    assert d.data_ptr() != ptr and torch.equal(d, a + b) and op._table.count(0) == before + 2


def test_an_out_the_kernel_cannot_write_gets_a_copy_or_a_clear_error(module: Any) -> None:
    from tileship.errors import CallError

    op, entry = ffi_runner(module)
    a, b = torch.randn(64), torch.randn(64)
    op(a, b)
    op(a, b)
    for out in (torch.empty(65)[1:], a):  # misaligned (4 bytes in); the same bytes as an input
        want = a + b
        before = op._table.count(0)
        assert op(a, b, out=out) is out and torch.equal(out, want)
        assert op._table.count(0) == before + 1  # the kernel ran once, into its own output, then a copy
    with pytest.raises(CallError, match="out is not contiguous"):  # as without the table
        op(a, b, out=torch.empty(128)[::2])
    with pytest.raises(CallError, match="out is \\(32,\\) torch.float32, this call needs \\(64,\\)"):
        op(a, b, out=torch.empty(32))
    with pytest.raises(CallError, match="out is \\(64,\\) torch.float64"):
        op(a, b, out=torch.empty(64, dtype=torch.float64))
    with pytest.raises(CallError, match="expected a tensor"):
        op(a, b, out=[1, 2])
    c = torch.empty(64)
    assert op(a, b, out=c) is c and torch.equal(c, a + b)  # and a good out still goes straight in


def test_out_through_the_table_from_many_threads_lands_in_each_callers_tensor(module: Any) -> None:
    import threading

    op, _ = ffi_runner(module)
    a = torch.randn(4096)
    op(a, a)
    op(a, a)
    errors: list[str] = []

    def worker(k: int) -> None:
        b = torch.full((4096,), float(k))
        for _ in range(200):
            c = torch.empty(4096)
            if op(a, b, out=c) is not c or not torch.equal(c, a + b):
                errors.append(f"thread {k}")
                return

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_many_threads_through_the_table_count_exactly(module: Any) -> None:
    op, entry = ffi_runner(module)
    errors: list[str] = []
    n_threads, per_thread = 8, 200

    def worker(tid: int) -> None:
        g = torch.Generator().manual_seed(tid)
        for i in range(per_thread):
            n = (16, 1024, 3000, 1 << 21)[i % 4]
            a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
            if not torch.equal(op(a, b), a + b):
                errors.append(f"t{tid} i{i}")

    together(n_threads, worker)
    assert not errors, errors[:5]
    counts = op.snapshot()
    assert counts == {"kernel:kernel": n_threads * per_thread * 3 // 4,
                      "reference:undeclared_shape": n_threads * per_thread // 4}, counts
    assert op._table.count(0) > 0


def test_attach_gives_tables_only_to_operators_with_tvm_ffi_kernels(tmp_path: Path, module: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert native.compile_library(tmp_path / native.LIBRARY).ok
    op, _ = ffi_runner(module)
    op._table, op._native = None, None
    plain = OpRunner(OpShape("neg", (("A", ("N",)),), 1), lambda a: -a, [])
    assert native.attach(tmp_path, {"add": op, "neg": plain}) is None
    assert op._table is not None and plain._table is None
    monkeypatch.setenv("TILESHIP_NATIVE_CALL", "off")
    fresh, _ = ffi_runner(module)
    fresh._table, fresh._native = None, None
    assert "TILESHIP_NATIVE_CALL=off" in (native.attach(tmp_path, {"add": fresh}) or "")
    assert fresh._table is None
    assert native.attach(tmp_path / "nothing-here", {"add": fresh}) is None


# -- "c"-target kernels: the CPU catalog, compiled by TileLang, served by the table ---------------
def test_a_cpu_release_serves_its_c_kernels_through_the_table(cpu_release_build: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from tileship.runtime.loader import load

    release = load(cpu_release_build.path)
    add, norm = release.op("add"), release.op("rmsnorm_cpu")
    assert add._table is not None and norm._table is not None, release.notes
    calls = 0
    for n in (1, 7, 4096, 100_003):
        a, b = torch.randn(n), torch.randn(n)
        for _ in range(3):
            assert torch.equal(add(a, b), a + b), n
            calls += 1
    x, w = torch.randn(33, 1024), torch.randn(1024)
    for _ in range(3):
        torch.testing.assert_close(norm(x, w), torch.nn.functional.rms_norm(x, (1024,), w, 1e-6),
                                   atol=1e-5, rtol=1e-5)
    served = sum(add._table.count(i) for i in range(len(add.entries)))
    assert served == calls - 2 * 4, "the table did not serve each key from its third call on"
    assert norm._table.count(next(i for i, e in enumerate(norm.entries) if e.kernel is not None)) >= 1
    assert release.counters() == {"add": {"kernel:kernel": calls}, "rmsnorm_cpu": {"kernel:kernel": 3}}
    # out=: the "c" kernel writes into the caller's tensor itself (its output allocation is handed it): no copy
    import tileship.runtime.dispatch as dispatch

    monkeypatch.setattr(dispatch, "fill_out", lambda *a: pytest.fail("out= was served by a copy"))
    a, b = torch.randn(4096), torch.randn(4096)
    before = sum(add._table.count(i) for i in range(len(add.entries)))
    for _ in range(3):
        c = torch.full((4096,), float("nan"))
        assert add(a, b, out=c) is c and torch.equal(c, a + b)
    assert sum(add._table.count(i) for i in range(len(add.entries))) == before + 3
    y = torch.empty(33, 1024)
    assert norm(x, w, out=y) is y
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (1024,), w, 1e-6), atol=1e-5, rtol=1e-5)


def test_malformed_plans_are_refused_with_the_reason(module: Any) -> None:
    table = native.NativeTable(module, 2, 1)
    a = torch.randn(8)
    plan_ok = [3, 1, 2, 2 | 32 << 8 | 1 << 16, 1, 8, 0, 1, -1, 8, 1, 0]
    cases = {
        "int64 CPU tensor": torch.tensor(plan_ok, dtype=torch.int32),
        "too short": torch.tensor([1, 0, 0], dtype=torch.int64),
        "counts are out of range": torch.tensor([3, 1, 2, 0, 1, 8, 0, 1, -1, 8, 1], dtype=torch.int64),
        "source is out of range": torch.tensor([3, 1, 2, 0, 1, 8, 0, 5, -1, 8, 1, 0], dtype=torch.int64),
        "call address is NULL": torch.tensor(plan_ok[:-2] + [0, 0], dtype=torch.int64),
    }
    for why, plan in cases.items():
        with pytest.raises(Exception, match=why):
            table.call(5, 0, plan, a, a)
    assert table.size() == 0


def test_the_table_refuses_a_plan_it_cannot_hold_and_the_python_launcher_serves(module: Any) -> None:
    table = native.NativeTable(module, 2, 1)
    a = torch.randn(8)
    too_many = (1, 0, tuple(range(2)) + (-1,), tuple(range(30)), ((8,), torch.float32))
    assert table.put_c(0, too_many, (a, a)) is False and table.size() == 0
    odd_dtype = (1, 0, (0, 1, -1), (), ((8,), torch.complex64))
    assert table.put_c(0, odd_dtype, (a, a)) is False


def test_a_kernel_swapped_in_after_the_table_served_it_is_never_bypassed(module: Any) -> None:
    op, entry = ffi_runner(module)
    a = torch.randn(64)
    for _ in range(3):
        op(a, a)
    assert op._table.count(0) == 1 and op._table.size() == 1
    seen: list[int] = []

    def swapped(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.append(1)
        return x + y

    entry.kernel = swapped
    assert op._table.size() == 0, "assigning the kernel did not drop the table's rows"
    for _ in range(3):
        assert torch.equal(op(a, a), a + a)
    assert len(seen) == 3 and op._table.count(0) == 1, "the table launched the kernel that was swapped out"


def test_arrays_that_are_not_torch_tensors_are_refused_as_without_the_table(cpu_release_build: Any) -> None:
    from tileship.errors import CallError
    from tileship.runtime.loader import load

    add = load(cpu_release_build.path).op("add")
    a, b = torch.randn(64), torch.randn(64)
    for _ in range(3):
        add(a, b)  # the key's row is written: a NumPy array of the same key must still not reach the kernel
    with pytest.raises(CallError, match="expected a torch.Tensor, got numpy.ndarray"):
        add(a.numpy(), b.numpy())
    with pytest.raises(CallError, match="expected a torch.Tensor, got int"):
        add(1, 2)
    assert add.snapshot() == {"kernel:kernel": 3}


def test_tune_times_each_path_through_the_table_the_release_serves_with(cpu_release_build: Any) -> None:
    """Tune and served_vs_best time every candidate through a dispatcher of its own: it gets the
    release's table where the served operator has one, so a kernel is not timed through the Python
    path it is never served by (about 2 us a call on the H200 host), and the reference-only
    dispatcher gets it too (its route row, as served)."""
    from tileship.runtime.loader import load, load_artifact
    from tileship.verify.tune import _runner, served_table

    root = cpu_release_build.path
    release = load(root)
    served = release.ops["add"]
    table = served_table(root, [e.kernel for e in served.entries])
    assert table == root
    assert served_table(root, [None]) is None and served_table(None, [e.kernel for e in served.entries]) is None
    spec = next(e.spec for e in served.entries if e.kernel is not None and e.spec.dtype == "float32")
    desc = release.declarations["add"]
    kernel = _runner(desc, "add", served.reference, spec, load_artifact(root / "specs" / spec.id, spec.id), table)
    reference = _runner(desc, "add", served.reference, spec, None, table)
    python = _runner(desc, "add", served.reference, spec, load_artifact(root / "specs" / spec.id, spec.id))
    a, b = torch.randn(1000), torch.randn(1000)
    for _ in range(4):
        assert torch.equal(kernel(a, b), a + b) and torch.equal(reference(a, b), a + b)
        assert torch.equal(python(a, b), a + b)
    assert kernel._table is not None and reference._table is not None and python._table is None
    assert kernel._table.count(0) == 4 - 2, "the table did not serve the kernel from the key's third call on"
    assert reference.snapshot() == {"reference:tuning": 4}
