"""Causal flash-attention forward, (batch, heads, seq, head_dim), online softmax in fp32."""

import math
from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs, flash
from tileship.declare.spec import Operator, TensorArg, Tolerance


def flash_attention(B: int, H: int, S: int, D: int, dtype: str = "float16", block_M: int = 128,
                    block_N: int = 128, num_stages: int = 2, threads: int = 256) -> Any:
    """O = softmax(Q K^T / sqrt(D) + causal mask) V, one (block_M rows, head, batch) tile per block."""
    acc_t = "float32"
    scale = (1.0 / math.sqrt(D)) * 1.44269504  # fold log2(e): exp2 instead of exp
    shape = (B, H, S, D)
    tiles = flash.qkv_tiles(block_M, block_N, D, dtype)
    state = flash.softmax_state(block_M)
    accumulate = flash.softmax_accumulate(block_M, block_N, scale)

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
             O: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(S, block_M), H, B, threads=threads) as (bm, h, b):
            q_s, k_s, v_s = tiles()
            o_s = T.alloc_shared((block_M, D), dtype)
            s = T.alloc_fragment((block_M, block_N), acc_t)
            p = T.alloc_fragment((block_M, block_N), dtype)
            o = T.alloc_fragment((block_M, D), acc_t)
            m_new, m_old, corr, rowsum, denom = state()

            T.copy(Q[b, h, bm * block_M:(bm + 1) * block_M, :], q_s)
            T.fill(o, 0)
            T.fill(denom, 0)
            T.fill(m_new, -T.infinity(acc_t))
            n_blocks = T.min(T.ceildiv(S, block_N), T.ceildiv((bm + 1) * block_M, block_N))
            for kb in T.Pipelined(n_blocks, num_stages=num_stages):
                T.copy(K[b, h, kb * block_N:(kb + 1) * block_N, :], k_s)
                for i, j in T.Parallel(block_M, block_N):
                    s[i, j] = T.if_then_else(bm * block_M + i >= kb * block_N + j, 0, -T.infinity(acc_t))
                T.gemm(q_s, k_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(m_new, m_old)
                T.fill(m_new, -T.infinity(acc_t))
                T.reduce_max(s, m_new, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    m_new[i] = T.max(m_new[i], m_old[i])
                for i in T.Parallel(block_M):
                    corr[i] = T.exp2(m_old[i] * scale - m_new[i] * scale)
                accumulate(s, m_new, corr, rowsum, denom)
                for i, j in T.Parallel(block_M, D):
                    o[i, j] *= corr[i]
                T.copy(s, p)
                T.copy(V[b, h, kb * block_N:(kb + 1) * block_N, :], v_s)
                T.gemm(p, v_s, o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_M, D):
                o[i, j] /= denom[i]
            T.copy(o, o_s)
            T.copy(o_s, O[b, h, bm * block_M:(bm + 1) * block_M, :])

    return main


def attention_reference(q: Any, k: Any, v: Any) -> Any:
    """PyTorch SDPA (flash/efficient kernels on GPU) with a causal mask."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


attention = Operator(
    name="attention",
    factory=flash_attention,
    reference=attention_reference,
    cost=costs.causal_attention,
    inputs=(TensorArg("Q", ("B", "H", "S", "D")), TensorArg("K", ("B", "H", "S", "D")),
            TensorArg("V", ("B", "H", "S", "D"))),
    outputs=(TensorArg("O", ("B", "H", "S", "D")),),
    dtypes=("float16", "bfloat16"),
    targets=("cuda-sm90a",),
    config={"block_M": 128, "block_N": 128, "num_stages": 2, "threads": 256},
    shapes=({"B": 1, "H": 32, "S": 2048, "D": 128}, {"B": 4, "H": 32, "S": 1024, "D": 128},
            {"B": 1, "H": 32, "S": 4096, "D": 128}),
    tolerances={"float16": Tolerance(atol=2e-2, rtol=2e-2), "bfloat16": Tolerance(atol=5e-2, rtol=5e-2)},
)
