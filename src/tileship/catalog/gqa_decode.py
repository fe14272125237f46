"""GQA decode attention over a KV cache (flash-decoding, split-KV), per-sequence lengths.

``o[b, h] = softmax(q[b, h] . K[b, :lengths[b], h // G]^T / sqrt(D)) @ V[b, :lengths[b], h // G]``
for one new token per sequence: q [B, H_q, D], the cache K/V [B, S, H_kv, D] (S its capacity),
lengths [B] int32 (1..S valid positions). Llama-3-8B heads: H_q 32, H_kv 8, D 128.

Kernel 1 runs one CTA per (split, kv head, sequence), all G = H_q / H_kv query heads of the
group in one tile, with a loop bound read from ``lengths`` (splits past the length do no
loads) and K/V read through per-sequence views whose extent is the length, so positions past
it are zero-filled, never loaded. Kernel 2 combines the splits by their log-sum-exp. The
partials live in a workspace the kernel allocates (``T.alloc_global``), not in the outputs.

The reference is ``F.scaled_dot_product_attention(enable_gqa=True)`` over the whole cache with
a boolean mask of the valid positions: graph-safe (no host sync, no data-dependent shape) and
what a PyTorch decoder under CUDA graphs runs. Positions past a length must hold finite values
for it (a zero-initialised cache does); the kernel never reads them.
"""

from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs, flash
from tileship.declare.spec import Operator, TensorArg, Tolerance

H_Q, H_KV, HEAD_DIM = 32, 8, 128
NUM_SMS = 132
#: TileLang 0.1.15: the pipelined loop with a length-dependent bound needs explicit unrolling
#: in codegen; warp specialization is not used for this kernel (as in TileLang's own example)
PASS_CONFIGS = {"tl.disable_warp_specialized": True, "tl.UnrollLoop": {"explicit_unroll": True}}


def pick_split(B: int, S: int, HKV: int = H_KV, block_N: int = 64) -> int:
    """Splits per (sequence, kv head): one resident wave of ~3 CTAs per SM, >= 2 KV tiles a split."""
    pairs = B * HKV
    num_split = 1 << (max(1, (3 * NUM_SMS) // pairs).bit_length() - 1)
    tiles = max(1, S // block_N // 2)
    return max(1, min(num_split, 64, 1 << (tiles.bit_length() - 1)))


def split_plan(B: int, S: int, HQ: int, HKV: int, D: int, block_N: int, block_H: int) -> tuple[int, int]:
    """(splits per (sequence, kv head), positions per split, a whole number of KV tiles)."""
    if HQ % HKV or HQ // HKV > block_H or D > 256:
        raise ValueError(f"gqa_decode needs HQ % HKV == 0, HQ/HKV <= {block_H} and D <= 256 "
                         f"(HQ={HQ}, HKV={HKV}, D={D})")
    if S % block_N:
        raise ValueError(f"gqa_decode needs the cache capacity S to be a multiple of {block_N}, got {S}")
    num_split = pick_split(B, S, HKV, block_N)
    per_split = -(-S // num_split)  # ceil
    return num_split, -(-per_split // block_N) * block_N  # rounded up to whole KV tiles


def attend_split(HQ: int, HKV: int, D: int, dtype: str, block_N: int, block_H: int, num_stages: int,
                 split_len: int, load: Any) -> Any:
    """A macro: one (split, kv head, sequence) of kernel 1, all G query heads of the group in one
    tile, online softmax over the split's valid KV tiles; partial output and log-sum-exp out.

    ``load(tile, kv, aux, bid, g, start, k, n_valid)`` fills ``tile`` [block_N, D] with ``kv``'s rows
    ``start + k * block_N ..`` (+ block_N) of sequence ``bid``, head ``g``; rows past the split's
    ``n_valid`` must come out finite (zero), as their scores are masked but V rows still multiply.
    ``aux`` is the layout's extra buffer (the block table of a paged cache), unused when contiguous.
    """
    G = HQ // HKV
    acc_t = "float32"
    scale = (1.0 / D) ** 0.5 * 1.44269504  # log2(e) folded in: exp2 domain
    neg_inf = -T.infinity(acc_t)
    tiles = flash.qkv_tiles(block_H, block_N, D, dtype)
    state = flash.softmax_state(block_H)
    accumulate = flash.softmax_accumulate(block_H, block_N, scale)

    @T.macro
    def attend(Q, K, V, aux, o_part, lse_part, sid, g, bid, seqlen):
        q_s, k_s, v_s = tiles()
        p_s = T.alloc_shared((block_H, block_N), dtype)
        s_acc = T.alloc_fragment((block_H, block_N), acc_t)
        o_acc = T.alloc_fragment((block_H, D), acc_t)
        m_new, m_old, corr, row_sum, denom = state()
        start = sid * split_len
        n_valid = T.min(seqlen - start, split_len)
        if n_valid > 0:
            for i, j in T.Parallel(block_H, D):
                q_s[i, j] = T.if_then_else(i < G, Q[bid, g * G + T.min(i, G - 1), j], T.cast(0, dtype))
            T.fill(o_acc, 0)
            T.fill(denom, 0)
            T.fill(m_new, neg_inf)
            for k in T.Pipelined(T.ceildiv(n_valid, block_N), num_stages=num_stages):
                load(k_s, K, aux, bid, g, start, k, n_valid)
                T.clear(s_acc)
                T.gemm(q_s, k_s, s_acc, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_H, block_N):
                    s_acc[i, j] = T.if_then_else(k * block_N + j < n_valid, s_acc[i, j], neg_inf)
                T.copy(m_new, m_old)
                T.reduce_max(s_acc, m_new, dim=1, clear=False)
                for i in T.Parallel(block_H):
                    m_new[i] = T.max(m_new[i], m_old[i])
                    corr[i] = T.exp2(m_old[i] * scale - m_new[i] * scale)
                accumulate(s_acc, m_new, corr, row_sum, denom)
                T.copy(s_acc, p_s)
                for i, j in T.Parallel(block_H, D):
                    o_acc[i, j] *= corr[i]
                load(v_s, V, aux, bid, g, start, k, n_valid)
                T.gemm(p_s, v_s, o_acc, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_H, D):
                if i < G:
                    o_part[bid, g * G + i, sid, j] = o_acc[i, j] / denom[i]
            for i in T.Parallel(block_H):
                if i < G:
                    lse_part[bid, g * G + i, sid] = T.log2(denom[i]) + m_new[i] * scale
        else:
            for i in T.Parallel(block_H):
                if i < G:
                    lse_part[bid, g * G + i, sid] = neg_inf

    return attend


def combine_splits(D: int, dtype: str, num_split: int, split_len: int) -> Any:
    """A macro: kernel 2's body for one (query head, sequence), the splits summed by their log-sum-exp."""
    acc_t = "float32"
    neg_inf = -T.infinity(acc_t)

    @T.macro
    def combine(o_part, lse_part, lengths, O, h, bz):
        tx = T.get_thread_binding()
        lse_s = T.alloc_shared((num_split,), acc_t)
        lse_max = T.alloc_local((1,), acc_t)
        lse_sum = T.alloc_local((1,), acc_t)
        acc = T.alloc_local((1,), acc_t)
        used = T.min(T.ceildiv(lengths[bz], split_len), num_split)
        if tx < num_split:
            lse_s[tx] = T.if_then_else(tx < used, lse_part[bz, h, T.min(tx, num_split - 1)], neg_inf)
        T.sync_threads()
        lse_max[0] = neg_inf
        for k in T.unroll(num_split):
            lse_max[0] = T.max(lse_max[0], lse_s[k])
        lse_sum[0] = 0
        acc[0] = 0
        for k in T.unroll(num_split):
            if k < used:
                lse_sum[0] += T.exp2(lse_s[k] - lse_max[0])
                acc[0] += T.exp2(lse_s[k] - lse_max[0]) * o_part[bz, h, k, tx]
        O[bz, h, tx] = T.cast(acc[0] / lse_sum[0], dtype)

    return combine


def gqa_decode(B: int, S: int, HQ: int = H_Q, HKV: int = H_KV, D: int = HEAD_DIM, dtype: str = "float16",
               block_N: int = 64, block_H: int = 16, num_stages: int = 2, threads: int = 128) -> Any:
    """The split-KV decode kernel for one (B, S); the split count follows from the shape."""
    num_split, split_len = split_plan(B, S, HQ, HKV, D, block_N, block_H)
    strides = (S * HKV * D, HKV * D, D, 1)

    @T.macro
    def load(tile, kv, aux, bid, g, start, k, n_valid):
        T.copy(kv[bid, start + k * block_N:start + (k + 1) * block_N, g, :], tile)

    attend = attend_split(HQ, HKV, D, dtype, block_N, block_H, num_stages, split_len, load)
    combine = combine_splits(D, dtype, num_split, split_len)

    @T.prim_func
    def main(Q: T.Tensor((B, HQ, D), dtype), K: T.Tensor((B, S, HKV, D), dtype),
             V: T.Tensor((B, S, HKV, D), dtype), lengths: T.Tensor((B,), "int32"),
             O: T.Tensor((B, HQ, D), dtype)):
        o_part = T.alloc_global((B, HQ, num_split, D), "float32")
        lse_part = T.alloc_global((B, HQ, num_split), "float32")
        with T.Kernel(num_split, HKV, B, threads=threads) as (sid, g, bid):
            seqlen = lengths[bid]
            # K/V through views whose extent is the length: rows past it are zero-filled, never loaded
            k_view = T.StridedTensor((B, seqlen, HKV, D), strides, dtype, data=K.data)
            v_view = T.StridedTensor((B, seqlen, HKV, D), strides, dtype, data=V.data)
            attend(Q, k_view, v_view, lengths, o_part, lse_part, sid, g, bid, seqlen)
        with T.Kernel(HQ, B, threads=D) as (h, bz):
            combine(o_part, lse_part, lengths, O, h, bz)

    return main


def gqa_decode_reference(q: Any, k: Any, v: Any, lengths: Any) -> Any:
    """SDPA (GQA) over the whole cache with a mask of the valid positions; no host sync."""
    s = k.shape[1]
    valid = torch.arange(s, device=q.device)[None, :] < lengths.to(q.device).long()[:, None]  # [B, S]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=valid[:, None, None, :], enable_gqa=True)
    return out.squeeze(2)


def gqa_decode_sample(dims: dict[str, int], dtype: str, device: Any) -> tuple[Any, Any, Any, Any]:
    """A full cache of N(0, 1) keys/values, every sequence at its full length S, and queries of

    std 3 so that the softmax is peaked and outputs are O(1) (a flat softmax over thousands of
    positions averages to ~0, which a loose tolerance could not tell from a wrong answer)."""
    b, s, h_q, h_kv, d = dims["B"], dims["S"], dims["HQ"], dims["HKV"], dims["D"]
    dt = getattr(torch, dtype)
    q = (3.0 * torch.randn(b, h_q, d, device=device)).to(dt)
    k = torch.randn(b, s, h_kv, d, device=device).to(dt)
    v = torch.randn(b, s, h_kv, d, device=device).to(dt)
    return q, k, v, torch.full((b,), s, dtype=torch.int32, device=device)


gqa = Operator(
    name="gqa_decode",
    factory=gqa_decode,
    reference=gqa_decode_reference,
    cost=costs.gqa_decode,
    inputs=(TensorArg("q", ("B", "HQ", "D")), TensorArg("k_cache", ("B", "S", "HKV", "D")),
            TensorArg("v_cache", ("B", "S", "HKV", "D")), TensorArg("lengths", ("B",), dtype="int32")),
    outputs=(TensorArg("o", ("B", "HQ", "D")),),
    dtypes=("float16", "bfloat16"),
    targets=("cuda-sm90a",),
    shapes=tuple({"B": b, "S": s, "HQ": H_Q, "HKV": H_KV, "D": HEAD_DIM}
                 for b, s in ((1, 1024), (1, 8192), (1, 32768), (8, 1024), (8, 8192), (32, 1024), (32, 8192))),
    tolerances={"float16": Tolerance(atol=2e-3, rtol=1e-2), "bfloat16": Tolerance(atol=1.6e-2, rtol=2e-2)},
    pass_configs=PASS_CONFIGS,
    sample=gqa_decode_sample,
)
