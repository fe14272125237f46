"""Weight-only int4 linear (W4A16) for the Llama-3-8B projections: declaration, packing, reference.

``y[M, N] = x[M, K] @ W^T`` with ``W`` stored as int4 (symmetric, zero point 8), eight per
int32 word, and one fp16/bf16 scale per 128 weights of a row (``quantize``). The kernel the
build compiles depends on the shape, as measured (``w4a16_linear``): GEMVs for decode batches,
a swapped tensor-core GEMM for larger static M, the tensor-core GEMM for the ``T.dynamic`` M range.

The reference dequantizes and calls ``torch.matmul`` (cuBLAS). The best int4 path PyTorch
itself has on CUDA, ``torch.ops.aten._weight_int4pack_mm`` (bf16 only), is timed beside both
by ``benchmarks/w4a16_bench.py``.
"""

from typing import Any

import torch

from tileship.catalog import costs
from tileship.catalog.w4a16_device import GROUP
from tileship.catalog.w4a16_gemv import w4a16_gemv, w4a16_gemv3
from tileship.catalog.w4a16_mma import mv_config, w4a16_gemm_mv
from tileship.catalog.w4a16_tc import w4a16_gemm, w4a16_gemm_rs, w4a16_gemm_swap
from tileship.declare.spec import DynamicRange, Operator, TensorArg, Tolerance

#: (name, N, K) of the linear layers of one Llama-3-8B decoder layer, and its LM head
LLAMA3_8B = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
             ("down", 4096, 14336), ("lm_head", 128256, 4096))
#: the decode batches compiled as static specializations
DECODE_M = (1, 4, 8, 16, 32)
#: nibble j of each int32 word holds element PERM[j] of its 8 (one LOP3 decodes a pair in order)
PERM = (0, 2, 4, 6, 1, 3, 5, 7)


def w4a16_linear(M: Any, N: int, K: int, dtype: str = "float16") -> Any:
    """The kernel for one shape (``M`` may be dynamic), chosen as measured on the H200.

    From ``benchmarks/results/h200/dev/w4a16_sweep_run1.json.xz`` (``benchmarks/dev/w4a16_sweep.py``):
    - M=1: the K-split GEMV, 4 rows a block, 4 warps along K (2 for bf16, and where K / 1024 is
      not a multiple of 4), its weights loaded straight into registers: streaming them through a
      ``cp.async`` ring instead (``w4a16_gemv3(depth=D)``, round 31 on an H100) was slower at every
      depth and tiling tried (down M=1: 21.5-30.5 us against 16.3-17.1 for these GEMVs);
    - M=2, 3: the K-split GEMV at K > 4096, the warp-per-rows GEMV otherwise;
    - M = 4 to 8: the MMA-GEMV (``w4a16_mma``: weights streamed to registers, ``mma.sync`` on them, one
      launch): 1.05-1.25x faster than the GEMM below at M=8 on every projection (round 24,
      ``benchmarks/results/h200/round24/mv{1,2,3}/``: gate_up 27.8-28.0 vs 32.2-33.3 us, down 18.6-19.6
      vs 21.5-21.6, lm_head 91.6-92.9 vs 105.6-107.8); at M=4 it does the same work (B lanes past M
      hold zeros), as the GEMM below does with the batch padded to 8;
    - M = 9 to 64: the swapped tensor-core GEMM with the weights decoded into its register operand
      by LOP3 (``w4a16_gemm_rs(decode="lop3")``, ``benchmarks/results/h200/round11/w4a16_sweep_rsl.json``),
      compiled without warp specialization: 1.4-2.4x faster than cuBLAS fp16 where the int-to-float
      decode it replaces was 0.8-1.7x; at M=4 (the batch padded to 8 rows, ``..._m4.json``) faster than
      the GEMVs on every projection (bf16 down 21.0 vs 57.0 us), o within 0.2 us. Warp
      specialization gave one block of 4 decoding warps per SM (its consumer warpgroup holds 240
      registers a thread) and capped every such kernel at 0.75-0.94 TB/s (``..._run2.json``);
      its packed tile stays unswizzled: ``swizzle=True`` removes a 4-way bank conflict but measured
      about the same (round 12, ``w4a16_gemm_rs``'s docstring), and neither the pair decode nor a
      cluster split-K reduce nor a split-K sum with all its loads in flight (``reduce="vector"``, round 29:
      within the spread at M=16 and 32) helped: the limit at M = 4-32 is elsewhere (``benchmarks/README.md``);
      above M = 64, the shared-memory decode (``w4a16_gemm_swap``);
    - the dynamic range (prefill): the tensor-core GEMM with 64-row tiles.
    """
    if not isinstance(M, int):
        return w4a16_gemm(M, N, K, dtype, block_M=64, block_N=128, split_k=1)
    steps = K // 1024
    if M == 1 and K % 1024 == 0:
        k_warps = 4 if dtype == "float16" and steps % 4 == 0 else 2 if steps % 2 == 0 else 1
        return w4a16_gemv3(M, N, K, dtype, rows=4, k_warps=k_warps) if k_warps > 1 else \
            w4a16_gemv3(M, N, K, dtype, rows=2, k_warps=1, n_warps=4)
    if M < 4 and K > 4096 and K % 2048 == 0:
        return w4a16_gemv3(M, N, K, dtype, rows=4, k_warps=2)
    if M < 4:
        return w4a16_gemv(M, N, K, dtype, rows=2, n_warps=4, nw=2)
    mv = mv_config(M, N, K) if M <= 8 else None
    if mv is not None:
        return w4a16_gemm_mv(M, N, K, dtype, **mv)
    block_M = min(64, -(-M // 8) * 8)
    if M <= 64:
        # the register-decoded GEMM with the LOP3 decode (``..._rsl.json``): 64-wide weight tiles, K split
        # until the grid covers the SMs (8 at N = 4096, 4 at 6144, none at 28672; lm_head: 4 at M = 8)
        split = 8 if N <= 4096 else 4 if N <= 8192 else (4 if M <= 8 else 1) if N >= 65536 else 1
        while K % (GROUP * split):
            split //= 2
        stages = 4 if N >= 65536 else 3
        return w4a16_gemm_rs(M, N, K, dtype, block_M=block_M, block_N=64, split_k=split, num_stages=stages,
                             decode="lop3")
    split = 2 if N >= 65536 else 4
    while K % (GROUP * split):
        split //= 2
    return w4a16_gemm_swap(M, N, K, dtype, block_M=block_M, block_N=64, split_k=split, num_stages=4)


def quantize(weight: Any, group_size: int = GROUP) -> tuple[Any, Any]:
    """An ``nn.Linear`` weight [N, K] -> (qweight int32 [N, K/8], scales [N, K/128] in its dtype).

    Symmetric per group: ``scale = absmax / 7``, ``q = round(w / scale) + 8`` clamped to 0..15.
    Raises ValueError when K is not a multiple of the group size.
    """
    if group_size != GROUP:
        raise ValueError(f"the kernels use groups of {GROUP} weights, not {group_size}")
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"K={k} is not a multiple of the group size {GROUP}")
    w = weight.detach().float().reshape(n, k // GROUP, GROUP)
    scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 7.0
    q = (torch.clamp(torch.round(w / scale), -8, 7) + 8).to(torch.int64).reshape(n, k // 8, 8)
    q = q[:, :, list(PERM)]
    shifts = torch.arange(8, dtype=torch.int64, device=weight.device) * 4
    packed = (q << shifts).sum(dim=-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.contiguous(), scale.reshape(n, k // GROUP).to(weight.dtype).contiguous()


def dequantize(qweight: Any, scales: Any) -> Any:
    """The weight [N, K] that ``(qweight, scales)`` stand for, in the scales' dtype."""
    n = qweight.shape[0]
    shifts = torch.arange(8, dtype=torch.int32, device=qweight.device) * 4
    nibbles = (qweight.unsqueeze(-1) >> shifts) & 0xF  # [N, K/8, 8] in nibble order
    # nibbles 0-3 hold elements 0,2,4,6 and nibbles 4-7 elements 1,3,5,7 (PERM): a transpose, no
    # index tensor, so the reference is capturable in a CUDA graph (no host-to-device copy)
    q = nibbles.reshape(n, -1, 2, 4).transpose(-1, -2).reshape(n, -1, GROUP).to(scales.dtype) - 8
    # q (-8..7) is exact in every float dtype and q * scale is one correctly rounded product, the
    # same bits as computing it in float32 and rounding; each group's scale broadcast, not repeated
    return (q * scales.unsqueeze(-1)).reshape(n, -1)


def w4a16_reference(x: Any, qweight: Any, scales: Any) -> Any:
    """The PyTorch path: dequantize, then ``torch.matmul`` (cuBLAS on CUDA) in x's dtype."""
    return torch.matmul(x, dequantize(qweight, scales).to(x.dtype).t())


def w4a16_sample(dims: dict[str, int], dtype: str, device: Any) -> tuple[Any, Any, Any]:
    """Valid inputs: activations ~ N(0, 1), any int32 bit pattern, scales ~ U(0.5, 1.5) / (8 sqrt(K))

    so that outputs are O(1) whatever K is (tolerances are absolute + relative)."""
    m, n, k = dims["M"], dims["N"], dims["K"]
    dt = getattr(torch, dtype)
    x = torch.randn(m, k, device=device).to(dt)
    qweight = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), dtype=torch.int32, device=device)
    scales = ((torch.rand(n, k // GROUP, device=device) + 0.5) / (8.0 * k**0.5)).to(dt)
    return x, qweight, scales


w4a16 = Operator(
    name="w4a16_linear",
    factory=w4a16_linear,
    reference=w4a16_reference,
    cost=costs.w4a16_linear,
    inputs=(TensorArg("x", ("M", "K")), TensorArg("qweight", ("N", "K/8"), dtype="int32"),
            TensorArg("scales", ("N", "K/128"))),
    outputs=(TensorArg("y", ("M", "N")),),
    dtypes=("float16", "bfloat16"),
    targets=("cuda-sm90a",),
    shapes=tuple({"M": m, "N": n, "K": k} for _, n, k in LLAMA3_8B for m in DECODE_M),
    ranges=tuple(DynamicRange("M", 1, 8192, {"N": n, "K": k}) for _, n, k in LLAMA3_8B),
    tolerances={"float16": Tolerance(atol=1e-2, rtol=1e-2), "bfloat16": Tolerance(atol=4e-2, rtol=4e-2)},
    sample=w4a16_sample,
    # measured: without warp specialization the tensor-core kernels fit several blocks an SM
    pass_configs={"tl.disable_warp_specialized": True},
)
