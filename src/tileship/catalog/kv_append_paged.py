"""KV-cache append into the paged cache that ``gqa_decode_paged`` reads (pages of 64 positions).

Position ``pos[b]`` of sequence ``b`` is row ``pos[b] % 64`` of page ``block_table[b, pos[b] // 64]``
in the pools ``k_pages``/``v_pages`` [P, 64, H_kv, D]; the new rows k_new/v_new [B, H_kv, D] are
written there, in place (``mutates``, no outputs). A position outside ``[0, S)`` (S = 64 x the
table's columns) or a table entry outside ``[0, P)`` writes nothing, on both paths. As in any paged
cache, the slots written by one call must be distinct (each sequence owns the page it appends to).

The kernel is ``kv_append``'s: one CTA per sequence, a guarded 16-byte-vectorized row copy, plus
one table lookup. The reference is PyTorch indexing (``index_put_``), no host sync.
"""

from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs
from tileship.catalog.gqa_decode import H_KV, HEAD_DIM
from tileship.catalog.gqa_paged import PAGE
from tileship.catalog.kv_append import append_fields
from tileship.declare.spec import Operator, TensorArg

INPUTS = (TensorArg("k_pages", ("P", "PAGE", "HKV", "D")), TensorArg("v_pages", ("P", "PAGE", "HKV", "D")),
          TensorArg("k_new", ("B", "HKV", "D")), TensorArg("v_new", ("B", "HKV", "D")),
          TensorArg("block_table", ("B", "S/64"), dtype="int32"), TensorArg("pos", ("B",), dtype="int32"))
MUTATES = ("k_pages", "v_pages")


def kv_append_paged(B: int, S: int, P: int, HKV: int = H_KV, D: int = HEAD_DIM, page: int = PAGE,
                    dtype: str = "float16", threads: int = 128) -> Any:
    """One CTA per sequence: look its page up, copy the new K and V rows when position and page are in range."""
    if page != PAGE:
        raise ValueError(f"kv_append_paged takes pages of {PAGE} positions, not {page}")
    if P * PAGE * HKV * D >= 2**31:
        raise ValueError(f"kv_append_paged indexes the pool with int32: P*64*HKV*D = {P * PAGE * HKV * D} >= 2^31")

    @T.prim_func
    def main(K: T.Tensor((P, PAGE, HKV, D), dtype), V: T.Tensor((P, PAGE, HKV, D), dtype),
             k_new: T.Tensor((B, HKV, D), dtype), v_new: T.Tensor((B, HKV, D), dtype),
             block_table: T.Tensor((B, S // PAGE), "int32"), pos: T.Tensor((B,), "int32")):
        with T.Kernel(B, threads=threads) as b:
            p = pos[b]
            if p >= 0 and p < S:
                pg = block_table[b, p // PAGE]
                if pg >= 0 and pg < P:
                    for h, d in T.Parallel(HKV, D):
                        K[pg, p % PAGE, h, d] = k_new[b, h, d]
                    for h, d in T.Parallel(HKV, D):
                        V[pg, p % PAGE, h, d] = v_new[b, h, d]

    return main


def kv_append_paged_reference(k_pages: Any, v_pages: Any, k_new: Any, v_new: Any, block_table: Any, pos: Any) -> None:
    """Write each sequence's new rows at its slot in place; a position or page out of range writes
    its (clamped) slot back unchanged. No host sync; returns None."""
    n_pages, page = k_pages.shape[0], k_pages.shape[1]
    s = block_table.shape[1] * page
    dev = k_pages.device
    p = pos.to(device=dev, dtype=torch.long)
    at = p.clamp(0, s - 1)
    pg = block_table.to(dev).long()[torch.arange(block_table.shape[0], device=dev), at // page]
    valid = ((p >= 0) & (p < s) & (pg >= 0) & (pg < n_pages))[:, None, None]
    pg, row = pg.clamp(0, n_pages - 1), at % page
    for pages, new in ((k_pages, k_new), (v_pages, v_new)):
        pages[pg, row] = torch.where(valid, new.to(pages.dtype), pages[pg, row])


def kv_append_paged_sample(dims: dict[str, int], dtype: str, device: Any) -> tuple[Any, ...]:
    """Pools of N(0, 1), pages dealt at random from the pool (every slot owned by one sequence), new
    rows of N(0, 1) +- 4 (not what they replace), random positions, the last sequence's S - 1. Drawn
    on ``device`` from the RNG that ``make_inputs`` seeds: each verification seed differs."""
    b, s, p, h, d, page = dims["B"], dims["S"], dims["P"], dims["HKV"], dims["D"], dims["PAGE"]
    dt = getattr(torch, dtype)
    k = torch.randn(p, page, h, d, device=device).to(dt)
    v = torch.randn(p, page, h, d, device=device).to(dt)
    k_new = (torch.randn(b, h, d, device=device) + 4.0).to(dt)
    v_new = (torch.randn(b, h, d, device=device) - 4.0).to(dt)
    table = torch.randperm(p, device=device)[: b * (s // page)].reshape(b, s // page).to(torch.int32)
    pos = torch.randint(0, s, (b,), device=device, dtype=torch.int32)
    pos[-1] = s - 1
    return k, v, k_new, v_new, table, pos


kv_append_paged_op = Operator(
    name="kv_append_paged",
    factory=kv_append_paged,
    params={"PAGE": "page"},
    shapes=tuple({"B": b, "S": s, "P": b * s // PAGE + 16, "PAGE": PAGE, "HKV": H_KV, "D": HEAD_DIM}
                 for b, s in ((1, 8192), (1, 32768), (8, 8192), (32, 1024))),
    **append_fields(INPUTS, MUTATES, reference=kv_append_paged_reference, sample=kv_append_paged_sample,
                    cost=costs.kv_append_paged),
)
