"""``"c"``-target twins of the KV-cache appends (``kv_append``, ``kv_append_paged``): same contract,
reference and sample.

It lets a CPU-only machine (CI) build, load and call an operator that updates its inputs in place
(``mutates``, no outputs) through the real pipeline: declaration, build, signature, load, dispatch,
verify and the torch custom op.
"""

from typing import Any

import tilelang.language as T

from tileship.catalog import costs
from tileship.catalog import kv_append_paged as paged
from tileship.catalog.gqa_paged import PAGE
from tileship.catalog.kv_append import INPUTS, MUTATES, kv_append_reference, kv_append_sample
from tileship.declare.spec import Operator, Tolerance


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


kv_append_cpu_op = Operator(
    name="kv_append_cpu",
    factory=kv_append_cpu,
    reference=kv_append_reference,
    cost=costs.kv_append,
    inputs=INPUTS,
    mutates=MUTATES,
    dtypes=("float32",),
    targets=("c",),
    shapes=({"B": 3, "S": 16, "HKV": 2, "D": 8}, {"B": 1, "S": 64, "HKV": 2, "D": 16}),
    tolerances={"float32": Tolerance(0.0, 0.0)},  # a copy: bit-exact
    sample=kv_append_sample,
)

kv_append_paged_cpu_op = Operator(
    name="kv_append_paged_cpu",
    factory=kv_append_paged_cpu,
    reference=paged.kv_append_paged_reference,
    cost=costs.kv_append_paged,
    inputs=paged.INPUTS,
    mutates=paged.MUTATES,
    dtypes=("float32",),
    targets=("c",),
    params={"PAGE": "page"},
    shapes=({"B": 3, "S": 256, "P": 14, "PAGE": PAGE, "HKV": 2, "D": 16},),
    tolerances={"float32": Tolerance(0.0, 0.0)},
    sample=paged.kv_append_paged_sample,
)
