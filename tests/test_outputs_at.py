"""The shape and dtype a declaration gives its outputs at one call (``declare.outputs_at``), and every caller that
sizes outputs asking it: the server (``serve.validate.output_bytes``, ``serve.answer.check_declared``), the
dispatcher (``runtime.route.expected_outputs``) and the torch custom ops' fake kernel.

Three copies of the rule disagreed: the server floored a division that does not divide (``K/8`` at K=12 gave 1,
so a reference's answer was refused as a wrong shape, a 500), could not read a literal written with spaces
(``" 6"``), left an output of a literal dtype outside the operator's dtypes out of the bytes it counts against
``--max-output-mib`` and the gRPC message; the fake kernel crashed with a TypeError where a shape cannot be told;
a runner whose outputs the release filled in took ``"same"`` for its first input's dtype where no input is
``"same"``."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tileship.declare.dims import SAME
from tileship.declare.outputs_at import described_outputs_at, output_shape, outputs_at, shape_or_why
from tileship.declare.parts import DTYPES
from tileship.errors import CallError, DeclarationError

BASES = ("M", "N", "K", "_b")
BAD = ("0", "-2", "K+1", "", "K/0", "K*", "٦", "M N", "00")


# -- the property: against a straightforward oracle over dims built from their parts ---------------------------

@st.composite
def a_dim(draw):
    """(the dim as a declaration writes it, its parts for the oracle)."""
    kind = draw(st.sampled_from(("name", "div", "floordiv", "mul", "lit", "lit-int", "bad")))
    pad = draw(st.sampled_from(("", " ")))
    base = draw(st.sampled_from(BASES))
    k = draw(st.integers(1, 12))
    if kind == "name":
        return f"{pad}{base}{pad}", ("name", base, 1)
    if kind in ("div", "floordiv", "mul"):
        op = {"div": "/", "floordiv": "//", "mul": "*"}[kind]
        return f"{base}{pad}{op}{pad}{k}", (kind, base, k)
    if kind == "lit":
        return f"{pad}{k}{pad}", ("lit", "", k)
    if kind == "lit-int":
        return k, ("lit", "", k)
    return draw(st.sampled_from(BAD)), ("bad", "", 0)


def oracle_dim(parts, sizes):
    kind, base, k = parts
    if kind == "lit":
        return k
    if kind == "bad" or base not in sizes or sizes[base] < 0:
        return None
    v = sizes[base]
    if kind == "mul":
        return v * k
    if kind in ("div", "floordiv"):
        return v // k if v % k == 0 else None
    return v


def oracle_shape(dims_parts, sizes):
    shape = tuple(oracle_dim(p, sizes) for p in dims_parts)
    return None if any(s is None for s in shape) else shape


OUTPUT = st.tuples(st.lists(a_dim(), max_size=4), st.sampled_from((SAME, *DTYPES)))
SIZES = st.dictionaries(st.sampled_from(BASES), st.integers(-3, 48), max_size=len(BASES))


@settings(max_examples=400, deadline=None)
@given(outputs=st.lists(OUTPUT, max_size=4), sizes=SIZES, call_dtype=st.sampled_from(DTYPES),
       by_name=st.booleans())
def test_outputs_at_agrees_with_the_oracle(outputs, sizes, call_dtype, by_name):
    rows = [(f"o{i}", [d for d, _ in dims]) for i, (dims, _) in enumerate(outputs)]
    exprs = [e for _, e in outputs]
    dtypes = {n: e for (n, _), e in zip(rows, exprs, strict=True)} if by_name else exprs
    got = outputs_at(rows, dtypes, sizes, call_dtype)
    assert len(got) == len(outputs)
    for o, (name, ds), (dims, expr) in zip(got, rows, outputs, strict=True):
        want = oracle_shape([p for _, p in dims], sizes)
        assert o.shape == want, (ds, sizes, o)
        assert output_shape(ds, sizes) == want
        assert (o.why == "") == (want is not None), o  # an untold shape always says why
        assert o.dtype == (call_dtype if expr == SAME else expr)
        assert (o.name, o.dims) == (name, tuple(ds))


@settings(max_examples=200, deadline=None)
@given(outputs=st.lists(OUTPUT, min_size=1, max_size=3), sizes=SIZES, call_dtype=st.sampled_from(DTYPES))
def test_the_server_and_the_dispatcher_size_outputs_as_outputs_at_does(outputs, sizes, call_dtype):
    from tileship.runtime.route import expected_outputs
    from tileship.serve.call_plan import CallPlan, output_bytes
    from tileship.serve.encoding import ITEMSIZE, KSERVE

    rows = [[f"o{i}", [d for d, _ in dims]] for i, (dims, _) in enumerate(outputs)]
    tdt = {f"o{i}": e for i, (_, e) in enumerate(outputs)}
    decl = {"inputs": [["X", ["M"]]], "outputs": rows, "dtypes": [call_dtype], "tensor_dtypes": tdt}
    want = described_outputs_at(decl, sizes, call_dtype)
    plan = CallPlan([], call_dtype, dict(sizes), True, [])
    assert output_bytes(decl, plan) == {o.name: math.prod(o.shape) * ITEMSIZE[KSERVE[o.dtype]]
                                        for o in want if o.shape is not None}
    x = torch.empty(1, dtype=getattr(torch, call_dtype))
    specs = expected_outputs([(n, tuple(ds)) for n, ds in rows], tuple(tdt.values()), (SAME,), [x], dict(sizes))
    if any(o.shape is None for o in want):
        assert specs is None  # the fast launcher and out= need every shape
    else:
        assert specs == tuple((o.shape, getattr(torch, o.dtype)) for o in want)


# -- regressions: what each caller answered before ------------------------------------------------------------

UNEVEN = {"inputs": [["X", ["K"]]], "outputs": [["Y", ["K/8"]]], "dtypes": ["float32"]}


def test_the_server_no_longer_floors_a_division_that_does_not_divide():
    """K=12 and an output ``K/8``: the declaration does not cover that shape (its divisions are exact), so it
    gives no shape to hold a reference's answer to. The server floored it to [1] and refused a reference's
    [2] as a wrong shape (a 500); the dispatcher serves it. Now neither holds the shape, and its bytes are not
    counted as 4."""
    from tileship.serve.answer import check_declared
    from tileship.serve.call_plan import CallPlan, output_bytes

    check_declared("uneven", (torch.zeros(2),), UNEVEN, "float32", {"K": 12})
    assert output_bytes(UNEVEN, CallPlan([], "float32", {"K": 12}, False, [])) == {}
    with pytest.raises(DeclarationError, match=r"output 'Y' of the call is float64 \[2\]; the operator declares "
                                               r"it float32 \['K/8'\] for this call"):
        check_declared("uneven", (torch.zeros(2, dtype=torch.float64),), UNEVEN, "float32", {"K": 12})
    with pytest.raises(DeclarationError, match=r"output 'Y' of the call is float32 \[3\]; the operator declares "
                                               r"it float32 \[2\] for this call"):
        check_declared("uneven", (torch.zeros(3),), UNEVEN, "float32", {"K": 16})


TOPK = {"inputs": [["X", ["M", "N"]]], "outputs": [["V", ["M", " 6"]], ["I", ["M", "6"]]], "dtypes": ["float16"],
        "tensor_dtypes": {"X": "same", "V": "same", "I": "int64"}}


def test_the_server_counts_an_output_of_a_dtype_outside_the_operator_dtypes_and_a_spaced_literal():
    """An ``int64`` output of a ``float16`` operator was left out of the bytes counted against --max-output-mib,
    the gRPC message and a shared-memory output's byte size (only the operator dtypes had an item size), and a
    literal written ``" 6"`` (the declaration's grammar allows the spaces) gave no size at all."""
    from tileship.serve.answer import check_declared
    from tileship.serve.call_plan import CallPlan, output_bytes

    plan = CallPlan([], "float16", {"M": 4, "N": 32}, True, [])
    assert output_bytes(TOPK, plan) == {"V": 4 * 6 * 2, "I": 4 * 6 * 8}
    with pytest.raises(DeclarationError, match=r"output 'V' of the call is float16 \[4, 5\]; the operator declares "
                                               r"it float16 \[4, 6\]"):
        check_declared("topk", (torch.zeros(4, 5, dtype=torch.float16), torch.zeros(4, 6, dtype=torch.int64)),
                       TOPK, "float16", {"M": 4, "N": 32})


def test_the_fake_kernel_names_an_output_it_cannot_size_instead_of_a_type_error():
    """Under FakeTensorMode (torch.compile's tracing) an input K=12 with an output ``K/8``, or a ``K*2`` input of
    odd size, crashed ``new_empty`` with a TypeError (a None in the shape); it is a CallError naming the output and
    the dim now."""
    from tileship.torchops.custom_ops import _fake

    fake = _fake("uneven", (("X", ("K",), SAME),), (("Y", ("K/8",)),))
    assert fake(torch.empty(16, device="meta")).shape == (2,)
    with pytest.raises(CallError, match=r"uneven: output Y cannot be sized at this call: K=12 is not divisible by "
                                        r"8 \(dim K/8\)"):
        fake(torch.empty(12, device="meta"))
    doubled = _fake("doubled", (("X", ("K*2",), SAME),), (("Y", ("K",)),))
    assert doubled(torch.empty(6, device="meta")).shape == (3,)
    with pytest.raises(CallError, match=r"doubled: output Y cannot be sized at this call: dim K\*2=5 of X gives "
                                        r"no whole K"):
        doubled(torch.empty(5, device="meta"))


def test_a_runner_the_release_fills_outputs_into_takes_same_as_the_operator_dtype():
    """A runner built without its outputs (``Release`` fills them from the declaration) whose inputs have no
    ``"same"`` tensor: the dispatcher took ``"same"`` for the first input's dtype (int32 here) and refused the
    reference's float16 answer; the declaration's rule (``call_dtypes``) is the operator's one dtype."""
    from tileship.runtime.dispatch import OpRunner, OpShape
    from tileship.runtime.loaded import Release

    decl = {"inputs": [["I", ["M"]]], "outputs": [["Y", ["M"]]], "dtypes": ["float16"],
            "tensor_dtypes": {"I": "int32", "Y": "same"}}
    runner = OpRunner(OpShape("gather", (("I", ("M",)),), 1, dtypes=("int32",)), lambda i: i.half(), [])
    rel = Release("r", None, "k", {}, {}, "", None, {"gather": runner}, declarations={"gather": decl})
    assert rel.op("gather").shape.out_dtypes == ("float16",)
    y = rel.op("gather")(torch.arange(4, dtype=torch.int32))
    assert y.dtype == torch.float16 and y.tolist() == [0, 1, 2, 3]


def test_why_names_what_was_wrong():
    assert shape_or_why(["M", "K/8"], {"M": 2}) == (None, "no input gives dim K (dim K/8)")
    assert shape_or_why(["M"], {"M": -1}) == (None, "M=-1 is not a size (dim M)")
    assert shape_or_why(["M"], {"M": 0}) == ((0,), "")
    assert shape_or_why([], {}) == ((), "")
    assert "fixed size must be a positive int" in shape_or_why(["0"], {})[1]
    assert outputs_at([], {}, {"M": 1}, "float16") == ()  # an operator that only updates inputs in place
