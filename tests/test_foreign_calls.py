"""Calling foreign "c"-target operators (``tests/calls_ops.py``) the ways a user does and gets wrong: the wrong
number of arguments to an operator with scalars, ``out=`` tensors that alias each other or an input, an ``out=``
that requires grad, and an output of the operator dtype when no input has it (eager, ``out=``, fake tensors)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("tilelang")

import calls_ops  # noqa: E402

from tileship.errors import CallError, DeclarationError  # noqa: E402


@pytest.fixture(scope="module")
def release(calls_release_build):
    import tileship

    return tileship.load(calls_release_build.path)


@pytest.mark.parametrize("args", [lambda x: (x, 2.0, True, 4), lambda x: (x, 2.0, True, x), lambda x: (x, 2.0),
                                  lambda x: ()], ids=["one-more", "a-tensor-more", "one-less", "none"])
def test_the_wrong_number_of_arguments_to_an_operator_with_scalars_is_a_call_error(release, args):
    """The memo key of an operator with scalars read only the declared positions: a call with one argument more hit
    the memoized key, launched the kernel with four arguments, and the kernel's ValueError opened the circuit, so
    every later caller got the reference; one argument less raised IndexError from the key."""
    op = release.op("scale")
    x = torch.randn(32)
    for _ in range(2):  # memoized, and in the compiled table if there is one
        assert torch.equal(op(x, 2.0, True), x * 2)
    for call in (op, op.call):
        with pytest.raises(CallError, match=r"scale: expected 3 arguments \(A, s, flag\), got \d"):
            call(*args(x))
    assert release.decisions()["scale"] == {"scale.float32.N32.c": "kernel:kernel"} and not op.faults


def test_out_tensors_sharing_memory_are_a_call_error(release):
    """``out=(o, o)`` for two outputs: the kernel wrote both into ``o`` and the caller got P where S was asked for."""
    op = release.op("sum_prod")
    a, b, o = torch.randn(64), torch.randn(64), torch.empty(64)
    whole = torch.empty(128)
    for out in ((o, o), (whole[:64], whole[32:96])):
        for call in (op, op.call):
            with pytest.raises(CallError, match=r"sum_prod\(out\): out\[0\] and out\[1\] share memory") as info:
                call(a, b, out=out)
            assert info.value.argument == "out"


@pytest.mark.parametrize("n", [64, 100], ids=["static", "dynamic"])
def test_an_out_that_is_an_input_gets_the_kernels_answer_copied_in(release, n):
    """``out=(A, fresh)``: the kernel wrote S into A while it still read A for P, so P was (A + B) * B. The compiled
    table already hands such an ``out`` the kernel's own output; the Python path now does the same."""
    op = release.op("sum_prod")
    g = torch.Generator().manual_seed(n)
    a0, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    for call in (lambda *x, out: (op(*x, out=out), None), op.call):
        a, p = a0.clone(), torch.empty(n)
        got, d = call(a, b, out=(a, p))
        assert d is None or d.path == "kernel", d
        assert got[0] is a and got[1] is p
        assert torch.equal(a, a0 + b) and torch.equal(p, a0 * b), "an output was computed from an overwritten input"


def test_an_output_of_the_operator_dtype_with_no_input_of_it_has_that_dtype_everywhere(release):
    """``half``: an int32 X and a "same" (float64) Y. ``out=`` demanded an int32 tensor (the first input's dtype) and
    refused the float64 one the kernel writes; the fake tensor was int32, so opcheck and compiled graphs had the
    wrong dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tileship.torchops.custom_ops import register

    op = release.op("half")
    x = torch.arange(48, dtype=torch.int32)
    y, d = op.call(x, out=torch.empty(48, dtype=torch.float64))
    assert d.path == "kernel" and y.dtype == torch.float64 and torch.equal(y, x / 2)
    with pytest.raises(CallError, match=r"half\(out\): out is \(48,\) torch.int32, this call needs \(48,\) "
                                        r"torch.float64"):
        op.call(x, out=torch.empty(48, dtype=torch.int32))
    y, d = op.call(torch.arange(10, dtype=torch.int32), out=torch.empty(10, dtype=torch.float64))  # the reference
    assert (d.path, d.reason) == ("reference", "undeclared_shape") and torch.equal(y, torch.arange(10) / 2)
    ops = register(release)
    with FakeTensorMode():
        assert ops.half(torch.empty(7, dtype=torch.int32)).dtype == torch.float64
    torch.library.opcheck(ops.half, (x,))


def test_several_dtypes_with_no_input_of_the_operator_dtype_are_refused():
    """No input tensor says which operator dtype a call wants: the dispatcher silently served whichever
    specialization came last, in a dtype the caller never chose."""
    with pytest.raises(DeclarationError) as exc:
        dataclasses.replace(calls_ops.half, dtypes=("float32", "float64")).check()
    assert exc.value.field == "dtypes" and "no input tensor has the operator dtype" in str(exc.value)


def test_an_out_that_requires_grad_is_a_call_error_on_every_path(release):
    """The kernel wrote into such an ``out`` behind autograd's back, the reference's copy into it raised
    RuntimeError ('a leaf Variable that requires grad is being used in an in-place operation')."""
    op = release.op("scale")
    for n in (32, 20):  # the kernel, the reference
        x = torch.randn(n)
        for call in (op, op.call):
            with pytest.raises(CallError, match=r"scale\(out\): out requires grad") as info:
                call(x, 2.0, True, out=torch.empty(n, requires_grad=True))
            assert info.value.argument == "out"
        with torch.no_grad():
            y = torch.empty(n, requires_grad=True)
            op(x, 2.0, True, out=y)
            assert torch.equal(y, x * 2)


def test_an_out_that_requires_grad_is_refused_by_the_compiled_tables_out_too(cpu_release_build):
    import tileship

    add = tileship.load(cpu_release_build.path).op("add")
    a, b = torch.randn(4096), torch.randn(4096)
    assert add(a, b, out=torch.empty(4096)) is not None  # the table serves out= for this operator
    with pytest.raises(CallError, match=r"add\(out\): out requires grad"):
        add(a, b, out=torch.empty(4096, requires_grad=True))


def _twice_in_a_tuple(a):
    return (a * 2,)


def test_a_reference_returning_a_sequence_of_one_for_one_output_fails_verification_and_names_itself():
    """It passed verification (the result was flattened), then every reference-routed call of the custom op raised
    AttributeError ('tuple' object has no attribute 'is_contiguous') and ``release.op`` returned a tuple on one path
    and a tensor on the other."""
    from test_torch_ops import fake_release

    from tileship.declare.spec import Specialization
    from tileship.torchops.custom_ops import register
    from tileship.verify.spec_check import VerifyOptions, verify_spec

    spec = Specialization("twice", "float32", (("N", 32),), "c")
    desc = {"inputs": [["A", ["N"]]], "outputs": [["B", ["N"]]], "dtypes": ["float32"]}
    verdict = verify_spec(spec, lambda a: a * 2, _twice_in_a_tuple, desc,
                          options=VerifyOptions(timing=False, seeds=(0,), strict_poison=False))
    assert ("twice.reference: the call answered a tuple of 1 (Tensor); the operator declares 1 output tensor(s)"
            in verdict.failure), verdict.failure
    op = register(fake_release(_twice_in_a_tuple, release_id="f00d0000000000c1")).scale
    with pytest.raises(DeclarationError, match=r"scale.reference: the call answered a tuple of 1 \(Tensor\); the "
                                               r"operator declares 1 output tensor\(s\)"):
        op(torch.randn(4, 8))


@pytest.mark.parametrize("name", ["in", "A b", "x\u00e9", "1x", "", "NoneType", "None"])
def test_a_tensor_name_no_schema_can_hold_is_refused_when_declared(name):
    """Such a name built, then ``register`` failed with torch's schema parser error (RuntimeError: 'expected ident
    but found 'in' here'), taking every operator of the release with it."""
    from tileship import TensorArg

    for change in (dict(inputs=(TensorArg(name, ("N",)),)), dict(outputs=(TensorArg(name, ("N",), "float64"),))):
        with pytest.raises(DeclarationError, match="cannot name a kernel parameter or a torch schema argument") as exc:
            dataclasses.replace(calls_ops.half, **change).check()
        assert exc.value.field in ("inputs", "outputs")


def test_out_for_an_operator_without_outputs_or_of_the_wrong_count_says_what_it_got(release):
    """It said 'expected a sequence of 0 tensors, got Tensor' and 'expected a sequence of 2 tensors, got tuple'."""
    x, acc = torch.randn(64), torch.zeros(64)
    with pytest.raises(CallError, match=r"bump\(out\): the operator has no outputs \(it updates inputs in place\)"):
        release.op("bump").call(x, acc, out=torch.empty(64))
    assert torch.equal(acc, torch.zeros(64))
    with pytest.raises(CallError, match=r"sum_prod\(out\): expected a sequence of 2 tensors, got tuple of 3"):
        release.op("sum_prod").call(x, x, out=(acc, acc.clone(), acc.clone()))
    assert release.op("bump")(x, acc) is None and torch.equal(acc, x)
