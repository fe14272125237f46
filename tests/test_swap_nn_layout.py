"""``swap`` with a linear operator declared in ``F.linear``'s layout (``X(M, K), W(N, K)``, as the catalog's
decode ``linear``): the layer passes its own weight, no W^T copy, and answers as ``nn.Linear`` does, on the
kernel and on the reference path. A real "c"-target build of a naive kernel in that layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tilelang.language as T
import torch
from test_swap import HIDDEN, SEQ, assert_close, ids, tiny

from tileship.declare.spec import DynamicRange, Operator, TensorArg


def naive_linear(M: Any, N: int, K: int, dtype: str = "float32") -> Any:
    @T.prim_func
    def main(X: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M) as row:
            acc = T.alloc_local((1,), "float32")
            for n in T.serial(N):
                acc[0] = 0.0
                for k in T.serial(K):
                    acc[0] += T.cast(X[row, k], "float32") * T.cast(W[n, k], "float32")
                Y[row, n] = T.cast(acc[0], dtype)

    return main


def linear_reference(x: Any, w: Any) -> Any:
    return torch.nn.functional.linear(x, w)


linear_nk = Operator(
    name="linear_nk", factory=naive_linear, reference=linear_reference,
    inputs=(TensorArg("X", ("M", "K")), TensorArg("W", ("N", "K"))), outputs=(TensorArg("Y", ("M", "N")),),
    dtypes=("float32",), targets=("c",), ranges=(DynamicRange("M", 1, 64, {"N": HIDDEN, "K": HIDDEN}),),
)


@pytest.fixture(scope="module")
def nk_release(tmp_path_factory: pytest.TempPathFactory):
    import tileship
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import Project

    project = Project(model="swap-nk", model_version="1", operator_modules=(), targets=("c",),
                      root=Path(__file__).parent)
    result = build(project, {"linear_nk": linear_nk}, tmp_path_factory.mktemp("swap-nk"), BuildOptions(jobs=1))
    assert result.ok, [(r.spec.id, r.error) for r in result.failed]
    return tileship.load(result.path)


def test_a_linear_operator_in_f_linear_layout_takes_the_weight_as_stored(nk_release) -> None:
    from tileship.torchops.kernel_layers import KernelLinear
    from tileship.torchops.swap import swap

    ref, model = tiny(), tiny()
    report = swap(model, nk_release, names={"linear": "linear_nk"})
    q = model.layers[0].attn.q_proj
    assert isinstance(q, KernelLinear) and q.nn_layout
    assert q.weight_t.data_ptr() == q.weight.data_ptr() and q.weight_t.shape == q.weight.shape  # no copy
    assert sorted(report.replaced) == sorted(f"layers.0.attn.{n}_proj" for n in "qkvo")
    # the fixed dims are read from the F.linear layout: K = in_features, N = out_features
    assert "no linear_nk specialization for K=1024, N=1536 in float32" in report.kept["layers.0.mlp.gate_proj"]
    with torch.no_grad():
        assert_close(model(ids(1, SEQ)), ref(ids(1, SEQ)))
        assert nk_release.counters()["linear_nk"] == {"kernel:kernel": 4}  # q, k, v, o at M=16
        assert_close(model(ids(5, SEQ)), ref(ids(5, SEQ)))  # M = 80 > 64: the reference path (F.linear)
        assert nk_release.counters()["linear_nk"] == {"kernel:kernel": 4, "reference:undeclared_shape": 4}


def test_the_alias_follows_a_loaded_state_dict(nk_release) -> None:
    from tileship.torchops.swap import swap

    src = tiny()
    model = tiny()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    swap(model, nk_release, names={"linear": "linear_nk"})
    model.load_state_dict(src.state_dict())
    q = model.layers[0].attn.q_proj
    assert q.weight_t.data_ptr() == q.weight.data_ptr()
    with torch.no_grad():
        assert_close(model(ids(1, SEQ)), src(ids(1, SEQ)))
    assert not any(k.endswith("weight_t") for k in model.state_dict())
