"""The W4A16 MMA-GEMV with its weight stream kept in flight by ``cp.async``: decode batches of 2..32 rows.

The same arithmetic as ``w4a16_mma``'s kernel (lane (g, c) owns words ``4c .. 4c + 3`` of rows g and
g + 8 of each of ``rt`` row tiles, per 128-weight group; LOP3 decode, scale in the input dtype,
``mma.sync.m16n8k16``; the ``wk`` warps along K meet in shared memory), but the packed weights reach
registers through a ring of ``depth`` shared-memory slots a warp, one group a slot, filled by
``cp.async`` (``w4a16_async`` says why: ptxas sinks register loads next to their use). The warp's
scales, ``GPW`` a row (GPW = groups a warp, a multiple of 8), are copied once at the start by lane
``l`` for row ``l`` of the warp's ``16 rt`` rows, in the first group's commit.

Ring of a warp, in int32 words: ``depth`` slots of ``2 rt`` chunks of 128 words (the 32 lanes' 16 bytes
of rows ``16 t + 8 h + g``), then ``16 rt`` rows of ``GPW / 2`` words of scales.

Measured (round 31, an H100, ``benchmarks/results/h100/round31/mva/``): **slower** than ``w4a16_mma``'s
kernel the catalog uses: down M=8 26.7 us (best of 15 tilings and depths) against 18.8, M=32 37.7 against
28.8 (the catalog's tensor-core kernel). A sweep option (kind ``mva``), not used by the catalog.
"""

from typing import Any

import tilelang.language as T

from tileship.catalog.w4a16_async import ASYNC_SRC
from tileship.catalog.w4a16_device import DEVICE_SRC, GROUP, device_types
from tileship.catalog.w4a16_mma import MMA_SRC, check

MMA_ASYNC_SRC = r"""
// group j of a warp's K range into ring slot j % D: chunk (t, h) of lane (g, c) is words 4c .. 4c + 3 of group
// grp0 + j of row row0 + 16 t + 8 h + g.
template <int RT, int D>
__device__ __forceinline__ void ts_w4_mma_fill(int* wring, const int* B, int ldb, int row0, int grp0, int j,
                                               int lane) {
  const int g = lane >> 2, c = lane & 3;
  int* slot = wring + (j % D) * RT * 2 * 128;
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      ts_cp16(slot + (t * 2 + h) * 128 + 4 * lane,
              B + (size_t)(row0 + 16 * t + 8 * h + g) * ldb + (grp0 + j) * 16 + 4 * c);
}

// One block of WN x WK warps (warp = wk * WN + wn), one row tile block; D groups of a warp in flight.
template <typename T2, typename T1, bool BF16, int RT, int NT, int M, int GPW, int WN, int WK, int D>
__device__ __forceinline__ void ts_w4_mma_async(const void* Bv, const void* Av, const void* Sv, void* Cv,
                                                float* part, int* ring, int K, int N, int bx) {
  const int* B = reinterpret_cast<const int*>(Bv);
  const T1* A = reinterpret_cast<const T1*>(Av);
  const T1* S = reinterpret_cast<const T1*>(Sv);
  T1* C = reinterpret_cast<T1*>(Cv);
  const int ldb = K / 8, lds = K / 128;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wn = warp % WN, wk = warp / WN;
  const int g = lane >> 2, c = lane & 3;
  const int grp0 = wk * GPW;
  const int row0 = (bx * WN + wn) * 16 * RT;
  constexpr int SROW = GPW / 2;  // int32 words of scales a row
  int* wring = ring + warp * (D * RT * 2 * 128 + 16 * RT * SROW);
  const int* sring = wring + D * RT * 2 * 128;
  if (lane < 16 * RT) {
#pragma unroll
    for (int q = 0; q < GPW / 8; ++q)
      ts_cp16(wring + D * RT * 2 * 128 + lane * SROW + 4 * q, S + (size_t)(row0 + lane) * lds + grp0 + 8 * q);
  }
#pragma unroll
  for (int j = 0; j < (D < GPW ? D : GPW); ++j) {
    ts_w4_mma_fill<RT, D>(wring, B, ldb, row0, grp0, j, lane);
    ts_cp_commit();
  }
  const T1* ap[NT];
  bool aval[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    aval[n] = 8 * n + g < M;
    ap[n] = A + (size_t)(aval[n] ? 8 * n + g : 0) * K + (size_t)grp0 * 128 + 32 * c;
  }
  float acc[RT][NT][4];
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][n][i] = 0.f;
#pragma unroll
  for (int j = 0; j < GPW; ++j) {
    ts_cp_wait(GPW - 1 - j < D - 1 ? GPW - 1 - j : D - 1);
    __syncwarp();
    const int* slot = wring + (j % D) * RT * 2 * 128;
    uint4 w[RT][2];
    T1 sc[RT][2];
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        w[t][h] = *reinterpret_cast<const uint4*>(slot + (t * 2 + h) * 128 + 4 * lane);
        sc[t][h] = reinterpret_cast<const T1*>(sring + (16 * t + 8 * h + g) * SROW)[j];
      }
    __syncwarp();
    if (j + D < GPW) {
      ts_w4_mma_fill<RT, D>(wring, B, ldb, row0, grp0, j + D, lane);
      ts_cp_commit();
    }
    uint4 x[NT][4];
    ts_w4_mma_x<T1, NT>(ap, aval, j, x);
    ts_w4_mma_group<T2, T1, BF16, RT, NT>(w, sc, x, acc);
  }
  ts_mma_reduce_store<T1, RT, NT, M, WN, WK>(acc, part, C, N, row0, wn, wk, lane);
}
"""


def w4a16_gemm_mva(M: int, N: int, K: int, dtype: str = "float16", rt: int = 1, wn: int = 1, wk: int = 14,
                   depth: int = 4) -> Any:
    """y[M, N] = x[M, K] @ W^T for a static M of 1..32 (module doc): blocks of ``wn * wk`` warps over
    ``16 * rt * wn`` rows each, ``depth`` (1..8) weight groups of a warp in flight through its ring.
    Raises ValueError where the groups a warp (K / 128 / wk) are not a multiple of 8."""
    gpw = check(M, N, K, rt, wn, wk, 1, "w4a16_gemm_mva")
    if gpw % 8 or (K // GROUP) % 8 or not 1 <= depth <= 8:
        raise ValueError(f"w4a16_gemm_mva needs a multiple of 8 groups a warp (K / 128 / wk = {gpw}) and depth "
                         f"1..8 (depth={depth})")
    pair, scalar, _ = device_types(dtype)
    nt = -(-M // 8)
    fn = (f"ts_w4_mma_async<{pair}, {scalar}, {'true' if dtype == 'bfloat16' else 'false'}, {rt}, {nt}, {M}, "
          f"{gpw}, {wn}, {wk}, {depth}>")
    part_len = wk * wn * rt * nt * 4 * 32
    ring_len = wk * wn * (depth * rt * 2 * 128 + 16 * rt * gpw // 2)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
             S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // (16 * rt * wn), threads=32 * wn * wk) as bx:
            part = T.alloc_shared((part_len,), "float32")
            ring = T.alloc_shared((ring_len,), "int32")
            T.import_source(DEVICE_SRC + ASYNC_SRC + MMA_SRC + MMA_ASYNC_SRC)
            T.evaluate(T.call_extern("handle", fn, T.address_of(B[0, 0]), T.address_of(A[0, 0]),
                                     T.address_of(S[0, 0]), T.address_of(C[0, 0]), T.access_ptr(part, "rw"),
                                     T.access_ptr(ring, "rw"), K, N, bx))

    return main
