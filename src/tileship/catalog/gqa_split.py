"""The split-KV pieces of GQA decode attention, as TileLang macros, and how a kernel is launched.

One CTA runs one (split, kv head, sequence): all G = H_q / H_kv query heads of the group in one
tile, an online softmax over the split's valid KV tiles (``attend_split``). What it does with its
result is the launch's choice, given as ``store`` macros:

- ``split``: partial outputs and log-sum-exp go to a global workspace, and a second kernel
  combines the splits (``combine_splits``): two launches, any split count;
- ``cluster``: the splits of one (kv head, sequence) form a thread-block cluster (at most 16
  CTAs); each sends its partial into CTA 0's shared memory, and after the cluster barrier CTA 0
  combines them (``combine_cluster``): one launch, no workspace;
- one split: the CTA writes the output itself (``direct_store``).
"""

from typing import Any

import tilelang.language as T

from tileship.catalog import flash

NUM_SMS = 132
#: the largest thread-block cluster the kernel asks for (16 is beyond CUDA's portable 8; H100/H200 allow it)
MAX_CLUSTER = 16
ACC = "float32"


def exp2_scale(D: int) -> float:
    """The score scale with log2(e) folded in: the kernels work in the exp2 domain."""
    return (1.0 / D) ** 0.5 * 1.44269504


def pick_split(B: int, S: int, HKV: int = 8, block_N: int = 64, cap: int = 64) -> int:
    """Splits per (sequence, kv head): one resident wave of ~3 CTAs per SM, >= 2 KV tiles a split,
    at most ``cap`` (a power of two: 16 when the splits of a head form one thread-block cluster)."""
    pairs = B * HKV
    num_split = 1 << (max(1, (3 * NUM_SMS) // pairs).bit_length() - 1)
    tiles = max(1, S // block_N // 2)
    return max(1, min(num_split, cap, 1 << (tiles.bit_length() - 1)))


def split_plan(B: int, S: int, HQ: int, HKV: int, D: int, block_N: int, block_H: int,
               cap: int = 64, num_split: int = 0) -> tuple[int, int]:
    """(splits per (sequence, kv head), positions per split, a whole number of KV tiles);
    ``num_split`` > 0 fixes the split count instead of ``pick_split``'s choice."""
    if HQ % HKV or HQ // HKV > block_H or D > 256:
        raise ValueError(f"gqa_decode needs HQ % HKV == 0, HQ/HKV <= {block_H} and D <= 256 "
                         f"(HQ={HQ}, HKV={HKV}, D={D})")
    if S % block_N:
        raise ValueError(f"gqa_decode needs the cache capacity S to be a multiple of {block_N}, got {S}")
    num_split = num_split or pick_split(B, S, HKV, block_N, cap)
    per_split = -(-S // num_split)  # ceil
    return num_split, -(-per_split // block_N) * block_N  # rounded up to whole KV tiles


def attend_split(HQ: int, HKV: int, D: int, dtype: str, block_N: int, block_H: int, num_stages: int,
                 split_len: int, load: Any, store: Any, store_empty: Any) -> Any:
    """A macro: one (split, kv head, sequence) of kernel 1, all G query heads of the group in one
    tile, online softmax over the split's valid KV tiles; partial output and log-sum-exp out.

    ``load(tile, kv, aux, bid, g, start, k, n_valid)`` fills ``tile`` [block_N, D] with ``kv``'s rows
    ``start + k * block_N ..`` (+ block_N) of sequence ``bid``, head ``g``; rows past the split's
    ``n_valid`` must come out finite (zero), as their scores are masked but V rows still multiply.
    ``aux`` is the layout's extra buffer (the block table of a paged cache), unused when contiguous.
    ``store(o_out, l_out, o_acc, denom, m_new, sid, g, bid)`` writes a split's result (one of the
    ``*_store`` macros below) and ``store_empty(o_out, l_out, sid, g, bid)`` a split past the length.
    """
    G = HQ // HKV
    acc_t = "float32"
    scale = exp2_scale(D)
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
            store(o_part, lse_part, o_acc, denom, m_new, sid, g, bid)
        else:
            store_empty(o_part, lse_part, sid, g, bid)

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


def partials_store(G: int, D: int, block_H: int, scale: float) -> tuple[Any, Any]:
    """``split`` launch: (store, store_empty) into the workspace o_part [B, HQ, splits, D] and
    lse_part [B, HQ, splits]; an empty split's log-sum-exp is -inf."""
    neg_inf = -T.infinity(ACC)

    @T.macro
    def store(o_part, lse_part, o_acc, denom, m_new, sid, g, bid):
        for i, j in T.Parallel(block_H, D):
            if i < G:
                o_part[bid, g * G + i, sid, j] = o_acc[i, j] / denom[i]
        for i in T.Parallel(block_H):
            if i < G:
                lse_part[bid, g * G + i, sid] = T.log2(denom[i]) + m_new[i] * scale

    @T.macro
    def store_empty(o_part, lse_part, sid, g, bid):
        for i in T.Parallel(block_H):
            if i < G:
                lse_part[bid, g * G + i, sid] = neg_inf

    return store, store_empty


def local_store(G: int, D: int, block_H: int, scale: float) -> tuple[Any, Any]:
    """``cluster`` launch: (store, store_empty) into this CTA's shared part_o [block_H, D] and
    part_l [block_H]; an empty split leaves part_o zero and its log-sum-exp -inf."""
    neg_inf = -T.infinity(ACC)

    @T.macro
    def store(part_o, part_l, o_acc, denom, m_new, sid, g, bid):
        for i, j in T.Parallel(block_H, D):
            part_o[i, j] = o_acc[i, j] / denom[i]
        for i in T.Parallel(block_H):
            part_l[i] = T.log2(denom[i]) + m_new[i] * scale

    @T.macro
    def store_empty(part_o, part_l, sid, g, bid):
        for i, j in T.Parallel(block_H, D):
            part_o[i, j] = T.cast(0, ACC)
        for i in T.Parallel(block_H):
            part_l[i] = neg_inf

    return store, store_empty


def direct_store(G: int, D: int, block_H: int, dtype: str) -> tuple[Any, Any]:
    """One split: (store, store_empty) straight into O [B, HQ, D] (a sequence of length 0 gets zeros)."""

    @T.macro
    def store(O, unused, o_acc, denom, m_new, sid, g, bid):
        for i, j in T.Parallel(block_H, D):
            if i < G:
                O[bid, g * G + i, j] = T.cast(o_acc[i, j] / denom[i], dtype)

    @T.macro
    def store_empty(O, unused, sid, g, bid):
        for i, j in T.Parallel(block_H, D):
            if i < G:
                O[bid, g * G + i, j] = T.cast(0, dtype)

    return store, store_empty


def combine_cluster(G: int, D: int, dtype: str, num_split: int, split_len: int) -> Any:
    """A macro for CTA 0 of a cluster, after the cluster barrier: the splits' partials all_o
    [splits, G, D] and log-sum-exps all_l [splits, G] (written into its shared memory by every CTA of
    the cluster) summed into O[bid, g * G + i, :]. Thread ``tx`` < D owns column ``tx``."""
    neg_inf = -T.infinity(ACC)

    @T.macro
    def combine(all_o, all_l, seqlen, O, g, bid):
        tx = T.get_thread_binding()
        lse_max = T.alloc_local((1,), ACC)
        lse_sum = T.alloc_local((1,), ACC)
        acc = T.alloc_local((1,), ACC)
        used = T.min(T.ceildiv(seqlen, split_len), num_split)
        if tx < D:
            for i in T.serial(G):
                lse_max[0] = neg_inf
                for k in T.unroll(num_split):
                    if k < used:
                        lse_max[0] = T.max(lse_max[0], all_l[k, i])
                lse_sum[0] = 0
                acc[0] = 0
                for k in T.unroll(num_split):
                    if k < used:
                        lse_sum[0] += T.exp2(all_l[k, i] - lse_max[0])
                        acc[0] += T.exp2(all_l[k, i] - lse_max[0]) * all_o[k, i, tx]
                O[bid, g * G + i, tx] = T.cast(acc[0] / lse_sum[0], dtype)

    return combine
