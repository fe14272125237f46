"""Declarations as kernels are written: per-tensor dtypes, derived dims (``K/8``), a sample hook;
built for the CPU target, then dispatched, verified, served and traced with them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import pytest
import torch

from tileship.build.builder import BuildOptions, build
from tileship.declare.dims import DimExpr, bind
from tileship.declare.inputs import make_inputs
from tileship.declare.project import Project, load_operators
from tileship.declare.spec import DynamicRange, TensorArg, Tolerance, describe, expand
from tileship.errors import DeclarationError

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def typed_ops():
    import typed_ops

    return typed_ops


@pytest.fixture(scope="module")
def typed_release(tmp_path_factory):
    proj = Project(model="typed", model_version="1", operator_modules=("typed_ops",), targets=("c",), root=TESTS)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("typed"), BuildOptions(jobs=2))
    assert res.ok, [(r.spec.id, r.error) for r in res.failed]
    return res.path


# -- declaration -------------------------------------------------------------------------

BAD = [
    ("tensor-dtype", dict(inputs=(TensorArg("A", ("N",)), TensorArg("Q", ("N/8",), dtype="int4"))), "inputs.Q.dtype",
     'write "same"'),
    ("dim-expression", dict(inputs=(TensorArg("A", ("N",)), TensorArg("Q", ("N/8+1",), dtype="int32"))),
     "inputs.Q.dims", "<dim>/<int>"),
    ("dim-zero", dict(inputs=(TensorArg("A", ("N",)), TensorArg("Q", ("N/0",), dtype="int32"))), "inputs.Q.dims",
     "positive int"),
    ("dims-string", dict(inputs=(TensorArg("A", "N"), TensorArg("Q", ("N/8",), dtype="int32"))), "inputs.A.dims",
     "(note the comma)"),
    ("shape-not-exact", dict(shapes=({"N": 60},)), "shapes[0].N", "use a N that divides"),
    ("range-of-one-size-is-exact", dict(shapes=(), ranges=(DynamicRange("N", 8, 8),)), None, None),
    ("range-divided-dynamic", dict(shapes=(), ranges=(DynamicRange("N", 8, 64),)), "ranges[0].dim",
     "declare static shapes"),
    ("tolerance-key", dict(tolerances={"nope": Tolerance(0, 0)}), "tolerances.nope", "key by operator dtype"),
    ("tolerance-value", dict(tolerances={"Z": (0, 0)}), "tolerances.Z", "Tolerance(atol, rtol)"),
    ("sample-not-callable", dict(sample=3), "sample", "sample=fn(dims, dtype, device)"),
    ("output-base-unknown", dict(outputs=(TensorArg("C", ("P/2",)),)), "outputs.C", None),
]


@pytest.mark.parametrize("change,field,hint", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_declaration_names_the_field_and_the_fix(typed_ops, change, field, hint):
    op = dataclasses.replace(typed_ops.qadd, **change)
    if field is None:  # valid: a range whose dynamic dim is the only value keeps exactness
        op.check()
        return
    with pytest.raises(DeclarationError) as info:
        op.check()
    assert info.value.field == field, str(info.value)
    assert f"qadd.{field}" in str(info.value)
    if hint:
        assert hint in str(info.value), str(info.value)


def test_only_base_dims_reach_ids_and_descriptions(typed_ops):
    assert typed_ops.qadd.dims == ("N",)
    assert sorted(s.id for s in expand(typed_ops.qadd))[:2] == ["qadd.float32.N256.c", "qadd.float32.N64.c"]
    d = describe(typed_ops.masked_rows)
    assert d["tensor_dtypes"] == {"X": "same", "mask": "uint8", "Y": "same", "mean": "float32"}
    assert d["output_tolerances"] == {"mean": {"atol": 1e-5, "rtol": 1e-5}}
    assert typed_ops.masked_rows.tolerance("float64", "mean") == Tolerance(1e-5, 1e-5)
    assert typed_ops.masked_rows.tolerance("float64", "Y") == Tolerance(1e-9, 1e-9)


@pytest.mark.parametrize("expr,base,size,want", [("K/8", 64, 8, True), ("K//128", 256, 2, True), ("K*2", 3, 6, True),
                                                 ("K/8", 60, None, False)],
                         ids=["div", "floordiv", "mul", "inexact"])
def test_dim_expressions(expr, base, size, want):
    e = DimExpr.parse(expr)
    assert e.exact(base) is want
    if want:
        assert e.apply(base) == size and e.inverse(size) == base


def test_bind_derived_dims():
    decl = [("x", ("M", "K")), ("qweight", ("N", "K/8"))]
    assert bind(decl, [(2, 64), (3, 8)]).dims == {"M": 2, "K": 64, "N": 3}
    b = bind(decl, [(2, 64), (3, 9)])
    assert b.problem == "derived" and b.argument == "qweight" and "K/8=9" in b.message
    assert bind([("q", ("K/8",))], [(4,)]).dims == {"K": 32}  # the base only appears derived


def test_default_inputs_follow_each_dtype():
    decl = [("x", ("N",)), ("lengths", ("N",)), ("mask", ("N",)), ("q", ("N/2",))]
    x, lengths, mask, q = make_inputs(decl, {"N": 64}, "float32", "cpu", 0, dtypes=("same", "int32", "bool", "uint8"))
    assert (x.dtype, lengths.dtype, mask.dtype, q.dtype) == (torch.float32, torch.int32, torch.bool, torch.uint8)
    assert q.shape == (32,) and set(q.unique().tolist()) <= {0, 1} and lengths.abs().max() <= 8


def test_sample_hook_is_used_and_checked(typed_ops):
    decl = [("A", ("N",)), ("Q", ("N/8",))]
    a, q = make_inputs(decl, {"N": 64}, "float32", "cpu", 3, dtypes=("same", "int32"), sample=typed_ops.qadd_sample)
    again = make_inputs(decl, {"N": 64}, "float32", "cpu", 3, dtypes=("same", "int32"), sample=typed_ops.qadd_sample)
    assert q.min() >= 0 and torch.equal(q, again[1])  # the hook's values, reproducible per seed
    with pytest.raises(ValueError, match="sample\\(\\) returned Q as torch.int32 \\(8,\\); declared int64"):
        make_inputs(decl, {"N": 64}, "float32", "cpu", 3, dtypes=("same", "int64"), sample=typed_ops.qadd_sample)


# -- build -> load -> call ---------------------------------------------------------------

def test_dispatch_follows_each_tensor_dtype_and_derived_dims(typed_release):
    from tileship.runtime.loader import load

    rel = load(typed_release)
    op = rel.op("qadd")
    a, q = torch.randn(64), torch.randint(0, 1 << 20, (8,), dtype=torch.int32)
    (c, z), d = op.call(a, q)
    ref_c, ref_z = op.reference(a, q)
    assert (d.path, d.spec_id) == ("kernel", "qadd.float32.N64.c")
    assert c.dtype == torch.float32 and z.dtype == torch.int32 and torch.equal(z, ref_z) and torch.allclose(c, ref_c)
    _, d = op.call(a, q.long())
    assert (d.path, d.reason) == ("reference", "undeclared_dtype")
    _, d = op.call(a.double(), q)
    assert (d.path, d.spec_id) == ("kernel", "qadd.float64.N64.c")
    entry = op._resolve(op._key_of((a, q[:7])), (a, q[:7]))  # K/8 = 7 but N = 64: the reference would raise
    assert (entry.decision.path, entry.decision.reason) == ("reference", "undeclared_shape")
    assert op.snapshot()["reference:undeclared_dtype"] == 1
    m = rel.op("masked_rows")
    x, mask = torch.randn(8, 32, dtype=torch.float64), torch.tensor([1, 0] * 4, dtype=torch.uint8)
    (y, mean), d = m.call(x, mask)
    assert d.path == "kernel" and mean.dtype == torch.float32 and y.dtype == torch.float64
    assert torch.equal(y[1], torch.zeros(32, dtype=torch.float64)) and torch.allclose(mean, x.mean(-1).float())


def test_verify_sizes_poison_and_tolerance_per_output(typed_release):
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    res = verify(typed_release, VerifyOptions(timing=False, seeds=(0,)), write=False)
    assert res.ok, [(v.spec.id, v.failure) for v in res.verdicts]
    assert {v.spec.op for v in res.verdicts} == {"qadd", "masked_rows", "scaled_add"}
    assert all(p.poison_confirmed for v in res.verdicts for p in v.points)


def test_int_poison_is_a_sentinel_and_caught():
    from tileship.verify.compare import check_output, fill_poison

    out = fill_poison(torch.empty(8, dtype=torch.int32))
    out[:5] = 1
    c = check_output(out, torch.ones(8, dtype=torch.int32), atol=0, rtol=0)
    assert c.unwritten == 3 and "never written" in c.failure
    b = fill_poison(torch.empty(4, dtype=torch.bool))
    assert int(check_output(b, torch.ones(4, dtype=torch.bool), atol=0, rtol=0).unwritten) == 4


def test_fake_tensors_have_each_outputs_dtype_and_derived_size(typed_release):
    from tileship.runtime.loader import load
    from tileship.torchops.custom_ops import register

    ops = register(load(typed_release))
    c, z = ops.qadd(torch.empty(64, device="meta"), torch.empty(8, dtype=torch.int32, device="meta"))
    assert (c.shape, c.dtype, z.shape, z.dtype) == ((64,), torch.float32, (8,), torch.int32)
    y, mean = ops.masked_rows(torch.empty(8, 32, dtype=torch.float64, device="meta"),
                              torch.empty(8, dtype=torch.uint8, device="meta"))
    assert (y.dtype, mean.dtype, mean.shape) == (torch.float64, torch.float32, (8,))
    fn = torch.compile(lambda a, q: ops.qadd(a, q)[1], fullgraph=True, backend="eager")
    q = torch.randint(0, 9, (8,), dtype=torch.int32)
    assert torch.equal(fn(torch.randn(64), q), q + 1)


def test_serve_takes_int_inputs_and_lists_each_datatype(typed_release):
    from tileship.serve import BackgroundServer, ServeConfig

    srv = BackgroundServer(ServeConfig(source=typed_release)).start()
    try:
        assert srv.wait_ready(), srv.service.holder.readiness()[1]
        base = f"http://127.0.0.1:{srv.port}/v2/models"
        meta = httpx.get(f"{base}/qadd").json()
        assert meta["inputs"] == [{"name": "A", "datatype": "FP32", "shape": [-1]},
                                  {"name": "Q", "datatype": "INT32", "shape": [-1]}]
        assert meta["outputs"][1] == {"name": "Z", "datatype": "INT32", "shape": [-1]}
        assert httpx.get(f"{base}/masked_rows").json()["inputs"][1] == {"name": "mask", "datatype": "UINT8",
                                                                        "shape": [8]}
        body = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [64], "data": [0.5] * 64},
                           {"name": "Q", "datatype": "INT32", "shape": [8], "data": [0x21] * 8}]}
        r = httpx.post(f"{base}/qadd/infer", json=body)
        assert r.status_code == 200, r.text
        outs = {o["name"]: o for o in r.json()["outputs"]}
        assert outs["Z"]["datatype"] == "INT32" and outs["Z"]["data"] == [0x22] * 8
        assert outs["C"]["data"][:3] == [1.5, 2.5, 0.5]
        body["inputs"][1]["datatype"] = "INT64"
        r = httpx.post(f"{base}/qadd/infer", json=body)
        assert r.status_code == 400 and "input Q is INT64; model qadd declares it INT32" in r.text
        body["inputs"][1].update(datatype="INT32", shape=[7], data=[1] * 7)
        r = httpx.post(f"{base}/qadd/infer", json=body)
        assert r.status_code == 400 and "N/8=7" in r.text
        mask = {"inputs": [{"name": "X", "datatype": "FP64", "shape": [8, 32], "data": [1.0] * 256},
                           {"name": "mask", "datatype": "UINT8", "shape": [8], "data": [1] * 8}]}
        r = httpx.post(f"{base}/masked_rows/infer", json=mask)
        assert r.status_code == 200 and {o["name"]: o["datatype"] for o in r.json()["outputs"]} == {
            "Y": "FP64",
            "mean": "FP32",
        }
    finally:
        srv.stop()


def test_report_shows_each_tensor_dtype(typed_release):
    import json

    from tileship.verify.report import signature

    desc = json.loads((typed_release / "release.json").read_text())["operators"]["qadd"]
    assert signature(desc) == "A: same (N), Q: int32 (N/8) -> C: same (N), Z: int32 (N/8) [same = float32 | float64]"


def test_a_sample_hook_or_reference_that_raises_is_a_verdict_not_a_crash(typed_release, typed_ops):
    import json

    from tileship.declare.spec import Specialization
    from tileship.runtime.loader import load_artifact
    from tileship.verify.spec_check import VerifyOptions, verify_spec

    rel = json.loads((typed_release / "release.json").read_text())
    sid = "qadd.float32.N64.c"
    spec = Specialization.from_json(rel["specializations"][sid]["spec"])
    kernel = load_artifact(typed_release / "specs" / sid, sid)
    opts = VerifyOptions(timing=False, seeds=(0,))

    def bad_sample(dims, dtype, device):
        raise ZeroDivisionError("no lengths")

    def bad_reference(a, q):
        raise ValueError("shape trouble")

    v = verify_spec(spec, kernel, typed_ops.qadd_reference, rel["operators"]["qadd"], options=opts, sample=bad_sample)
    assert not v.passed and "making inputs failed: ZeroDivisionError: no lengths" in v.failure
    v = verify_spec(spec, kernel, bad_reference, rel["operators"]["qadd"], options=opts, sample=typed_ops.qadd_sample)
    assert not v.passed and "reference raised ValueError: shape trouble" in v.failure


# -- scalar arguments --------------------------------------------------------------------

def test_scalar_args_are_passed_by_value_and_never_keyed_by_value(typed_release):
    from tileship.errors import CallError
    from tileship.runtime.loader import load

    op = load(typed_release).op("scaled_add")
    a = torch.randn(128)
    out, d = op.call(a, 0.5, 3)
    assert (d.path, d.spec_id) == ("kernel", "scaled_add.float32.N128.c") and torch.allclose(out, a * 0.5 + 3)
    out, d = op.call(a, 2.0, -1)  # another value, the same specialization and memo entry
    assert d.path == "kernel" and torch.allclose(out, a * 2 - 1) and len(op._memo) == 1
    _, d = op.call(torch.randn(100), 2.0, 1)
    assert (d.path, d.reason) == ("reference", "undeclared_shape")
    with pytest.raises(CallError, match=r"scaled_add\(s\): is a ScalarArg: pass a Python number, got Tensor"):
        op.call(a, torch.tensor(0.5), 1)
    # a float for the int32 scalar is the caller's error, not a kernel fault: nothing trips the breaker
    with pytest.raises(CallError, match=r"scaled_add\(n\): is an int32 ScalarArg, got float 2.5"):
        op(a, 0.5, 2.5)
    with pytest.raises(CallError, match=r"is an int32 ScalarArg, got bool"):
        op.call(a, 0.5, True)
    out, d = op.call(a, 1, 3)  # an int for the float32 scalar is fine
    assert d.path == "kernel" and torch.allclose(out, a + 3) and not op.faults


def test_scalar_args_verify_trace_and_serve(typed_release):
    from tileship.runtime.loader import load
    from tileship.serve import BackgroundServer, ServeConfig
    from tileship.torchops.custom_ops import register
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    res = verify(typed_release, VerifyOptions(timing=False, seeds=(0,), only=("scaled_add",)), write=False)
    assert res.ok, [(v.spec.id, v.failure) for v in res.verdicts]
    ops = register(load(typed_release))
    a = torch.randn(128)
    assert torch.allclose(ops.scaled_add(a, 0.25, 2), a * 0.25 + 2)
    fn = torch.compile(lambda x: ops.scaled_add(x, 0.25, 2), fullgraph=True, backend="eager")
    assert torch.allclose(fn(a), a * 0.25 + 2)
    srv = BackgroundServer(ServeConfig(source=typed_release)).start()
    try:
        assert srv.wait_ready(), srv.service.holder.readiness()[1]
        base = f"http://127.0.0.1:{srv.port}/v2/models/scaled_add"
        meta = httpx.get(base).json()
        assert meta["inputs"][1:] == [{"name": "s", "datatype": "FP32", "shape": []},
                                      {"name": "n", "datatype": "INT32", "shape": []}]
        body = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [128], "data": [1.0] * 128},
                           {"name": "s", "datatype": "FP32", "shape": [1], "data": [0.5]},
                           {"name": "n", "datatype": "INT32", "shape": [1], "data": [2]}]}
        r = httpx.post(f"{base}/infer", json=body)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"][:2] == [2.5, 2.5], r.text
        body["inputs"][1]["shape"] = [2]
        body["inputs"][1]["data"] = [0.5, 0.5]
        r = httpx.post(f"{base}/infer", json=body)
        assert r.status_code == 400 and "input s is a scalar; send shape [1]" in r.text
    finally:
        srv.stop()


def test_scalar_output_is_refused_with_the_fix(typed_ops):
    from tileship.declare.spec import ScalarArg

    op = dataclasses.replace(typed_ops.scaled_add, outputs=(ScalarArg("B"),))
    with pytest.raises(DeclarationError) as info:
        op.check()
    assert info.value.field == "outputs.B" and "a kernel writes tensors, not scalars" in str(info.value)
    assert 'TensorArg("B", ("M",))' in str(info.value)
