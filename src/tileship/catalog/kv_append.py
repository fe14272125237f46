"""KV-cache append: one new K/V row per sequence written in place at its position, the cache ``gqa_decode`` reads.

``k_cache[b, pos[b]] = k_new[b]`` and ``v_cache[b, pos[b]] = v_new[b]`` for the contiguous cache
[B, S, H_kv, D] of ``gqa_decode`` (S its capacity), the new rows k_new/v_new [B, H_kv, D] and the
positions pos [B] int32. The caches are declared ``mutates``: the kernel and the reference update
them in place and the operator has no outputs (``docs/declaring.md``). A decode step appends at
``pos = lengths`` and then attends with ``lengths + 1``.

A position outside ``[0, S)`` writes nothing, on both paths: the kernel guards the store and the
reference writes the row back unchanged (it cannot skip it without a host sync). Every other row
of the cache is left as it was; ``tileship verify`` compares the whole caches, so a stray write
fails verification.

The kernel is one CTA per sequence: the H_kv x D row of K and of V as a parallel copy, eight fp16
elements (16 bytes) per thread at H_kv 8, D 128, 128 threads. The reference is PyTorch indexing
(``index_put_``): graph-capturable, no ``.item()``.
"""

from collections.abc import Callable
from typing import Any

import tilelang.language as T
import torch

from tileship.catalog import costs
from tileship.catalog.gqa_decode import H_KV, HEAD_DIM
from tileship.declare.spec import Operator, TensorArg, Tolerance

INPUTS = (TensorArg("k_cache", ("B", "S", "HKV", "D")), TensorArg("v_cache", ("B", "S", "HKV", "D")),
          TensorArg("k_new", ("B", "HKV", "D")), TensorArg("v_new", ("B", "HKV", "D")),
          TensorArg("pos", ("B",), dtype="int32"))
MUTATES = ("k_cache", "v_cache")


def append_fields(inputs: tuple[TensorArg, ...], mutates: tuple[str, ...], *, reference: Callable[..., Any],
                  sample: Callable[..., Any], cost: Callable[..., Any]) -> dict[str, Any]:
    """The fields a KV-cache append on Hopper declares (``kv_append``, ``kv_append_paged``): ``inputs``,
    the caches among them updated in place (``mutates``, no outputs), its reference, sample hook and
    cost; fp16/bf16, compared bit-exact (the kernel copies rows)."""
    return {"inputs": inputs, "mutates": mutates, "reference": reference, "sample": sample, "cost": cost,
            "dtypes": ("float16", "bfloat16"), "targets": ("cuda-sm90a",),
            "tolerances": {"float16": Tolerance(0.0, 0.0), "bfloat16": Tolerance(0.0, 0.0)}}


def kv_append(B: int, S: int, HKV: int = H_KV, D: int = HEAD_DIM, dtype: str = "float16", threads: int = 128) -> Any:
    """One CTA per sequence copies its new K and V rows to position ``pos[b]`` when it is in range.
    The generated indexing is int32: a cache of 2^31 elements or more is refused (ValueError)."""
    if B * S * HKV * D >= 2**31:
        raise ValueError(f"kv_append indexes the cache with int32: B*S*HKV*D = {B * S * HKV * D} >= 2^31")

    @T.prim_func
    def main(K: T.Tensor((B, S, HKV, D), dtype), V: T.Tensor((B, S, HKV, D), dtype),
             k_new: T.Tensor((B, HKV, D), dtype), v_new: T.Tensor((B, HKV, D), dtype), pos: T.Tensor((B,), "int32")):
        with T.Kernel(B, threads=threads) as b:
            p = pos[b]
            if p >= 0 and p < S:
                for h, d in T.Parallel(HKV, D):
                    K[b, p, h, d] = k_new[b, h, d]
                for h, d in T.Parallel(HKV, D):
                    V[b, p, h, d] = v_new[b, h, d]

    return main


def kv_append_reference(k_cache: Any, v_cache: Any, k_new: Any, v_new: Any, pos: Any) -> None:
    """Write row ``pos[b]`` of each sequence's caches in place; a position outside [0, S) writes its
    (clamped) row back unchanged, so nothing changes there. No host sync; returns None."""
    s = k_cache.shape[1]
    p = pos.to(device=k_cache.device, dtype=torch.long)
    valid = ((p >= 0) & (p < s))[:, None, None]
    rows = torch.arange(k_cache.shape[0], device=k_cache.device)
    at = p.clamp(0, s - 1)
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        cache[rows, at] = torch.where(valid, new.to(cache.dtype), cache[rows, at])


def kv_append_sample(dims: dict[str, int], dtype: str, device: Any) -> tuple[Any, Any, Any, Any, Any]:
    """Caches full of N(0, 1) values and new rows of N(0, 1) +- 4 (not what they replace, so a kernel
    that writes nothing fails), random positions, the last sequence's S - 1 (the capacity's edge).
    Drawn on ``device`` from the RNG that ``make_inputs`` seeds: each verification seed differs."""
    b, s, h, d = dims["B"], dims["S"], dims["HKV"], dims["D"]
    dt = getattr(torch, dtype)
    k = torch.randn(b, s, h, d, device=device).to(dt)
    v = torch.randn(b, s, h, d, device=device).to(dt)
    k_new = (torch.randn(b, h, d, device=device) + 4.0).to(dt)
    v_new = (torch.randn(b, h, d, device=device) - 4.0).to(dt)
    pos = torch.randint(0, s, (b,), device=device, dtype=torch.int32)
    pos[-1] = s - 1
    return k, v, k_new, v_new, pos


kv_append_op = Operator(
    name="kv_append",
    factory=kv_append,
    shapes=tuple({"B": b, "S": s, "HKV": H_KV, "D": HEAD_DIM}
                 for b, s in ((1, 1024), (1, 8192), (1, 32768), (8, 1024), (8, 8192), (32, 1024), (32, 8192))),
    **append_fields(INPUTS, MUTATES, reference=kv_append_reference, sample=kv_append_sample, cost=costs.kv_append),
)
