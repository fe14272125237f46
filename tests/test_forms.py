"""Every factory form declares with no wrapper: a plain function imported from another module, a
``@tilelang.jit`` object (its pass configs inherited), an ``@autotune``-wrapped jit, and an
eager-style kernel whose outputs are its ``T.empty`` tensors. Each builds and runs on "c"."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tileship.build.builder import BuildOptions, build
from tileship.declare.project import Project, load_operators
from tileship.declare.spec import describe
from tileship.errors import DeclarationError

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def forms():
    import forms_ops

    return forms_ops


@pytest.fixture(scope="module")
def forms_build(tmp_path_factory):
    proj = Project(model="forms", model_version="1", operator_modules=("forms_ops",), targets=("c",), root=TESTS)
    return build(proj, load_operators(proj), tmp_path_factory.mktemp("forms"), BuildOptions(jobs=2))


def test_every_form_is_recorded(forms):
    ops = load_operators(Project(model="f", model_version="1", operator_modules=("forms_ops",), targets=("c",),
                                 root=TESTS))
    info = {n: describe(o)["factory_info"] for n, o in ops.items()}
    assert {n: i["form"] for n, i in info.items()} == {"eager_add": "jit", "imported_scale": "function",
                                                       "jit_add": "jit", "tuned_add": "autotune"}
    assert info["imported_scale"]["function"] == "forms_helpers.scale_kernel" and info["imported_scale"]["sources"] == [
        "forms_helpers.py"
    ]
    assert all(o.module == "forms_ops" for o in ops.values())  # the declaring module, not the factory's
    d = describe(ops["jit_add"])
    assert d["pass_configs"] == {"tl.disable_tma_lower": True, "tl.disable_warp_specialized": False}
    assert d["pass_configs_overridden"] == ["tl.disable_warp_specialized"]
    eager = describe(ops["eager_add"])
    assert eager["outputs"] == [["C", ["N"]], ["S", ["N/2"]]] and eager["tensor_dtypes"]["S"] == "int32"


def test_every_form_builds_loads_and_runs(forms_build):
    from tileship.runtime.loader import load
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    assert forms_build.ok, [(r.spec.id, r.error) for r in forms_build.failed]
    art = json.loads(next((forms_build.path / "specs").glob("jit_add.*")).joinpath("artifact.json").read_text())
    assert art["factory"]["form"] == "jit" and art["pass_configs"]["tl.disable_tma_lower"] is True
    res = verify(forms_build.path, VerifyOptions(timing=False, seeds=(0,)), write=False)
    assert res.ok and len(res.verdicts) == 4, [(v.spec.id, v.failure) for v in res.verdicts]
    rel = load(forms_build.path)
    (c, s), d = rel.op("eager_add").call(torch.ones(128), torch.ones(128))
    assert (
        d.path == "kernel"
        and torch.equal(c, torch.full((128,), 2.0))
        and torch.equal(s, torch.arange(64, dtype=torch.int32))
    )
    out, d = rel.op("tuned_add").call(torch.ones(1000), torch.ones(1000))
    assert d.path == "kernel" and torch.equal(out, torch.full((1000,), 2.0))
    out, d = rel.op("imported_scale").call(torch.ones(100))
    assert d.path == "kernel" and torch.equal(out, torch.full((100,), 2.0))


def test_build_worker_finds_the_operator_in_the_declaring_module():
    from tileship.build.worker import find_operator
    from tileship.errors import BuildError

    assert find_operator("forms_ops", "imported_scale").name == "imported_scale"
    with pytest.raises(BuildError,
                       match=r"module forms_helpers declares no Operator named 'imported_scale' \(it declares: none\)"):
        find_operator("forms_helpers", "imported_scale")


# -- what a declaration cannot say, and what to write instead --------------------------------

def _errors(forms):
    return [
        ("jit-wrong-param", dataclasses.replace(forms.jit_add, config={"blok": 64}), "config.blok",
         "factory add_jit() (jit) has no parameter 'blok' (it takes: N, dtype, block)"),
        ("jit-dtype-param", dataclasses.replace(forms.imported_scale, params={}), "dtype_param",
         'params={"dtype": None} when the factory hard-codes it'),
        ("params-unknown-name", dataclasses.replace(forms.imported_scale, params={"dtype": "in_dtype", "Q": "q"}),
         "params.Q", "map a declared dim or \"dtype\""),
        ("params-dim-none", dataclasses.replace(forms.imported_scale, params={"dtype": "in_dtype", "N": None}),
         "params.N", 'params={"N": "n"}'),
        ("no-dtype-two-dtypes", dataclasses.replace(forms.eager_add, dtypes=("float32", "float16")), "params.dtype",
         'declare dtypes=("float32",)'),
        ("required-not-passed", dataclasses.replace(forms.imported_scale, params={"dtype": "in_dtype", "N": "factor"}),
         "config", "add them to config={...}"),
        ("primfunc-not-factory", dataclasses.replace(forms.jit_add, factory=forms.add_jit.get_tir(N=64)), "factory",
         "pass the function that returns the T.prim_func"),
    ]


def test_unsupported_declarations_name_the_field_and_the_fix(forms):
    for case, op, field, words in _errors(forms):
        with pytest.raises(DeclarationError) as info:
            op.check()
        assert info.value.field == field, (case, str(info.value))
        assert words in str(info.value), (case, str(info.value))


def test_outputs_omitted_without_t_empty_names_outputs(forms):
    from tileship.declare.outputs import infer_outputs

    op = dataclasses.replace(forms.jit_add, outputs=())
    op.check()  # omitting outputs is valid to declare; the trace says whether the kernel has T.empty ones
    with pytest.raises(DeclarationError) as info:
        infer_outputs(op)
    assert info.value.field == "outputs" and "allocates no outputs with T.empty" in str(info.value)
    assert "declare outputs=(TensorArg(name, dims), ...)" in str(info.value)


def test_outputs_that_disagree_with_t_empty_fail_naming_both(tmp_path):
    from forms_bad import eager_one_output

    from tileship.build.builder import compile_one
    from tileship.declare.spec import expand

    r = compile_one(eager_one_output, expand(eager_one_output)[0], tmp_path / "out", timeout_s=120, sys_path=str(TESTS))
    assert not r.ok
    assert "outputs= declares 1 outputs (C) but the kernel's T.empty outputs are parameters [2, 3] (C, S)" in r.error, \
        r.error


def test_a_factory_that_returns_no_primfunc_is_a_build_error_naming_the_specialization():
    """``trace`` refuses a factory whose result is not a PrimFunc with a BuildError that names the
    specialization (it had raised a TypeError of its own: BuildError took no ``spec_id``)."""
    import dataclasses

    from tileship.catalog.cpu import add
    from tileship.declare.factory import trace
    from tileship.declare.spec import expand
    from tileship.errors import BuildError

    op = dataclasses.replace(add, factory=lambda N, dtype="float32", block=256: 42)
    spec = expand(op)[0]
    with pytest.raises(BuildError) as exc:
        trace(op, spec)
    assert exc.value.spec_id == spec.id and "returned int, not a PrimFunc" in str(exc.value)
