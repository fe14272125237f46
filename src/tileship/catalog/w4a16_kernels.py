"""The W4A16 TileLang kernels: a warp-per-rows GEMV for decode batches and a tensor-core GEMM.

Weights are int4, eight per int32 word, interleaved so that one LOP3 per pair decodes them
(``tileship.catalog.w4a16.quantize`` packs them), with one fp16/bf16 scale per 128 weights of
a row. Both kernels are ordinary TileLang prim_funcs; the GEMV's inner step and the int4
decode are CUDA device functions pulled in with ``T.import_source``, as TileLang's own
dequantize examples do.

- ``w4a16_gemv``: static M (decode batches). One warp owns ``rows`` output rows; lane ``kr``
  owns the 8-weight chunks ``kr, kr + 32, ...`` of a step, so both the packed weights and the
  activations are read coalesced; fp16/bf16 packed FMAs over 8 (fp16) or 4 (bf16) products,
  fp32 across them, one warp all-reduce per output at the end.
- ``w4a16_gemm``: any M (``T.dynamic`` included): packed tile -> scaled fp16/bf16 shared tile
  -> ``T.gemm``; optional split-K whose fp32 partials are summed by a second kernel.
"""

from typing import Any

import tilelang.language as T

GROUP = 128

DEVICE_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
// 8 int4 (nibble j holds element {0,2,4,6,1,3,5,7}[j]) -> 4 pairs of (q - 8), exact.
__device__ __forceinline__ void ts_w4_decode8(unsigned int w, __half2* out) {
  const unsigned int lut = (0xf0 & 0xcc) | 0xaa;
  const unsigned int bias = 0x64086408u;  // 1024 (the magic exponent) + 8 (the zero point)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned int h;
    asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(h) : "r"(w >> (4 * i)), "n"(0x000f000f), "n"(0x64006400), "n"(lut));
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(h) : "r"(h), "r"(bias));
    out[i] = *reinterpret_cast<__half2*>(&h);
  }
}
__device__ __forceinline__ void ts_w4_decode8(unsigned int w, __nv_bfloat162* out) {
  const unsigned int lut = (0xf0 & 0xcc) | 0xaa;
  const unsigned int bias = 0x43084308u;  // 128 (exact for 0..15 with 7 mantissa bits) + 8
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned int h;
    asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(h) : "r"(w >> (4 * i)), "n"(0x000f000f), "n"(0x43004300), "n"(lut));
    out[i] = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&h), *reinterpret_cast<const __nv_bfloat162*>(&bias));
  }
}
__device__ __forceinline__ float2 ts_to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 ts_to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float ts_to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float ts_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ __half2 ts_splat(float v, __half2) { return __float2half2_rn(v); }
__device__ __forceinline__ __nv_bfloat162 ts_splat(float v, __nv_bfloat162) { return __float2bfloat162_rn(v); }

// 8 int4 -> 8 values (q - 8) * scale stored as one 16-byte chunk (the GEMM's shared tile).
template <typename T2>
__device__ __forceinline__ void ts_w4_dq8(int w, float scale, void* out) {
  T2 h[4];
  ts_w4_decode8((unsigned int)w, h);
  const T2 s2 = ts_splat(scale, T2());
  uint4 o;
  T2* op = reinterpret_cast<T2*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i) op[i] = __hmul2(h[i], s2);
  *reinterpret_cast<uint4*>(out) = o;
}

// One K step of one lane: R rows x NW words (chunks kr + 32 j), dotted with M activation rows.
// CHAIN pairs are summed in T2 before going to fp32 (4 for fp16, 2 for bf16's short mantissa).
template <typename T2, typename T1, int NW, int M, int R, int CHAIN>
__device__ __forceinline__ void ts_w4_gemv_step(const void* bq, int ldb, const void* a, int lda,
                                                const void* s, int lds, float* acc) {
  const int* b = reinterpret_cast<const int*>(bq);
  const T1* sp = reinterpret_cast<const T1*>(s);
  unsigned int w[R][NW];
  float sc[R][NW];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NW; ++j) {
      w[r][j] = (unsigned int)b[r * ldb + 32 * j];
      sc[r][j] = ts_to_float(sp[r * lds + 2 * j]);
    }
  T2 hw[R][NW][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NW; ++j) ts_w4_decode8(w[r][j], hw[r][j]);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    uint4 av[NW];
    const T1* am = reinterpret_cast<const T1*>(a) + (size_t)m * lda;
#pragma unroll
    for (int j = 0; j < NW; ++j) av[j] = *reinterpret_cast<const uint4*>(am + 256 * j);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float t = 0.f;
#pragma unroll
      for (int j = 0; j < NW; ++j) {
        const T2* x = reinterpret_cast<const T2*>(&av[j]);
        float part = 0.f;
#pragma unroll
        for (int c = 0; c < 4; c += CHAIN) {
          T2 h = __hmul2(x[c], hw[r][j][c]);
#pragma unroll
          for (int i = 1; i < CHAIN; ++i) h = __hfma2(x[c + i], hw[r][j][c + i], h);
          const float2 f = ts_to_float2(h);
          part += f.x + f.y;
        }
        t = fmaf(part, sc[r][j], t);
      }
      acc[r * M + m] += t;
    }
  }
}

// One streamed 16-byte load of packed weights: read once, so kept out of L1.
__device__ __forceinline__ uint4 ts_ldg_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// U consecutive 1024-weight K steps of one lane over R rows: the lane owns weights 32 kr .. 32 kr + 31
// of each step (one 16-byte load a row, one scale group), so every load of the step is issued
// before any decode. Activations are read as four 16-byte vectors a step and row of x.
template <typename T2, typename T1, int M, int R, int U, int CHAIN>
__device__ __forceinline__ void ts_w4_gemv3_steps(const void* bq, int ldb, const void* a, int lda,
                                                  const void* s, int lds, float* acc) {
  const int* b = reinterpret_cast<const int*>(bq);
  const T1* sp = reinterpret_cast<const T1*>(s);
  uint4 w[U][R];
  float sc[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      w[u][r] = ts_ldg_stream(b + (size_t)r * ldb + 128 * u);
      sc[u][r] = ts_to_float(sp[(size_t)r * lds + 8 * u]);
    }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    T2 hw[R][4][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      ts_w4_decode8(w[u][r].x, hw[r][0]);
      ts_w4_decode8(w[u][r].y, hw[r][1]);
      ts_w4_decode8(w[u][r].z, hw[r][2]);
      ts_w4_decode8(w[u][r].w, hw[r][3]);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const T1* am = reinterpret_cast<const T1*>(a) + (size_t)m * lda + 1024 * u;
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
        acc[r * M + m] = fmaf(part, sc[u][r], acc[r * M + m]);
      }
    }
  }
}
"""


def _types(dtype: str) -> tuple[str, str, int]:
    """(pair type, scalar type, chain) of the device functions for ``dtype``."""
    if dtype == "float16":
        return "__half2", "__half", 4
    if dtype == "bfloat16":
        return "__nv_bfloat162", "__nv_bfloat16", 2
    raise ValueError(f"w4a16 kernels take float16 or bfloat16 activations, not {dtype}")


def w4a16_gemv(M: int, N: int, K: int, dtype: str = "float16", rows: int = 2, n_warps: int = 4, nw: int = 2,
               unroll: bool = True) -> Any:
    """y[M, N] = x[M, K] @ W^T for a static M; ``nw`` words of 8 weights per lane per K step."""
    block_k = 32 * nw * 8
    if K % block_k or N % (rows * n_warps):
        raise ValueError(f"w4a16_gemv needs K % {block_k} == 0 and N % {rows * n_warps} == 0 (K={K}, N={N})")
    pair, scalar, chain = _types(dtype)
    step = f"ts_w4_gemv_step<{pair}, {scalar}, {nw}, {M}, {rows}, {chain}>"

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
             S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // (rows * n_warps), threads=(32, n_warps)) as bx:
            acc = T.alloc_local((rows * M,), "float32")
            red = T.alloc_local((1,), "float32")
            kr = T.thread_binding(0, 32, thread="threadIdx.x")
            ni = T.thread_binding(0, n_warps, thread="threadIdx.y")
            T.import_source(DEVICE_SRC)
            for i in T.unroll(rows * M):
                acc[i] = 0.0
            for ko in (T.unroll if unroll else T.serial)(K // block_k):
                T.call_extern("handle", step,
                              T.address_of(B[(bx * n_warps + ni) * rows, ko * 32 * nw + kr]), K // 8,
                              T.address_of(A[0, (ko * 32 * nw + kr) * 8]), K,
                              T.address_of(S[(bx * n_warps + ni) * rows, ko * 2 * nw + kr // 16]), K // GROUP,
                              T.access_ptr(acc, "rw"))
            for i in T.unroll(rows * M):
                with T.attr(T.comm_reducer(lambda x, y: x + y, [T.cast(0, "float32")]), "reduce_scope",
                            T.reinterpret(T.uint64(0), dtype="handle")):
                    T.evaluate(T.tvm_thread_allreduce(T.uint32(1), acc[i], True, red[0], kr, dtype="handle"))
                if kr == 0:
                    C[i % M, (bx * n_warps + ni) * rows + i // M] = T.cast(red[0], dtype)

    return main


def w4a16_gemm(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 64, block_N: int = 128,
               split_k: int = 1, num_stages: int = 3, threads: int = 128) -> Any:
    """y = x @ W^T through tensor cores; ``M`` may be ``T.dynamic``. K tiles are one scale group."""
    if K % (GROUP * split_k) or N % block_N:
        raise ValueError(f"w4a16_gemm needs K % {GROUP * split_k} == 0 and N % {block_N} == 0 (K={K}, N={N})")
    pair, _, _ = _types(dtype)
    dq8 = f"ts_w4_dq8<{pair}>"
    ks = K // GROUP // split_k

    @T.macro
    def tile(A, B, S, out, bx, by, bz, to_workspace: bool):
        a_sh = T.alloc_shared((block_M, GROUP), dtype)
        bq_sh = T.alloc_shared((block_N, GROUP // 8), "int32")
        b_sh = T.alloc_shared((block_N, GROUP), dtype)
        acc = T.alloc_fragment((block_M, block_N), "float32")
        b_loc = T.alloc_local((8,), dtype)
        tx = T.get_thread_binding()
        T.import_source(DEVICE_SRC)
        T.clear(acc)
        for k in T.Pipelined(ks, num_stages=num_stages):
            T.copy(A[by * block_M, (bz * ks + k) * GROUP], a_sh)
            T.copy(B[bx * block_N, (bz * ks + k) * (GROUP // 8)], bq_sh)
            for it in T.unroll(block_N * GROUP // 8 // threads):
                T.call_extern("handle", dq8, bq_sh[(it * threads + tx) // (GROUP // 8), (it * threads + tx) % (GROUP // 8)],
                              T.cast(S[bx * block_N + (it * threads + tx) // (GROUP // 8), bz * ks + k], "float32"),
                              T.access_ptr(b_loc, "w"))
                for v in T.vectorized(8):
                    b_sh[(it * threads + tx) // (GROUP // 8), ((it * threads + tx) % (GROUP // 8)) * 8 + v] = b_loc[v]
            T.gemm(a_sh, b_sh, acc, transpose_B=True)
        if to_workspace:
            T.copy(acc, out[bz, by * block_M, bx * block_N])
        else:
            T.copy(acc, out[by * block_M, bx * block_N])

    if split_k == 1:
        @T.prim_func
        def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
                 S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
            with T.Kernel(N // block_N, T.ceildiv(M, block_M), threads=threads) as (bx, by):
                tile(A, B, S, C, bx, by, 0, False)

        return main

    @T.prim_func
    def main_split(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
                   S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        ws = T.alloc_global((split_k, M, N), "float32")
        with T.Kernel(N // block_N, T.ceildiv(M, block_M), split_k, threads=threads) as (bx, by, bz):
            tile(A, B, S, ws, bx, by, bz, True)
        with T.Kernel(N // 256, M, threads=256) as (bx, by):
            for i in T.Parallel(256):
                total = T.alloc_var("float32")
                total = 0.0
                for s in T.serial(split_k):
                    total += ws[s, by, bx * 256 + i]
                C[by, bx * 256 + i] = T.cast(total, dtype)

    return main_split


def w4a16_gemv3(M: int, N: int, K: int, dtype: str = "float16", rows: int = 2, k_warps: int = 4,
                n_warps: int = 1) -> Any:
    """y[M, N] = x[M, K] @ W^T for a static M, K split across ``k_warps`` warps of a block.

    A block owns ``rows * n_warps`` output rows. Each of its ``k_warps`` warps along K streams
    ``K / 1024 / k_warps`` steps of 1024 weights a row with 16-byte loads issued before any
    decode; the partial sums meet in one block all-reduce (a warp all-reduce when ``k_warps`` is 1).
    """
    steps = K // 1024
    if K % 1024 or steps % k_warps or N % (rows * n_warps):
        raise ValueError(f"w4a16_gemv3 needs K % 1024 == 0, (K / 1024) % {k_warps} == 0 and N % {rows * n_warps} == 0"
                         f" (K={K}, N={N})")
    if k_warps > 1 and (n_warps > 1 or rows * M > 32):
        raise ValueError("w4a16_gemv3 splits a block along K or along N, not both, and sums at most 32 outputs a block")
    pair, scalar, chain = _types(dtype)
    per_warp = steps // k_warps
    fn = f"ts_w4_gemv3_steps<{pair}, {scalar}, {M}, {rows}, {per_warp}, {chain}>"
    threads = (32, k_warps) if k_warps > 1 else (32, n_warps)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
             S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // (rows * n_warps), threads=threads) as bx:
            acc = T.alloc_local((rows * M,), "float32")
            red = T.alloc_local((1,), "float32")
            tot = T.alloc_local((1,), "float32")
            kr = T.thread_binding(0, 32, thread="threadIdx.x")
            wy = T.thread_binding(0, threads[1], thread="threadIdx.y")
            T.import_source(DEVICE_SRC)
            for i in T.unroll(rows * M):
                acc[i] = 0.0
            if k_warps > 1:
                part = T.alloc_shared((k_warps, rows * M), "float32")
                T.call_extern("handle", fn,
                              T.address_of(B[bx * rows, wy * per_warp * 128 + kr * 4]), K // 8,
                              T.address_of(A[0, wy * per_warp * 1024 + kr * 32]), K,
                              T.address_of(S[bx * rows, wy * per_warp * 8 + kr // 4]), K // GROUP,
                              T.access_ptr(acc, "rw"))
                for i in T.unroll(rows * M):
                    with T.attr(T.comm_reducer(lambda x, y: x + y, [T.cast(0, "float32")]), "reduce_scope",
                                T.reinterpret(T.uint64(0), dtype="handle")):
                        T.evaluate(T.tvm_thread_allreduce(T.uint32(1), acc[i], True, red[0], kr, dtype="handle"))
                    if kr == 0:
                        part[wy, i] = red[0]
                if wy == 0 and kr < rows * M:
                    tot[0] = 0.0
                    for w in T.unroll(k_warps):
                        tot[0] += part[w, kr]
                    C[kr % M, bx * rows + kr // M] = T.cast(tot[0], dtype)
            else:
                T.call_extern("handle", fn,
                              T.address_of(B[(bx * n_warps + wy) * rows, kr * 4]), K // 8,
                              T.address_of(A[0, kr * 32]), K,
                              T.address_of(S[(bx * n_warps + wy) * rows, kr // 4]), K // GROUP,
                              T.access_ptr(acc, "rw"))
                for i in T.unroll(rows * M):
                    with T.attr(T.comm_reducer(lambda x, y: x + y, [T.cast(0, "float32")]), "reduce_scope",
                                T.reinterpret(T.uint64(0), dtype="handle")):
                        T.evaluate(T.tvm_thread_allreduce(T.uint32(1), acc[i], True, red[0], kr, dtype="handle"))
                    if kr == 0:
                        C[i % M, (bx * n_warps + wy) * rows + i // M] = T.cast(red[0], dtype)

    return main


def w4a16_gemm_swap(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 16, block_N: int = 128,
                    split_k: int = 1, num_stages: int = 3, threads: int = 128) -> Any:
    """y = x @ W^T computed as y^T = W x^T, so the weight tile fills the MMA's wide side.

    For decode batches (M of 8 to 64) the activations are the narrow operand; the packed weight
    tile is scaled into shared memory one 128-weight group at a time, as in ``w4a16_gemm``.
    """
    if K % (GROUP * split_k) or N % block_N:
        raise ValueError(f"w4a16_gemm_swap needs K % {GROUP * split_k} == 0 and N % {block_N} == 0 (K={K}, N={N})")
    pair, _, _ = _types(dtype)
    dq8 = f"ts_w4_dq8<{pair}>"
    ks = K // GROUP // split_k

    @T.macro
    def tile(A, B, S, out, bx, by, bz, to_workspace: bool):
        a_sh = T.alloc_shared((block_M, GROUP), dtype)
        bq_sh = T.alloc_shared((block_N, GROUP // 8), "int32")
        b_sh = T.alloc_shared((block_N, GROUP), dtype)
        acc = T.alloc_fragment((block_N, block_M), "float32")
        b_loc = T.alloc_local((8,), dtype)
        tx = T.get_thread_binding()
        T.import_source(DEVICE_SRC)
        T.clear(acc)
        for k in T.Pipelined(ks, num_stages=num_stages):
            T.copy(A[by * block_M, (bz * ks + k) * GROUP], a_sh)
            T.copy(B[bx * block_N, (bz * ks + k) * (GROUP // 8)], bq_sh)
            for it in T.unroll(block_N * GROUP // 8 // threads):
                T.call_extern("handle", dq8, bq_sh[(it * threads + tx) // (GROUP // 8), (it * threads + tx) % (GROUP // 8)],
                              T.cast(S[bx * block_N + (it * threads + tx) // (GROUP // 8), bz * ks + k], "float32"),
                              T.access_ptr(b_loc, "w"))
                for v in T.vectorized(8):
                    b_sh[(it * threads + tx) // (GROUP // 8), ((it * threads + tx) % (GROUP // 8)) * 8 + v] = b_loc[v]
            T.gemm(b_sh, a_sh, acc, transpose_B=True)
        for i, j in T.Parallel(block_N, block_M):
            if to_workspace:
                out[bz, by * block_M + j, bx * block_N + i] = acc[i, j]
            else:
                out[by * block_M + j, bx * block_N + i] = T.cast(acc[i, j], dtype)

    if split_k == 1:
        @T.prim_func
        def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
                 S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
            with T.Kernel(N // block_N, T.ceildiv(M, block_M), threads=threads) as (bx, by):
                tile(A, B, S, C, bx, by, 0, False)

        return main

    @T.prim_func
    def main_split(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
                   S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        ws = T.alloc_global((split_k, M, N), "float32")
        with T.Kernel(N // block_N, T.ceildiv(M, block_M), split_k, threads=threads) as (bx, by, bz):
            tile(A, B, S, ws, bx, by, bz, True)
        with T.Kernel(N // 256, M, threads=256) as (bx, by):
            for i in T.Parallel(256):
                total = T.alloc_var("float32")
                total = 0.0
                for s in T.serial(split_k):
                    total += ws[s, by, bx * 256 + i]
                C[by, bx * 256 + i] = T.cast(total, dtype)

    return main_split


def w4a16_gemm_rs(M: Any, N: int, K: int, dtype: str = "float16", block_M: int = 16, block_N: int = 128,
                  split_k: int = 1, num_stages: int = 3, threads: int = 128) -> Any:
    """y^T = W x^T with the weight tile decoded straight into the MMA's register operand.

    As ``w4a16_gemm_swap``, but no decoded weight tile goes through shared memory: each thread
    decodes the int4 weights its fragment holds (one 128-weight scale group a K step), and the
    tensor-core GEMM reads them from registers.
    """
    if K % (GROUP * split_k) or N % block_N:
        raise ValueError(f"w4a16_gemm_rs needs K % {GROUP * split_k} == 0 and N % {block_N} == 0 (K={K}, N={N})")
    _types(dtype)
    ks = K // GROUP // split_k

    @T.macro
    def tile(A, B, S, out, bx, by, bz, to_workspace: bool):
        a_sh = T.alloc_shared((block_M, GROUP), dtype)
        bq_sh = T.alloc_shared((block_N, GROUP // 8), "int32")
        b_frag = T.alloc_fragment((block_N, GROUP), dtype)
        s_sh = T.alloc_shared((block_N, ks), dtype)
        acc = T.alloc_fragment((block_N, block_M), "float32")
        T.clear(acc)
        T.copy(S[bx * block_N, bz * ks], s_sh)
        for k in T.Pipelined(ks, num_stages=num_stages):
            T.copy(A[by * block_M, (bz * ks + k) * GROUP], a_sh)
            T.copy(B[bx * block_N, (bz * ks + k) * (GROUP // 8)], bq_sh)
            for i, j in T.Parallel(block_N, GROUP):
                # element j % 8 of a word sits in nibble (j % 2) * 4 + (j % 8) // 2 (see PERM in w4a16.py);
                # (q - 8) is exact in fp16/bf16, so the one rounding is the product's, as in the reference
                b_frag[i, j] = (T.cast((bq_sh[i, j // 8] >> (((j % 2) * 4 + (j % 8) // 2) * 4)) & 15, dtype)
                                - T.cast(8, dtype)) * s_sh[i, k]
            T.gemm(b_frag, a_sh, acc, transpose_B=True)
        for i, j in T.Parallel(block_N, block_M):
            if to_workspace:
                out[bz, by * block_M + j, bx * block_N + i] = acc[i, j]
            else:
                out[by * block_M + j, bx * block_N + i] = T.cast(acc[i, j], dtype)

    if split_k == 1:
        @T.prim_func
        def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
                 S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
            with T.Kernel(N // block_N, T.ceildiv(M, block_M), threads=threads) as (bx, by):
                tile(A, B, S, C, bx, by, 0, False)

        return main

    @T.prim_func
    def main_split(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K // 8), "int32"),
                   S: T.Tensor((N, K // GROUP), dtype), C: T.Tensor((M, N), dtype)):
        ws = T.alloc_global((split_k, M, N), "float32")
        with T.Kernel(N // block_N, T.ceildiv(M, block_M), split_k, threads=threads) as (bx, by, bz):
            tile(A, B, S, ws, bx, by, bz, True)
        with T.Kernel(N // 256, M, threads=256) as (bx, by):
            for i in T.Parallel(256):
                total = T.alloc_var("float32")
                total = 0.0
                for s in T.serial(split_k):
                    total += ws[s, by, bx * 256 + i]
                C[by, bx * 256 + i] = T.cast(total, dtype)

    return main_split
