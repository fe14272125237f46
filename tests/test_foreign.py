"""Foreign kernels (``tests/foreign_ops.py``: TileLang's own examples, unedited) through tileship's public API:
eager kernels whose dims are ``T.const``, a dtype passed to two factory parameters, an output before two
buffers updated in place (``out_idx=[-3]``), a kernel whose dims are its own ``T.dynamic`` names; each built
for sm_90a with nvcc and loaded on a machine without a GPU (the reference serves, saying why), and the CPU
kernels built for "c", loaded with no JIT and called against their references. Declaration mistakes a user
makes name the field or the kernel's parameter, and a dtype or shape the kernel cannot take fails that
specialization alone."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("tilelang")

import foreign_ops  # noqa: E402

from tileship.build.builder import BuildOptions, build  # noqa: E402
from tileship.declare.project import Project, load_operators  # noqa: E402
from tileship.declare.spec import describe, expand  # noqa: E402
from tileship.errors import BuildError, CallError, DeclarationError  # noqa: E402

TESTS = Path(__file__).parent


def _project(targets: tuple[str, ...]) -> Project:
    return Project(model="foreign", model_version="1", operator_modules=("foreign_ops",), targets=targets, root=TESTS)


def _build(targets: tuple[str, ...], names: tuple[str, ...], out: Path):
    """``tileship build`` of some of the operators: the project's (``load_operators``: T.empty outputs read)."""
    proj = _project(targets)
    ops = load_operators(proj)
    return build(proj, {n: ops[n] for n in names}, out, BuildOptions(jobs=2))


def _traced(op, spec_index: int = 0):
    from tileship.declare.factory import reconcile_out_idx, resolve, trace
    from tileship.declare.outputs import infer_outputs

    op = infer_outputs(op) if op.infers_outputs else op
    spec = expand(op)[spec_index]
    func = trace(op, spec)
    return op, spec, func, reconcile_out_idx(op, resolve(op.factory, operator=op.name), func)


# -- declaring: no compile ---------------------------------------------------------------------------------


def test_eager_kernels_declare_their_t_const_dims_and_leave_their_tensor_parameters_alone():
    """``def elementwise_add(A, B, block_M, ...)`` with ``M, N = T.const("M, N")``: A and B are TileLang's to bind,
    M and N go in by keyword although the signature does not list them (this was refused: 'factory
    elementwise_add() (jit) has no parameter 'M'')."""
    from tileship.declare.outputs import infer_outputs

    for op in (foreign_ops.ew_add, foreign_ops.gemv, foreign_ops.rms, foreign_ops.mm_dynamic):
        op.check()
    info = describe(foreign_ops.ew_add)["factory_info"]
    assert info["form"] == "jit" and info["tensor_params"] == ["A", "B"]
    assert "tensor_params" not in describe(foreign_ops.ln_fwd)["factory_info"]  # a lazy kernel's is unchanged
    assert infer_outputs(foreign_ops.ew_add).outputs == (foreign_ops.TensorArg("C", ("M", "N")),)
    assert infer_outputs(foreign_ops.gemv).outputs == (foreign_ops.TensorArg("C", ("N",)),)
    # the kernel's own T.dynamic("m"), ("n") name the declared dims M and N
    assert infer_outputs(foreign_ops.mm_dynamic).outputs == (foreign_ops.TensorArg("C", ("M", "N")),)
    _, spec, func, (_, positions) = _traced(foreign_ops.rms)
    assert spec.dynamic_dim == "M" and [str(s) for s in func.buffer_map[func.params[0]].shape] == ["m", "256"]
    assert positions == [1]


def test_a_config_key_an_eager_kernel_does_not_take_is_still_refused():
    op = dataclasses.replace(foreign_ops.gemv, config={"BLOCK_N": 128, "BLOK_K": 128})
    with pytest.raises(DeclarationError) as exc:
        op.check()
    assert exc.value.field == "config.BLOK_K" and "has no parameter 'BLOK_K'" in str(exc.value)


def test_a_dim_not_named_like_the_eager_kernels_t_const_names_the_t_const():
    a, b = foreign_ops.TensorArg("A", ("Kdim",)), foreign_ops.TensorArg("B", ("N", "Kdim"))
    op = dataclasses.replace(foreign_ops.gemv, inputs=(a, b), outputs=(foreign_ops.TensorArg("C", ("N",)),),
                             shapes=({"N": 256, "Kdim": 128},))
    with pytest.raises(BuildError) as exc:
        _traced(op)
    assert "the kernel's T.const dim K is none of the declared dims (Kdim, N)" in str(exc.value)
    assert 'params={"<declared dim>": "K"}' in str(exc.value)


def test_one_dtype_goes_to_every_factory_parameter_it_is_mapped_to():
    """``_layernorm_fwd(..., in_dtype="bfloat16", out_dtype="bfloat16")`` at float16: with ``"dtype": "in_dtype"``
    alone Y stays bfloat16 and the build refuses it; ``("in_dtype", "out_dtype")`` passes both."""
    from tileship.declare import contract

    op, spec, func, (_, positions) = _traced(foreign_ops.ln_fwd)
    assert [str(func.buffer_map[p].dtype) for p in func.params] == ["float16"] * 4 + ["float32"] * 2
    contract.check(op, spec, func, positions)
    old = dataclasses.replace(foreign_ops.ln_fwd, params={"dtype": "in_dtype"})
    old, spec, func, (_, positions) = _traced(old)
    with pytest.raises(BuildError, match=r"Y \(the kernel's parameter Y\): declared float16 but the kernel's is "
                                         r"bfloat16"):
        contract.check(old, spec, func, positions)
    for bad, words in (((), "must name each factory parameter once"),
                       (("in_dtype", "in_dtype"), "must name each factory parameter once"),
                       (("in_dtype", "dtype_out"), "has no parameter 'dtype_out'")):
        with pytest.raises(DeclarationError, match=words) as exc:
            dataclasses.replace(foreign_ops.ln_fwd, params={"dtype": bad}).check()
        assert exc.value.field == "params.dtype"


def test_an_output_before_buffers_updated_in_place_takes_the_kernels_out_idx():
    """``@tilelang.jit(out_idx=[-3])`` over (DY, X, gamma, Mean, Rstd, DX, DGamma, DBeta): DX is the output,
    the seven others the inputs in the kernel's order (this was refused: 'outputs= declares parameters [7]')."""
    from tileship.declare import contract

    op, spec, func, (out_idx, positions) = _traced(foreign_ops.ln_bwd)
    assert out_idx == positions == [5]
    contract.check(op, spec, func, positions)
    swapped = dataclasses.replace(op, inputs=(op.inputs[1], op.inputs[0], *op.inputs[2:]))
    with pytest.raises(BuildError, match="the same names in another order would be served swapped"):
        contract.check(swapped, spec, func, positions)
    two = dataclasses.replace(op, outputs=(*op.outputs, foreign_ops.TensorArg("extra", ("D",))))
    with pytest.raises(BuildError, match=r"outputs= declares 2 outputs \(DX, extra\) but "
                                         r"@tilelang.jit\(out_idx=\[-3\]\) makes parameters \[5\] its outputs \(DX\)"):
        _traced(two)


def test_a_plain_factorys_output_before_a_scalar_is_found_by_its_name():
    """``matmul_int_variable`` returns (A, B, C, offset) and upstream compiles it with ``out_idx=2``: a plain factory
    says nothing, so C is placed among the kernel's parameters by name (it was taken for the tail, where the int32
    offset is, and refused)."""
    from tileship.declare import contract

    op, spec, func, (out_idx, positions) = _traced(foreign_ops.mm_offset)
    assert out_idx == positions == [2]
    contract.check(op, spec, func, positions)


def test_a_scalar_declared_with_another_dtype_than_the_kernels_is_refused():
    """A float32 ScalarArg over the kernel's ``valid_len: T.int32`` let a call pass 2.5: the launch raised, the circuit
    opened and every later caller got the reference."""
    from tileship.declare import contract

    op = dataclasses.replace(foreign_ops.parallel,
                             inputs=(foreign_ops.parallel.inputs[0], foreign_ops.ScalarArg("valid_len", "float32")))
    op, spec, func, (_, positions) = _traced(op)
    assert positions == [1]
    with pytest.raises(BuildError, match=r"valid_len \(the kernel's parameter valid_len\): declared a float32 "
                                         r"ScalarArg but the kernel takes a int32"):
        contract.check(op, spec, func, positions)


def _one_input(a):
    return a


def _sample_two(dims, dtype):
    return ()


def test_a_reference_or_hook_that_cannot_take_its_arguments_is_refused_when_declared():
    """It built before and failed at the first call the kernel does not serve (a TypeError from the reference)."""
    with pytest.raises(DeclarationError) as exc:
        dataclasses.replace(foreign_ops.reduce_sum, reference=_one_input).check()
    assert exc.value.field == "reference" and "_one_input(a) cannot be called with the 2 arguments" in str(exc.value)
    assert "def ref(A, Init)" in str(exc.value)
    with pytest.raises(DeclarationError) as exc:
        dataclasses.replace(foreign_ops.reduce_sum, sample=_sample_two).check()
    assert exc.value.field == "sample" and "(dims, dtype, device)" in str(exc.value)


# -- the CPU target: build, load with no JIT, call ---------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_build(tmp_path_factory):
    return _build(("c",), ("reduce_sum", "reduce_xor", "parallel"), tmp_path_factory.mktemp("foreign-c"))


def test_cpu_kernels_build_where_they_lower_and_fail_apart_where_they_do_not(cpu_build):
    errors = {r.spec.id: r.error for r in cpu_build.failed}
    assert sorted(cpu_build.built) == ["parallel.float32.N64.c", "reduce_sum.float32.M3_N17.c",
                                       "reduce_xor.int32.M4_N8.c"], errors
    assert sorted(errors) == ["reduce_sum.float32.M1-64_N8.c", "reduce_xor.bool.M4_N8.c"]
    # the "c" target's limit, said before the compiler runs (``declare.c_target``), not the compiler's
    # ``cannot convert 'bool*' to 'int8_t*'``
    assert "reduce_xor.bool.M4_N8.c: the kernel's parameter 'A' is a bool tensor, which the CPU \"c\" target cannot " \
           "pass" in errors["reduce_xor.bool.M4_N8.c"], errors["reduce_xor.bool.M4_N8.c"]
    log = json.loads((cpu_build.path / "build-log.json").read_text())["specializations"]
    assert "a bool tensor" in json.dumps(log["reduce_xor.bool.M4_N8.c"])  # and in the build log


def test_cpu_kernels_load_with_no_jit_and_match_their_references(cpu_build):
    from tileship.runtime import nojit
    from tileship.runtime.loader import load

    rel = load(cpu_build.path)
    before = nojit.attempts()
    g = torch.Generator().manual_seed(0)
    a, init = torch.randn(3, 17, generator=g), torch.randn(3, generator=g)
    out, d = rel.op("reduce_sum").call(a, init)
    assert d.path == "kernel" and torch.allclose(out, init + a.sum(1), atol=1e-5), (d, out)
    a, init = torch.randn(5, 8, generator=g), torch.randn(5, generator=g)
    out, d = rel.op("reduce_sum").call(a, init)  # the range that failed to build: its reference
    assert (d.path, d.reason) == ("reference", "build_failed") and torch.allclose(out, init + a.sum(1), atol=1e-5)
    x, xi = torch.randint(-50, 50, (4, 8), dtype=torch.int32, generator=g), torch.zeros(4, dtype=torch.int32)
    out, d = rel.op("reduce_xor").call(x, xi)
    assert d.path == "kernel" and torch.equal(out, foreign_ops.reduce_xor_ref(x, xi))
    xb, ib = torch.rand(4, 8, generator=g) > 0.5, torch.zeros(4, dtype=torch.bool)
    out, d = rel.op("reduce_xor").call(xb, ib)
    assert (d.path, d.reason) == ("reference", "build_failed") and torch.equal(out, foreign_ops.reduce_xor_ref(xb, ib))
    a = torch.randn(64, generator=g)
    for n in (13, 0, 100):  # B is the kernel's parameter 1, valid_len its parameter 2
        out, d = rel.op("parallel").call(a, n)
        assert d.path == "kernel" and torch.equal(out, foreign_ops.parallel_ref(a, n)), (n, d)
    with pytest.raises(CallError, match=r"parallel\(valid_len\): is an int32 ScalarArg, got float 2.5"):
        rel.op("parallel").call(a, 2.5)
    assert rel.decisions()["parallel"] == {"parallel.float32.N64.c": "kernel:kernel"}  # the breaker stayed closed
    assert nojit.attempts() == before


# -- sm_90a with nvcc, loaded on a machine without a GPU ---------------------------------------------------


@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    return _build(("cuda-sm90a",), ("ew_add", "rms", "ln_fwd", "ln_bwd"), tmp_path_factory.mktemp("foreign-cuda"))


def test_eager_and_interleaved_kernels_compile_for_sm90a(cuda_build):
    """Each compile runs in its own worker process (``build.worker``); nothing here compiles in-process."""
    from tileship.runtime import signature
    from tileship.runtime.launch import _places

    assert cuda_build.ok, [(r.spec.id, r.error) for r in cuda_build.failed]
    specs = cuda_build.path / "specs"
    art = json.loads((specs / "ln_bwd.bfloat16.N64_D256.cuda-sm90a" / "artifact.json").read_text())
    assert art["out_idx"] == [5] and art["execution_backend"] == "tvm_ffi"
    sig = signature.read((specs / "ln_bwd.bfloat16.N64_D256.cuda-sm90a" / "signature.json").read_text(),
                         art["out_idx"])
    assert [p.name for p in sig.params] == ["DY", "X", "gamma", "Mean", "Rstd", "DX", "DGamma", "DBeta"]
    assert sig.result_idx == (5,)
    # a caller's seven inputs land on every parameter but DX, in order
    assert _places(type("A", (), {"result_idx": [5]})(), 7) == [(False, 0), (False, 1), (False, 2), (False, 3),
                                                               (False, 4), (True, 0), (False, 5), (False, 6)]
    art = json.loads((specs / "ew_add.float32.M128_N256.cuda-sm90a" / "artifact.json").read_text())
    assert art["factory"]["tensor_params"] == ["A", "B"] and art["out_idx"] == [2]
    rel = json.loads((cuda_build.path / "release.json").read_text())
    assert rel["operators"]["ew_add"]["outputs"] == [["C", ["M", "N"]]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU fallback")
def test_without_a_gpu_the_reference_serves_and_says_why(cuda_build):
    from tileship.runtime.loader import load

    rel = load(cuda_build.path)
    assert rel.status()["kernels"] == 0 and not rel.load_errors
    assert {sid: d for op in rel.decisions().values() for sid, d in op.items()} == {
        s: "reference:device_not_covered" for s in cuda_build.built}
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(128, 256, generator=g), torch.randn(128, 256, generator=g)
    out, d = rel.op("ew_add").call(a, b)
    assert (d.path, d.reason) == ("reference", "device_not_covered") and torch.equal(out, a + b)
    args = foreign_ops.ln_sample({"N": 64, "D": 256}, "bfloat16", "cpu")
    dgamma, dbeta = args[5].clone(), args[6].clone()
    dx, d = rel.op("ln_bwd").call(*args)
    assert (d.path, d.reason) == ("reference", "device_not_covered") and dx.dtype == torch.bfloat16
    assert not torch.equal(args[5], dgamma) and not torch.equal(args[6], dbeta)  # updated in place, as declared


# -- an 8-bit float output: declared, built, served --------------------------------------------------------


@pytest.fixture(scope="module")
def fp8_build(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    return _build(("cuda-sm90a",), ("cast_fp8", "topk"), tmp_path_factory.mktemp("foreign-fp8"))


def test_an_fp8_output_is_declared_built_and_served_by_the_reference_without_a_gpu(fp8_build):
    """``per_token_cast_to_fp8``'s X_fp8 is ``T.float8_e4m3fn``: the declaration refused the dtype ('unknown dtype
    float8_e4m3fn'), so the upstream cast kernel could not ship at all."""
    from tileship.runtime.loader import load

    assert fp8_build.ok, [(r.spec.id, r.error) for r in fp8_build.failed]
    desc = json.loads((fp8_build.path / "release.json").read_text())["operators"]["cast_fp8"]
    assert desc["outputs"] == [["X_fp8", ["M", "N"]], ["X_amax", ["M", "N/128"]]]
    assert desc["tensor_dtypes"]["X_fp8"] == "float8_e4m3fn"
    rel = load(fp8_build.path)
    x = torch.randn(40, 512, generator=torch.Generator().manual_seed(2))
    (q, s), d = rel.op("cast_fp8").call(x)
    if not torch.cuda.is_available():
        assert (d.path, d.reason) == ("reference", "device_not_covered")
    rq, rs = foreign_ops.cast_fp8_ref(x)
    assert q.dtype == torch.float8_e4m3fn and torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(s, rs)


def test_fp8_tensors_verify_and_travel_over_kserve():
    """The pieces an fp8 output passes through besides the kernel: the poison verification fills it with, the
    non-finite check of the circuit breaker, and the KServe encoding (FP8_E4M3: raw bytes, or JSON numbers)."""
    import orjson

    from tileship.declare.parts import DEFAULT_TOLERANCES
    from tileship.runtime.route import all_finite
    from tileship.serve.encoding import DATATYPES, encode_response
    from tileship.verify.compare import check_output, fill_poison

    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(3))
    q, _ = foreign_ops.cast_fp8_ref(x)
    atol, rtol = DEFAULT_TOLERANCES["float8_e4m3fn"]
    assert check_output(q, q.double(), atol=atol, rtol=rtol).passed
    half = fill_poison(torch.empty_like(q))
    half[:4] = q[:4]
    check = check_output(half, q.double(), atol=atol, rtol=rtol)
    assert check.unwritten == 4 * 128 and "never written" in (check.failure or "")
    assert all_finite((q,)) and not all_finite((torch.full((2,), float("nan")).to(torch.float8_e4m3fn),))
    assert DATATYPES["FP8_E4M3"] == "float8_e4m3fn" and DATATYPES["FP8_E5M2"] == "float8_e5m2"
    enc = encode_response(model="cast_fp8", version="r", request_id=None, parameters={},
                          outputs=[("X_fp8", q, True), ("again", q, False)])
    head = orjson.loads(enc.parts[0])
    assert head["outputs"][0]["datatype"] == "FP8_E4M3" and bytes(enc.parts[1]) == q.view(torch.uint8).numpy().tobytes()
    assert head["outputs"][1]["data"] == q.double().reshape(-1).tolist()


# -- a size the kernel fixes ---------------------------------------------------------------------------------


def test_an_output_of_a_fixed_size_is_read_from_the_kernel_and_built(fp8_build):
    """``tl_topk``'s outputs are (M, topk) with topk=6 from the config: no input determines 6, so the declaration
    could not say it ('the size of dim 1 of the kernel's T.empty output topk_gates (6) matches no declared dim', and
    'output topk_gates uses dim 'topk' that no input determines'). A fixed size is a dim now: read, built, served."""
    from tileship.runtime.loader import load
    from tileship.serve.encoding import tensor_metadata

    assert fp8_build.ok, [(r.spec.id, r.error) for r in fp8_build.failed]
    desc = json.loads((fp8_build.path / "release.json").read_text())["operators"]["topk"]
    assert desc["outputs"] == [["topk_gates", ["M", "6"]], ["topk_indices", ["M", "6"]]]
    rel = load(fp8_build.path)
    for m in (320, 100):  # the declared shape, and one the reference serves as undeclared
        x = torch.rand(m, 128, generator=torch.Generator().manual_seed(m))
        (gates, idx), d = rel.op("topk").call(x)
        want = foreign_ops.topk_ref(x)
        assert gates.shape == (m, 6) and torch.equal(gates, want[0]) and torch.equal(idx, want[1]), d
    assert [t["shape"] for t in tensor_metadata(rel.declarations["topk"], "outputs")] == [[320, 6], [320, 6]]
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tileship.torchops.custom_ops import register

    ops = register(rel)
    with FakeTensorMode():  # what torch.compile traces the custom op with
        gates, idx = ops.topk(torch.empty(17, 128))
        assert gates.shape == idx.shape == (17, 6) and idx.dtype == torch.int32


def test_a_fixed_size_is_declared_checked_and_bound():
    from tileship.declare import contract
    from tileship.declare.dims import DimExpr, bind, shape_at

    assert foreign_ops.TensorArg("g", ("M", 6)).dims == ("M", "6")
    op = dataclasses.replace(foreign_ops.topk, outputs=(foreign_ops.TensorArg("topk_gates", ("M", 6)),
                                                        foreign_ops.TensorArg("topk_indices", ("M", 6), "int32")))
    op.check()
    assert op.dims == ("M", "N") and [s.id for s in expand(op)] == ["topk.float32.M320_N128.cuda-sm90a"]
    op, spec, func, (_, positions) = _traced(op)
    contract.check(op, spec, func, positions)
    eight = dataclasses.replace(op, outputs=(foreign_ops.TensorArg("topk_gates", ("M", 8)), op.outputs[1]))
    with pytest.raises(BuildError, match=r"topk_gates \(the kernel's parameter topk_gates\): dim 1 is fixed at 8 in "
                                         r"the declaration but 6 in the kernel"):
        contract.check(eight, spec, func, positions)
    assert shape_at(("M", "6"), {"M": 3}) == (3, 6)
    assert DimExpr.parse("6").size({}) == 6 and str(DimExpr.parse("6")) == "6"
    assert bind([("w", ("C", "3"))], [(4, 3)]).dims == {"C": 4}
    b = bind([("w", ("C", "3"))], [(4, 5)])
    assert b.problem == "derived" and b.message == "has 5 where the declaration fixes 3"  # the reference serves it
    with pytest.raises(DeclarationError, match="a fixed size must be a positive int"):
        dataclasses.replace(op, outputs=(foreign_ops.TensorArg("topk_gates", ("M", "0")),)).check()
