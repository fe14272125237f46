"""``"c"``-target twins of the KV-cache appends (``kv_append``, ``kv_append_paged``): same contract,
reference and sample.

It lets a CPU-only machine (CI) build, load and call an operator that updates its inputs in place
(``mutates``, no outputs) through the real pipeline: declaration, build, signature, load, dispatch,
verify and the torch custom op.
"""

from typing import Any

import tilelang.language as T

from tileship.catalog import kv_append
from tileship.catalog import kv_append_paged as paged
from tileship.catalog.cpu import twin
from tileship.catalog.gqa_paged import PAGE


def kv_append_cpu(B: int, S: int, HKV: int, D: int, dtype: str = "float32") -> Any:
    """One grid step per sequence; a position outside [0, S) writes nothing."""

    @T.prim_func
    def main(K: T.Tensor((B, S, HKV, D), dtype), V: T.Tensor((B, S, HKV, D), dtype),
             k_new: T.Tensor((B, HKV, D), dtype), v_new: T.Tensor((B, HKV, D), dtype), pos: T.Tensor((B,), "int32")):
        with T.Kernel(B) as b:
            if pos[b] >= 0 and pos[b] < S:
                for h, d in T.Parallel(HKV, D):
                    K[b, pos[b], h, d] = k_new[b, h, d]
                    V[b, pos[b], h, d] = v_new[b, h, d]

    return main


def kv_append_paged_cpu(B: int, S: int, P: int, HKV: int, D: int, page: int = PAGE, dtype: str = "float32") -> Any:
    """One grid step per sequence: its slot is row ``pos % page`` of page ``block_table[b, pos // page]``;
    a position or page out of range writes nothing."""

    @T.prim_func
    def main(K: T.Tensor((P, page, HKV, D), dtype), V: T.Tensor((P, page, HKV, D), dtype),
             k_new: T.Tensor((B, HKV, D), dtype), v_new: T.Tensor((B, HKV, D), dtype),
             block_table: T.Tensor((B, S // page), "int32"), pos: T.Tensor((B,), "int32")):
        with T.Kernel(B) as b:
            if pos[b] >= 0 and pos[b] < S:
                pg = block_table[b, pos[b] // page]
                if pg >= 0 and pg < P:
                    for h, d in T.Parallel(HKV, D):
                        K[pg, pos[b] % page, h, d] = k_new[b, h, d]
                        V[pg, pos[b] % page, h, d] = v_new[b, h, d]

    return main


# the CUDA operators are reached through their modules: a project listing this module builds every
# Operator in its namespace (``load_operators``), and only the twins are to be built from it
kv_append_cpu_op = twin(kv_append.kv_append_op, "kv_append_cpu", kv_append_cpu,
                        ({"B": 3, "S": 16, "HKV": 2, "D": 8}, {"B": 1, "S": 64, "HKV": 2, "D": 16}),
                        module=__name__, tol=0.0)  # a copy: bit-exact

kv_append_paged_cpu_op = twin(paged.kv_append_paged_op, "kv_append_paged_cpu", kv_append_paged_cpu,
                              ({"B": 3, "S": 256, "P": 14, "PAGE": PAGE, "HKV": 2, "D": 16},),
                              module=__name__, tol=0.0)
