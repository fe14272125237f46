"""Operators that update inputs in place (``Operator.mutates``), end to end with the KV-cache append:
declaration errors, a real "c"-target build -> load -> call, verify (which must fail a kernel that
writes nothing, the wrong row, or a stray row), the torch custom op (eager and torch.compile), and a
real nvcc build of the CUDA kernel."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import tileship
from tileship.catalog import cpu_cache, kv_append, kv_append_paged
from tileship.declare.spec import Operator, ScalarArg, TensorArg, describe, expand
from tileship.errors import DeclarationError, TileshipError

DIMS = {"B": 3, "S": 16, "HKV": 2, "D": 8}


def _copy_factory(N: int, dtype: str = "float32") -> Any:
    return None  # never traced: the declaration checks run first


def _decl(**kw: Any) -> Operator:
    base: dict[str, Any] = dict(name="inplace", factory=_copy_factory, reference=lambda x, y, s: None,
                                inputs=(TensorArg("x", ("N",)), TensorArg("y", ("N",)), ScalarArg("s")),
                                mutates=("x",), dtypes=("float32",), targets=("c",), shapes=({"N": 8},))
    return Operator(**{**base, **kw})


@pytest.mark.parametrize("mutates, outputs, field, message", [
    ("x", (), "mutates", "got the string 'x'"),
    (("z",), (), "mutates.z", "'z' is not an input (inputs: x, y, s)"),
    (("out",), (TensorArg("out", ("N",)),), "mutates.out", "out is an output"),
    (("s",), (), "mutates.s", "s is a ScalarArg"),
    (("x", "x"), (), "mutates", "names an input twice"),
], ids=["a-string", "not-an-input", "an-output", "a-scalar", "twice"])
def test_bad_mutates_are_declaration_errors(mutates, outputs, field, message) -> None:
    with pytest.raises(DeclarationError, match=re.escape(message)) as info:
        _decl(mutates=mutates, outputs=outputs).check()
    assert isinstance(info.value, TileshipError)
    assert info.value.field == field and info.value.operator == "inplace"


def test_a_tolerance_may_be_keyed_by_a_mutated_input_only() -> None:
    from tileship.declare.spec import Tolerance

    _decl(tolerances={"x": Tolerance(0.0, 0.0)}).check()  # compared whole by verify: may have its own
    with pytest.raises(DeclarationError, match="neither a dtype nor an output or mutated input name"):
        _decl(tolerances={"y": Tolerance(0.0, 0.0)}).check()


def test_the_description_names_the_mutated_inputs_and_only_then() -> None:
    desc = describe(cpu_cache.kv_append_cpu_op)
    assert desc["mutates"] == ["k_cache", "v_cache"] and desc["outputs"] == []
    assert "mutates" not in describe(dataclasses.replace(cpu_cache.kv_append_cpu_op, mutates=(),
                                                         outputs=(TensorArg("o", ("B",)),)))
    assert kv_append.kv_append_op.infers_outputs is False  # no outputs, and none read from the kernel


# -- the reference ------------------------------------------------------------------------------------

def _sample(dims: dict[str, int] = DIMS, dtype: str = "float32") -> list[torch.Tensor]:
    return list(kv_append.kv_append_sample(dims, dtype, "cpu"))


def test_reference_writes_the_rows_at_pos_and_nothing_else() -> None:
    k, v, k_new, v_new, pos = _sample()
    pos = torch.tensor([0, 7, -1], dtype=torch.int32)  # sequence 2: out of range, writes nothing
    k0, v0 = k.clone(), v.clone()
    assert kv_append.kv_append_reference(k, v, k_new, v_new, pos) is None
    want_k, want_v = k0.clone(), v0.clone()
    for b, p in ((0, 0), (1, 7)):
        want_k[b, p], want_v[b, p] = k_new[b], v_new[b]
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    for bad in (16, 1 << 30, -(1 << 30)):  # past the capacity, either way: no write, no error
        kv_append.kv_append_reference(k, v, k_new, v_new, torch.full((3,), bad, dtype=torch.int32))
        assert torch.equal(k, want_k) and torch.equal(v, want_v), f"pos={bad} wrote the cache"


def test_reference_compiles_in_one_graph_without_host_sync() -> None:
    """No .item() and no data-dependent shape: fullgraph tracing would break on either (and a CUDA
    graph capture could not hold it)."""
    k, v, k_new, v_new, pos = _sample()
    k0, k2, v2 = k.clone(), k.clone(), v.clone()
    torch._dynamo.reset()
    torch.compile(kv_append.kv_append_reference, fullgraph=True, backend="aot_eager")(k, v, k_new, v_new, pos)
    kv_append.kv_append_reference(k2, v2, k_new, v_new, pos)
    assert torch.equal(k, k2) and torch.equal(v, v2)
    assert not torch.equal(k, k0), "the compiled reference wrote nothing"


# -- a real "c"-target build -> load -> call ----------------------------------------------------------

@pytest.fixture(scope="module")
def cache_release(tmp_path_factory):
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import builtin_project, load_operators

    project = dataclasses.replace(builtin_project(), targets=("c",), operator_modules=("tileship.catalog.cpu_cache",))
    result = build(project, load_operators(project), tmp_path_factory.mktemp("cache"), BuildOptions(jobs=2))
    assert not result.failed, result.failed
    return result


def test_the_built_kernel_updates_the_cache_in_place(cache_release) -> None:
    spec_dir = next((cache_release.path / "specs").glob("kv_append_cpu.float32.B3_*"))
    art = json.loads((spec_dir / "artifact.json").read_text())
    assert art["out_idx"] == [] and art["callee_allocated_outputs"] is False  # caller-owned buffers
    release = tileship.load(cache_release.path)
    runner = release.op("kv_append_cpu")
    k, v, k_new, v_new, pos = _sample()
    ref = [t.clone() for t in (k, v, k_new, v_new, pos)]
    before_k, before_v = k.clone(), v.clone()
    out, decision = runner.call(k, v, k_new, v_new, pos)
    assert out is None and (decision.path, decision.reason) == ("kernel", "kernel"), decision
    kv_append.kv_append_reference(*ref)
    assert torch.equal(k, ref[0]) and torch.equal(v, ref[1])
    changed = (k != before_k).any(dim=(2, 3))  # [B, S]: the rows the kernel touched
    want = torch.zeros_like(changed)
    want[torch.arange(3), pos.long()] = True
    assert torch.equal(changed, want), f"rows written: {changed.nonzero().tolist()}, want {want.nonzero().tolist()}"
    assert torch.equal((v != before_v).any(dim=(2, 3)), want)
    assert runner(k, v, k_new, v_new, pos) is None  # the inlined hot path, the fast launcher
    assert "ctypes" in runner.launchers().values()
    assert release.counters()["kv_append_cpu"] == {"kernel:kernel": 2}


def test_out_of_range_positions_write_nothing_on_either_path(cache_release) -> None:
    runner = tileship.load(cache_release.path).op("kv_append_cpu")
    k, v, k_new, v_new, _ = _sample()
    for pos in ([-1, 16, 1 << 30], [16, -5, 15]):
        p = torch.tensor(pos, dtype=torch.int32)
        kk, vv = k.clone(), v.clone()
        rk, rv = k.clone(), v.clone()
        _, decision = runner.call(kk, vv, k_new, v_new, p)
        assert decision.path == "kernel"
        kv_append.kv_append_reference(rk, rv, k_new, v_new, p)
        assert torch.equal(kk, rk) and torch.equal(vv, rv), f"kernel and reference differ at pos={pos}"
    assert torch.equal(kk[:2], k[:2]) and not torch.equal(kk[2], k[2])  # only pos 15 of sequence 2 written


def test_the_reference_fallback_leaves_the_same_cache(cache_release) -> None:
    release = tileship.load(cache_release.path)
    runner = release.op("kv_append_cpu")
    k, v, k_new, v_new, pos = _sample()
    # a cache seen through a non-contiguous view: the reference serves it, writing through the view
    big_k, big_v = torch.zeros(3, 16, 2, 16), torch.zeros(3, 16, 2, 16)
    big_k[..., ::2], big_v[..., ::2] = k, v
    view_k, view_v = big_k[..., ::2], big_v[..., ::2]
    _, decision = runner.call(view_k, view_v, k_new, v_new, pos)
    assert (decision.path, decision.reason) == ("reference", "non_contiguous")
    _, decision = runner.call(k, v, k_new, v_new, pos)
    assert decision.path == "kernel"
    assert torch.equal(view_k, k) and torch.equal(view_v, v)
    assert bool((big_k[..., 1::2] == 0).all()), "the fallback wrote outside the view"
    # an undeclared shape: the reference, the same in-place semantics, counted with its reason
    k8, v8, kn8, vn8, pos8 = _sample({"B": 2, "S": 8, "HKV": 2, "D": 8})
    rk, rv = k8.clone(), v8.clone()
    out, decision = runner.call(k8, v8, kn8, vn8, pos8)
    assert out is None and (decision.path, decision.reason) == ("reference", "undeclared_shape")
    kv_append.kv_append_reference(rk, rv, kn8, vn8, pos8)
    assert torch.equal(k8, rk) and torch.equal(v8, rv)
    assert release.counters()["kv_append_cpu"] == {"kernel:kernel": 1, "reference:non_contiguous": 1,
                                                   "reference:undeclared_shape": 1}


def test_a_kernel_that_raises_opens_the_circuit_and_the_reference_writes_the_cache(cache_release) -> None:
    runner = tileship.load(cache_release.path).op("kv_append_cpu")
    entry = next(e for e in runner.entries if e.spec is not None and e.spec.dims == tuple(DIMS.items()))

    def broken(*args: Any) -> None:
        raise RuntimeError("device fault")

    entry.kernel = broken
    k, v, k_new, v_new, pos = _sample()
    rk, rv = k.clone(), v.clone()
    out, decision = runner.call(k, v, k_new, v_new, pos)
    assert out is None and (decision.path, decision.reason) == ("reference", "circuit_open")
    kv_append.kv_append_reference(rk, rv, k_new, v_new, pos)
    assert torch.equal(k, rk) and torch.equal(v, rv)
    assert runner.faults == {"kernel_raised": 1}


def test_serve_warm_up_and_the_demo_accept_the_kernel(cache_release) -> None:
    from tileship.serve.holder import warm_up
    from tileship.verify.demo import exercise

    release = tileship.load(cache_release.path)
    report = warm_up(release, {"kv_append_cpu": "cpu", "kv_append_paged_cpu": "cpu"})
    assert report.failures == {} and report.calls == 3
    rows = exercise(release)
    assert rows and all(r["ok"] and r["path"] == "kernel" for r in rows), rows


def test_the_paged_twin_writes_the_slot_its_table_names_and_nothing_else(cache_release) -> None:
    runner = tileship.load(cache_release.path).op("kv_append_paged_cpu")
    dims = {"B": 3, "S": 256, "P": 14, "PAGE": 64, "HKV": 2, "D": 16}
    k, v, k_new, v_new, table, pos = kv_append_paged.kv_append_paged_sample(dims, "float32", "cpu")
    table[1, 1] = 99  # not a page of the pool: sequence 1 appends at 70, in that entry: nothing written
    pos = torch.tensor([130, 70, 255], dtype=torch.int32)
    before_k = k.clone()
    rk, rv = k.clone(), v.clone()
    out, decision = runner.call(k, v, k_new, v_new, table, pos)
    assert out is None and decision.path == "kernel", decision
    kv_append_paged.kv_append_paged_reference(rk, rv, k_new, v_new, table, pos)
    assert torch.equal(k, rk) and torch.equal(v, rv)
    written = (k != before_k).any(dim=(2, 3)).nonzero().tolist()  # [page, row] slots
    assert written == sorted([[int(table[0, 2]), 2], [int(table[2, 3]), 63]]), written


def _caches_back(body: dict[str, Any], sample: list[torch.Tensor]) -> None:
    """The answer carries the two caches as the reference leaves them, named like the inputs (``serve.in_place``);
    was ``"outputs": []``."""
    k, v, k_new, v_new, pos = (t.clone() for t in sample)
    kv_append.kv_append_reference(k, v, k_new, v_new, pos)
    assert [(o["name"], o["shape"]) for o in body["outputs"]] == [("k_cache", list(k.shape)),
                                                                   ("v_cache", list(v.shape))], body["outputs"]
    got = {o["name"]: torch.tensor(o["data"], dtype=torch.float32).reshape(o["shape"]) for o in body["outputs"]}
    assert torch.equal(got["k_cache"], k) and torch.equal(got["v_cache"], v)


def test_served_over_http_it_runs_the_kernel_and_answers_the_updated_caches(cache_release, tmp_path) -> None:
    import io

    import httpx

    from tileship.serve import BackgroundServer, ServeConfig

    srv = BackgroundServer(ServeConfig(source=cache_release.path, diagnostics_dir=tmp_path / "diag",
                                       log_stream=io.StringIO())).start()
    try:
        assert srv.wait_ready(), srv.service.holder.readiness()[1]  # the warm-up call of each kernel agreed
        names = ("k_cache", "v_cache", "k_new", "v_new", "pos")
        sample = _sample()
        inputs = [{"name": n, "shape": list(t.shape), "datatype": "INT32" if t.dtype == torch.int32 else "FP32",
                   "data": t.flatten().tolist()} for n, t in zip(names, sample, strict=True)]
        r = httpx.post(srv.url + "/v2/models/kv_append_cpu/infer", json={"inputs": inputs}, timeout=30.0)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["parameters"]["tileship_path"] == "kernel", body
        _caches_back(body, sample)
    finally:
        srv.stop()


def test_served_by_a_worker_process_it_answers_the_updated_caches(cache_release, tmp_path) -> None:
    """``--workers 1``: the worker took the call's None (no outputs) for one output (``None.nbytes``), so every call
    killed the worker that ran it (503 ``worker failure``) and the next found none ready."""
    import httpx
    from test_serve_workers import workers_server

    names = ("k_cache", "v_cache", "k_new", "v_new", "pos")
    sample = _sample()
    inputs = [{"name": n, "shape": list(t.shape), "datatype": "INT32" if t.dtype == torch.int32 else "FP32",
               "data": t.flatten().tolist()} for n, t in zip(names, sample, strict=True)]
    with workers_server(cache_release.path, workers=1, diagnostics_dir=tmp_path / "diag") as srv:
        for _ in range(2):
            r = httpx.post(srv.url + "/v2/models/kv_append_cpu/infer", json={"inputs": inputs}, timeout=30.0)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["parameters"]["tileship_path"] == "kernel", body
            _caches_back(body, sample)


# -- verify ---------------------------------------------------------------------------------------------

def test_verify_passes_the_real_kernel_comparing_the_whole_caches(cache_release) -> None:
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    result = verify(cache_release.path, VerifyOptions(seeds=(0, 1), timing=False), write=False)
    assert result.verdicts and all(v.passed for v in result.verdicts), [v.failure for v in result.verdicts]
    point = result.verdicts[0].points[0]
    b, s, h, d = (dict(result.verdicts[0].spec.dims)[x] for x in ("B", "S", "HKV", "D"))
    assert [c.numel for _, c in point.checks] == [b * s * h * d] * 4  # k_cache, v_cache, per seed


def _wrong(how: str) -> Any:
    def kernel(k, v, k_new, v_new, pos):
        if how == "nothing":
            return None
        rows = torch.arange(k.shape[0])
        p = pos.long()
        if how == "wrong row":
            p = (p + 1) % k.shape[1]
        k[rows, p], v[rows, p] = k_new, v_new
        if how == "stray row":
            k[0, (pos[0].long() + 3) % k.shape[1]] = k_new[0]
        return None

    return kernel


def test_verify_fails_a_paged_kernel_that_writes_the_right_row_of_the_wrong_page(cache_release) -> None:
    from tileship.verify.spec_check import VerifyOptions, verify_spec

    def wrong_page(k, v, k_new, v_new, table, pos):
        p = pos.long()
        pg = table.long()[torch.arange(p.shape[0]), p // 64]
        k[(pg + 1) % k.shape[0], p % 64] = k_new
        v[pg, p % 64] = v_new

    desc = json.loads((cache_release.path / "release.json").read_text())["operators"]["kv_append_paged_cpu"]
    spec = expand(cpu_cache.kv_append_paged_cpu_op)[0]
    v = verify_spec(spec, wrong_page, kv_append_paged.kv_append_paged_reference, desc,
                    options=VerifyOptions(seeds=(0,), timing=False), sample=kv_append_paged.kv_append_paged_sample)
    assert not v.passed and "output k_pages" in v.failure, v.failure
    assert [c.passed for _, c in v.points[0].checks] == [False, True]  # k_pages wrong, v_pages right


@pytest.mark.parametrize("how, where", [("nothing", "output k_cache"), ("wrong row", "output k_cache"),
                                        ("stray row", "output k_cache")])
def test_verify_fails_a_kernel_that_writes_nothing_the_wrong_row_or_a_stray_row(cache_release, how, where) -> None:
    from tileship.verify.spec_check import VerifyOptions, verify_spec

    desc = json.loads((cache_release.path / "release.json").read_text())["operators"]["kv_append_cpu"]
    spec = next(s for s in expand(cpu_cache.kv_append_cpu_op) if dict(s.dims)["B"] == 3)
    v = verify_spec(spec, _wrong(how), kv_append.kv_append_reference, desc,
                    options=VerifyOptions(seeds=(0,), timing=False), sample=kv_append.kv_append_sample)
    assert not v.passed and v.failure is not None
    assert where in v.failure and "beyond atol=0" in v.failure, v.failure
    n_bad = v.points[0].checks[0][1].mismatches
    assert n_bad == (2 * 3 * 2 * 8 if how == "wrong row" else 2 * 8 if how == "stray row" else 3 * 2 * 8), n_bad


# -- the torch custom op ----------------------------------------------------------------------------------

def test_the_custom_op_declares_and_performs_the_mutation(cache_release) -> None:
    from tileship.torchops.custom_ops import register

    ops = register(tileship.load(cache_release.path))
    op = ops.kv_append_cpu
    schema = str(op._schema)
    assert "Tensor(a!) k_cache" in schema and "Tensor(b!) v_cache" in schema and schema.endswith("-> ()"), schema
    assert "kv_append_cpu" not in ops.out_ops  # no out= form for an operator without outputs
    k, v, k_new, v_new, pos = _sample()
    rk, rv = k.clone(), v.clone()
    assert op(k, v, k_new, v_new, pos) is None
    kv_append.kv_append_reference(rk, rv, k_new, v_new, pos)
    assert torch.equal(k, rk) and torch.equal(v, rv)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_custom_op_mutates_under_torch_compile(cache_release, backend) -> None:
    """Functionalization turns the op into a functional one and writes the results back: the caller's
    cache holds the new rows, and a read after the append in the same graph sees them."""
    from torch._dynamo.utils import counters

    from tileship.torchops.custom_ops import register

    release = tileship.load(cache_release.path)
    ops = register(release)

    def step(k: torch.Tensor, v: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
             pos: torch.Tensor) -> torch.Tensor:
        ops.kv_append_cpu(k, v, k_new, v_new, pos)
        return k[torch.arange(k.shape[0]), pos.long()] * 2.0  # reads the rows just appended

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    k, v, k_new, v_new, pos = _sample()
    rk, rv = k.clone(), v.clone()
    got = compiled(k, v, k_new, v_new, pos)
    kv_append.kv_append_reference(rk, rv, k_new, v_new, pos)
    assert torch.equal(k, rk) and torch.equal(v, rv), "the compiled graph did not write the caller's cache"
    assert torch.equal(got, k_new * 2.0)
    assert not counters["graph_break"]
    assert release.counters()["kv_append_cpu"] == {"kernel:kernel": 1}


# -- a real nvcc build of the CUDA kernel (no GPU needed) -------------------------------------------------

def test_the_cuda_kernel_builds_with_caller_owned_caches(tmp_path: Path) -> None:
    from tileship.build.builder import compile_one
    from tileship.runtime import artifact, signature

    for dtype in ("float16", "bfloat16"):
        spec = next(s for s in expand(kv_append.kv_append_op) if s.dtype == dtype)
        r = compile_one(kv_append.kv_append_op, spec, tmp_path / spec.id, timeout_s=300)
        assert r.ok, r.error
        d = tmp_path / spec.id
        art = json.loads((d / "artifact.json").read_text())
        assert (art["execution_backend"], art["out_idx"], art["callee_allocated_outputs"]) == ("tvm_ffi", [], False)
        sig = signature.read((d / "signature.json").read_text(), art["out_idx"])
        assert [p.name for p in sig.params] == ["K", "V", "k_new", "v_new", "pos"] and sig.result_idx == ()
        assert artifact.ffi_abi(d, art, sig, spec.id).callee_allocated_outputs is False  # the load-time check
        assert '"main: num_args should be 5"' in (d / "host_kernel.cu").read_text()
        src = (d / "device_kernel.cu").read_text()
        assert "(0 <= p) && (p < 1024)" in src, "the store is not guarded by the position check"
        assert "*(uint4*)(K + " in src and "*(uint4*)(V + " in src, "the row copy is not 16-byte vectorized"
        assert (d / "kernel.cubin").stat().st_size > 0


def test_the_paged_cuda_kernel_builds_with_caller_owned_pools(tmp_path: Path) -> None:
    from tileship.build.builder import compile_one

    op = kv_append_paged.kv_append_paged_op
    spec = next(s for s in expand(op) if s.dtype == "float16" and dict(s.dims)["B"] == 32)
    r = compile_one(op, spec, tmp_path / spec.id, timeout_s=300)
    assert r.ok, r.error
    art = json.loads((tmp_path / spec.id / "artifact.json").read_text())
    assert (art["out_idx"], art["callee_allocated_outputs"]) == ([], False)
    assert '"main: num_args should be 6"' in (tmp_path / spec.id / "host_kernel.cu").read_text()
    src = (tmp_path / spec.id / "device_kernel.cu").read_text()
    assert "(0 <= p) && (p < 1024)" in src and "< 528)" in src, "position and page guards"


def test_the_cuda_factory_refuses_a_cache_int32_cannot_index() -> None:
    with pytest.raises(ValueError, match="int32"):
        kv_append.kv_append(64, 32768, 8, 128)


def test_the_samples_follow_the_verification_seed() -> None:
    """make_inputs seeds the RNG the samples draw from: one seed, the same inputs; another, others."""
    from tileship.declare.inputs import make_inputs

    decl = [(a.name, a.dims) for a in kv_append.INPUTS]
    dtypes = [a.dtype_for("float32") for a in kv_append.INPUTS]

    def draw(seed: int) -> list[torch.Tensor]:
        return make_inputs(decl, DIMS, "float32", "cpu", seed, dtypes=dtypes, sample=kv_append.kv_append_sample)

    a, b, c = draw(1), draw(1), draw(2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert int(a[4][-1]) == DIMS["S"] - 1 and a[4].dtype == torch.int32


# -- the rollback drill over an operator with no outputs: it expects the updated caches the server answers --------

def _drill_registry(cache_release, tmp_path: Path) -> tuple[Any, str, str]:
    import shutil

    from tileship.release import bundle
    from tileship.release.registry import Registry

    old_src = tmp_path / "old"
    shutil.copytree(cache_release.path, old_src)
    rel = json.loads((old_src / "release.json").read_text())
    rel["model"]["version"] = "2"  # another release id
    (old_src / "release.json").write_text(json.dumps(rel, indent=2, sort_keys=True) + "\n")
    bundle.write_manifest(old_src)
    reg = Registry(tmp_path / "reg")
    new, old = reg.publish(cache_release.path), reg.publish(old_src)
    reg.activate(old)
    reg.activate(new)
    return reg, new, old


def test_the_drill_expects_the_updated_caches_and_sends_the_inputs_as_they_were(cache_release, tmp_path) -> None:
    """Before: ``build_samples`` took a reference's ``None`` as one output and raised ``AttributeError: 'NoneType'
    object has no attribute 'cpu'``, so a drill over any release with an in-place operator (the KV-cache append)
    could not start; and an integer input went to the reference uncopied, so an in-place reference changed the
    request the drill then sent."""
    from tileship.verify.drill import DrillOptions, build_samples

    reg, new, old = _drill_registry(cache_release, tmp_path)
    samples, _ = build_samples(reg, new, old, DrillOptions(registry=reg.root, per_op=2, ops=("kv_append_cpu",)))
    assert samples and all(s.outputs == ["k_cache", "v_cache"] for s in samples if s.op == "kv_append_cpu"), samples
    s = next(s for s in samples if s.op == "kv_append_cpu")
    want = _request_tensors(s.body, s.header_length)  # the request: the caches before the append
    k, v = want[0].double(), want[1].double()
    kv_append.kv_append_reference(k, v, *want[2:])
    assert torch.equal(s.expected[0], k) and torch.equal(s.expected[1], v)
    assert not torch.equal(want[0].double(), k), "the append wrote nothing: the request would not show a change"


def _request_tensors(body: bytes, header_length: int) -> list[torch.Tensor]:
    head = json.loads(body[:header_length])
    out, offset = [], header_length
    for i in head["inputs"]:
        size = i["parameters"]["binary_data_size"]
        dt = {"FP32": torch.float32, "INT32": torch.int32, "INT64": torch.int64}[i["datatype"]]
        out.append(torch.frombuffer(bytearray(body[offset:offset + size]), dtype=dt).reshape(i["shape"]))
        offset += size
    return out


def test_a_rollback_drill_over_the_in_place_operator_passes(cache_release, tmp_path) -> None:
    """The drill, with a real server, switching N -> N-1 -> reference -> N under load: every answer of the in-place
    operator (its updated caches) matches the reference's, with no failed or dropped request."""
    from tileship.verify.drill import DrillOptions, run_drill

    reg, new, old = _drill_registry(cache_release, tmp_path)
    report = run_drill(DrillOptions(registry=reg.root, out_dir=tmp_path / "report", phase_seconds=1.0, concurrency=2,
                                    per_op=2, startup_timeout_s=300))
    text = (tmp_path / "report" / "drill.txt").read_text()
    assert report["passed"], text
    assert report["totals"]["requests"] > 8, report["totals"]
    assert report["totals"]["failed"] == report["totals"]["dropped"] == report["totals"]["mismatched"] == 0
