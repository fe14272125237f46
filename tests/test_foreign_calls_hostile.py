"""Calling foreign "c"-target operators (``tests/calls_ops.py``) as a foreign caller does: inputs by their declared
names, operators of several outputs (on the fast launcher, TileLang's adapter and the reference, with and without
``out=``), and inputs such a caller sends that no path can take as they are: out-of-range scalars, fake, batched
(vmap) and nested tensors, arrays, lists, None, 0-dim, meta, bool and empty tensors. Each is served correctly or is
a CallError naming the argument, and leaves the operator serving later calls from its kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("tilelang")

from tileship.errors import CallError  # noqa: E402

HOW = {"op": lambda op, *a, **k: op(*a, **k), "call": lambda op, *a, **k: op.call(*a, **k)[0]}


@pytest.fixture(scope="module")
def release(calls_release_build):
    import tileship

    return tileship.load(calls_release_build.path)


def _kernel_calls(op) -> int:
    return sum(e.kernel_calls() for e in op.entries)


def _serves_from_its_kernel(release, name: str, args: tuple) -> None:
    """``name`` still answers ``args`` from its kernel: no circuit opened, no decision changed."""
    op = release.op(name)
    _, d = op.call(*args)
    assert d.path == "kernel", f"{name} now serves {args[0].shape} from the reference ({d.reason})"
    assert not op.faults, op.faults
    assert all(v == "kernel:kernel" for v in release.decisions()[name].values()), release.decisions()[name]


# -- inputs by name ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", list(HOW))
def test_inputs_are_taken_by_their_declared_names(release, how):
    """``op(A=a, B=b)`` raised Python's bare TypeError ('got an unexpected keyword argument'): a caller that names
    the inputs, as it would a PyTorch function's, could not call the operator at all."""
    call = HOW[how]
    sp, scale, mul_add = release.op("sum_prod"), release.op("scale"), release.op("mul_add")
    g = torch.Generator().manual_seed(7)
    a, b, x = torch.randn(64, generator=g), torch.randn(64, generator=g), torch.randn(32, generator=g)
    before = [_kernel_calls(op) for op in (sp, scale, mul_add)]
    for got in (call(sp, A=a, B=b), call(sp, B=b, A=a), call(sp, a, B=b)):
        assert torch.equal(got[0], a + b) and torch.equal(got[1], a * b)
    assert torch.equal(call(scale, x, s=2.0, flag=True), x * 2)
    assert torch.equal(call(scale, flag=False, A=x, s=2.0), x)
    m, p = call(mul_add, x, n=3, s=0.5)
    assert torch.equal(m, x * 0.5) and torch.equal(p, x + 3)
    s_out, p_out = torch.empty(64), torch.empty(64)
    got = call(sp, B=b, A=a, out=[s_out, p_out])
    assert got[0] is s_out and got[1] is p_out and torch.equal(s_out, a + b) and torch.equal(p_out, a * b)
    assert [_kernel_calls(op) - n for op, n in zip((sp, scale, mul_add), before, strict=True)] == [4, 2, 1]


@pytest.mark.parametrize("how", list(HOW))
@pytest.mark.parametrize("args,named,argument,message", [
    ("", "ABC", "C", r"unexpected keyword argument 'C' \(the operator takes A, B; and out="),
    ("", "ab", "a", r"unexpected keyword argument 'a' \(the operator takes A, B; and out="),
    ("A", "A", "A", r"given twice: as positional argument 1 and by name"),
    ("AB", "B", "B", r"given twice: as positional argument 2 and by name"),
    ("", "B", "A", r"missing input A \(the operator takes A, B\)"),
    ("ABA", "A", None, r"expected 2 inputs \(A, B\), got 3 positional and 1 by name"),
    ("", "", None, r"expected 2 tensors \(A, B\), got 0"),
], ids=["unknown", "lower-case", "twice-first", "twice-second", "missing", "too-many", "none"])
def test_a_wrong_keyword_is_a_call_error_naming_it(release, how, args, named, argument, message):
    """Each was Python's TypeError naming no operator ('__call__() got an unexpected keyword argument'), or, for an
    input given twice, ('got multiple values')."""
    sp = release.op("sum_prod")
    t = {"A": torch.randn(64), "B": torch.randn(64), "C": torch.randn(64), "a": torch.randn(64), "b": torch.randn(64)}
    with pytest.raises(CallError, match=rf"^sum_prod(\({argument}\))?: {message}") as info:
        HOW[how](sp, *[t[k] for k in args], **{k: t[k] for k in named})
    assert info.value.argument == argument and info.value.operator == "sum_prod"
    _serves_from_its_kernel(release, "sum_prod", (t["A"], t["B"]))


def test_span_names_an_input_only_on_op_and_times_the_call_on_call(release):
    """``span=`` is ``.call``'s timer; the plain call takes no timer, so there it is a keyword naming no input."""
    sp, a = release.op("sum_prod"), torch.randn(64)
    with pytest.raises(CallError, match=r"sum_prod\(span\): unexpected keyword argument 'span'") as info:
        sp(a, a, span=None)
    assert info.value.argument == "span"
    marks: list[str] = []

    class Span:
        def start(self) -> None:
            marks.append("start")

        def stop(self) -> None:
            marks.append("stop")

    (s, p), d = sp.call(B=a, A=a, span=Span())
    assert marks == ["start", "stop"] and d.path == "kernel" and torch.equal(s, a + a)


# -- several outputs ---------------------------------------------------------------------------------------------
def _two_outputs(case: str):
    """(operator, arguments, expected (path, reason), expected outputs) of each way a two-output call is served."""
    g = torch.Generator().manual_seed(len(case))
    if case.startswith("sum_prod"):
        n = {"sum_prod-launcher": 64, "sum_prod-dynamic": 100, "sum_prod-reference": 2000}.get(case, 128)
        a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
        if case == "sum_prod-strided":
            a = a[::2]
            b = b[::2]
        want = {"sum_prod-reference": ("reference", "undeclared_shape"),
                "sum_prod-strided": ("reference", "non_contiguous")}.get(case, ("kernel", "kernel"))
        return "sum_prod", (a, b), want, (a + b, a * b)
    x = torch.randn(32 if case == "mul_add-adapter" else 20, generator=g)
    want = ("kernel", "kernel") if case == "mul_add-adapter" else ("reference", "undeclared_shape")
    return "mul_add", (x, 0.5, 3), want, (x * 0.5, x + 3)


CASES = ["sum_prod-launcher", "sum_prod-dynamic", "sum_prod-reference", "sum_prod-strided", "mul_add-adapter",
         "mul_add-reference-list"]


@pytest.mark.parametrize("checked", [False, True], ids=["plain", "check_finite"])
@pytest.mark.parametrize("case", CASES)
def test_several_outputs_are_a_tuple_on_every_path(release, case, checked):
    """The kernel path returned a list (the fast launchers, TileLang's adapter) and the reference path whatever the
    reference returned (``mul_add``'s is a list): one operator answered in two types, so ``isinstance(r, tuple)``,
    ``r == r2`` and pytree code saw a different answer depending on the path a shape took."""
    name, args, (path, reason), want = _two_outputs(case)
    op = release.op(name)
    op.check_finite = checked
    try:
        for _ in range(2):  # the first call of a key, then the memoized one (in the compiled table if any)
            got, d = op.call(*args)
            plain = op(*args)
            assert type(got) is tuple and type(plain) is tuple, (type(got), type(plain))
            assert (d.path, d.reason) == (path, reason)
            for out in (got, plain):
                assert len(out) == 2 and all(torch.equal(o, w) for o, w in zip(out, want, strict=True))
    finally:
        op.check_finite = False


@pytest.mark.parametrize("seq", [list, tuple])
@pytest.mark.parametrize("case", ["sum_prod-launcher", "sum_prod-reference", "mul_add-adapter",
                                  "mul_add-reference-list"])
def test_out_takes_a_list_or_a_tuple_for_several_outputs_and_returns_the_tuple_of_them(release, case, seq):
    """``out=[s, p]`` came back as that list on every path, ``out=(s, p)`` as that tuple: the type of the answer
    depended on the container the caller allocated, not on the operator."""
    name, args, (path, reason), want = _two_outputs(case)
    op = release.op(name)
    for how in HOW:
        outs = [torch.full_like(w, float("nan")) for w in want]
        got = HOW[how](op, *args, out=seq(outs))
        assert type(got) is tuple and got[0] is outs[0] and got[1] is outs[1], (how, type(got))
        assert all(torch.equal(o, w) for o, w in zip(outs, want, strict=True))
    assert op.call(*args, out=seq(outs))[1].path == path
    for wrong in (outs[:1], [*outs, outs[0].clone()]):
        with pytest.raises(CallError, match=rf"{name}\(out\): expected a sequence of 2 tensors, got "
                                            rf"{seq.__name__} of {len(wrong)}"):
            op(*args, out=seq(wrong))


def test_the_adapter_served_keys_of_an_operator_with_scalars_name_their_shapes(release):
    """``launchers()`` listed an operator with scalars as ``mul_add.float32.N32.c
    [cpuxtorch.float32xtorch.Size([32])]``: its memo key holds one (device, dtype, shape) per tensor, which the
    listing joined whole."""
    op = release.op("mul_add")
    op(torch.randn(32), 1.0, 2)
    assert op.launchers() == {"mul_add.float32.N32.c [32]": "adapter: scalar arguments go through the cython adapter"}


# -- scalars a kernel cannot take as declared --------------------------------------------------------------------
@pytest.mark.parametrize("n", [2**32 + 3, 2**31, -(2**31) - 1, 2**64 + 1], ids=["2^32+3", "2^31", "-2^31-1", "2^64+1"])
def test_an_integer_scalar_outside_its_dtype_is_a_call_error_not_a_wrapped_value(release, n):
    """``n=2**32 + 3`` for an int32 ScalarArg: the kernel was handed 3 (ctypes wraps it) and answered A + 3 where
    the reference answers A + 2**32 + 3, with the decision 'kernel': a wrong answer, silently. The value is not in
    the memo key, so a memoized key checks it on every call."""
    op = release.op("mul_add")
    x = torch.randn(32)
    op(x, 1.0, 2)  # memoized
    for how in HOW:
        for size in (32, 20):  # the kernel's key, and a key the reference serves
            with pytest.raises(CallError, match=r"mul_add\(n\): is an int32 ScalarArg, got .*, outside the range it "
                                                r"takes \[-2147483648, 2147483647\]") as info:
                HOW[how](op, torch.randn(size), 1.0, n)
            assert info.value.argument == "n"
    (_, p), d = op.call(x, 1.0, 2**31 - 1)  # the largest int32 is the kernel's
    assert d.path == "kernel" and torch.equal(p, x + (2**31 - 1))
    _serves_from_its_kernel(release, "mul_add", (x, 1.0, 2))


@pytest.mark.parametrize("k", [2**32 + 3, 2**31, -(2**31) - 1], ids=["2^32+3", "2^31", "-2^31-1"])
def test_a_same_scalar_of_an_int32_operator_takes_the_int32_range(release, k):
    """``shift``'s ``k`` is declared "same" and the operator runs at int32: ``k=2**32 + 3`` got only a float's range
    check, and the kernel was handed 3 (ctypes wraps it) and answered X + 3 with the decision 'kernel'. The value is
    not in the memo key, so a memoized key checks it on every call."""
    op = release.op("shift")
    x = torch.arange(32, dtype=torch.int32)
    assert torch.equal(op(x, 2), x + 2)  # memoized, from its kernel
    for how in HOW:
        for size in (32, 20):  # the kernel's key, and a key the reference serves
            with pytest.raises(CallError, match=r"shift\(k\): is a ScalarArg of the operator dtype \(int32\), got "
                                                r".*, outside the range it takes \[-2147483648, 2147483647\]") as info:
                HOW[how](op, torch.arange(size, dtype=torch.int32), k)
            assert info.value.argument == "k"
    y, d = op.call(x, 2**31 - 1 - 31)  # the largest int32 that X + k holds is the kernel's
    assert d.path == "kernel" and torch.equal(y, x + (2**31 - 1 - 31))
    _serves_from_its_kernel(release, "shift", (x, 2))


def test_an_int_too_large_for_a_float_scalar_is_a_call_error_and_keeps_the_kernel(release):
    """``s=2**1100`` for a float32 ScalarArg: converting it for the kernel raised OverflowError, which the breaker
    took for a kernel fault: the specialization went to the reference (circuit_open) for every later caller."""
    op, x = release.op("mul_add"), torch.randn(32)
    op(x, 1.0, 2)
    for how in HOW:
        for s in (2**1100, -(10**400)):
            with pytest.raises(CallError, match=r"mul_add\(s\): is a float32 ScalarArg, got an int of \d+ bits, "
                                                r"outside the range it takes \[-1\.798e\+308, 1\.798e\+308\]"):
                HOW[how](op, x, s, 2)
    assert torch.equal(op(x, 2**100, 2)[0], x * float(2**100))  # a large int that a float holds is served
    _serves_from_its_kernel(release, "mul_add", (x, 1.0, 2))


# -- tensors a kernel cannot read ---------------------------------------------------------------------------------
FAKE_CALLS = """
import json, sys, torch, tileship
from torch._subclasses.fake_tensor import FakeTensorMode

name = sys.argv[2]
args = {"sum_prod": (torch.randn(64), torch.randn(64)), "half": (torch.arange(48, dtype=torch.int32),),
        "scale": (torch.randn(32), 2.0, True)}[name]
op = tileship.load(sys.argv[1]).op(name)
op(*args), op(*args)  # memoized, and in the compiled table where the operator has one
mode = FakeTensorMode()
with mode:
    fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
    got, (again, d) = op(*fake), op.call(*fake)
outs = [*(got if isinstance(got, tuple) else (got,)), *(again if isinstance(again, tuple) else (again,))]
print(json.dumps({"types": sorted({type(t).__name__ for t in outs}), "shapes": [list(t.shape) for t in outs],
                  "reason": d.reason, "then": op.call(*args)[1].reason, "faults": op.faults}))
"""


@pytest.mark.parametrize("name,shapes", [("sum_prod", [[64]] * 4), ("half", [[48]] * 2), ("scale", [[32]] * 2)],
                         ids=["python-launcher", "compiled-table", "adapter"])
def test_fake_tensors_get_the_references_fake_outputs_not_a_kernel_launched_on_a_null_pointer(release, name, shapes):
    """A FakeTensor (FakeTensorMode; torch.compile tracing a model that calls ``release.op`` directly) has the memo
    key of a real tensor and a null data pointer: the compiled table (``half``), the Python launchers (``sum_prod``)
    and TileLang's adapter (``scale``) handed address 0 to the kernel and the process died (SIGSEGV). Run in a child
    process so that a regression fails this test, not the session."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", FAKE_CALLS, str(release.path), name],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, f"the child exited with {proc.returncode}: {proc.stderr[-3000:]}"
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "types": ["FakeTensor"], "shapes": shapes, "reason": "no_data", "then": "kernel", "faults": {}}


def test_vmap_over_an_operator_is_served_by_the_reference(release):
    """Inside ``torch.vmap`` each input is a batched tensor with the key of one example and no storage: the kernel
    path's ``data_ptr()`` raised RuntimeError ('Cannot access data pointer of Tensor that doesn't have storage')."""
    sp, scale = release.op("sum_prod"), release.op("scale")
    g = torch.Generator().manual_seed(11)
    sp(torch.randn(64), torch.randn(64))
    x, y, z = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g), torch.randn(3, 32, generator=g)
    before = sp.snapshot().get("reference:no_data", 0)
    s, p = torch.vmap(sp)(x, y)
    assert torch.equal(s, x + y) and torch.equal(p, x * y)
    s, p = torch.vmap(lambda a, b: sp.call(a, b)[0])(x, y)
    assert torch.equal(s, x + y) and torch.equal(p, x * y)
    assert torch.equal(torch.vmap(lambda t: scale(t, 2.0, True))(z), z * 2)
    assert sp.snapshot()["reference:no_data"] == before + 2
    _serves_from_its_kernel(release, "sum_prod", (x[0], y[0]))


def _nested(layout):
    with warnings.catch_warnings():  # the strided layout is a prototype, and says so
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor([torch.randn(64), torch.randn(64)], layout=layout)


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
def test_a_nested_tensor_is_a_call_error_naming_it(release, layout):
    """A strided nested tensor raised torch's RuntimeError from the memo key ('NestedTensorImpl doesn't support
    sizes'); a jagged one, whose shape holds a symbolic size (2, j1), AttributeError ('NestedIntNode' object has no
    attribute 'int_') from the shape binding when its rank matched the declaration."""
    for name, args, argument in (("sum_prod", lambda t: (torch.randn(64), t), "B"),
                                 ("scale", lambda t: (t, 2.0, True), "A")):
        for how in HOW:
            with pytest.raises(CallError, match=rf"{name}\({argument}\): is a nested tensor") as info:
                HOW[how](release.op(name), *args(_nested(layout)))
            assert info.value.argument == argument
    _serves_from_its_kernel(release, "sum_prod", (torch.randn(64), torch.randn(64)))


HOSTILE = {  # what the first input is, for sum_prod (A, B) with B a plain 64-float tensor: refused, or served
    "numpy": (lambda: np.ones(64, dtype=np.float32), r"sum_prod\(A\): expected a torch.Tensor, got numpy.ndarray"),
    "list": (lambda: [1.0] * 64, r"sum_prod\(A\): expected a torch.Tensor, got list"),
    "None": (lambda: None, r"sum_prod\(A\): expected a torch.Tensor, got NoneType"),
    "0-dim": (lambda: torch.tensor(1.0), r"sum_prod\(A\): has rank 0 \(shape \(\)\), declared \(N\)"),
    "2-dim": (lambda: torch.ones(8, 8), r"sum_prod\(A\): has rank 2 \(shape \(8, 8\)\), declared \(N\)"),
    "meta": (lambda: torch.empty(64, device="meta"), r"sum_prod\(B\): is on cpu but A is on meta"),
    "empty": (lambda: torch.empty(0), r"sum_prod\(B\): dim N=64 disagrees with N=0 of an earlier input"),
}


@pytest.mark.parametrize("what", list(HOSTILE))
def test_an_input_no_path_can_take_is_a_call_error_naming_it(release, what):
    make, message = HOSTILE[what]
    sp, b = release.op("sum_prod"), torch.randn(64)
    _serves_from_its_kernel(release, "sum_prod", (torch.randn(64), b))  # the key is memoized (a compiled table row)
    for how in HOW:
        for _ in range(2):  # nothing was memoized for it
            with pytest.raises(CallError, match=message):
                HOW[how](sp, make(), b)
    _serves_from_its_kernel(release, "sum_prod", (torch.randn(64), b))


@pytest.mark.parametrize("n", [64, 2000], ids=["launcher-row", "reference-row"])
def test_numpy_arrays_are_a_call_error_on_a_key_the_compiled_table_routes_to_python(release, n):
    """The compiled table takes NumPy arrays by DLPack, with the key of torch tensors: for a key it answers with a route
    row (a Python launcher serves it: two outputs; or the reference) it handed the arrays to that route, and the
    launcher raised AttributeError ('numpy.ndarray' object has no attribute 'is_contiguous'), or the reference
    computed on them: NumPy arrays came back as the operator's outputs, or NumPy's TypeError ('Concatenation
    operation is not implemented for NumPy arrays'). An array after a torch tensor on a reference row (the table
    cannot tell it from a tensor) was served by the reference through ``op(...)`` (``Tensor + ndarray`` is a
    Tensor) where ``.call(...)`` refused it."""
    sp = release.op("sum_prod")
    a, b = torch.randn(n), torch.randn(n)
    for _ in range(2):
        sp(a, b)  # memoized: a route row in the compiled table
    for args, name in (((a.numpy(), b.numpy()), "A"), ((a, b.numpy()), "B"), ((a.numpy(), b), "A")):
        for how in HOW:
            with pytest.raises(CallError, match=rf"sum_prod\({name}\): expected a torch.Tensor, got numpy.ndarray"):
                HOW[how](sp, *args)
    assert sp.call(a, b)[1].path == ("kernel" if n == 64 else "reference")


def test_a_jagged_tensor_of_the_declared_rank_is_a_call_error_naming_it(cpu_release_build):
    """rmsnorm's X is (M, N): a jagged tensor (2, j1) has that rank, and binding its symbolic j1 to N raised
    AttributeError ('NestedIntNode' object has no attribute 'int_')."""
    import tileship

    norm = tileship.load(cpu_release_build.path).op("rmsnorm_cpu")
    x, w = _nested(torch.jagged), torch.ones(64)
    assert x.dim() == 2
    for how in HOW:
        with pytest.raises(CallError, match=r"rmsnorm_cpu\(X\): is a nested tensor") as info:
            HOW[how](norm, x, w)
        assert info.value.argument == "X"


SERVED = {  # both inputs alike: what the reference answers, and why a kernel does not
    "meta": (lambda n: torch.empty(n, device="meta"), 64, "device_not_covered"),
    "huge-meta": (lambda n: torch.empty(n, device="meta"), 2**40, "device_not_covered"),
    "bool": (lambda n: torch.rand(n) > 0.5, 64, "undeclared_dtype"),
    "float64": (lambda n: torch.randn(n, dtype=torch.float64), 64, "undeclared_dtype"),
    "empty": (lambda n: torch.empty(n), 0, "undeclared_shape"),
    "expanded": (lambda n: torch.randn(1).expand(n), 64, "non_contiguous"),
}


@pytest.mark.parametrize("what", list(SERVED))
def test_inputs_a_kernel_does_not_cover_get_the_reference_and_its_reason(release, what):
    make, n, reason = SERVED[what]
    sp = release.op("sum_prod")
    a, b = make(n), make(n)
    for _ in range(2):
        (s, p), d = sp.call(a, b)
        assert (d.path, d.reason) == ("reference", reason)
        assert s.shape == p.shape == (n,) and s.device == a.device and s.dtype == (a + b).dtype
        if a.device.type == "cpu":
            assert torch.equal(s, a + b) and torch.equal(p, a * b)
    _serves_from_its_kernel(release, "sum_prod", (torch.randn(64), torch.randn(64)))


def test_the_call_docs_example_runs(cpu_release_build, capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "pytorch.md").read_text()
    block = re.search(r"## Calling an operator\n\n```python\n(.*?)```", text, re.S).group(1)
    printed = re.search(r"^    print\(.*\)\n# (.*)$", block, re.M).group(1)
    exec(compile(block, "docs/pytorch.md", "exec"), {"release_path": cpu_release_build.path})
    assert capsys.readouterr().out.strip() == printed
