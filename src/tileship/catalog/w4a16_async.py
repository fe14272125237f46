"""Device code of the W4A16 GEMV whose weight stream is kept in flight by ``cp.async`` (``w4a16_gemv3(depth=D)``).

Why: ``w4a16_gemv3``'s device step issues every 16-byte weight load of a lane before any decode in its
PTX, but ptxas schedules most of them back next to their use to save registers (the M=1 down
projection's SASS, K = 14336: 6 of the lane's 28 weight loads issued ahead, its scale loads after two
steps of arithmetic), so a warp keeps about 1.5 K steps of weights in flight and waits on each scale.
Copies into shared memory with ``cp.async`` cannot be moved by ptxas: this step keeps ``D`` K steps of
a warp's weights and scales in flight in a ring of ``D`` shared-memory slots, and decodes and multiplies
step ``u`` while steps ``u + 1 .. u + D - 1`` are still arriving.

Layout of a warp's ring: ``D`` slots of ``R`` rows of ``RING_ROW`` int32, a row being the 32 lanes'
16-byte weight chunks of one K step (128 words) followed by its 8 scales (16 bytes, copied by lane
``r`` for row ``r``). Each lane reads back the chunks it copied; the scales cross lanes, so a
``__syncwarp`` follows each wait, and another precedes each refill of a slot.

Measured (round 31, an H100, ``benchmarks/results/h100/round31/``): **slower** than the register loads it
was meant to replace at every depth (2-6) and tiling tried: down M=1 best 21.5 us against 16.3 us, M=2
24.4 against 19.9; on the product path (depth 4) down M=1 went from 3.26x to 2.35x cuBLAS fp16. Kept as
a sweep option (kind ``gemv3a``), not used by the catalog: keeping more steps in flight is not what the
GEMV lacks; the shared-memory round trip and the per-step wait cost more than the sunk loads did.
"""

#: int32 words a row of a ring slot holds: 128 of weights (32 lanes x 16 bytes) and 4 of scales (8 x 2 bytes)
RING_ROW = 132

ASYNC_SRC = r"""
__device__ __forceinline__ void ts_cp16(void* smem, const void* g) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
}
__device__ __forceinline__ void ts_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// wait until at most n of this thread's committed groups are pending (n is a constant once unrolled)
__device__ __forceinline__ void ts_cp_wait(int n) {
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
  }
}

// K step u of a warp's R rows into ring slot u % D: lane copies its 16-byte chunk of each row, lane r < R the
// row's 8 scales. b: B at the warp's first row and first word of its K range, s: S at the same row and group.
template <typename T1, int R, int D>
__device__ __forceinline__ void ts_w4_ring_fill(int* ring, const int* b, int ldb, const T1* s, int lds, int u,
                                                int lane) {
  int* slot = ring + (u % D) * R * 132;
#pragma unroll
  for (int r = 0; r < R; ++r) ts_cp16(slot + r * 132 + 4 * lane, b + (size_t)r * ldb + 128 * u + 4 * lane);
  if (lane < R) ts_cp16(slot + lane * 132 + 128, s + (size_t)lane * lds + 8 * u);
  ts_cp_commit();
}

// U consecutive 1024-weight K steps of one warp over R rows, D steps in flight (see the module docstring).
// Lane owns weights 32 lane .. 32 lane + 31 of each step (one scale group). a: x at the warp's first K column.
template <typename T2, typename T1, int M, int R, int U, int CHAIN, int D>
__device__ __forceinline__ void ts_w4_gemv3_async(const void* bq, int ldb, const void* a, int lda,
                                                  const void* s, int lds, float* acc, int* ring) {
  const int* b = reinterpret_cast<const int*>(bq);
  const T1* sp = reinterpret_cast<const T1*>(s);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < (D < U ? D : U); ++u) ts_w4_ring_fill<T1, R, D>(ring, b, ldb, sp, lds, u, lane);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    ts_cp_wait(U - 1 - u < D - 1 ? U - 1 - u : D - 1);
    __syncwarp();
    const int* slot = ring + (u % D) * R * 132;
    T2 hw[R][4][4];
    float sc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 w = *reinterpret_cast<const uint4*>(slot + r * 132 + 4 * lane);
      sc[r] = ts_to_float(reinterpret_cast<const T1*>(slot + r * 132 + 128)[lane >> 2]);
      ts_w4_decode8(w.x, hw[r][0]);
      ts_w4_decode8(w.y, hw[r][1]);
      ts_w4_decode8(w.z, hw[r][2]);
      ts_w4_decode8(w.w, hw[r][3]);
    }
    __syncwarp();
    if (u + D < U) ts_w4_ring_fill<T1, R, D>(ring, b, ldb, sp, lds, u + D, lane);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const T1* am = reinterpret_cast<const T1*>(a) + (size_t)m * lda + 1024 * u + 32 * lane;
      uint4 av[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) av[c] = *reinterpret_cast<const uint4*>(am + 8 * c);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float part = 0.f;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const T2* x = reinterpret_cast<const T2*>(&av[c]);
#pragma unroll
          for (int p = 0; p < 4; p += CHAIN) {
            T2 h = __hmul2(x[p], hw[r][c][p]);
#pragma unroll
            for (int i = 1; i < CHAIN; ++i) h = __hfma2(x[p + i], hw[r][c][p + i], h);
            const float2 f = ts_to_float2(h);
            part += f.x + f.y;
          }
        }
        acc[r * M + m] = fmaf(part, sc[r], acc[r * M + m]);
      }
    }
  }
}
"""
