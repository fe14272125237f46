"""``"c"``-target twins of the decode operators (W4A16, GQA decode contiguous and paged, add + RMSNorm).

Same contract, same reference, same sample hook as the CUDA ones.

They let a CPU-only machine (CI) build, load and call W4A16 and GQA decode through the real
pipeline (per-tensor dtypes, derived dims, int32 inputs) that the CUDA kernels ship through.
"""

from typing import Any

import tilelang.language as T

from tileship.catalog import add_rmsnorm, gqa_decode, gqa_paged, w4a16
from tileship.catalog.cpu import twin
from tileship.catalog.gqa_paged import PAGE
from tileship.catalog.rmsnorm import EPS


def w4a16_cpu(M: Any, N: int, K: int, dtype: str = "float32") -> Any:
    """The CUDA catalog's W4A16 linear, one output per grid step: same packing, same reference."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"), S: T.Tensor((N, K // 128), dtype),
             C: T.Tensor((M, N), dtype)):
        with T.Kernel(M, N) as (m, n):
            acc = T.alloc_local((1,), "float32")
            acc[0] = 0.0
            for k in T.serial(K):
                # element k % 8 of its word sits in nibble (k % 8) // 2 + 4 * (k % 2)
                q = ((B[n, k // 8] >> (4 * ((k % 8) // 2 + 4 * (k % 2)))) & 15) - 8
                acc[0] += T.cast(A[m, k], "float32") * T.cast(q, "float32") * T.cast(S[n, k // 128], "float32")
            C[m, n] = T.cast(acc[0], dtype)

    return main


def _gqa_cpu_body(B: int, HQ: int, HKV: int, D: int, S: int, dtype: str, row: Any) -> Any:
    """A macro: online softmax per (b, h) over positions ``row(K, aux, b, s)`` of K and V."""
    group = HQ // HKV
    scale = D**-0.5

    @T.macro
    def body(Q, K, V, aux, lengths, O):
        with T.Kernel(B, HQ) as (b, h):
            st = T.alloc_local((4,), "float32")  # running max, denominator, score, correction
            acc = T.alloc_local((D,), "float32")
            st[0] = -T.infinity("float32")
            st[1] = 0.0
            for d in T.serial(D):
                acc[d] = 0.0
            for s in T.serial(T.min(lengths[b], S)):
                st[2] = 0.0
                for d in T.serial(D):
                    st[2] += T.cast(Q[b, h, d], "float32") * T.cast(row(K, aux, b, s, h // group, d), "float32")
                st[2] = st[2] * scale
                st[3] = T.exp(st[0] - T.max(st[0], st[2]))
                st[0] = T.max(st[0], st[2])
                st[1] = st[1] * st[3] + T.exp(st[2] - st[0])
                for d in T.serial(D):
                    acc[d] = acc[d] * st[3] + T.exp(st[2] - st[0]) * T.cast(row(V, aux, b, s, h // group, d), "float32")
            for d in T.serial(D):
                O[b, h, d] = T.cast(acc[d] / st[1], dtype)

    return body


def gqa_decode_cpu(B: int, S: int, HQ: int, HKV: int, D: int, dtype: str = "float32") -> Any:
    """The CUDA catalog's GQA decode (same contract and reference), online softmax per (b, h)."""
    body = _gqa_cpu_body(B, HQ, HKV, D, S, dtype, lambda kv, aux, b, s, g, d: kv[b, s, g, d])

    @T.prim_func
    def main(Q: T.Tensor((B, HQ, D), dtype), K: T.Tensor((B, S, HKV, D), dtype), V: T.Tensor((B, S, HKV, D), dtype),
             lengths: T.Tensor((B,), "int32"), O: T.Tensor((B, HQ, D), dtype)):
        body(Q, K, V, lengths, lengths, O)

    return main


def gqa_decode_paged_cpu(B: int, S: int, P: int, HQ: int, HKV: int, D: int, page: int = PAGE,
                         dtype: str = "float32") -> Any:
    """The CUDA catalog's paged GQA decode (same contract and reference): position s of sequence b
    is row s % page of page ``block_table[b, s // page]``."""
    body = _gqa_cpu_body(B, HQ, HKV, D, S, dtype, lambda kv, table, b, s, g, d: kv[table[b, s // page], s % page, g, d])

    @T.prim_func
    def main(Q: T.Tensor((B, HQ, D), dtype), K: T.Tensor((P, page, HKV, D), dtype),
             V: T.Tensor((P, page, HKV, D), dtype), block_table: T.Tensor((B, S // page), "int32"),
             lengths: T.Tensor((B,), "int32"), O: T.Tensor((B, HQ, D), dtype)):
        body(Q, K, V, block_table, lengths, O)

    return main


def add_rms_norm_cpu(M: int, N: int, dtype: str = "float32") -> Any:
    """The CUDA catalog's fused residual add + RMSNorm (same contract and reference), a row a step."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), R: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype),
             Y: T.Tensor((M, N), dtype), H: T.Tensor((M, N), dtype)):
        with T.Kernel(M) as m:
            ss = T.alloc_local((1,), "float32")
            ss[0] = 0.0
            for n in T.serial(N):
                H[m, n] = X[m, n] + R[m, n]
                ss[0] += T.cast(H[m, n], "float32") * T.cast(H[m, n], "float32")
            ss[0] = T.rsqrt(ss[0] / N + EPS)
            for n in T.serial(N):
                Y[m, n] = T.cast(T.cast(H[m, n], "float32") * ss[0] * T.cast(W[n], "float32"), dtype)

    return main


w4a16_cpu_op = twin(w4a16.w4a16, "w4a16_cpu", w4a16_cpu, ({"M": 1, "N": 64, "K": 256}, {"M": 4, "N": 32, "K": 512}),
                    module=__name__, tol=1e-4)
gqa_decode_cpu_op = twin(gqa_decode.gqa, "gqa_decode_cpu", gqa_decode_cpu,
                         ({"B": 2, "S": 64, "HQ": 4, "HKV": 2, "D": 16},), module=__name__, tol=1e-4)
add_rmsnorm_cpu_op = twin(add_rmsnorm.add_rmsnorm, "add_rmsnorm_cpu", add_rms_norm_cpu,
                          ({"M": 1, "N": 256}, {"M": 8, "N": 256}), module=__name__, tol=1e-5)
gqa_decode_paged_cpu_op = twin(gqa_paged.gqa_paged, "gqa_decode_paged_cpu", gqa_decode_paged_cpu,
                               ({"B": 3, "S": 256, "P": 14, "PAGE": PAGE, "HQ": 4, "HKV": 2, "D": 16},),
                               module=__name__, tol=1e-4)
