"""The W4A16 MMA-GEMV: decode batches (M up to 32) on tensor cores, weights streamed straight to registers.

``y[M, N] = x[M, K] @ W^T`` with ``W`` packed as ``w4a16.quantize`` packs it (eight int4 a word,
``w4a16_device``'s interleave, one scale per 128-weight group). The tensor-core kernels of
``w4a16_tc`` stage the weight tile through shared memory in a pipeline; at M=8 they stream the
weights at about half the copy ceiling (Nsight Compute, ``benchmarks/README.md`` round 13), where the
M=1 GEMV, which loads 16 bytes a lane straight into registers, streams at about 0.9 of it. This kernel
keeps the GEMV's loads and does the arithmetic with ``mma.sync.m16n8k16``:

- a warp owns ``16 * rt`` rows of W (``rt`` row tiles) and ``K / wk`` of K; lane (g, c) = (lane / 4,
  lane % 4) loads, per 128-weight group, words ``4c .. 4c + 3`` (16 bytes) of rows g and g + 8 of each
  tile, ``unroll`` groups issued before any is used;
- the MMA's K order inside a group is a permutation of the physical one: lane c's A-fragment pairs
  of k-step s are the pairs ``2 (s % 2)`` and ``2 (s % 2) + 1`` of its word ``s / 2`` (decoded by one
  LOP3 each, times the row's scale in the input dtype, which is the reference's rounding), and the
  B fragment takes x at the same physical k, which is x[n, 32c .. 32c + 31] for the lane's column n:
  four 16-byte loads a group and column tile (``mma_order`` states the permutation; tests replay it);
- the ``wk`` warps along K of a block (``wn`` of them along N) meet in shared memory; one launch,
  no workspace.

Measured on the H200 (``benchmarks/README.md``, round 24): at M=8 it streams int4 weights at 1.0-2.9 TB/s
(2.0-2.8x cuBLAS fp16, faster than ``w4a16_tc``'s kernel at every Llama-3-8B projection), so
``w4a16_linear`` uses it at M = 4..8; at M=16 and 32 the two and four times larger activation traffic and MMA
count make it slower than ``w4a16_tc``'s at the large projections (faster only at qkv and o at M=16), so that
kernel keeps those batches.
"""

from typing import Any

import tilelang.language as T

from tileship.catalog.w4a16_device import DEVICE_SRC, GROUP, device_types

MMA_SRC = r"""
template <bool BF16> struct TsMma;
template <> struct TsMma<false> {
  static __device__ __forceinline__ void run(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct TsMma<true> {
  static __device__ __forceinline__ void run(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ unsigned ts_u4(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The packed words (16 bytes a row: words 4c .. 4c + 3 of the group) and scales of rows r, r + 8 of each of RT
// row tiles, for U groups from grp: every load issued before any is used.
template <typename T1, int RT, int U, int L2 = 0>
__device__ __forceinline__ void ts_w4_mma_load(const int* B, const T1* S, int ldb, int lds, int r, int grp, int word,
                                               uint4 (&w)[U][RT][2], T1 (&sc)[U][RT][2]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = r + 16 * t + 8 * h;
        w[u][t][h] = ts_ldg_stream_pf<L2>(B + (size_t)row * ldb + (size_t)(grp + u) * 16 + word);
        sc[u][t][h] = S[(size_t)row * lds + grp + u];
      }
}

// The next chunk's weights and scales into (w, sc): copied from the prefetched (wn, sn) with PF, else loaded now.
template <typename T1, int RT, int U, bool PF, int L2 = 0>
__device__ __forceinline__ void ts_w4_mma_next(const int* B, const T1* S, int ldb, int lds, int r, int grp, int word,
                                               uint4 (&w)[U][RT][2], T1 (&sc)[U][RT][2],
                                               const uint4 (&wn)[U][RT][2], const T1 (&sn)[U][RT][2]) {
  if (PF) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          w[u][t][h] = wn[u][t][h];
          sc[u][t][h] = sn[u][t][h];
        }
  } else {
    ts_w4_mma_load<T1, RT, U, L2>(B, S, ldb, lds, r, grp, word, w, sc);
  }
}

// The WK partial sums of each output of a warp meet in shared memory (part[wk][wn][t][n][i][lane]); the warps
// with wk == 0 add them up and store rows [row0, row0 + 16 RT) of C (M x N) from the C fragments:
// (g, 2c + i % 2) and (g + 8, 2c + i % 2) of row tile t, column tile n. Ends with no barrier after the reads.
template <typename T1, int RT, int NT, int M, int WN, int WK>
__device__ __forceinline__ void ts_mma_reduce_store(const float (&acc)[RT][NT][4], float* part, T1* C, int N,
                                                    int row0, int wn, int wk, int lane) {
  constexpr int PER = RT * NT * 4;
  const int g = lane >> 2, c = lane & 3;
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
        for (int i = 0; i < 4; ++i) {
          float v = 0.f;
#pragma unroll
          for (int k = 0; k < WK; ++k) v += part[((k * WN + wn) * PER + (t * NT + n) * 4 + i) * 32 + lane];
          const int row = row0 + 16 * t + g + 8 * (i >> 1);
          const int col = 8 * n + 2 * c + (i & 1);
          if (col < M) C[(size_t)col * N + row] = T1(v);
        }
  }
}

// The activations of group j for each column tile: x[8n + g, 32c .. 32c + 31] of the group (zeros past M).
template <typename T1, int NT>
__device__ __forceinline__ void ts_w4_mma_x(const T1* (&ap)[NT], bool (&aval)[NT], int j, uint4 (&x)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int q = 0; q < 4; ++q)
      x[n][q] = aval[n] ? __ldg(reinterpret_cast<const uint4*>(ap[n] + (size_t)j * 128) + q)
                        : make_uint4(0u, 0u, 0u, 0u);
}

// One 128-weight group of RT row tiles times NT column tiles: decode (LOP3), scale in the input dtype, 8 k-steps
// of mma.sync m16n8k16 each (the K order of ``mma_order``).
template <typename T2, typename T1, bool BF16, int RT, int NT>
__device__ __forceinline__ void ts_w4_mma_group(const uint4 (&w)[RT][2], const T1 (&sc)[RT][2], const uint4 (&x)[NT][4],
                                                float (&acc)[RT][NT][4]) {
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
#pragma unroll
    for (int t = 0; t < RT; ++t) {
      T2 d0[4], d1[4];
      ts_w4_decode8(ts_u4(w[t][0], wi), d0);
      ts_w4_decode8(ts_u4(w[t][1], wi), d1);
      T2 s0, s1;
      s0.x = sc[t][0];
      s0.y = sc[t][0];
      s1.x = sc[t][1];
      s1.y = sc[t][1];
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        d0[p] = __hmul2(d0[p], s0);
        d1[p] = __hmul2(d1[p], s1);
      }
      const unsigned* e0 = reinterpret_cast<const unsigned*>(d0);
      const unsigned* e1 = reinterpret_cast<const unsigned*>(d1);
      const unsigned lo[4] = {e0[0], e1[0], e0[1], e1[1]};  // k-step 2 wi: pairs 0 and 1
      const unsigned hi[4] = {e0[2], e1[2], e0[3], e1[3]};  // k-step 2 wi + 1: pairs 2 and 3
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const uint4& xv = x[n][wi];
        TsMma<BF16>::run(acc[t][n], lo, xv.x, xv.y);
        TsMma<BF16>::run(acc[t][n], hi, xv.z, xv.w);
      }
    }
  }
}

// One block: WN x WK warps, warp (wn, wk) = threadIdx.x / 32 = wk * WN + wn. Rows [row0, row0 + 16 RT) of
// W for warp wn, groups [wk GPW, (wk + 1) GPW) of K. C (M x N) gets the block's 16 RT WN rows.
template <typename T2, typename T1, bool BF16, int RT, int NT, int M, int GPW, int U, int WN, int WK, bool PF, bool XE,
          int TPB, int L2 = 0>
__device__ __forceinline__ void ts_w4_mma_block(const void* Bv, const void* Av, const void* Sv, void* Cv,
                                                float* part, int K, int N, int bx) {
  const int* B = reinterpret_cast<const int*>(Bv);
  const T1* A = reinterpret_cast<const T1*>(Av);
  const T1* S = reinterpret_cast<const T1*>(Sv);
  T1* C = reinterpret_cast<T1*>(Cv);
  const int ldb = K / 8, lds = K / 128;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wn = warp % WN, wk = warp / WN;
  const int g = lane >> 2, c = lane & 3;
  const int grp0 = wk * GPW;
  const int nblk = gridDim.x;  // a block serves TPB row blocks: bx, bx + nblk, ...
  constexpr int CHUNKS = GPW / U;
  const T1* ap[NT];
  bool aval[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    aval[n] = 8 * n + g < M;
    ap[n] = A + (size_t)(aval[n] ? 8 * n + g : 0) * K + (size_t)grp0 * 128 + 32 * c;
  }
  uint4 w[U][RT][2], wnext[U][RT][2];
  T1 sc[U][RT][2], snext[U][RT][2];
  ts_w4_mma_load<T1, RT, U, L2>(B, S, ldb, lds, (bx * WN + wn) * 16 * RT + g, grp0, 4 * c, w, sc);
#pragma unroll 1
  for (int ti = 0; ti < TPB; ++ti) {
    const int row0 = ((bx + ti * nblk) * WN + wn) * 16 * RT;
    const int next0 = ((bx + (ti + 1) * nblk) * WN + wn) * 16 * RT;  // the next tile's rows (ti + 1 < TPB)
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
      // the chunk after this one: the same rows' next groups, else the next tile's first ones
      const bool more = ch + 1 < CHUNKS || ti + 1 < TPB;
      const int nrow = ch + 1 < CHUNKS ? row0 : next0;
      const int ngrp = ch + 1 < CHUNKS ? grp0 + j0 + U : grp0;
      if (PF && more) ts_w4_mma_load<T1, RT, U, L2>(B, S, ldb, lds, nrow + g, ngrp, 4 * c, wnext, snext);
      uint4 xe[XE ? U : 1][NT][4];  // XE: every group's activations loaded before the first is used
      if (XE) {
#pragma unroll
        for (int u = 0; u < U; ++u) ts_w4_mma_x<T1, NT>(ap, aval, j0 + u, xe[XE ? u : 0]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        uint4 xl[NT][4];
        if (!XE) ts_w4_mma_x<T1, NT>(ap, aval, j0 + u, xl);
        ts_w4_mma_group<T2, T1, BF16, RT, NT>(w[u], sc[u], XE ? xe[XE ? u : 0] : xl, acc);
      }
      if (more) ts_w4_mma_next<T1, RT, U, PF, L2>(B, S, ldb, lds, nrow + g, ngrp, 4 * c, w, sc, wnext, snext);
    }
    if (ti > 0) __syncthreads();  // the previous tile's sums have been read
    ts_mma_reduce_store<T1, RT, NT, M, WN, WK>(acc, part, C, N, row0, wn, wk, lane);
  }
}
"""


def check(M: int, N: int, K: int, rt: int, wn: int, wk: int, unroll: int, kernel: str = "w4a16_gemm_mv") -> int:
    """Groups of 128 columns of K a warp; raises ValueError naming ``kernel`` for a shape or tiling the kernel
    does not cover."""
    groups = K // GROUP
    if K % GROUP or N % (16 * rt * wn) or groups % wk or (groups // wk) % unroll:
        raise ValueError(f"{kernel} needs K % {GROUP} == 0, N % {16 * rt * wn} == 0 and "
                         f"(K / {GROUP}) divisible by wk * unroll = {wk * unroll} (M={M}, N={N}, K={K})")
    if not 1 <= M <= 32:
        raise ValueError(f"{kernel} serves decode batches of 1 to 32 rows, not M={M}")
    return groups // wk


def w4a16_gemm_mv(M: int, N: int, K: int, dtype: str = "float16", rt: int = 2, wn: int = 2, wk: int = 4,
                  unroll: int = 2, prefetch: bool = True, x_early: bool = False, tiles: int = 1,
                  l2_prefetch: int = 0) -> Any:
    """y[M, N] = x[M, K] @ W^T for a static M of 1..32 (module doc): blocks of ``wn * wk`` warps over
    ``16 * rt * wn`` rows each, ``unroll`` weight groups in flight a lane (twice that with ``prefetch``:
    the next groups' loads are issued before the current ones are used; with ``x_early`` the activations
    of all ``unroll`` groups are loaded before the first is used). Each block serves ``tiles`` row blocks
    in turn, the next one's first weights loaded while the last groups of the current one are used.
    ``l2_prefetch`` (128 or 256; 0: none): each weight load asks L2 for the aligned 128 or 256 bytes around it
    (``ts_ldg_stream_pf``), so the row's next groups are in L2 before their loads are issued. Measured at M=8 on an
    H100 (round 32, ``benchmarks/results/h100/round32/mvp/``): 256 bytes 5-25% slower at every projection (down
    22.1 vs 18.7 us), 128 bytes within the spread (down 18.3 vs 18.7): not used by ``w4a16_linear``."""
    if l2_prefetch not in (0, 128, 256):
        raise ValueError(f"w4a16_gemm_mv: l2_prefetch is 0, 128 or 256 bytes, not {l2_prefetch}")
    gpw = check(M, N, K, rt, wn, wk, unroll)
    blocks = N // (16 * rt * wn)
    if tiles < 1 or blocks % tiles:
        raise ValueError(f"w4a16_gemm_mv: {blocks} row blocks do not split into tiles={tiles} a block")
    pair, scalar, _ = device_types(dtype)
    nt = -(-M // 8)
    fn = (f"ts_w4_mma_block<{pair}, {scalar}, {'true' if dtype == 'bfloat16' else 'false'}, {rt}, {nt}, {M}, "
          f"{gpw}, {unroll}, {wn}, {wk}, {'true' if prefetch else 'false'}, "
          f"{'true' if x_early else 'false'}, {tiles}{f', {l2_prefetch}' if l2_prefetch else ''}>")
    part_len = wk * wn * rt * nt * 4 * 32

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
             S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(blocks // tiles, threads=32 * wn * wk) as bx:
            part = T.alloc_shared((part_len,), "float32")
            T.import_source(DEVICE_SRC + MMA_SRC)
            T.evaluate(T.call_extern("handle", fn, T.address_of(B[0, 0]), T.address_of(A[0, 0]),
                                     T.address_of(S[0, 0]), T.address_of(C[0, 0]), T.access_ptr(part, "rw"),
                                     K, N, bx))

    return main


def mv_config(M: int, N: int, K: int) -> dict[str, Any] | None:
    """The tiling ``w4a16_linear`` uses at M = 4..8, as measured on the H200 (fp16, M=8, three sweeps of
    ``benchmarks/dev/w4a16_sweep.py``: ``benchmarks/results/h200/round24/mv{1,2,3,k}/``), or None where it
    does not cover the shape: K past 4096 (down) one row tile, 14 warps along K (8 groups each), two in
    flight (17.5 us; 18.6-19.6 with 8 warps along K, which the first three sweeps found best among wk <= 8);
    N of 64k or more (lm_head) two row tiles, 4 warps along K, 4 groups;
    N of 16k or more (gate_up) the same with 8 warps along K; the rest (qkv, o) one row tile and 8 warps
    along K with 4 groups (N up to 4096) or 4 warps with 8 groups."""
    if K > 4096:
        cfg: dict[str, Any] = dict(rt=1, wn=1, wk=14, unroll=2, prefetch=False)
    elif N >= 65536:
        cfg = dict(rt=2, wn=1, wk=4, unroll=4, prefetch=False)
    elif N >= 16384:
        cfg = dict(rt=2, wn=1, wk=8, unroll=4, prefetch=False)
    else:
        cfg = dict(rt=1, wn=1, wk=8 if N <= 4096 else 4, unroll=4 if N <= 4096 else 8, prefetch=False)
    try:
        check(M, N, K, cfg["rt"], cfg["wn"], cfg["wk"], cfg["unroll"])
    except ValueError:
        return None
    return cfg


def mma_order(c: int, s: int) -> list[int]:
    """The physical offsets, inside a 128-weight group, of the MMA's logical k = 2c, 2c + 1, 2c + 8, 2c + 9
    of k-step ``s`` (0..7) for lane column ``c`` (0..3): the same for the weights (A) and x (B)."""
    base = 32 * c + 8 * (s // 2) + 4 * (s % 2)
    return [base, base + 1, base + 2, base + 3]
