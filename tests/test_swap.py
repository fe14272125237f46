"""swap: layers replaced by released kernels where the release covers them, a truthful report,
per-call fallback, torch.compile over the swapped model, and the kernel stamp in checkpoints.

The CPU catalog has no GEMM or attention, so this module declares its own "c"-target ones
(naive loops, real TileLang) and builds a three-specialization release once per module.
The tiny model (hidden 1024, 8 heads of 128, intermediate 1536) is sized so that q/k/v/o and
the norms are covered and the MLP and LM head are not.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import tilelang.language as T
import torch

from tileship.catalog import cpu
from tileship.declare.spec import DynamicRange, Operator, TensorArg

HIDDEN, HEADS, HEAD_DIM, SEQ = 1024, 8, 128, 16


def naive_gemm(M: Any, N: int, K: int, dtype: str = "float32") -> Any:
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(M) as row:
            acc = T.alloc_local((1,), "float32")
            for n in T.serial(N):
                acc[0] = 0.0
                for k in T.serial(K):
                    acc[0] += T.cast(A[row, k], "float32") * T.cast(B[k, n], "float32")
                C[row, n] = T.cast(acc[0], dtype)

    return main


def naive_attention(B: int, H: int, S: int, D: int, dtype: str = "float32") -> Any:
    scale = 1.0 / math.sqrt(D)

    @T.prim_func
    def main(Q: T.Tensor((B, H, S, D), dtype), K: T.Tensor((B, H, S, D), dtype), V: T.Tensor((B, H, S, D), dtype),
             O: T.Tensor((B, H, S, D), dtype)):
        with T.Kernel(S, H, B) as (i, h, b):
            p = T.alloc_local((S,), "float32")
            o = T.alloc_local((D,), "float32")
            st = T.alloc_local((2,), "float32")  # running max, softmax denominator
            st[0] = -T.infinity("float32")
            st[1] = 0.0
            for j in T.serial(S):
                p[j] = 0.0
                if j <= i:
                    for d in T.serial(D):
                        p[j] += T.cast(Q[b, h, i, d], "float32") * T.cast(K[b, h, j, d], "float32")
                    p[j] = p[j] * scale
                    st[0] = T.max(st[0], p[j])
            for d in T.serial(D):
                o[d] = 0.0
            for j in T.serial(S):
                if j <= i:
                    p[j] = T.exp(p[j] - st[0])
                    st[1] += p[j]
                    for d in T.serial(D):
                        o[d] += p[j] * T.cast(V[b, h, j, d], "float32")
            for d in T.serial(D):
                O[b, h, i, d] = T.cast(o[d] / st[1], dtype)

    return main


def matmul_reference(a: Any, b: Any) -> Any:
    return torch.matmul(a, b)


def attention_reference(q: Any, k: Any, v: Any) -> Any:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


gemm = Operator(
    name="gemm", factory=naive_gemm, reference=matmul_reference,
    inputs=(TensorArg("A", ("M", "K")), TensorArg("B", ("K", "N"))), outputs=(TensorArg("C", ("M", "N")),),
    dtypes=("float32",), targets=("c",), ranges=(DynamicRange("M", 1, 64, {"N": HIDDEN, "K": HIDDEN}),),
)
attention = Operator(
    name="attention", factory=naive_attention, reference=attention_reference,
    inputs=(TensorArg("Q", ("B", "H", "S", "D")), TensorArg("K", ("B", "H", "S", "D")),
            TensorArg("V", ("B", "H", "S", "D"))),
    outputs=(TensorArg("O", ("B", "H", "S", "D")),),
    dtypes=("float32",), targets=("c",), shapes=({"B": 1, "H": HEADS, "S": SEQ, "D": HEAD_DIM},),
)
NAMES = {"rmsnorm": "rmsnorm_cpu"}


@pytest.fixture(scope="module")
def swap_release_build(tmp_path_factory: pytest.TempPathFactory):
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import Project

    norm = dataclasses.replace(cpu.rmsnorm_cpu, shapes=())  # keep its dynamic M range at N=1024 only
    project = Project(model="swap-test", model_version="1", operator_modules=(), targets=("c",),
                      root=Path(__file__).parent)
    result = build(project, {"attention": attention, "gemm": gemm, "rmsnorm_cpu": norm},
                   tmp_path_factory.mktemp("swap"), BuildOptions(jobs=2))
    assert result.ok, [(r.spec.id, r.error) for r in result.failed]
    return result


@pytest.fixture
def release(swap_release_build):
    import tileship

    return tileship.load(swap_release_build.path)


def tiny(**overrides: Any) -> Any:
    from examples.llama import LlamaConfig, random_llama

    cfg = LlamaConfig(vocab_size=64, hidden=HIDDEN, n_layers=1, n_heads=HEADS, intermediate=1536, max_seq=64,
                      **overrides)
    return random_llama(cfg, seed=1)


def ids(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, 64, (batch, seq), generator=torch.Generator().manual_seed(batch * 100 + seq))


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-3, rtol: float = 1e-3) -> None:
    err = (got.double() - want.double()).abs()
    bad = err > atol + rtol * want.double().abs()
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} elements differ, max abs error {err.max().item():.3e}"


def test_report_says_what_was_replaced_and_why_not(release):
    from tileship.torchops.swap import KernelAttention, KernelLinear, KernelRMSNorm, swap

    model = tiny()
    report = swap(model, release, names=NAMES)
    assert sorted(report.replaced) == sorted([
        "layers.0.input_norm", "layers.0.attn.q_proj", "layers.0.attn.k_proj", "layers.0.attn.v_proj",
        "layers.0.attn.o_proj", "layers.0.attn.core", "layers.0.post_attn_norm", "norm"])
    kept = report.kept
    assert sorted(kept) == ["layers.0.mlp.down_proj", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj", "lm_head"]
    assert "no gemm specialization for K=1024, N=1536 in float32" in kept["layers.0.mlp.gate_proj"]
    assert "K=1024, N=1024" in kept["layers.0.mlp.gate_proj"]  # names what the release does cover
    assert "K=1536, N=1024" in kept["layers.0.mlp.down_proj"]
    assert "N=64" in kept["lm_head"]
    q = report.record("layers.0.attn.q_proj")
    assert q.specs == ("gemm.float32.M1-64_K1024_N1024.c",) and q.serving == ("kernel",)
    assert report.record("layers.0.attn.core").specs == ("attention.float32.B1_H8_S16_D128.c",)
    assert isinstance(model.layers[0].attn.q_proj, KernelLinear)
    assert isinstance(model.layers[0].attn.core, KernelAttention)
    assert isinstance(model.norm, KernelRMSNorm)
    assert type(model.layers[0].mlp.gate_proj) is torch.nn.Linear
    assert "8 of 12 candidate layers replaced" in str(report)
    assert report.to_json()["kept"] == 4
    again = swap(model, release, names=NAMES)  # idempotent: nothing replaced twice
    assert sorted(again.replaced) == sorted(report.replaced) and again.record("norm").reason == "already swapped"


def test_layers_the_release_cannot_serve_are_kept(release):
    from tileship.torchops.swap import kernel_stamp, swap

    eps = swap(tiny(eps=1e-5), release, names=NAMES)
    assert eps.kept["norm"] == "eps 1e-05 differs from the kernel's 1e-06"
    double = tiny().double()
    wide = swap(double, release, names=NAMES)
    assert wide.replaced == [] and kernel_stamp(double) is None  # runs no kernels, claims none
    assert wide.kept["layers.0.attn.q_proj"] == "no gemm specialization in float64 (the release has float32)"
    assert "no gemm specialization in float64" in wide.kept["layers.0.attn.q_proj"]
    assert wide.kept["layers.0.attn.core"].startswith("no attention specialization in float64")
    missing = swap(tiny(), release)  # default names: the release has no operator called "rmsnorm"
    assert missing.kept["norm"].startswith(
        "the release has no 'rmsnorm' operator (it has: attention, gemm, rmsnorm_cpu)"
    )


def test_serving_only_keeps_layers_whose_every_covering_specialization_serves_the_reference(swap_release_build):
    """A layer whose kernels all serve the reference (here: disabled at load) would only pay the
    dispatcher's time when swapped: ``serving_only`` keeps it on PyTorch and says why; the default
    still replaces it (it decides per call), and the other layers are swapped either way."""
    import tileship
    from tileship.torchops.swap import KernelLinear, KernelRMSNorm, swap

    release = tileship.load(swap_release_build.path, disabled=["gemm.float32.M1-64_K1024_N1024.c"])
    assert release.ops["gemm"].entries[0].decision.path == "reference"
    model = tiny()
    report = swap(model, release, names=NAMES, serving_only=True)
    q = report.record("layers.0.attn.q_proj")
    assert not q.replaced and q.specs == ("gemm.float32.M1-64_K1024_N1024.c",)
    assert q.serving == ("reference:disabled_by_policy",)
    assert "every covering specialization serves the reference now (reference:disabled_by_policy)" in q.reason
    assert type(model.layers[0].attn.q_proj) is torch.nn.Linear
    assert isinstance(model.norm, KernelRMSNorm) and report.record("norm").serving == ("kernel",)
    assert sorted(report.replaced) == ["layers.0.attn.core", "layers.0.input_norm", "layers.0.post_attn_norm", "norm"]
    x = ids(1, SEQ)
    with torch.no_grad():
        assert_close(model(x), tiny()(x))  # same weights (seed 1): the kept layers are the model's own
    default = tiny()
    assert isinstance(default.layers[0].attn.q_proj, torch.nn.Linear)
    swap(default, release, names=NAMES)  # without serving_only the covered layer is swapped as before
    assert isinstance(default.layers[0].attn.q_proj, KernelLinear)


def test_wrong_operator_for_a_kind_is_refused(release):
    from tileship.errors import DeclarationError
    from tileship.torchops.swap import swap

    with pytest.raises(
        DeclarationError,
        match=r"operator 'rmsnorm_cpu' is declared \(X\(M, N\), W\(N\)\).*a linear layer needs A\(M, K\), B\(K, N\)",
    ):
        swap(tiny(), release, names={"linear": "rmsnorm_cpu"})


def test_swapped_model_matches_and_falls_back_per_call(release):
    from tileship.torchops.swap import swap

    ref = tiny()
    model = tiny()
    swap(model, release, names=NAMES)
    with torch.no_grad():
        assert_close(model(ids(1, SEQ)), ref(ids(1, SEQ)))
        counts = release.counters()
        assert counts["gemm"] == {"kernel:kernel": 4}  # q, k, v, o; the MLP stayed on torch
        assert counts["attention"] == {"kernel:kernel": 1}
        assert counts["rmsnorm_cpu"] == {"kernel:kernel": 3}
        # a sequence length the attention was not built for, and a batch past the GEMM's M range
        assert_close(model(ids(1, 8)), ref(ids(1, 8)))
        assert release.counters()["attention"] == {"kernel:kernel": 1, "reference:undeclared_shape": 1}
        assert_close(model(ids(5, SEQ)), ref(ids(5, SEQ)))  # M = 80 > 64
        assert release.counters()["gemm"] == {"kernel:kernel": 8, "reference:undeclared_shape": 4}


def test_compiled_swapped_model_has_no_graph_break_nor_recompile(release):
    from torch._dynamo.utils import counters

    from tileship.torchops.custom_ops import mark_dynamic
    from tileship.torchops.swap import swap

    ref = tiny()
    model = tiny()
    swap(model, release, names=NAMES)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for batch in (1, 2, 3):  # M = 16, 32, 48: one graph, every call on the kernels
            x = mark_dynamic(ids(batch, SEQ), 0)
            assert_close(compiled(x), ref(x))
    assert counters["stats"]["unique_graphs"] == 1
    assert release.counters()["gemm"] == {"kernel:kernel": 12}
    assert release.counters()["attention"] == {"kernel:kernel": 1, "reference:undeclared_shape": 2}  # B=2,3 not built


def test_reference_model_compiles_fullgraph():
    from torch._dynamo.utils import counters

    from tileship.torchops.custom_ops import mark_dynamic

    model = tiny()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for batch in (1, 4):
            x = mark_dynamic(ids(batch, SEQ), 0)
            assert_close(compiled(x), model(x))
    assert counters["stats"]["unique_graphs"] == 1


def test_state_dict_carries_the_kernel_stamp(release, cpu_release_build, tmp_path):
    import tileship
    from tileship.errors import KernelMismatch
    from tileship.torchops.swap import kernel_stamp, load, load_state_dict, save, swap

    model = tiny()
    swap(model, release, names=NAMES)
    stamp = kernel_stamp(model)
    assert (
        stamp is not None
        and stamp.release_id == release.release_id
        and stamp.kernel_revision == release.kernel_revision
    )
    assert stamp.operators == ("attention", "gemm", "rmsnorm_cpu")
    sd = model.state_dict()
    assert sd["tileship_kernels._extra_state"] == stamp.to_json()
    assert "layers.0.attn.q_proj.weight" in sd and not any(k.endswith("weight_t") for k in sd)  # same keys as nn.Linear

    # round trip through a file into a fresh model swapped with the same release
    path = tmp_path / "model.pt"
    save(model, path)
    again = tiny()
    with torch.no_grad():
        for p in again.parameters():
            p.zero_()
    swap(again, release, names=NAMES)
    assert load(again, path) == stamp.to_json()
    with torch.no_grad():
        assert_close(again(ids(1, SEQ)), model(ids(1, SEQ)))  # weight_t was refreshed from the loaded weights

    # another release's kernels: refused, with both ids in the message; the override loads
    other = tiny()
    cpu_catalog = tileship.load(cpu_release_build.path)
    with pytest.raises(KernelMismatch, match=f"already runs kernels of release {release.release_id}"):
        swap(model, cpu_catalog, names=NAMES)
    swap(other, cpu_catalog, names=NAMES)
    with pytest.raises(
        KernelMismatch,
        match=f"release_id {release.release_id} \\(checkpoint\\) != {cpu_release_build.release_id} \\(model\\)",
    ):
        load(other, path)
    with pytest.raises(KernelMismatch, match="release_id"):
        other.load_state_dict(sd)  # plain torch loading checks too
    load(other, path, allow_kernel_mismatch=True)
    assert kernel_stamp(other).release_id == cpu_release_build.release_id  # the model keeps its own kernels

    # a changed kernel revision is a mismatch even under the same release id
    sd_rev = {**sd, "tileship_kernels._extra_state": {**stamp.to_json(), "kernel_revision": "0000000"}}
    with pytest.raises(KernelMismatch, match="kernel_revision 0000000 \\(checkpoint\\)"):
        again.load_state_dict(sd_rev)

    # a plain model refuses a stamped checkpoint unless told; plain weights load into a swapped model
    plain = tiny()
    with pytest.raises(KernelMismatch, match="this model runs no tileship kernels"):
        load(plain, path)
    load_state_dict(plain, sd, allow_kernel_mismatch=True)
    again.load_state_dict(tiny().state_dict())


class _SeenOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every op that reaches torch's dispatcher (a custom op call shows as its own name)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_swapped_layers_skip_the_dispatcher_in_eager_but_not_for_autograd(release):
    from tileship.torchops.custom_ops import EagerOp
    from tileship.torchops.swap import swap

    model = tiny()
    swap(model, release, names=NAMES)
    q = model.layers[0].attn.q_proj
    assert isinstance(q.op, EagerOp)
    x = torch.randn(SEQ, HIDDEN)
    want = x @ q.weight.detach().t()
    with torch.no_grad(), _SeenOps() as seen:
        assert_close(q(x), want)
    assert not any("tileship_" in n for n in seen.names), seen.names  # the implementation ran directly
    with _SeenOps() as seen:  # grad mode on, an input requires grad: autograd must see the custom op
        assert_close(q(x.requires_grad_()).detach(), want)
    assert any(n.startswith(f"tileship_{release.release_id}.gemm") for n in seen.names), seen.names
    runner = release.ops["gemm"]
    runner.check_finite = True  # the implementation's path (it refuses the NaN check under graph capture)
    try:
        with torch.no_grad(), _SeenOps() as seen:
            assert_close(q(x.detach()), want)
    finally:
        runner.check_finite = False
    assert not any("tileship_" in n for n in seen.names), seen.names
    assert release.counters()["gemm"] == {"kernel:kernel": 3}  # every call dispatched by tileship, on the kernel


def test_kernel_rmsnorm_keeps_the_input_shape_for_any_output_layout():
    import torch

    from tileship.torchops.swap import KernelRMSNorm

    w = torch.nn.Parameter(torch.rand(8) + 0.5)

    def ref(x2, w_):
        return x2 * torch.rsqrt(x2.pow(2).mean(-1, keepdim=True) + 1e-6) * w_

    def strided(x2, w_):  # a foreign operator whose answer is a transposed copy's transpose
        return ref(x2, w_).t().contiguous().t()

    x = torch.randn(2, 3, 8)
    want = ref(x.reshape(-1, 8), w).reshape(2, 3, 8)
    for op in (ref, strided):
        y = KernelRMSNorm(w, 1e-6, op)(x)
        assert y.shape == x.shape and torch.equal(y, want)
    xt = torch.randn(3, 2, 8).transpose(0, 1)  # a non-contiguous input
    y = KernelRMSNorm(w, 1e-6, ref)(xt)
    assert y.shape == xt.shape and torch.allclose(y, ref(xt.reshape(-1, 8), w).reshape(2, 3, 8))


def test_reference_routed_linear_runs_torch_linear_and_is_still_counted(release):
    """A key the dispatcher sends to the reference runs F.linear on the layer's own parameters (what
    nn.Linear ran), not the operator's reference; the call is counted under the key's reason; keys a
    kernel serves still reach the kernel; a copied layer starts with an empty memo."""
    import copy

    from tileship.torchops.swap import swap

    model = tiny()
    swap(model, release, names=NAMES)
    q = model.layers[0].attn.q_proj
    runner = release.ops["gemm"]
    calls: list[int] = []
    plain_reference = runner.reference

    def spy(*args: Any) -> Any:
        calls.append(1)
        return plain_reference(*args)

    runner.reference = spy
    try:
        with torch.no_grad():
            big = torch.randn(80, HIDDEN)  # M = 80: past the GEMM's declared range
            for _ in range(3):
                assert_close(q(big), big @ q.weight.t())
            assert calls == []  # F.linear served it, not the operator's reference
            assert release.counters()["gemm"] == {"reference:undeclared_shape": 3}
            small = torch.randn(2, 8, HIDDEN)  # M = 16: a kernel serves it, through the operator
            assert_close(q(small), small @ q.weight.t())
            assert release.counters()["gemm"] == {"kernel:kernel": 1, "reference:undeclared_shape": 3}
            assert len(q._routes) == 2
            twin = copy.deepcopy(q)
            assert twin._routes == {}
            assert_close(twin(big), big @ q.weight.t())
            assert calls == []
            twin.op = twin.op  # a new op (serve's recorder sets one) starts a new memo
            assert twin._routes == {}
    finally:
        runner.reference = plain_reference


def test_reference_routed_linear_keeps_its_bias_and_follows_a_new_runner(release):
    """With a bias, the bypass adds it as nn.Linear does; after the release is registered again the
    memoized runner is stale and the layer asks the new one."""
    from torch import nn

    from tileship.torchops import custom_ops
    from tileship.torchops.swap import KernelLinear

    ops = custom_ops.register(release)
    lin = nn.Linear(HIDDEN, HIDDEN, bias=True)
    layer = KernelLinear(lin, ops.eager("gemm"))
    x = torch.randn(80, HIDDEN)
    with torch.no_grad():
        assert_close(layer(x), lin(x))
        (runner, route), = layer._routes.values()
        assert route is not None and runner is release.ops["gemm"]
        qual = layer.op.qual
        served = custom_ops._runners[qual]

        class NewRunner:  # what a re-registration binds: here one whose kernel serves every key
            check_finite = False
            asked = 0

            def reference_route(self, *args: Any) -> None:
                NewRunner.asked += 1

            def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
                return torch.zeros(a.shape[0], b.shape[1])

        custom_ops._runners[qual] = NewRunner()
        try:
            assert_close(layer(x), torch.zeros(80, HIDDEN) + lin.bias)  # the new runner served it
            assert NewRunner.asked == 1
            assert [hit[0] for hit in layer._routes.values()] == [custom_ops._runners[qual]]  # the old one forgotten
        finally:
            custom_ops._runners[qual] = served
        assert_close(layer(x), lin(x))


def test_reference_routed_norm_and_attention_run_their_torch_layers_code(release):
    """A swapped RMSNorm or attention whose key goes to the reference runs what the replaced layer ran
    (``F.rms_norm``, causal SDPA), not the operator's reference, and the call is counted; a norm of a
    foreign class (``rmsnorm_types``) may compute otherwise, so its calls still go through the operator."""
    from tileship.torchops.layers import RMSNorm
    from tileship.torchops.swap import swap

    model = tiny()
    swap(model, release, names=NAMES)
    norm, core = model.norm, model.layers[0].attn.core
    spied: dict[str, list[int]] = {"rmsnorm_cpu": [], "attention": []}
    plain = {name: release.ops[name].reference for name in spied}

    def spy(name: str) -> Any:
        def call(*args: Any) -> Any:
            spied[name].append(1)
            return plain[name](*args)
        return call

    for name in spied:
        release.ops[name].reference = spy(name)
    try:
        with torch.no_grad():
            x = torch.randn(1, 4097, HIDDEN)  # M = 4097: past rmsnorm_cpu's declared range
            want = torch.nn.functional.rms_norm(x, (HIDDEN,), norm.weight, norm.eps)
            for _ in range(2):
                assert torch.equal(norm(x), want)
            q, k, v = (torch.randn(1, HEADS, 8, HEAD_DIM).transpose(2, 3).contiguous().transpose(2, 3)
                       for _ in range(3))  # S = 8 (undeclared), and not contiguous
            assert torch.equal(core(q, k, v), attention_reference(q, k, v))
            assert spied == {"rmsnorm_cpu": [], "attention": []}
            counters = release.counters()
            assert counters["rmsnorm_cpu"] == {"reference:undeclared_shape": 2}
            assert counters["attention"] == {"reference:undeclared_shape": 1}
            assert len(norm._routes) == 1 and len(core._routes) == 1
            norm.to(torch.float64)  # moving a layer (device, dtype) forgets what it learned
            assert norm._routes == {} and len(core._routes) == 1
            norm.to(torch.float32)

            class OwnNorm(RMSNorm):  # a subclass: swap replaces it, but its forward may differ
                pass

            foreign = tiny()
            foreign.norm = OwnNorm(HIDDEN)
            swap(foreign, release, names=NAMES, rmsnorm_types=(OwnNorm,))
            assert_close(foreign.norm(x), want / norm.weight * foreign.norm.weight)
            assert spied["rmsnorm_cpu"] == [1] and foreign.norm._routes == {}
    finally:
        for name in spied:
            release.ops[name].reference = plain[name]
