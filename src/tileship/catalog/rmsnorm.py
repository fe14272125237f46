"""RMSNorm with a weight, one row per thread block, fp32 statistics."""

from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs
from tileship.declare.spec import DynamicRange, Operator, TensorArg

EPS = 1e-6


def rms_scale(N: int, eps: float, dtype: str) -> Any:
    """A macro: ``out = x * rsqrt(mean(x^2) + eps) * w`` for one row, ``x`` held in the fp32 fragment
    ``xf`` [1, N], ``w`` [N] in shared memory, ``out`` [1, N] in ``dtype``; fp32 statistics."""

    @T.macro
    def scale(xf, w_tile, out):
        sq = T.alloc_fragment((1, N), "float32")
        ss = T.alloc_fragment((1,), "float32")
        for i, j in T.Parallel(1, N):
            sq[i, j] = xf[i, j] * xf[i, j]
        T.reduce_sum(sq, ss, dim=1)
        for i in T.Parallel(1):
            ss[i] = T.rsqrt(ss[i] / N + eps)
        for i, j in T.Parallel(1, N):
            out[i, j] = T.cast(xf[i, j] * ss[i] * T.cast(w_tile[j], "float32"), dtype)

    return scale


def rms_norm(M: Any, N: int, dtype: str = "float16", threads: int = 128, eps: float = EPS) -> Any:
    """y = x * rsqrt(mean(x^2) + eps) * w, row-wise. ``M`` may be ``T.dynamic``."""
    scale = rms_scale(N, eps, dtype)

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M, threads=threads) as row:
            x_tile = T.alloc_shared((1, N), dtype)
            w_tile = T.alloc_shared((N,), dtype)
            xf = T.alloc_fragment((1, N), "float32")
            T.copy(X[row, 0], x_tile)
            T.copy(W, w_tile)
            T.copy(x_tile, xf)
            scale(xf, w_tile, x_tile)
            T.copy(x_tile, Y[row, 0])

    return main


def rms_norm_reference(x: Any, w: Any) -> Any:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, EPS)


rmsnorm = Operator(
    name="rmsnorm",
    factory=rms_norm,
    reference=rms_norm_reference,
    cost=costs.rmsnorm,
    inputs=(TensorArg("X", ("M", "N")), TensorArg("W", ("N",))),
    outputs=(TensorArg("Y", ("M", "N")),),
    dtypes=("float16", "bfloat16"),
    targets=("cuda-sm90a",),
    config={"threads": 128, "eps": EPS},
    ranges=(DynamicRange("M", 1, 65536, {"N": 4096}),),
    shapes=({"M": 4096, "N": 4096},),
    pass_configs={"tl.disable_tma_lower": True},
)
