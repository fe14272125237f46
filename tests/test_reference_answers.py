"""A reference that answers other than declared, called in process (``release.op(name)(...)``, ``.call``, ``out=``,
the torch custom op, the circuit breaker's rerun): float64 where float32 is declared, the wrong shape, a NumPy
array, a tuple of the wrong length, a tensor from an operator with no outputs. Each was returned to the caller as
it came (only the server checked it); each is now a ``DeclarationError`` naming the operator, the output, what it
got and what is declared, on every route through the dispatcher (``runtime.answer``)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from tileship.declare.spec import Specialization
from tileship.errors import DeclarationError
from tileship.runtime.dispatch import KERNEL, Decision, Entry, OpRunner, OpShape

ONE = OpShape("scale", (("X", ("M", "N")),), 1, outputs=(("Y", ("M", "N")),), out_dtypes=("same",))
TWO = OpShape("split", (("X", ("M", "N")),), 2, outputs=(("Y", ("M", "N")), ("S", ("M",))),
              out_dtypes=("same", "float32"))
NONE = OpShape("bump", (("X", ("M", "N")),), 0, mutates=(0,))

WRONG = [  # (id, shape, reference, the words of the error)
    ("float64", ONE, lambda x: x.double(), "output 'Y' of the call is float64 [4, 8]; the operator declares it "
                                           "float32 [4, 8] for this call"),
    ("a-row-short", ONE, lambda x: x[:-1], "output 'Y' of the call is float32 [3, 8]; the operator declares it "
                                           "float32 [4, 8]"),
    ("transposed", ONE, lambda x: x.t(), "output 'Y' of the call is float32 [8, 4]"),
    ("numpy", ONE, lambda x: x.numpy(), "the call answered ndarray; the operator declares 1 output tensor(s)"),
    ("none", ONE, lambda x: None, "the call answered nothing; the operator declares 1 output tensor(s)"),
    ("tuple-of-one", ONE, lambda x: (x,), "the call answered a tuple of 1 (Tensor); the operator declares 1"),
    ("list-of-one", ONE, lambda x: [x * 2], "the call answered a list of 1 (Tensor)"),
    ("two-of-three", TWO, lambda x: (x, x.sum(1), x), "the call answered a tuple of 3 (Tensor, Tensor, Tensor); "
                                                       "the operator declares 2 output tensor(s)"),
    ("two-of-one", TWO, lambda x: x, "the call answered Tensor; the operator declares 2 output tensor(s)"),
    ("second-float16", TWO, lambda x: (x, x.sum(1).half()), "output 'S' of the call is float16 [4]; the operator "
                                                            "declares it float32 [4]"),
    ("second-a-list", TWO, lambda x: [x, x.sum(1).tolist()], "the call answered a tuple of 2 (Tensor, list)"),
    ("no-outputs", NONE, lambda x: x.add_(1), "the call answered Tensor; the operator declares 0 output tensor(s)"),
    ("on-meta", ONE, lambda x: torch.empty_like(x, device="meta"), "output 'Y' of the call is on meta; the call's "
                                                                   "inputs are on cpu"),
    ("second-on-meta", TWO, lambda x: (x, x.sum(1).to("meta")), "output 'S' of the call is on meta; the call's "
                                                                 "inputs are on cpu"),
    ("undeclared-on-meta", OpShape("scale", (("X", ("M", "N")),), 1), lambda x: x.to("meta"),
     "output 0 of the call is on meta; the call's inputs are on cpu"),
]


def _calls(op: OpRunner, x: torch.Tensor) -> list[tuple[str, Any]]:
    """Every in-process way into the reference route: the first call of a key, the memoized one (inlined in
    ``__call__``) and its timed sample, ``.call``, ``out=``."""
    ways: list[tuple[str, Any]] = [("op()", lambda: op(x)), ("op() again", lambda: op(x)),
                                   ("op.call()", lambda: op.call(x))]
    ways += [(f"op() #{i}", lambda: op(x)) for i in range(3, 70)]  # past one SAMPLE: the timed call too
    if op.shape.n_outputs == 1:
        ways.append(("out=", lambda: op(x, out=torch.empty(4, 8))))
    return ways


@pytest.mark.parametrize("name,shape,reference,words", WRONG, ids=[w[0] for w in WRONG])
def test_an_answer_unlike_the_declaration_is_refused_on_every_in_process_route(name, shape, reference, words):
    op = OpRunner(shape, reference, [])  # no kernel: every call is the reference's (undeclared_shape)
    x = torch.randn(4, 8)
    for way, call in _calls(op, x):
        with pytest.raises(DeclarationError) as info:
            call()
        e = info.value
        assert (e.operator, e.field) == (shape.name, "reference"), (way, str(e))
        assert words in str(e) and f"{shape.name}.reference: " in str(e), (way, str(e))


@pytest.mark.parametrize("i", range(6), ids=[w[0] for w in WRONG[:6]])
def test_the_torch_custom_op_and_the_breakers_rerun_refuse_it_too(i):
    """The custom op (``runner.call``) and a kernel whose NaN the reference reruns (``check_finite``)."""
    from tileship.runtime.dispatch import Release
    from tileship.torchops.custom_ops import register

    _, shape, reference, words = WRONG[i]
    decl = {"inputs": [["X", ["M", "N"]]], "outputs": [["Y", ["M", "N"]]], "dtypes": ["float32"]}
    rid = f"f00d0000000a{i:04d}"
    release = Release(release_id=rid, path=None, kernel_revision="test", model={}, lock={}, lock_digest="",
                      drift=None, ops={"scale": OpRunner(shape, reference, [])}, declarations={"scale": decl})
    with pytest.raises(DeclarationError, match=re.escape(words)):
        register(release).scale(torch.randn(4, 8))
    spec = Specialization("scale", "float32", (("M", 4), ("N", 8)), "c")
    nan = Entry(spec, lambda x: torch.full_like(x, float("nan")), Decision(KERNEL, KERNEL, spec.id))
    op = OpRunner(shape, reference, [nan], check_finite=True)
    with pytest.raises(DeclarationError, match=re.escape(words)):
        op(torch.randn(4, 8))


def test_an_answer_as_declared_is_returned_as_it_came():
    """Tensor subclasses, a list for several outputs (a tuple back), None for an operator with no outputs, and an
    undeclared dtype whose "same" output follows the call's dtype, all pass."""
    x = torch.randn(4, 8)
    p = torch.nn.Parameter(x.clone(), requires_grad=False)
    assert OpRunner(ONE, lambda x: p, [])(x) is p
    y, s = OpRunner(TWO, lambda x: [x, x.sum(1)], [])(x)
    assert torch.equal(y, x) and torch.equal(s, x.sum(1))
    assert OpRunner(NONE, lambda x: None, [])(x) is None
    assert OpRunner(ONE, lambda x: x * 2, [])(x.double()).dtype == torch.float64
    unknown = OpShape("scale", (("X", ("M", "N")),), 1)  # outputs not declared: only the count and type
    assert OpRunner(unknown, lambda x: x.t(), [])(x).shape == (8, 4)


def test_inputs_of_the_operator_dtype_that_disagree_leave_the_output_dtype_to_the_reference():
    """float32 and float64 where both are "same" (``undeclared_dtype``: the reference serves): torch promotes, and
    nothing declares which one the output has; its shape is still held (a row short is refused)."""
    shape = OpShape("add", (("A", ("N",)), ("B", ("N",))), 1, outputs=(("C", ("N",)),), out_dtypes=("same",))
    a, b = torch.randn(8), torch.randn(8, dtype=torch.float64)
    y, d = OpRunner(shape, lambda a, b: a + b, []).call(a, b)
    assert y.dtype == torch.float64 and d.path == "reference", d
    with pytest.raises(DeclarationError, match=r"output 'C' of the call is float64 \[7\]"):
        OpRunner(shape, lambda a, b: (a + b)[1:], [])(a, b)
