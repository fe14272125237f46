"""The online (flash) softmax that ``attention`` and ``gqa_decode`` share, as TileLang macros.

A block holds a Q tile of ``rows`` queries and walks K/V tiles of ``cols`` positions, keeping per
query the running max, the denominator and the output rescaled as the max grows. Scores live in
the exp2 domain: ``scale`` has log2(e) folded in. Each factory takes Python constants and returns
a ``T.macro``; buffers are passed in and returned, never expressions (a macro binds those as lets).
"""

from typing import Any

import tilelang.language as T

ACC = "float32"


def qkv_tiles(rows: int, cols: int, D: int, dtype: str) -> Any:
    """A macro returning the shared-memory tiles (q [rows, D], k [cols, D], v [cols, D])."""

    @T.macro
    def tiles():
        q_s = T.alloc_shared((rows, D), dtype)
        k_s = T.alloc_shared((cols, D), dtype)
        v_s = T.alloc_shared((cols, D), dtype)
        return q_s, k_s, v_s

    return tiles


def softmax_state(rows: int) -> Any:
    """A macro returning the fp32 fragments [rows] of the running softmax, in this order: the new and
    the previous max, the correction of what was summed under the previous max, a tile's row sums,
    the denominator."""

    @T.macro
    def state():
        m_new = T.alloc_fragment((rows,), ACC)
        m_old = T.alloc_fragment((rows,), ACC)
        corr = T.alloc_fragment((rows,), ACC)
        row_sum = T.alloc_fragment((rows,), ACC)
        denom = T.alloc_fragment((rows,), ACC)
        return m_new, m_old, corr, row_sum, denom

    return state


def softmax_accumulate(rows: int, cols: int, scale: float) -> Any:
    """A macro: the scores ``s`` [rows, cols] become ``exp2(s - max)`` and their row sums join the
    denominator rescaled by ``corr`` (the max and ``corr`` already updated for this tile)."""

    @T.macro
    def accumulate(s, m_new, corr, row_sum, denom):
        for i, j in T.Parallel(rows, cols):
            s[i, j] = T.exp2(s[i, j] * scale - m_new[i] * scale)
        T.reduce_sum(s, row_sum, dim=1)
        for i in T.Parallel(rows):
            denom[i] = denom[i] * corr[i] + row_sum[i]

    return accumulate
