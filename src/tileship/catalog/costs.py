"""Work models of the catalog operators: ``cost(dims, dtype) -> (flops, bytes)`` of one call.

Bytes are the minimum each call must move through memory (every input read once, every output
written once); flops count a multiply-add as two. ``tileship verify`` divides them by the
measured time and puts each shape on the roofline of the device (``tileship.verify.roofline``).
"""

from collections.abc import Mapping

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def gemm(dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    m, n, k = dims["M"], dims["N"], dims["K"]
    return 2.0 * m * n * k, float((m * k + k * n + m * n) * ITEMSIZE[dtype])


def rmsnorm(dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    m, n = dims["M"], dims["N"]
    return 4.0 * m * n, float((2 * m * n + n) * ITEMSIZE[dtype])


def add_rmsnorm(dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    """x + residual, then RMSNorm: reads x, residual and w, writes y and h."""
    m, n = dims["M"], dims["N"]
    return 5.0 * m * n, float((4 * m * n + n) * ITEMSIZE[dtype])


def causal_attention(dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    b, h, s, d = dims["B"], dims["H"], dims["S"], dims["D"]
    return 2.0 * b * h * s * s * d, float(4 * b * h * s * d * ITEMSIZE[dtype])  # 4 B H S^2 D / 2 (causal)


def add(dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    return float(dims["N"]), float(3 * dims["N"] * ITEMSIZE[dtype])


def w4a16_linear(dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    """int4 weights (N K / 2 bytes), one scale per 128 weights, activations and output in ``dtype``."""
    m, n, k = dims["M"], dims["N"], dims["K"]
    size = ITEMSIZE[dtype]
    return 2.0 * m * n * k, float(n * k // 2 + n * (k // 128) * size + (m * k + m * n) * size)


def gqa_decode_paged(dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    """As ``gqa_decode`` plus the block table: every sequence at its full capacity S (an upper
    bound: the sample's odd sequences are shorter, so achieved rates read low for B > 1)."""
    flops, nbytes = gqa_decode(dims, dtype)
    return flops, nbytes + 4.0 * dims["B"] * (dims["S"] // 64)


def gqa_decode(dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    """One query token per sequence over a full cache of S positions (the sample's lengths)."""
    b, s, hq, hkv, d = dims["B"], dims["S"], dims["HQ"], dims["HKV"], dims["D"]
    size = ITEMSIZE[dtype]
    return 4.0 * b * hq * s * d, float(2 * b * s * hkv * d * size + 2 * b * hq * d * size + 4 * b)


def kv_append(dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    """A copy (no flops): the new K and V rows read once and written once into the cache, and the positions."""
    b, hkv, d = dims["B"], dims["HKV"], dims["D"]
    return 0.0, float(4 * b * hkv * d * ITEMSIZE[dtype] + 4 * b)


def kv_append_paged(dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    """As ``kv_append`` plus one block-table entry read per sequence."""
    flops, nbytes = kv_append(dims, dtype)
    return flops, nbytes + 4.0 * dims["B"]
