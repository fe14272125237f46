"""GQA decode attention over a KV cache (flash-decoding, split-KV), per-sequence lengths.

``o[b, h] = softmax(q[b, h] . K[b, :lengths[b], h // G]^T / sqrt(D)) @ V[b, :lengths[b], h // G]``
for one new token per sequence: q [B, H_q, D], the cache K/V [B, S, H_kv, D] (S its capacity),
lengths [B] int32 (1..S valid positions). Llama-3-8B heads: H_q 32, H_kv 8, D 128.

Kernel 1 runs one CTA per (split, kv head, sequence), all G = H_q / H_kv query heads of the
group in one tile, with a loop bound read from ``lengths`` (splits past the length do no
loads) and K/V read through per-sequence views whose extent is the length, so positions past
it are zero-filled, never loaded. Kernel 2 combines the splits by their log-sum-exp. The
partials live in a workspace the kernel allocates (``T.alloc_global``), not in the outputs.
A shape with one split (large batches) is one kernel writing the output itself. The pieces
and the other launch forms are in ``gqa_split``.

The reference is ``F.scaled_dot_product_attention(enable_gqa=True)`` over the whole cache with
a boolean mask of the valid positions: graph-safe (no host sync, no data-dependent shape) and
what a PyTorch decoder under CUDA graphs runs. Positions past a length must hold finite values
for it (a zero-initialised cache does); the kernel never reads them.
"""

from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs, gqa_split
from tileship.declare.spec import Operator, TensorArg, Tolerance

H_Q, H_KV, HEAD_DIM = 32, 8, 128
#: TileLang 0.1.15: the pipelined loop with a length-dependent bound needs explicit unrolling
#: in codegen; warp specialization is not used for this kernel (as in TileLang's own example)
PASS_CONFIGS = {"tl.disable_warp_specialized": True, "tl.UnrollLoop": {"explicit_unroll": True}}


def gqa_decode(B: int, S: int, HQ: int = H_Q, HKV: int = H_KV, D: int = HEAD_DIM, dtype: str = "float16",
               block_N: int = 64, block_H: int = 16, num_stages: int = 2, threads: int = 128,
               launch: str = "split", num_split: int = 0, bounded: bool = True) -> Any:
    """The split-KV decode kernel for one (B, S). ``launch``: ``split`` (two kernels, a workspace; a
    shape with one split is one kernel either way) or ``cluster`` (one kernel; at most 16 splits,
    the combine in CTA 0's shared memory). The cluster form measured slower at every catalog shape
    on the H200 (B=1 S=8k: 22.6-36 us against 21-22 us, ``benchmarks/results/h200/round11/gqa_sweep.json``),
    so the operator builds ``split``. ``num_split`` > 0 fixes the split count (a development knob).

    ``bounded`` (the default) reads K/V through views whose extent is the length: rows past it are
    zero-filled by predicated copies and never loaded. ``bounded=False`` reads the whole cache's
    tiles (bulk TMA copies), so the last tile of a sequence also loads rows past its length: their
    scores are masked, and their V rows, weighted 0, must be finite, as the reference (masked SDPA)
    requires too."""
    if launch not in ("split", "cluster"):
        raise ValueError(f"gqa_decode: launch must be 'split' or 'cluster', got {launch!r}")
    cap = gqa_split.MAX_CLUSTER if launch == "cluster" else 64
    num_split, split_len = gqa_split.split_plan(B, S, HQ, HKV, D, block_N, block_H, cap, num_split)
    if launch == "cluster" and num_split > gqa_split.MAX_CLUSTER:
        raise ValueError(f"gqa_decode: a cluster launch takes at most {gqa_split.MAX_CLUSTER} splits, got {num_split}")
    strides = (S * HKV * D, HKV * D, D, 1)

    @T.macro
    def load(tile, kv, aux, bid, g, start, k, n_valid):
        T.copy(kv[bid, start + k * block_N:start + (k + 1) * block_N, g, :], tile)

    @T.macro
    def views(K, V, seqlen):
        if bounded:
            # K/V through views whose extent is the length: rows past it are zero-filled, never loaded
            k_view = T.StridedTensor((B, seqlen, HKV, D), strides, dtype, data=K.data)
            v_view = T.StridedTensor((B, seqlen, HKV, D), strides, dtype, data=V.data)
            return k_view, v_view
        return K, V

    args = (HQ, HKV, D, dtype, block_N, block_H, num_stages, split_len, load)
    G, scale = HQ // HKV, gqa_split.exp2_scale(D)
    if num_split == 1:
        attend = gqa_split.attend_split(*args, *gqa_split.direct_store(G, D, block_H, dtype))

        @T.prim_func
        def single(Q: T.Tensor((B, HQ, D), dtype), K: T.Tensor((B, S, HKV, D), dtype),
                   V: T.Tensor((B, S, HKV, D), dtype), lengths: T.Tensor((B,), "int32"),
                   O: T.Tensor((B, HQ, D), dtype)):
            with T.Kernel(1, HKV, B, threads=threads) as (sid, g, bid):
                seqlen = lengths[bid]
                k_view, v_view = views(K, V, seqlen)
                attend(Q, k_view, v_view, lengths, O, lengths, sid, g, bid, seqlen)

        return single
    if launch == "cluster":
        attend = gqa_split.attend_split(*args, *gqa_split.local_store(G, D, block_H, scale))
        combine = gqa_split.combine_cluster(G, D, dtype, num_split, split_len)

        @T.prim_func
        def clustered(Q: T.Tensor((B, HQ, D), dtype), K: T.Tensor((B, S, HKV, D), dtype),
                      V: T.Tensor((B, S, HKV, D), dtype), lengths: T.Tensor((B,), "int32"),
                      O: T.Tensor((B, HQ, D), dtype)):
            with T.ClusterKernel(num_split, HKV, B, cluster_dims=(num_split, 1, 1), threads=threads) as (sid, g, bid):
                part_o = T.alloc_shared((block_H, D), "float32")
                part_l = T.alloc_shared((block_H,), "float32")
                all_o = T.alloc_shared((num_split, G, D), "float32")
                all_l = T.alloc_shared((num_split, G), "float32")
                seqlen = lengths[bid]
                k_view, v_view = views(K, V, seqlen)
                attend(Q, k_view, v_view, lengths, part_o, part_l, sid, g, bid, seqlen)
                # every CTA done with its tiles before any writes into CTA 0's shared memory: TileLang may
                # place all_o over CTA 0's K/V tiles (their lifetimes do not overlap in CTA 0's own program)
                T.cluster_sync()
                T.copy_cluster(part_o[0:G, :], all_o[sid, :, :], dst_block=0)
                T.copy_cluster(part_l[0:G], all_l[sid, :], dst_block=0)
                T.cluster_sync()
                if sid == 0:
                    combine(all_o, all_l, seqlen, O, g, bid)

        return clustered
    attend = gqa_split.attend_split(*args, *gqa_split.partials_store(G, D, block_H, scale))
    combine = gqa_split.combine_splits(D, dtype, num_split, split_len)

    @T.prim_func
    def main(Q: T.Tensor((B, HQ, D), dtype), K: T.Tensor((B, S, HKV, D), dtype),
             V: T.Tensor((B, S, HKV, D), dtype), lengths: T.Tensor((B,), "int32"),
             O: T.Tensor((B, HQ, D), dtype)):
        o_part = T.alloc_global((B, HQ, num_split, D), "float32")
        lse_part = T.alloc_global((B, HQ, num_split), "float32")
        with T.Kernel(num_split, HKV, B, threads=threads) as (sid, g, bid):
            seqlen = lengths[bid]
            k_view, v_view = views(K, V, seqlen)
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
                 for b, s in ((1, 1024), (1, 8192), (1, 32768), (8, 1024), (8, 8192), (16, 1024), (16, 8192),
                              (32, 1024), (32, 8192))),
    tolerances={"float16": Tolerance(atol=2e-3, rtol=1e-2), "bfloat16": Tolerance(atol=1.6e-2, rtol=2e-2)},
    pass_configs=PASS_CONFIGS,
    sample=gqa_decode_sample,
)
