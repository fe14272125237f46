"""runtime.artifact / runtime.signature: a specialization loaded without TileLang's Python reads the
same calling convention TileLang's own loader reads, and runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tileship.errors import ArtifactLoadError
from tileship.runtime import artifact, signature


def tilelang_view(spec_dir: Path) -> tuple[list[tuple[str, tuple[str, ...]]], list[int], dict[str, tuple[int, ...]]]:
    """What TileLang 0.1.15's own loader makes of the same files (the reference for this test)."""
    from tilelang import tvm
    from tilelang.engine.param import load_kernel_params
    from tilelang.jit.adapter.base import CachedTextSource
    from tilelang.jit.kernel import JITKernel

    from tileship.declare.spec import Target

    art = json.loads((spec_dir / "artifact.json").read_text())
    k = JITKernel.from_database(
        func=tvm.ir.load_json((spec_dir / "signature.json").read_text()),
        host_kernel_source=CachedTextSource(path=str(spec_dir / "host_kernel.cu")),
        device_kernel_source=CachedTextSource(path=str(spec_dir / "device_kernel.cu")),
        kernel_lib_path=str(spec_dir / art["library"]),
        params=load_kernel_params((spec_dir / "params.json").read_text()),
        target=Target(art["target"]).tilelang(), target_host=None, out_idx=art["out_idx"],
        execution_backend=art["execution_backend"], pass_configs=art.get("pass_configs") or None)
    a = k.adapter
    params = [(str(p.torch_dtype()), tuple(str(d) for d in p.shape)) for p in a.params]
    return params, list(a.result_idx), {str(v): tuple(t) for v, t in a.dynamic_symbolic_map.items()}


def test_the_signature_is_the_one_tilelang_reads_for_every_catalog_kernel(cpu_release: Path) -> None:
    specs = sorted((cpu_release / "specs").iterdir())
    assert specs
    for d in specs:
        k = artifact.load(d, d.name)
        mine = ([(str(p.torch_dtype()), tuple(str(x) for x in p.shape or ())) for p in k.params], k.result_idx,
                {str(v): t for v, t in k.dynamic_symbolic_map.items()})
        assert mine == tilelang_view(d), d.name


@pytest.mark.parametrize("n", [1, 300, 4096])
def test_a_c_kernel_called_directly_allocates_its_output_and_matches(cpu_release: Path, n: int) -> None:
    spec = next(d for d in (cpu_release / "specs").iterdir() if d.name.startswith("add.") and "-" in d.name)
    k = artifact.load(spec, spec.name)
    a, b = torch.randn(n), torch.randn(n)
    out = k(a, b)
    assert out.shape == (n,) and torch.equal(out, a + b), f"{(out != a + b).sum()} of {n} elements differ"
    with pytest.raises(ValueError, match="dtype"):
        k(a.double(), b.double())


def test_unreadable_signature_and_unknown_backend_name_the_specialization(cpu_release: Path) -> None:
    spec = next((cpu_release / "specs").iterdir())
    (spec / "signature.json").write_text(json.dumps({"root_index": 0, "nodes": [{"type": "ffi.String", "data": "x"}]}))
    with pytest.raises(ArtifactLoadError, match=f"{spec.name}: signature.json"):
        artifact.load(spec, spec.name)
    art = json.loads((spec / "artifact.json").read_text())
    (spec / "artifact.json").write_text(json.dumps({**art, "execution_backend": "nvrtc"}))
    with pytest.raises(ArtifactLoadError, match="execution backend 'nvrtc'"):
        artifact.load(spec, spec.name)


def graph(attrs: dict[str, int]) -> str:
    """A PrimFunc of (A: float16[m, 64] with a symbolic row stride s, alpha: float32, C: float16[m, 64])."""
    nodes: list[dict] = []

    def add(kind: str, data: object = None) -> int:
        nodes.append({"type": kind, "data": data} if data is not None else {"type": kind})
        return len(nodes) - 1

    m = add("tirx.Var", {"name": add("ffi.String", "m"), "dtype": "int32"})
    s = add("tirx.Var", {"name": add("ffi.String", "s"), "dtype": "int32"})
    one, n64 = add("ir.IntImm", {"dtype": "int32", "value": 1}), add("int", 64)
    bufs, params = [], []
    for name, strides in (("A", [s, one]), ("C", [n64, one])):
        h = add("tirx.Var", {"name": add("ffi.String", name), "dtype": "handle"})
        b = add("tirx.Buffer", {"name": add("ffi.String", name), "dtype": "float16",
                                "shape": add("ffi.Array", [m, n64]), "strides": add("ffi.Array", strides)})
        bufs += [h, b]
        params.append(h)
    alpha = add("tirx.Var", {"name": add("ffi.String", "alpha"), "dtype": "float32"})
    params.insert(1, alpha)
    kv = [x for k, v in attrs.items() for x in (add("ffi.String", k), add("int", v))]
    fn = add("tirx.PrimFunc", {"params": add("ffi.Array", params), "buffer_map": add("ffi.Map", bufs),
                               "attrs": add("ir.DictAttrs", {"__dict__": add("ffi.Map", kv)})})
    return json.dumps({"root_index": fn, "nodes": nodes})


@pytest.mark.parametrize("stamp, callee", [({}, False), ({signature.CALLEE_ALLOCATED_OUTPUTS: 1}, True),
                                           ({signature.CALLEE_ALLOCATED_OUTPUTS: 0}, False)])
def test_scalars_symbolic_strides_and_the_callee_allocated_abi(stamp: dict[str, int], callee: bool) -> None:
    sig = signature.read(graph(stamp), [-1])
    assert [(p.name, p.is_scalar) for p in sig.params] == [("A", False), ("alpha", True), ("C", False)]
    assert sig.result_idx == (2,)
    assert [(str(v), t) for v, t in sig.dynamic] == [("m", (0, 0, 0, 1)), ("s", (1, 0, 0, 1))]
    assert sig.callee_allocated_outputs is callee
    assert sig.params[0].torch_dtype() == torch.float16


@pytest.fixture(scope="module")
def cuda_specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real nvcc builds of a one-output (add) and a two-output (add_rmsnorm) CUDA kernel."""
    from tileship.build.builder import compile_one
    from tileship.catalog import add_rmsnorm, elementwise
    from tileship.declare.spec import expand

    root = tmp_path_factory.mktemp("cuda-abi")
    out = {}
    for op in (elementwise.add_cuda, add_rmsnorm.add_rmsnorm):
        spec = next(s for s in expand(op) if s.target == "cuda-sm90a" and s.dtype == "float16")
        r = compile_one(op, spec, root / spec.id, timeout_s=300)
        assert r.ok, r.error
        out[op.name] = root / spec.id
    return out


@pytest.mark.parametrize("op, n_inputs", [("add_cuda", 2), ("add_rmsnorm", 3)])
def test_a_cuda_build_records_the_callee_allocated_abi_its_library_takes(cuda_specs, op: str, n_inputs: int) -> None:
    """TileLang decides the output ABI inside the compile; the bundle must say what it decided, and the
    loader's convention must match the argument count the generated host code checks."""
    d = cuda_specs[op]
    art = json.loads((d / "artifact.json").read_text())
    assert art["callee_allocated_outputs"] is True
    sig = signature.read((d / "signature.json").read_text(), art["out_idx"])
    assert sig.callee_allocated_outputs is True  # the stamp is in the signature as well
    got = artifact.ffi_abi(d, art, sig, d.name)
    assert got.callee_allocated_outputs is True
    assert f'"main: num_args should be {n_inputs + 1}"' in (d / "host_kernel.cu").read_text()


def test_a_convention_that_disagrees_with_the_library_is_refused_at_load(cuda_specs, tmp_path: Path) -> None:
    """A two-output kernel called with caller-allocated outputs would get 5 arguments where its main
    takes 4 (inputs + allocator anchor): the loader refuses it, naming both counts."""
    import shutil

    d = tmp_path / "spec"
    shutil.copytree(cuda_specs["add_rmsnorm"], d)
    art = json.loads((d / "artifact.json").read_text())
    art["callee_allocated_outputs"] = False
    sig = signature.read((d / "signature.json").read_text(), art["out_idx"])
    with pytest.raises(ArtifactLoadError, match="main takes 4 arguments, the signature gives 5"):
        artifact.ffi_abi(d, art, sig, d.name)
    # a bundle that predates the record: TileLang's CUDA rule (outputs -> callee-allocated) applies
    del art["callee_allocated_outputs"]
    assert artifact.ffi_abi(d, art, sig, d.name).callee_allocated_outputs is True


def test_a_cuda_kernel_with_scalars_and_a_dynamic_dim_passes_the_build_time_abi_check(tmp_path: Path) -> None:
    """Scalars are arguments of the tvm-ffi ``main`` and a dynamic dim is not: the check the build
    now runs (``ffi_abi``) must count them as the generated host code does, or such user kernels
    would stop building."""
    import cuda_scalar_ops

    from tileship.build.builder import compile_one
    from tileship.declare.spec import expand

    tests_dir = str(Path(__file__).parent)
    for spec in expand(cuda_scalar_ops.scaled_cuda):
        r = compile_one(cuda_scalar_ops.scaled_cuda, spec, tmp_path / spec.id, timeout_s=300, sys_path=tests_dir)
        assert r.ok, r.error
        art = json.loads((tmp_path / spec.id / "artifact.json").read_text())
        sig = artifact.ffi_abi(tmp_path / spec.id, art,
                               signature.read((tmp_path / spec.id / "signature.json").read_text(),
                                                                       art["out_idx"]), spec.id)
        assert sig.callee_allocated_outputs and [p.name for p in sig.params] == ["A", "s", "n", "B"]
        assert '"main: num_args should be 4"' in (tmp_path / spec.id / "host_kernel.cu").read_text()
