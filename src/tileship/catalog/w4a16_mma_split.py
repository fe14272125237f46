"""The W4A16 MMA-GEMV with K split across the CTAs of a thread-block cluster: decode batches of 9..32 rows.

``w4a16_mma``'s kernel streams the weights straight to registers and loads, per 128-weight group, the
activations of every batch row for the group. At M=32 those are 8 KB a group against 1 KB of weights for
a warp's 16 rows, and every block reads all of x (0.9 MB at K=14336) again: 256 blocks of 16 rows read
x 256 times from L2 at ``down``'s shape. Larger row blocks read it fewer times, but leave too few blocks
for the GPU (``down`` has 4096 rows: 32 blocks of 128). Here a row block of ``16 * rt * wn`` rows is
served by ``ks`` CTAs, each over its ``1 / ks`` of K, so a 128-row block reads x once and the grid keeps
``ks`` times as many CTAs:

- CTA ``kz`` of a cluster (its rank, ``blockIdx.x``) runs the MMA-GEMV's loop (same loads, decode and
  ``mma.sync``; ``ts_w4_mma_group``) over groups ``[(kz wk + k) gpw, +gpw)`` for its warp ``k`` along K;
- its ``wk`` warps along K meet in shared memory; CTAs 1..ks-1 leave their sums in an fp32 workspace
  (fragment order: each warp writes 32 consecutive floats a fragment register), then the cluster's
  barrier (release / acquire at cluster scope), and CTA 0 adds the ``ks - 1`` partials to its own and
  stores C. One launch, deterministic order of the sums, no atomics.

Not in the catalog: ``benchmarks/dev/w4a16_sweep.py`` (kind ``mvc``) measures it against the catalog's
rule kernel and cuBLAS first.
"""

from typing import Any

import tilelang.language as T

from tileship.catalog.w4a16_device import DEVICE_SRC, GROUP, device_types
from tileship.catalog.w4a16_mma import MMA_SRC

SPLIT_SRC = r"""
// CTA kz (cluster rank) of row block bx: rows [(bx WN + wn) 16 RT, +16 RT) for warp wn, groups
// [(kz WK + wk) GPW, +GPW) of K for warp wk. ws: (KS - 1) partial sums in fragment order.
template <typename T2, typename T1, bool BF16, int RT, int NT, int M, int GPW, int U, int WN, int WK, bool PF, int KS>
__device__ __forceinline__ void ts_w4_mma_split(const void* Bv, const void* Av, const void* Sv, void* Cv,
                                                float* part, float* ws, int K, int N, int bx, int kz) {
  const int* B = reinterpret_cast<const int*>(Bv);
  const T1* A = reinterpret_cast<const T1*>(Av);
  const T1* S = reinterpret_cast<const T1*>(Sv);
  T1* C = reinterpret_cast<T1*>(Cv);
  const int ldb = K / 8, lds = K / 128;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wn = warp % WN, wk = warp / WN;
  const int g = lane >> 2, c = lane & 3;
  const int grp0 = (kz * WK + wk) * GPW;
  const int row0 = (bx * WN + wn) * 16 * RT;
  constexpr int CHUNKS = GPW / U;
  constexpr int PER = RT * NT * 4;
  const T1* ap[NT];
  bool aval[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    aval[n] = 8 * n + g < M;
    ap[n] = A + (size_t)(aval[n] ? 8 * n + g : 0) * K + (size_t)grp0 * 128 + 32 * c;
  }
  uint4 w[U][RT][2], wnext[U][RT][2];
  T1 sc[U][RT][2], snext[U][RT][2];
  ts_w4_mma_load<T1, RT, U>(B, S, ldb, lds, row0 + g, grp0, 4 * c, w, sc);
  float acc[RT][NT][4];
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][n][i] = 0.f;
#pragma unroll 1
  for (int ch = 0; ch < CHUNKS; ++ch) {
    const int j0 = ch * U;
    const bool more = ch + 1 < CHUNKS;
    if (PF && more) ts_w4_mma_load<T1, RT, U>(B, S, ldb, lds, row0 + g, grp0 + j0 + U, 4 * c, wnext, snext);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      uint4 x[NT][4];
      ts_w4_mma_x<T1, NT>(ap, aval, j0 + u, x);
      ts_w4_mma_group<T2, T1, BF16, RT, NT>(w[u], sc[u], x, acc);
    }
    if (more) ts_w4_mma_next<T1, RT, U, PF>(B, S, ldb, lds, row0 + g, grp0 + j0 + U, 4 * c, w, sc, wnext, snext);
  }
  // the WK warps along K of this CTA meet in shared memory; warp wk == 0 keeps the CTA's sums in acc
  if (WK > 1) {
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) part[((wk * WN + wn) * PER + (t * NT + n) * 4 + i) * 32 + lane] = acc[t][n][i];
    __syncthreads();
    if (wk == 0) {
#pragma unroll
      for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int k = 1; k < WK; ++k) acc[t][n][i] += part[((k * WN + wn) * PER + (t * NT + n) * 4 + i) * 32 + lane];
    }
  }
  // the CTAs of the cluster: 1..KS-1 leave their sums in the workspace, CTA 0 adds them after the barrier
  const size_t slot = (size_t)(bx * WN + wn) * PER * 32;
  const size_t stride = (size_t)gridDim.y * WN * PER * 32;  // one CTA rank's partials
  if (KS > 1 && kz > 0 && wk == 0) {
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) ws[(kz - 1) * stride + slot + ((t * NT + n) * 4 + i) * 32 + lane] = acc[t][n][i];
  }
  if (KS > 1) {
    __threadfence();
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  }
  if (kz == 0 && wk == 0) {
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float v = acc[t][n][i];
#pragma unroll
          for (int k = 1; k < KS; ++k) v += __ldcg(ws + (k - 1) * stride + slot + ((t * NT + n) * 4 + i) * 32 + lane);
          const int row = row0 + 16 * t + g + 8 * (i >> 1);
          const int col = 8 * n + 2 * c + (i & 1);
          if (col < M) C[(size_t)col * N + row] = T1(v);
        }
  }
}
"""


def check_split(M: int, N: int, K: int, rt: int, wn: int, wk: int, ks: int, unroll: int) -> int:
    """Groups of 128 columns of K a warp; raises ValueError for a shape or tiling the kernel does not cover."""
    groups = K // GROUP
    if K % GROUP or N % (16 * rt * wn) or groups % (ks * wk) or (groups // (ks * wk)) % unroll:
        raise ValueError(f"w4a16_gemm_mv_split needs K % {GROUP} == 0, N % {16 * rt * wn} == 0 and (K / {GROUP}) "
                         f"divisible by ks * wk * unroll = {ks * wk * unroll} (M={M}, N={N}, K={K})")
    if ks not in (1, 2, 4, 8):
        raise ValueError(f"w4a16_gemm_mv_split: ks={ks} is not a portable cluster size (1, 2, 4 or 8)")
    if not 1 <= M <= 32:
        raise ValueError(f"w4a16_gemm_mv_split serves decode batches of 1 to 32 rows, not M={M}")
    return groups // (ks * wk)


def w4a16_gemm_mv_split(M: int, N: int, K: int, dtype: str = "float16", rt: int = 2, wn: int = 4, wk: int = 1,
                        ks: int = 4, unroll: int = 1, prefetch: bool = True) -> Any:
    """y[M, N] = x[M, K] @ W^T for a static M of 1..32 (module doc): clusters of ``ks`` CTAs of ``wn * wk`` warps
    over ``16 * rt * wn`` rows each; ``unroll`` weight groups in flight a lane (twice that with ``prefetch``)."""
    gpw = check_split(M, N, K, rt, wn, wk, ks, unroll)
    blocks = N // (16 * rt * wn)
    pair, scalar, _ = device_types(dtype)
    nt = -(-M // 8)
    per = rt * nt * 4
    fn = (f"ts_w4_mma_split<{pair}, {scalar}, {'true' if dtype == 'bfloat16' else 'false'}, {rt}, {nt}, {M}, "
          f"{gpw}, {unroll}, {wn}, {wk}, {'true' if prefetch else 'false'}, {ks}>")
    part_len = wk * wn * per * 32 if wk > 1 else 32
    ws_len = max(1, (ks - 1) * blocks * wn * per * 32)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
             S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        ws = T.alloc_global((ws_len,), "float32")
        with T.ClusterKernel(ks, blocks, cluster_dims=(ks, 1, 1), threads=32 * wn * wk) as (kz, bx):
            part = T.alloc_shared((part_len,), "float32")
            T.import_source(DEVICE_SRC + MMA_SRC + SPLIT_SRC)
            T.evaluate(T.call_extern("handle", fn, T.address_of(B[0, 0]), T.address_of(A[0, 0]),
                                     T.address_of(S[0, 0]), T.address_of(C[0, 0]), T.access_ptr(part, "rw"),
                                     T.address_of(ws[0]), K, N, bx, kz))

    return main
