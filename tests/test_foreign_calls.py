"""Calling foreign "c"-target operators (``tests/calls_ops.py``) the ways a user does and gets wrong: the wrong
number of arguments to an operator with scalars, ``out=`` tensors that alias each other or an input, an ``out=``
that requires grad, and an output of the operator dtype when no input has it (eager, ``out=``, fake tensors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("tilelang")


from tileship.errors import CallError  # noqa: E402

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    import tileship
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import Project, load_operators

    proj = Project(model="calls", model_version="1", operator_modules=("calls_ops",), targets=("c",), root=TESTS)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("calls"), BuildOptions(jobs=2))
    assert res.ok, [(r.spec.id, r.error) for r in res.failed]
    return tileship.load(res.path)


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
