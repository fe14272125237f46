"""W4A16 decode batches on Hopper's warpgroup MMA: weights decoded into registers, activations in shared memory.

``y[M, N] = x[M, K] @ W^T`` for M of 1..32, ``W`` packed as ``w4a16.quantize`` packs it. ``w4a16_mma``'s
MMA-GEMV loads, per 128-weight group, every batch row's activations into registers (16 loads of 16 bytes a
lane at M=32 against 2 of weights) and runs ``mma.sync`` once per 8 batch rows; at M=32 it loses to the
tensor-core GEMM. Here (the register-A form of ``wgmma``, as Machete and Marlin do on Hopper):

- a warpgroup (4 warps, 128 threads) owns 64 rows of W; lane (g, c) of warp w loads, per group, words
  ``4c .. 4c + 3`` of rows ``16 w + g`` and ``16 w + g + 8`` (16 bytes each, streamed, ``u`` groups in
  flight), decodes them with one LOP3 a pair and scales them: that is ``wgmma``'s A fragment for the 8
  k-steps of the group, in the K order of ``w4a16_mma.mma_order``;
- the group's activations, ``NP = 8 ceil(M / 8)`` rows (zeros past M), are copied by the warpgroup into one
  of two shared-memory slots in the same K order (``cp.async``, 4 bytes a copy), laid out as ``wgmma``
  reads a K-major operand without swizzle (core matrices of 8 rows x 16 bytes; ``lbo`` bytes between the two
  core matrices along K, ``sbo`` between blocks of 8 rows); the next group's slot is written while the
  current group's 8 ``wgmma.mma_async m64nNPk16`` run;
- the ``wk`` warpgroups of a CTA split K and meet in shared memory; with ``ks`` > 1 the CTAs of a cluster
  split it further and meet through a workspace after the cluster barrier (``w4a16_mma_split``'s scheme).

``layout`` (0, 1 or 2: ``offsets``) picks the shared layout (K-adjacent core matrices together, rows together, or
either padded so that a copy's lanes write distinct banks) and
``swap_fields`` puts the two offsets in the descriptor's fields the other way round, ``trans`` sets wgmma's
transpose-B bit. ``benchmarks/dev/wg_probe.py`` ran all eight readings on an H100 (round 33,
``benchmarks/results/h100/round33/wg_run1/``): layouts 0 and 1 with the fields as written and ``trans=0`` are right
(rel. L2 error 2.0-2.1e-4 fp16, 2.7e-3 bf16; CUTLASS's reading: ``lbo`` along K); the other six are wrong or fault.

Measured there (``w4a16_sweep.py`` kind ``wg``, layout 0, 74 tilings, 0 wrong): **about half the catalog's speed**,
down M=32 51.9 us (best) against the catalog's 29.1 and cuBLAS fp16 55.9; gate_up 96.8 against 44.3 and 96.7.
The suspect, read from the index arithmetic: each ``cp.async`` of a warp then wrote 8-16 lanes to one shared
bank. Layout 2 and the lane order of ``ts_wg_x_copy`` give every copy 32 banks (the replay test checks it).
Round 35 on an H100 (``benchmarks/results/h100/round35/``, 152 tilings, 0 wrong): layout 2 takes 40% off, and it
still does not beat the catalog: down M=32 30.0 us against 28.5 (not resolved), gate_up 48.3 against 44.6, down
M=8 23.1 against 18.7. Nsight Compute there: latency-bound (one CTA an SM, 122 registers a thread, 12% occupancy,
no eligible warp in 68% of cycles). Not in the catalog.
"""

from typing import Any

import tilelang.language as T

from tileship.catalog.w4a16_device import DEVICE_SRC, GROUP, device_types
from tileship.catalog.w4a16_mma import MMA_SRC

WG_SRC = r"""
template <int NP, bool BF16, int TR> struct TsWg;

__device__ __forceinline__ unsigned long long ts_wg_desc(unsigned addr, int lbo, int sbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
         ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32);
}
__device__ __forceinline__ void ts_wg_bar(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void ts_wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void ts_wg_keep(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void ts_wg_keep(unsigned& r) { asm volatile("" : "+r"(r)::"memory"); }

// The group of x at column 128 G into a slot by cp.async, 4 bytes a copy (zeros past row M): the pair of physical
// elements 2P, 2P + 1 = 32c + 8w + e of row n (c = P / 16, w = P / 4 % 4, e = 2 (P % 4)) is logical k
// 8 (P % 2) + 2c of k-step 2w + P % 4 / 2 (mma_order inverted); k-step s at s * SB bytes. Lane (c, w0, s1, l) of
// warp q (lane = 8c + 4 w0 + 2 s1 + l) copies pair P = 16c + 8 w1 + 4 w0 + 2 s1 + l of rows q + 4r, w1 = 0, 1: a
// copy reads runs of 32 bytes, and with SB = 32 and LBO = 16 (mod 128) its 32 lanes write 32 banks.
template <typename T1, int NP, int M, int LBO, int SBO, int SB>
__device__ __forceinline__ void ts_wg_x_copy(const T1* A, int K, int G, int t, unsigned slot) {
  const int q = t >> 5, lane = t & 31, l = lane & 1, s1 = (lane >> 1) & 1, w0 = (lane >> 2) & 1, c = lane >> 3;
  // byte offsets from the group's column in row 0: 32-bit (M K 2 < 2^31), one 64-bit base
  const char* base = reinterpret_cast<const char*>(A + (size_t)G * 128);
  const unsigned off0 = (unsigned)(q * K + 2 * (16 * c + 4 * w0 + 2 * s1 + l)) * 2u;
  const unsigned d00 = slot + (2 * w0 + s1) * SB + l * LBO + 4 * c + (q & 7) * 16;
#pragma unroll
  for (int w1 = 0; w1 < 2; ++w1) {
#pragma unroll
    for (int r = 0; r < NP / 4; ++r) {
      const int n = q + 4 * r;  // (n >> 3, n & 7) = (r / 2, q + 4 (r % 2))
      const bool ok = n < M;
      const unsigned dst = d00 + w1 * 4 * SB + (r >> 1) * SBO + (r & 1) * 64;
      const char* src = base + (ok ? off0 + (unsigned)(r * 4 * K) * 2u + (unsigned)(w1 * 32) : 0u);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
    }
  }
}
__device__ __forceinline__ void ts_wg_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void ts_wg_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// CTA (kz, bx) of WK warpgroups: rows [64 bx, +64), warpgroup wg over groups [(kz WK + wg) GPW, +GPW).
template <typename T2, typename T1, bool BF16, int NP, int M, int GPW, int U, int WK, int KS, int LBO, int SBO,
          int SB, bool FS, int TR, int XD>
__device__ __forceinline__ void ts_w4_wg(const void* Bv, const void* Av, const void* Sv, void* Cv, void* smem,
                                         float* ws, int K, int N, int bx, int kz) {
  const int* B = reinterpret_cast<const int*>(Bv);
  const T1* A = reinterpret_cast<const T1*>(Av);
  const T1* S = reinterpret_cast<const T1*>(Sv);
  T1* C = reinterpret_cast<T1*>(Cv);
  const int ldb = K / 8, lds = K / 128;
  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127, warp = t >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int grp0 = (kz * WK + wg) * GPW;
  const int row0 = bx * 64;
  const int r = row0 + 16 * warp + g;
  constexpr int SLOT = 8 * SB;  // bytes of one group of x: 8 k-steps
  unsigned char* base = reinterpret_cast<unsigned char*>(((size_t)smem + 127) & ~(size_t)127);
  unsigned char* xs = base + wg * XD * SLOT;
  const unsigned xs_addr = (unsigned)__cvta_generic_to_shared(xs);
  uint4 w[U][1][2];
  T1 sc[U][1][2];
  ts_w4_mma_load<T1, 1, U>(B, S, ldb, lds, r, grp0, 4 * c, w, sc);
  // groups 0 .. XD - 2 in flight before the loop, one commit group each (empty past GPW)
#pragma unroll
  for (int j = 0; j < XD - 1; ++j) {
    if (j < GPW) ts_wg_x_copy<T1, NP, M, LBO, SBO, SB>(A, K, grp0 + j, t, xs_addr + j * SLOT);
    ts_wg_commit();
  }
  ts_wg_wait<XD - 2>();
  ts_wg_proxy_fence();
  ts_wg_bar(1 + wg);
  float acc[NP / 2];
#pragma unroll
  for (int i = 0; i < NP / 2; ++i) acc[i] = 0.f;
#pragma unroll 1
  for (int ch = 0; ch < GPW / U; ++ch) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = ch * U + u;
      // group j + XD - 1 into the slot group j - 1 used (its wgmma waited for at the end of the last step)
      if (j + XD - 1 < GPW)
        ts_wg_x_copy<T1, NP, M, LBO, SBO, SB>(A, K, grp0 + j + XD - 1, t, xs_addr + ((j + XD - 1) % XD) * SLOT);
      ts_wg_commit();
      unsigned a[8][4];
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) {
        T2 d0[4], d1[4];
        ts_w4_decode8(ts_u4(w[u][0][0], wi), d0);
        ts_w4_decode8(ts_u4(w[u][0][1], wi), d1);
        T2 s0, s1;
        s0.x = sc[u][0][0];
        s0.y = sc[u][0][0];
        s1.x = sc[u][0][1];
        s1.y = sc[u][0][1];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          d0[p] = __hmul2(d0[p], s0);
          d1[p] = __hmul2(d1[p], s1);
        }
        const unsigned* e0 = reinterpret_cast<const unsigned*>(d0);
        const unsigned* e1 = reinterpret_cast<const unsigned*>(d1);
        a[2 * wi][0] = e0[0];
        a[2 * wi][1] = e1[0];
        a[2 * wi][2] = e0[1];
        a[2 * wi][3] = e1[1];
        a[2 * wi + 1][0] = e0[2];
        a[2 * wi + 1][1] = e1[2];
        a[2 * wi + 1][2] = e0[3];
        a[2 * wi + 1][3] = e1[3];
      }
      if (j + U < GPW) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          w[u][0][h] = ts_ldg_stream(B + (size_t)(r + 8 * h) * ldb + (size_t)(grp0 + j + U) * 16 + 4 * c);
          sc[u][0][h] = S[(size_t)(r + 8 * h) * lds + grp0 + j + U];
        }
      }
#pragma unroll
      for (int i = 0; i < NP / 2; ++i) ts_wg_keep(acc[i]);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
      const unsigned slot = xs_addr + (j % XD) * SLOT;
#pragma unroll
      for (int s = 0; s < 8; ++s)
        TsWg<NP, BF16, TR>::run(acc, a[s], ts_wg_desc(slot + s * SB, FS ? SBO : LBO, FS ? LBO : SBO));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      ts_wg_wait<XD - 2>();  // group j + 1's copies have landed
      ts_wg_proxy_fence();
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
      for (int i = 0; i < NP / 2; ++i) ts_wg_keep(acc[i]);
#pragma unroll
      for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) ts_wg_keep(a[s][i]);
      ts_wg_bar(1 + wg);
    }
  }
  // the WK warpgroups meet in shared memory (over the x slots, all read by now): warpgroup 0 keeps the sums
  if (WK > 1) {
    float* part = reinterpret_cast<float*>(base);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < NP / 2; ++i) part[(wg * (NP / 2) + i) * 128 + t] = acc[i];
    __syncthreads();
    if (wg == 0) {
#pragma unroll
      for (int i = 0; i < NP / 2; ++i)
#pragma unroll
        for (int k = 1; k < WK; ++k) acc[i] += part[(k * (NP / 2) + i) * 128 + t];
    }
  }
  const size_t slot = (size_t)bx * (NP / 2) * 128;
  const size_t stride = (size_t)(N / 64) * (NP / 2) * 128;  // one cluster rank's partials
  if (KS > 1 && kz > 0 && wg == 0) {
#pragma unroll
    for (int i = 0; i < NP / 2; ++i) ws[(kz - 1) * stride + slot + i * 128 + t] = acc[i];
  }
  if (KS > 1) {
    __threadfence();
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  }
  if (kz == 0 && wg == 0) {
#pragma unroll
    for (int i = 0; i < NP / 2; ++i) {
      float v = acc[i];
#pragma unroll
      for (int k = 1; k < KS; ++k) v += __ldcg(ws + (k - 1) * stride + slot + i * 128 + t);
      const int row = row0 + 16 * warp + g + 8 * ((i & 3) >> 1);
      const int col = 8 * (i >> 2) + 2 * c + (i & 1);
      if (col < M) C[(size_t)col * N + row] = T1(v);
    }
  }
}
"""


def wg_struct(np_: int, bf16: bool, tr: int) -> str:
    """The ``TsWg<NP, BF16, TR>`` specialization: one ``wgmma.mma_async.m64nNPk16`` with A from registers, f32
    accumulators (NP / 2 a thread), B from a shared-memory descriptor, transposed B when ``tr``."""
    n = np_ // 2
    ty = "bf16" if bf16 else "f16"
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    return (
        f"template <> struct TsWg<{np_}, {'true' if bf16 else 'false'}, {tr}> {{\n"
        "  static __device__ __forceinline__ void run(float* d, const unsigned* a, unsigned long long desc) {\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 5}, 0;\\n"\n'
        f'                 "wgmma.mma_async.sync.aligned.m64n{np_}k16.f32.{ty}.{ty} {{{regs}}}, '
        f'{{%{n}, %{n + 1}, %{n + 2}, %{n + 3}}}, %{n + 4}, p, 1, 1, {tr};\\n}}\\n"\n'
        f"                 : {outs}\n"
        '                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));\n'
        "  }\n};\n")


def offsets(layout: int, np_: int) -> tuple[int, int, int]:
    """(lbo, sbo, sb) bytes of shared ``layout``: between the two core matrices of a k-step along K, between its
    8-row blocks, and between k-steps. 0: K-adjacent core matrices together; 1: 8-row blocks together; 2 (padded):
    lbo = 16 and sb = 32 (mod 128), so that the 32 lanes of one ``cp.async`` write 32 banks (0 and 1 write 4-16
    lanes to one bank at NP = 32: round 33's first run, 52 us at down M=32)."""
    if layout == 0:
        return 128, 256, np_ * 32
    if layout == 1:
        return np_ * 16, 128, np_ * 32
    if layout == 2:
        size = np_ // 8 * 288
        return 144, 288, size + (32 - size) % 128
    raise ValueError(f"w4a16_gemm_wg: layout is 0, 1 or 2, not {layout}")


def check_wg(M: int, N: int, K: int, wk: int, ks: int, unroll: int) -> int:
    """Groups a warpgroup; raises ValueError for a shape or tiling the kernel does not cover."""
    groups = K // GROUP
    if K % GROUP or N % 64 or groups % (ks * wk) or (groups // (ks * wk)) % unroll:
        raise ValueError(f"w4a16_gemm_wg needs K % {GROUP} == 0, N % 64 == 0 and (K / {GROUP}) divisible by "
                         f"ks * wk * unroll = {ks * wk * unroll} (M={M}, N={N}, K={K})")
    if ks not in (1, 2, 4, 8) or not 1 <= wk <= 8:
        raise ValueError(f"w4a16_gemm_wg: ks={ks} is not a portable cluster size or wk={wk} not in 1..8")
    if not 1 <= M <= 32:
        raise ValueError(f"w4a16_gemm_wg serves decode batches of 1 to 32 rows, not M={M}")
    return groups // (ks * wk)


def w4a16_gemm_wg(M: int, N: int, K: int, dtype: str = "float16", wk: int = 2, ks: int = 1, unroll: int = 2,
                  x_depth: int = 2, layout: int = 0, swap_fields: bool = False, trans: int = 0) -> Any:
    """y[M, N] = x[M, K] @ W^T for a static M of 1..32 (module doc): CTAs of ``wk`` warpgroups over 64 rows,
    clusters of ``ks`` CTAs along K, ``unroll`` weight groups in flight a lane, ``x_depth`` shared slots of x a
    warpgroup (``x_depth - 1`` groups' copies in flight)."""
    gpw = check_wg(M, N, K, wk, ks, unroll)
    if not 2 <= x_depth <= 4:
        raise ValueError(f"w4a16_gemm_wg: x_depth is 2, 3 or 4 slots, not {x_depth}")
    pair, scalar, _ = device_types(dtype)
    bf16 = dtype == "bfloat16"
    np_ = 8 * -(-M // 8)
    lbo, sbo, sb = offsets(layout, np_)
    fn = (f"ts_w4_wg<{pair}, {scalar}, {'true' if bf16 else 'false'}, {np_}, {M}, {gpw}, {unroll}, {wk}, {ks}, "
          f"{lbo}, {sbo}, {sb}, {'true' if swap_fields else 'false'}, {trans}, {x_depth}>")
    src = DEVICE_SRC + MMA_SRC + WG_SRC + wg_struct(np_, bf16, trans)
    smem_words = (wk * x_depth * 8 * sb + 128) // 4
    blocks = N // 64
    ws_len = max(1, (ks - 1) * blocks * (np_ // 2) * 128)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
             S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        ws = T.alloc_global((ws_len,), "float32")
        with T.ClusterKernel(ks, blocks, cluster_dims=(ks, 1, 1), threads=128 * wk) as (kz, bx):
            buf = T.alloc_shared((smem_words,), "float32")
            T.import_source(src)
            T.evaluate(T.call_extern("handle", fn, T.address_of(B[0, 0]), T.address_of(A[0, 0]),
                                     T.address_of(S[0, 0]), T.address_of(C[0, 0]), T.access_ptr(buf, "rw"),
                                     T.address_of(ws[0]), K, N, bx, kz))

    return main
