"""The 16-bit MMA-GEMV: the decode ``linear`` (``y = x @ W^T``, fp16/bf16 weights) on tensor cores, with the
weights streamed straight to registers.

``catalog.w4a16_mma``'s kernel with 16-bit weights: W is [N, K] row-major (``nn.Linear``'s layout, the
``linear`` operator's), and there is no decode and no scale.

- A warp owns ``16 * rt`` rows of W and ``K / wk`` of K. Lane (g, c) = (lane / 4, lane % 4) loads, per
  128-column group, the halves ``32c .. 32c + 31`` of rows g and g + 8 of each row tile: four 16-byte
  loads a row, ``unroll`` groups issued before any is used.
- Each 16-byte vector is the A fragment of two k-steps in ``w4a16_mma.mma_order``'s permutation of K;
  x's B fragments are the same 16-byte loads of x[n, 32c .. 32c + 31] as there, so the pair (A, B)
  meets at the same physical k (``tests/test_linear_mma.py`` replays the plan lane by lane).
- The ``wk`` warps along K of a block meet in shared memory (``ts_mma_reduce_store``); one launch,
  no workspace, fp32 accumulation, one rounding to the output dtype.

Why: the catalog's swapped-operand GEMM (``linear_swap``, what ``linear_decode`` builds at M = 3..64)
streams 16-bit weights at about 2.1-2.2 TB/s at M=8 on the H200 (``benchmarks/README.md`` round 17),
and the int4 MMA-GEMV streams its weights at up to 2.9 TB/s (round 24). Whether this kernel beats
either on the H200 is not measured: ``linear`` declares it as candidates (``LINEAR_MV_CANDIDATES``) that
``tileship tune`` weighs against ``linear_decode``'s kernel and cuBLAS per shape on the target GPU,
and an untuned release serves the first candidate, ``linear_decode``'s kernel, as before.
"""

from typing import Any

import tilelang.language as T

from tileship.catalog.w4a16_device import DEVICE_SRC, device_types
from tileship.catalog.w4a16_mma import MMA_SRC, check

H_SRC = r"""
// One block of the 16-bit MMA-GEMV: WN x WK warps, warp (wn, wk) = threadIdx.x / 32 = wk * WN + wn; rows
// [row0, row0 + 16 RT) of W for warp wn, 128-column groups [wk GPW, (wk + 1) GPW) of K.
template <typename T1, bool BF16, int RT, int NT, int M, int GPW, int U, int WN, int WK>
__device__ __forceinline__ void ts_h_mma_block(const void* Wv, const void* Av, void* Cv, float* part, int K, int N,
                                               int bx) {
  const T1* W = reinterpret_cast<const T1*>(Wv);
  const T1* A = reinterpret_cast<const T1*>(Av);
  T1* C = reinterpret_cast<T1*>(Cv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wn = warp % WN, wk = warp / WN;
  const int g = lane >> 2, c = lane & 3;
  const int row0 = (bx * WN + wn) * 16 * RT;
  const int grp0 = wk * GPW;
  float acc[RT][NT][4];
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][n][i] = 0.f;
  const T1* ap[NT];
  bool aval[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    aval[n] = 8 * n + g < M;
    ap[n] = A + (size_t)(aval[n] ? 8 * n + g : 0) * K + (size_t)grp0 * 128 + 32 * c;
  }
#pragma unroll 1
  for (int j0 = 0; j0 < GPW; j0 += U) {
    uint4 w[U][RT][2][4];  // [group][row tile][rows g, g + 8][16-byte vector q: halves 32c + 8q .. + 7]
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int q = 0; q < 4; ++q)
            w[u][t][h][q] = ts_ldg_stream(W + (size_t)(row0 + 16 * t + g + 8 * h) * K +
                                          (size_t)(grp0 + j0 + u) * 128 + 32 * c + 8 * q);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      uint4 x[NT][4];
      ts_w4_mma_x<T1, NT>(ap, aval, j0 + u, x);
#pragma unroll
      for (int wi = 0; wi < 4; ++wi)
#pragma unroll
        for (int t = 0; t < RT; ++t) {
          const uint4& e0 = w[u][t][0][wi];
          const uint4& e1 = w[u][t][1][wi];
          const unsigned lo[4] = {e0.x, e1.x, e0.y, e1.y};  // k-step 2 wi: halves 8 wi + 0..3 of the lane
          const unsigned hi[4] = {e0.z, e1.z, e0.w, e1.w};  // k-step 2 wi + 1: halves 8 wi + 4..7
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            TsMma<BF16>::run(acc[t][n], lo, x[n][wi].x, x[n][wi].y);
            TsMma<BF16>::run(acc[t][n], hi, x[n][wi].z, x[n][wi].w);
          }
        }
    }
  }
  ts_mma_reduce_store<T1, RT, NT, M, WN, WK>(acc, part, C, N, row0, wn, wk, lane);
}
"""

#: the tilings ``linear`` declares as tune candidates, ``linear_decode``'s ``mv_*`` keywords; which of them a
#: shape builds is ``mv_applies``'s. Chosen by analogy with the int4 kernel's H200 sweeps (round 24), not
#: measured with 16-bit weights: 8 to 16 16-byte loads a lane in flight, 4 to 8 groups a warp
LINEAR_MV_CANDIDATES = (
    {"mv_rt": 1, "mv_wk": 8, "mv_unroll": 1},
    {"mv_rt": 1, "mv_wk": 4, "mv_unroll": 2},
    {"mv_rt": 2, "mv_wk": 8, "mv_unroll": 1},
    {"mv_rt": 1, "mv_wk": 14, "mv_unroll": 1},
    {"mv_rt": 1, "mv_wk": 14, "mv_unroll": 2},
)
#: the batches the candidates serve: below, the GEMV and the swapped GEMM; above, one more column tile of 8
#: doubles the activation traffic (the int4 kernel lost to the GEMM from M=16 on the large projections)
MV_M = (4, 16)
#: most 128-column groups a warp walks, and fewest blocks a launch has (132 SMs on the H200)
MV_MAX_GROUPS, MV_MIN_BLOCKS = 8, 64


def linear_mv(M: int, N: int, K: int, dtype: str = "float16", rt: int = 1, wn: int = 1, wk: int = 8,
              unroll: int = 1) -> Any:
    """y[M, N] = x[M, K] @ W[N, K]^T for a static M of 1..32 (module doc): blocks of ``wn * wk`` warps over
    ``16 * rt * wn`` rows each, ``unroll`` groups of 128 columns in flight a lane. Raises ValueError for a
    shape or tiling it does not cover."""
    gpw = check(M, N, K, rt, wn, wk, unroll, kernel="linear_mv")
    _, scalar, _ = device_types(dtype)
    nt = -(-M // 8)
    fn = (f"ts_h_mma_block<{scalar}, {'true' if dtype == 'bfloat16' else 'false'}, {rt}, {nt}, {M}, {gpw}, "
          f"{unroll}, {wn}, {wk}>")
    part_len = wk * wn * rt * nt * 4 * 32

    @T.prim_func
    def main(X: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(N // (16 * rt * wn), threads=32 * wn * wk) as bx:
            part = T.alloc_shared((part_len,), "float32")
            T.import_source(DEVICE_SRC + MMA_SRC + H_SRC)
            T.evaluate(T.call_extern("handle", fn, T.address_of(W[0, 0]), T.address_of(X[0, 0]),
                                     T.address_of(Y[0, 0]), T.access_ptr(part, "rw"), K, N, bx))

    return main


def mv_applies(config: Any, dims: Any) -> bool:
    """Whether ``linear`` builds a candidate for a shape (``Operator.applies``): ``linear_decode``'s own kernel
    (no ``mv_rt``) everywhere; an MMA-GEMV tiling at a static M in ``MV_M`` where the tiling divides the shape,
    a warp walks at most ``MV_MAX_GROUPS`` groups and the launch has at least ``MV_MIN_BLOCKS`` blocks."""
    rt = config.get("mv_rt", 0)
    if not rt:
        return True
    M, N, K = dims["M"], dims["N"], dims["K"]
    if isinstance(M, tuple) or not MV_M[0] <= M <= MV_M[1]:
        return False
    try:
        gpw = check(M, N, K, rt, 1, config["mv_wk"], config["mv_unroll"], kernel="linear_mv")
    except ValueError:
        return False
    return gpw <= MV_MAX_GROUPS and N // (16 * rt) >= MV_MIN_BLOCKS
