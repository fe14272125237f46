"""A user's kernels in upstream TileLang styles (``tests/user_styles.py``) through declare -> build -> load -> call
-> verify on the CPU "c" target."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("tilelang")

import user_styles  # noqa: E402

from tileship.build.builder import BuildOptions, build  # noqa: E402
from tileship.declare.project import Project, load_operators  # noqa: E402
from tileship.declare.spec import TensorArg  # noqa: E402

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def styles_build(tmp_path_factory):
    proj = Project(model="styles", model_version="1", operator_modules=("user_styles",), targets=("c",), root=TESTS)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("styles"), BuildOptions(jobs=2))
    return res


def test_outputs_omitted_are_read_from_the_decorators_out_idx():
    """``@tilelang.jit(out_idx=-1)`` on a lazy kernel names its output as TileLang's own ``kernel(a)`` uses it; with
    ``outputs=`` omitted the declaration was refused (``is omitted but the kernel allocates no outputs with
    T.empty``). The output is now read from the parameter the decorator names."""
    from tileship.declare.outputs import infer_outputs

    assert infer_outputs(user_styles.negated).outputs == (TensorArg("B", ("N",)),)


def test_a_kernel_declared_by_its_out_idx_alone_builds_and_serves_every_shape(styles_build):
    from tileship.runtime.loader import load

    assert not [r.spec.id for r in styles_build.failed if r.spec.op == "negated"]
    rel = load(styles_build.path)
    for n in (16, 5, 64):
        a = torch.randn(n)
        y, d = rel.op("negated").call(a)
        assert (d.path, d.reason) == ("kernel", "kernel") and torch.equal(y, -a), (n, d)


def test_parameters_named_like_the_ranges_dynamic_var_build_and_verify(styles_build):
    """A range over K traced the kernel with ``T.dynamic("k")``; a tensor parameter ``k`` (or a scalar ``n`` beside a
    range over N) then failed the C compile (``conflicting declaration 'int32_t k'``, ``redefinition of 'int32_t
    n'``), and the reference served every call. The var is now renamed where a parameter holds its name."""
    from tileship.runtime.loader import load
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    failed = {r.spec.id: r.error for r in styles_build.failed}
    assert failed == {}, failed
    rel = load(styles_build.path)
    for kk in (1, 8, 13):
        k = torch.randn(4, kk)
        y, d = rel.op("row_sum_k").call(k)
        assert (d.path, d.reason) == ("kernel", "kernel") and torch.allclose(y, k.sum(-1), atol=1e-5), (kk, d)
    for n, x in ((3, torch.randn(8)), (40, torch.randn(33))):
        y, d = rel.op("first_n").call(n, x)
        assert (d.path, d.reason) == ("kernel", "kernel") and torch.equal(y, user_styles.first_n_ref(n, x)), (n, d)
    report = verify(styles_build.path, VerifyOptions(timing=False), write=False)
    assert {v.spec.id: v.failure for v in report.verdicts} == {
        "copied.float32.M1-64_N8.c": None, "copied.float32.M4_N8.c": None, "first_n.float32.N1-64.c": None,
        "negated.float32.N16.c": None, "negated.float32.N1-64.c": None,
        "row_sum_k.float32.M4_K1-64.c": None, "scaled_.float32.N8.c": SCALED_, **EAGER}


#: the eager kernels whose own T.dynamic var is named like a parameter: every specialization verified
EAGER = {"first_n_eager.float32.N8.c": None, "first_n_eager.float32.N1-64.c": None,
         "row_sum_eager.float32.M4_K8.c": None, "row_sum_eager.float32.M4_K1-64.c": None}


def test_an_eager_kernels_own_dynamic_var_named_like_a_parameter_builds_and_serves(styles_build):
    """An eager kernel naming its own ``T.dynamic("k")`` beside a tensor parameter ``k`` (or ``T.dynamic("n")`` beside
    a scalar ``n``) failed every build (``conflicting declaration 'int32_t k'``, ``redefinition of 'int32_t n'``):
    tileship renamed only the var it passes a factory. The kernel's own var is now renamed in the traced function
    (``declare.var_names``) and every declared shape, static and ranged, is served by the kernel."""
    from tileship.runtime.loader import load

    failed = {r.spec.id: r.error for r in styles_build.failed if r.spec.op.endswith("_eager")}
    assert failed == {}, failed
    rel = load(styles_build.path)
    for kk in (8, 1, 13, 64):
        k = torch.randn(4, kk)
        y, d = rel.op("row_sum_eager").call(k)
        assert (d.path, d.reason) == ("kernel", "kernel") and torch.allclose(y, k.sum(-1), atol=1e-5), (kk, d)
    for n, x in ((3, torch.randn(8)), (40, torch.randn(33)), (0, torch.randn(1))):
        y, d = rel.op("first_n_eager").call(x, n)
        assert (d.path, d.reason) == ("kernel", "kernel") and torch.equal(y, user_styles.first_n_ref(n, x)), (n, d)


def test_a_clashing_var_that_cannot_be_renamed_is_refused_naming_var_parameter_and_fix():
    """A var named like a parameter that no parameter's tensor holds as a plain dim (only in ``k * 2``) cannot be
    renamed through TVM: the specialization is refused before the compiler runs, naming the var, the parameter and
    what to rename (a plain dim is renamed: ``k`` -> ``k_dyn``)."""
    from tilelang import tvm

    from tileship.declare.var_names import rename_clashing
    from tileship.errors import BuildError

    tir = tvm.tirx
    k, handle = tir.Var("k", "int32"), tir.Var("k", "handle")

    def func(shape: tuple) -> object:
        return tir.PrimFunc([handle], tir.Evaluate(0), buffer_map={handle: tir.decl_buffer(shape, "float32", "k")})

    renamed = rename_clashing(func((k, 4)), "op.float32.K8.c")
    assert [str(d) for d in renamed.buffer_map[renamed.params[0]].shape] == ["k_dyn", "4"]
    with pytest.raises(BuildError) as info:
        rename_clashing(func((k * 2,)), "op.float32.K8.c")
    text = str(info.value)
    assert "T.dynamic var 'k'" in text and "tensor parameter 'k'" in text and 'T.dynamic("k_dyn")' in text, text
    assert info.value.spec_id == "op.float32.K8.c"


#: the verdict of ``scaled_``, whose reference returns the tensor it updated in place
SCALED_ = ("at N=8: scaled_.reference: the call answered Tensor; the operator declares 0 output tensor(s) (it only "
           "updates inputs in place: its reference returns None)")


def test_a_reference_returning_its_updated_input_fails_verify_saying_so(styles_build):
    """An operator that only updates X in place, whose reference returns X (``x.mul_(s)``): verify said ``the kernel
    returned 1 and the reference 2 outputs; 1 are declared``, counting the updated input as an output of both
    paths. The reference's answer is now held to the declaration first (``runtime.answer``), in words that say what
    the reference should return."""
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    report = verify(styles_build.path, VerifyOptions(timing=False), write=False)
    assert {v.spec.id: v.failure for v in report.verdicts}["scaled_.float32.N8.c"] == SCALED_


def test_a_factory_with_positional_only_dims_builds_and_serves(styles_build):
    """``def copy_rows(M, N, /, dtype)``: the declaration was accepted, then every specialization failed to build
    (``TypeError: copy_rows() got some positional-only arguments passed as keyword arguments: 'M, N'``) and the
    reference served every call. The positional-only parameters are now passed by position."""
    from tileship.runtime.loader import load

    assert not [r.error for r in styles_build.failed if r.spec.op == "copied"]
    rel = load(styles_build.path)
    for m in (4, 9):
        a = torch.randn(m, 8)
        y, d = rel.op("copied").call(a)
        assert (d.path, d.reason) == ("kernel", "kernel") and torch.equal(y, a + 1), (m, d)


def test_a_positional_only_parameter_never_passed_is_refused_when_declared():
    """A required positional-only parameter the declaration never passes (``block``) passed check() and failed
    every build with a TypeError; it is refused like a keyword one."""
    import dataclasses

    from tileship.errors import DeclarationError

    def tiled(M, N, block, /, dtype="float32"):
        raise AssertionError("never traced")

    with pytest.raises(DeclarationError) as info:
        dataclasses.replace(user_styles.copied, factory=tiled).check()
    assert info.value.field == "config" and "requires ['block']" in str(info.value), str(info.value)
