"""GQA decode attention over a paged KV cache: the split-KV kernel of ``gqa_decode``, pages of 64.

The cache is a pool of pages, ``k_pages``/``v_pages`` [P, 64, H_kv, D]; sequence ``b``'s
positions ``64 i .. 64 i + 63`` live in page ``block_table[b, i]`` (int32 [B, S/64], S the
capacity of a sequence). One KV tile is one page, so each tile is one table lookup; rows past
a sequence's length are zero-filled by a predicated load and never read, and table entries past
it are never looked up (they may hold anything). Everything else (splits, online softmax, the
log-sum-exp combine) is ``gqa_decode``'s, shared through its macros.

The reference gathers the pages into a contiguous cache (positions past a length zeroed) and runs
``gqa_decode``'s reference: masked SDPA (GQA). PyTorch has no paged attention of its own.
"""

import dataclasses
from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs, gqa_decode
from tileship.catalog.gqa_decode import H_KV, H_Q, HEAD_DIM, gqa_decode_reference
from tileship.catalog.gqa_split import (
    attend_split,
    combine_splits,
    exp2_scale,
    partials_store,
    split_plan,
)
from tileship.declare.spec import TensorArg

PAGE = 64


def gqa_decode_paged(B: int, S: int, P: int, HQ: int = H_Q, HKV: int = H_KV, D: int = HEAD_DIM, page: int = PAGE,
                     dtype: str = "float16", block_H: int = 16, num_stages: int = 2, threads: int = 128) -> Any:
    """The split-KV decode kernel for one (B, S, P) over pages of ``PAGE`` positions (one KV tile a page)."""
    if page != PAGE:
        raise ValueError(f"gqa_decode_paged takes pages of {PAGE} positions, not {page}")
    num_split, split_len = split_plan(B, S, HQ, HKV, D, PAGE, block_H)

    @T.macro
    def load(tile, pages, table, bid, g, start, k, n_valid):
        page = table[bid, (start + k * PAGE) // PAGE]
        for i, j in T.Parallel(PAGE, D):
            tile[i, j] = T.if_then_else(k * PAGE + i < n_valid, pages[page, i, g, j], T.cast(0, dtype))

    attend = attend_split(HQ, HKV, D, dtype, PAGE, block_H, num_stages, split_len, load,
                          *partials_store(HQ // HKV, D, block_H, exp2_scale(D)))
    combine = combine_splits(D, dtype, num_split, split_len)

    @T.prim_func
    def main(Q: T.Tensor((B, HQ, D), dtype), K: T.Tensor((P, PAGE, HKV, D), dtype),
             V: T.Tensor((P, PAGE, HKV, D), dtype), block_table: T.Tensor((B, S // PAGE), "int32"),
             lengths: T.Tensor((B,), "int32"), O: T.Tensor((B, HQ, D), dtype)):
        o_part = T.alloc_global((B, HQ, num_split, D), "float32")
        lse_part = T.alloc_global((B, HQ, num_split), "float32")
        with T.Kernel(num_split, HKV, B, threads=threads) as (sid, g, bid):
            attend(Q, K, V, block_table, o_part, lse_part, sid, g, bid, lengths[bid])
        with T.Kernel(HQ, B, threads=D) as (h, bz):
            combine(o_part, lse_part, lengths, O, h, bz)

    return main


def gather_pages(pages: Any, block_table: Any, lengths: Any) -> Any:
    """The contiguous cache [B, S, H_kv, D] that ``pages`` + ``block_table`` stand for, with the
    positions past each length zeroed (their table entries may point anywhere, or nowhere)."""
    n_pages, page = pages.shape[0], pages.shape[1]
    b, per_seq = block_table.shape
    lengths = lengths.to(pages.device).long()
    used = torch.arange(per_seq, device=pages.device)[None, :] * page < lengths[:, None]  # [B, S/page]
    table = torch.where(used, block_table.to(pages.device).long(), 0).clamp(0, n_pages - 1)
    kv = pages[table].reshape(b, per_seq * page, *pages.shape[2:])  # [B, S, H_kv, D]
    valid = torch.arange(per_seq * page, device=pages.device)[None, :] < lengths[:, None]
    return torch.where(valid[:, :, None, None], kv, torch.zeros((), dtype=kv.dtype, device=kv.device))


def gqa_decode_paged_reference(q: Any, k_pages: Any, v_pages: Any, block_table: Any, lengths: Any) -> Any:
    """Gather the pages, then ``gqa_decode``'s reference (masked SDPA, GQA)."""
    return gqa_decode_reference(q, gather_pages(k_pages, block_table, lengths),
                                gather_pages(v_pages, block_table, lengths), lengths)


def gqa_decode_paged_sample(dims: dict[str, int], dtype: str, device: Any) -> tuple[Any, Any, Any, Any, Any]:
    """Pages dealt at random from the pool, odd sequences shorter (S - 3S/8 - 5: a page and a tile
    cut short) than the full even ones, and NaN in every page no sequence uses, so a kernel that
    reads past a length or an unused table entry fails verification."""
    b, s, p = dims["B"], dims["S"], dims["P"]
    h_q, h_kv, d, page = dims["HQ"], dims["HKV"], dims["D"], dims["PAGE"]
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(b * 7919 + s)
    q = (3.0 * torch.randn(b, h_q, d, generator=gen)).to(dt)
    k = torch.randn(p, page, h_kv, d, generator=gen).to(dt)
    v = torch.randn(p, page, h_kv, d, generator=gen).to(dt)
    lengths = torch.tensor([s if i % 2 == 0 else s - 3 * s // 8 - 5 for i in range(b)], dtype=torch.int32)
    table = torch.randperm(p, generator=gen)[: b * (s // page)].reshape(b, s // page).to(torch.int32)
    used = torch.zeros(p, dtype=torch.bool)
    for i in range(b):
        used[table[i, : -(-int(lengths[i]) // page)].long()] = True
    k[~used] = float("nan")
    v[~used] = float("nan")
    return q.to(device), k.to(device), v.to(device), table.to(device), lengths.to(device)


#: ``gqa_decode``'s operator over a paged cache: its output, dtypes, target, tolerances and pass
#: configs (the kernel is its split-KV kernel); the cache, the inputs and the reference are the pages'
gqa_paged = dataclasses.replace(
    gqa_decode.gqa,
    name="gqa_decode_paged",
    factory=gqa_decode_paged,
    reference=gqa_decode_paged_reference,
    cost=costs.gqa_decode_paged,
    inputs=(TensorArg("q", ("B", "HQ", "D")), TensorArg("k_pages", ("P", "PAGE", "HKV", "D")),
            TensorArg("v_pages", ("P", "PAGE", "HKV", "D")), TensorArg("block_table", ("B", "S/64"), dtype="int32"),
            TensorArg("lengths", ("B",), dtype="int32")),
    params={"PAGE": "page"},
    shapes=tuple({"B": b, "S": s, "P": b * s // PAGE + 16, "PAGE": PAGE, "HQ": H_Q, "HKV": H_KV, "D": HEAD_DIM}
                 for b, s in ((1, 8192), (1, 32768), (8, 8192), (32, 1024))),
    sample=gqa_decode_paged_sample,
    module=__name__,
)
