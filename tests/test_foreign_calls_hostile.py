"""Calling foreign "c"-target operators (``tests/calls_ops.py``) as a foreign caller does: inputs by their declared
names, operators of several outputs (on the fast launcher, TileLang's adapter and the reference, with and without
``out=``), and inputs such a caller sends that no path can take as they are: out-of-range scalars, fake, batched
(vmap) and nested tensors, arrays, lists, None, 0-dim, meta, bool and empty tensors. Each is served correctly or is
a CallError naming the argument, and leaves the operator serving later calls from its kernel."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tilelang")

from tileship.errors import CallError  # noqa: E402

HOW = {"op": lambda op, *a, **k: op(*a, **k), "call": lambda op, *a, **k: op.call(*a, **k)[0]}


@pytest.fixture(scope="module")
def release(calls_release_build):
    import tileship

    return tileship.load(calls_release_build.path)


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
