"""Foreign kernels (``tests/foreign_audit_ops.py``) through the public path a user takes: declare -> build ("c")
-> load -> ``release.op(name)`` and the torch custom op (eager and ``torch.compile``) -> verify -> serve over
HTTP. Two outputs sized by different dims of an int8 input, a ``T.dynamic`` dim at two positions with float and
int scalars and a dim named ``in``, an in-place update of two tensors with no outputs, a lazy ``@tilelang.jit``
gather, each compared with its torch reference; and what a ``sample`` hook that raises does to verify, warm-up,
the server's load and the demo, and what a float32 scalar's rounding did to a float64 operator's verification."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

pytest.importorskip("tilelang")

import foreign_audit_ops as F  # noqa: E402

from tileship.build.builder import BuildOptions, build  # noqa: E402
from tileship.declare.project import Project, load_operators  # noqa: E402

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def audit_build(tmp_path_factory):
    proj = Project(model="audit", model_version="1", operator_modules=("foreign_audit_ops",), targets=("c",),
                   root=TESTS)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("audit"), BuildOptions(jobs=2))
    assert res.ok, [(r.spec.id, r.error) for r in res.failed]
    return res


@pytest.fixture(scope="module")
def release(audit_build):
    import tileship

    return tileship.load(audit_build.path)


def _close(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    bad = ~torch.isclose(got.double(), want.double(), atol=atol, rtol=rtol)
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} mismatched, max |err| " \
                          f"{float((got.double() - want.double()).abs().max()):.3g}"


@pytest.mark.parametrize("m", [1, 5, 64, 65], ids=lambda m: f"M{m}")
def test_two_outputs_sized_by_different_dims_of_an_int8_input(release, m):
    """rowdot (M,) float32 and colmax (N,) int32 from X (M, N) int8 and w (N,) float32; M=65 is past the range."""
    x = torch.randint(-128, 128, (m, 16), dtype=torch.int8)
    w = torch.randn(16)
    (rowdot, colmax), d = release.op("stats").call(x, w)
    assert (d.path, d.reason) == (("kernel", "kernel") if m <= 64 else ("reference", "undeclared_shape")), d
    want = F.row_col_stats_ref(x, w)
    _close(rowdot, want[0], 1e-4, 1e-4)
    assert torch.equal(colmax, want[1])


@pytest.mark.parametrize("m,n,dtype", [(4, 3, torch.float32), (1, 8, torch.float32), (128, 8, torch.float64),
                                       (7, 8, torch.float64), (4, 3, torch.float64)], ids=str)
def test_a_dynamic_dim_at_two_positions_with_float_and_int_scalars_and_a_dim_named_in(release, m, n, dtype):
    """B (in, M) = A (M, in).T * alpha + shift: the dim named ``in`` reaches the factory as ``n_in``
    (``params=``), by position and by keyword, an int passed for the float scalar."""
    a = torch.randn(m, n, dtype=dtype)
    b, d = release.op("transposed").call(a, 2, -3)
    assert (d.path, d.reason) == ("kernel", "kernel"), d
    _close(b, F.transpose_affine_ref(a, 2, -3))
    _close(release.op("transposed")(a, shift=1, alpha=0.5), F.transpose_affine_ref(a, 0.5, 1))


def test_a_float32_scalar_of_a_float64_operator_gives_the_same_answer_on_either_path(release):
    """``alpha=0.1``: the kernel is handed it as a float32 (0.10000000149011612), the reference was handed 0.1, so
    a float64 call's answer changed by ~1.5e-9 relative with the path that served it (the shape, the circuit). The
    reference is now handed the value the kernel is."""
    a = torch.randn(200, 8, dtype=torch.float64)
    by_ref, d = release.op("transposed").call(a, 0.1, 1)
    assert (d.path, d.reason) == ("reference", "undeclared_shape"), d
    by_kernel, d = release.op("transposed").call(a[:128].contiguous(), 0.1, 1)
    assert (d.path, d.reason) == ("kernel", "kernel"), d
    _close(by_kernel, by_ref[:, :128].contiguous(), 1e-13, 1e-13)
    _close(by_ref, F.transpose_affine_ref(a, float(torch.tensor(0.1, dtype=torch.float32)), 1), 0.0, 0.0)
    assert release.op("transposed").reference is F.transpose_affine_ref  # the reference as given


@pytest.mark.parametrize("n", [1, 100, 4096])
def test_two_inputs_of_two_dtypes_updated_in_place_with_no_outputs(release, n):
    x = torch.randn(n) * 2
    hits = torch.full((1,), 7, dtype=torch.int32)
    want_x, want_hits = x.clone(), hits.clone()
    F.clip_count_ref(want_x, -1.0, 1.0, want_hits)
    out, d = release.op("clip_").call(x, -1.0, 1.0, hits)
    assert out is None and (d.path, d.reason) == ("kernel", "kernel"), d
    assert torch.equal(x, want_x) and torch.equal(hits, want_hits), (hits, want_hits)


@pytest.mark.parametrize("v,dd,m", [(16, 4, 5), (32, 8, 1), (32, 8, 256), (32, 8, 17)], ids=str)
def test_a_lazy_jit_gather_whose_output_takes_a_dim_from_each_input(release, v, dd, m):
    table = torch.randn(v, dd)
    idx = torch.randint(0, v, (m,), dtype=torch.int32)
    out, d = release.op("gather").call(table, idx)
    assert (d.path, d.reason) == ("kernel", "kernel"), d
    assert torch.equal(out, F.gather_rows_ref(table, idx))


@pytest.mark.parametrize("c", [1, 7, 64], ids=lambda c: f"class{c}")
def test_a_dynamic_dim_named_class_with_an_int64_scalar_and_int16_uint8_int64_tensors(release, c):
    x = torch.randint(-100, 100, (c, 8), dtype=torch.int16)
    (code, total), d = release.op("bucket").call(x, -5)
    assert (d.path, d.reason) == ("kernel", "kernel"), d
    want = F.bucketize_ref(x, -5)
    assert torch.equal(code, want[0]) and torch.equal(total, want[1])
    code, total = release.op("bucket")(x, 2**40)  # past int32: the int64 scalar is passed whole
    assert torch.equal(code, torch.ones_like(code)) and torch.equal(total, want[1])


@pytest.mark.parametrize("n", [1, 100, 1024])
def test_a_float16_scalar_reaches_the_c_kernel_as_a_half(release, n):
    """``a: T.float16`` on "c": the library takes ``half_float::half`` by value (an integer register) and the
    loader passed a ``c_float`` (a float register): ``Z = X * a + Y`` answered garbage and NaNs, silently."""
    x, y = torch.randn(n).half(), torch.randn(n).half()
    for a in (0.3, -2.0, 1e6):  # 1e6 is past float16: the kernel gets inf, as a float32 scalar's c_float would
        z, d = release.op("haxpy").call(x, y, a)
        assert (d.path, d.reason) == ("kernel", "kernel"), d
        want = x.float() * float(torch.tensor(a, dtype=torch.float16)) + y.float()
        if a == 1e6:
            assert torch.equal(torch.isinf(z), (x != 0) | torch.isinf(want)), z
            continue
        _close(z.float(), want, 1e-2, 1e-2)


def test_an_in_place_scatter_into_a_tensor_of_a_dim_of_its_own(release):
    acc = torch.randn(16)
    idx = torch.randint(0, 16, (600,))  # duplicates: each adds up
    src = torch.randn(600)
    for n, path in ((1, "kernel"), (300, "kernel"), (600, "reference")):  # 600 is past the range
        want = acc.clone()
        F.scatter_add_ref(want, idx[:n], src[:n])
        out, d = release.op("scatter").call(acc, idx[:n], src[:n])
        assert out is None and d.path == path, d
        _close(acc, want)


def test_the_torch_custom_ops_eager_and_compiled_with_dynamic_dims(release):
    from tileship.torchops.custom_ops import mark_dynamic, register

    ops = register(release)
    x = torch.randint(-5, 5, (3, 16), dtype=torch.int8)
    w = torch.randn(16)

    def stats2(x, w):
        rd, cm = ops.stats(x, w)
        return rd * 2, cm + 1

    rd, cm = torch.compile(stats2, fullgraph=True, backend="aot_eager")(x, w)
    want = F.row_col_stats_ref(x, w)
    _close(rd, want[0] * 2, 1e-4, 1e-4)
    assert torch.equal(cm, want[1] + 1)
    tr = torch.compile(lambda a: ops.transposed(a, 0.5, 2) + 1, fullgraph=True, backend="aot_eager")
    for m in (2, 3, 4):
        a = mark_dynamic(torch.randn(m, 8), 0)
        _close(tr(a), F.transpose_affine_ref(a, 0.5, 2) + 1)
    table = torch.randn(32, 8)
    ga = torch.compile(lambda t, i: ops.gather(t, i) * 1, fullgraph=True, backend="aot_eager")
    for m in (2, 3, 9):
        idx = mark_dynamic(torch.randint(0, 32, (m,), dtype=torch.int32), 0)
        assert torch.equal(ga(table, idx), table[idx.long()])

    def clip(x, h):
        ops.clip_(x, -1.0, 1.0, h)
        return x * 1, h + 0

    x = torch.randn(50) * 2
    hits = torch.zeros(1, dtype=torch.int32)
    want_x, want_hits = x.clone(), hits.clone()
    F.clip_count_ref(want_x, -1.0, 1.0, want_hits)
    got_x, got_hits = torch.compile(clip, fullgraph=True, backend="aot_eager")(x, hits)
    assert torch.equal(got_x, want_x) and torch.equal(got_hits, want_hits)
    assert torch.equal(x, want_x) and torch.equal(hits, want_hits)  # written back into the caller's tensors


def test_verify_passes_every_correct_kernel_and_names_a_sample_hook_that_took_dtype_for_torchs(audit_build):
    """``transposed.float64`` (a float32 scalar beside float64 tensors, tolerance 1e-8) failed verification at
    M=4 and M=128 (``max |err| 1.64e-07``): the drawn scalar (``r + 0.5``) was not a float32, the kernel was handed
    it rounded and the reference computed with it whole. A ``sample`` hook that calls ``x.to(dtype)`` failed with
    ``RuntimeError: Invalid device string: 'float32'``, which says nothing of why: it now says ``dtype`` is a str."""
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    report = verify(audit_build.path, VerifyOptions(timing=False), write=False)
    verdicts = {v.spec.id: v.failure for v in report.verdicts}
    bad = verdicts.pop("clip_bad_sample.float32.N8.c")
    assert verdicts == {sid: None for sid in verdicts} and len(verdicts) == 11, verdicts
    assert bad is not None and "making inputs failed: TypeError: clip_count_sample_torch_dtype(dims, dtype, " \
                                "device) raised RuntimeError: Invalid device string: 'float32': dtype is the " \
                                "dtype's name, the str 'float32'" in bad, bad


def test_a_float_scalar_is_drawn_and_sampled_as_its_declared_dtype_holds_it():
    from tileship.declare.inputs import as_declared, make_inputs

    ins = [("A", ("N",)), ("s", ()), ("t", ())]
    for seed in range(20):
        _, s, t = make_inputs(ins, {"N": 4}, "float64", "cpu", seed, dtypes=["same", "float32", "same"],
                              scalars=[1, 2])
        assert s == float(torch.tensor(s, dtype=torch.float32)) and isinstance(t, float), (seed, s)
    got = make_inputs(ins, {"N": 4}, "float64", "cpu", 0, dtypes=["same", "float16", "same"], scalars=[1, 2],
                      sample=lambda dims, dtype, device: (torch.zeros(4, dtype=torch.float64), 0.1, 0.1))
    assert got[1:] == [float(torch.tensor(0.1, dtype=torch.float16)), 0.1]
    assert as_declared(3, "float32") == 3 and as_declared(True, "float32") is True


def test_warm_up_and_the_demo_take_a_sample_hook_that_raises_as_that_operators_failure(audit_build):
    """The hook's error escaped warm-up and the server's load failed at startup (``load_failed``, 503, nothing
    served); the demo's table raised it. Now the warm-up lists it as ``sample: ...`` and leaves the kernel in
    place, and the demo gives its row ``ok=False``."""
    import tileship
    from tileship.serve.warmup import warm_up
    from tileship.verify.demo import exercise

    rel = tileship.load(audit_build.path)
    report = warm_up(rel, {name: "cpu" for name in rel.ops})
    assert list(report.failures) == ["clip_bad_sample.float32.N8.c"], report.failures
    assert report.failures["clip_bad_sample.float32.N8.c"].startswith(
        "sample: warm-up call at {'N': 8}: making inputs failed: TypeError: clip_count_sample_torch_dtype(")
    x, hits = torch.randn(8) * 2, torch.zeros(1, dtype=torch.int32)
    _, d = rel.op("clip_bad_sample").call(x, -1.0, 1.0, hits)
    assert (d.path, d.reason) == ("kernel", "kernel") and float(x.abs().max()) <= 1.0, d
    rows = [r for r in exercise(rel) if r["spec_id"].startswith("clip_bad_sample")]
    assert [(r["ok"], r["reason"].split(":")[0]) for r in rows] == [(False, "making inputs failed")], rows
    assert all(r["ok"] for r in exercise(rel) if not r["spec_id"].startswith("clip_bad_sample"))


def test_the_server_loads_the_release_and_answers_each_kernel_over_http(audit_build, tmp_path):
    import httpx
    from test_serve import serving

    from tileship.serve import ServeConfig

    cfg = ServeConfig(source=audit_build.path, diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO())
    with serving(cfg) as srv:
        ready = httpx.get(srv.url + "/v2/health/ready", timeout=10).json()
        assert list(ready.get("warmup_failures", {})) == ["clip_bad_sample.float32.N8.c"], ready
        x = torch.randint(-128, 128, (5, 16), dtype=torch.int8)
        w = torch.randn(16)
        body = {"inputs": [{"name": "X", "datatype": "INT8", "shape": [5, 16], "data": x.flatten().tolist()},
                           {"name": "w", "datatype": "FP32", "shape": [16], "data": w.tolist()}]}
        r = httpx.post(srv.url + "/v2/models/stats/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        outs = {o["name"]: o for o in r.json()["outputs"]}
        want = F.row_col_stats_ref(x, w)
        assert (outs["rowdot"]["datatype"], outs["colmax"]["datatype"]) == ("FP32", "INT32"), outs
        _close(torch.tensor(outs["rowdot"]["data"]), want[0], 1e-4, 1e-4)
        assert outs["colmax"]["data"] == want[1].tolist()
        a = torch.randn(6, 8)
        body = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [6, 8], "data": a.flatten().tolist()},
                           {"name": "alpha", "datatype": "FP32", "shape": [1], "data": [0.5]},
                           {"name": "shift", "datatype": "INT32", "shape": [1], "data": [3]}]}
        r = httpx.post(srv.url + "/v2/models/transposed/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        assert out["shape"] == [8, 6], out
        _close(torch.tensor(out["data"]).reshape(8, 6), F.transpose_affine_ref(a, 0.5, 3))


@pytest.mark.parametrize("inputs,outputs,where", [
    (("A", "alpha", "shift"), ("A",), "inputs[0] and outputs[0]"),
    (("A", "A", "shift"), ("B",), "inputs[0] and inputs[1]"),
], ids=["output_named_like_an_input", "scalar_named_like_a_tensor"])
def test_a_name_declared_twice_is_refused_naming_it_and_both_places(inputs, outputs, where):
    """Was ``duplicate tensor names ['A', 'alpha', 'shift', 'A']``: every name listed, the duplicate not said, a
    scalar called a tensor."""
    import dataclasses

    from tileship.errors import DeclarationError

    old = F.transposed
    ins = tuple(dataclasses.replace(a, name=n) for a, n in zip(old.inputs, inputs, strict=True))
    outs = tuple(dataclasses.replace(a, name=n) for a, n in zip(old.outputs, outputs, strict=True))
    with pytest.raises(DeclarationError) as exc:
        dataclasses.replace(old, inputs=ins, outputs=outs).check()
    words = f"transposed.inputs: 'A' names {where}: each input and output needs its own name"
    assert exc.value.field == "inputs" and exc.value.message.startswith(words), exc.value.message


def test_a_float16_scalar_for_cuda_is_refused_before_the_compiler_naming_the_parameter(tmp_path):
    """TileLang's tvm-ffi host wrapper declares ``half a`` in C that has no ``half``: the save of the compiled
    kernel failed (logged), and the build said ``RuntimeError: expected one TileLang cache entry, found 0``. The
    build now refuses it before compiling, naming the parameter; the "c" target builds it (above)."""
    import dataclasses

    proj = Project(model="audit", model_version="1", operator_modules=("foreign_audit_ops",),
                   targets=("cuda-sm90a",), root=TESTS)
    op = dataclasses.replace(load_operators(proj)["haxpy"], targets=("cuda-sm90a",), ranges=(), shapes=({"N": 64},))
    res = build(proj, {"haxpy": op}, tmp_path, BuildOptions(jobs=1))
    assert [(r.spec.id, r.error) for r in res.failed] == [(
        "haxpy.float16.N64.cuda-sm90a", "BuildError: haxpy.float16.N64.cuda-sm90a: the kernel's parameter 'a' is a "
        "float16 scalar, which TileLang's host wrapper for cuda-sm90a cannot pass (its generated C has no float16 "
        "type)")]


def test_a_failed_save_of_a_compiled_kernel_names_the_compilers_diagnostic():
    from tileship.build.builder import with_diagnostic
    from tileship.errors import COMPILER_FAILED

    output = ("[TileLang:tilelang.cache.kernel_cache:ERROR] (kernel_cache.py:639): Error during atomic cache save\n"
              "RuntimeError: Compilation error:\n/tmp/x/lib0.c: In function 'int32_t __tvm_ffi_main(...)':\n"
              "/tmp/x/lib0.c:83:3: error: 'half' was not declared in this scope\n   83 |   half a = ...\n")
    error = f"RuntimeError: TileLang compiled the kernel but saved no library: {COMPILER_FAILED}"
    assert with_diagnostic(error, output) == f"{error}: error: 'half' was not declared in this scope"
    assert with_diagnostic("RuntimeError: other", output) == "RuntimeError: other"
