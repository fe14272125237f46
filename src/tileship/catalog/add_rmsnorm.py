"""Fused residual add + RMSNorm, as a decoder layer runs it between its blocks.

``h = x + residual`` (rounded to the dtype, as an unfused model stores it), then
``y = h * rsqrt(mean(h^2) + eps) * w`` with fp32 statistics over the rounded ``h``. Both ``y``
(the next block's input) and ``h`` (the new residual) are outputs, so one pass reads ``x``,
``residual`` and ``w`` once and writes both, where the unfused path reads ``h`` back.

The reference is the unfused PyTorch pair, ``x + residual`` then ``F.rms_norm``. Under
``torch.compile`` inductor fuses the same pair; ``benchmarks/decode_kernels.py`` times that too.
"""

from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs
from tileship.catalog.rmsnorm import EPS, rms_scale
from tileship.declare.spec import DynamicRange, Operator, TensorArg


def add_rms_norm(M: Any, N: int, dtype: str = "float16", threads: int = 128, eps: float = EPS) -> Any:
    """One row per block: (y, h) for x, residual [M, N] and w [N]. ``M`` may be ``T.dynamic``."""
    scale = rms_scale(N, eps, dtype)

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), R: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype),
             Y: T.Tensor((M, N), dtype), H: T.Tensor((M, N), dtype)):
        with T.Kernel(M, threads=threads) as row:
            h_tile = T.alloc_shared((1, N), dtype)
            r_tile = T.alloc_shared((1, N), dtype)
            w_tile = T.alloc_shared((N,), dtype)
            hf = T.alloc_fragment((1, N), "float32")
            T.copy(X[row, 0], h_tile)
            T.copy(R[row, 0], r_tile)
            T.copy(W, w_tile)
            for i, j in T.Parallel(1, N):
                h_tile[i, j] = T.cast(T.cast(h_tile[i, j], "float32") + T.cast(r_tile[i, j], "float32"), dtype)
            T.copy(h_tile, H[row, 0])
            T.copy(h_tile, hf)
            scale(hf, w_tile, r_tile)  # r_tile, read, now holds y
            T.copy(r_tile, Y[row, 0])

    return main


def add_rms_norm_reference(x: Any, residual: Any, w: Any) -> tuple[Any, Any]:
    """The unfused PyTorch pair: ``h = x + residual``, ``y = F.rms_norm(h)``; returns (y, h)."""
    h = x + residual
    return torch.nn.functional.rms_norm(h, (h.shape[-1],), w, EPS), h


def add_rms_norm_sample(dims: dict[str, int], dtype: str, device: Any) -> tuple[Any, Any, Any]:
    """Activations and residuals ~ N(0, 1), weights ~ U(0.5, 1.5): outputs O(1)."""
    m, n = dims["M"], dims["N"]
    dt = getattr(torch, dtype)
    return (torch.randn(m, n, device=device).to(dt), torch.randn(m, n, device=device).to(dt),
            (torch.rand(n, device=device) + 0.5).to(dt))


add_rmsnorm = Operator(
    name="add_rmsnorm",
    factory=add_rms_norm,
    reference=add_rms_norm_reference,
    cost=costs.add_rmsnorm,
    inputs=(TensorArg("X", ("M", "N")), TensorArg("residual", ("M", "N")), TensorArg("W", ("N",))),
    outputs=(TensorArg("Y", ("M", "N")), TensorArg("H", ("M", "N"))),
    dtypes=("float16", "bfloat16"),
    targets=("cuda-sm90a",),
    config={"threads": 128, "eps": EPS},
    ranges=(DynamicRange("M", 1, 65536, {"N": 4096}),),
    shapes=tuple({"M": m, "N": 4096} for m in (1, 8, 32)),
    pass_configs={"tl.disable_tma_lower": True},
    sample=add_rms_norm_sample,
)
