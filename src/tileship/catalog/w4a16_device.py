"""The CUDA device code shared by the W4A16 kernels, and the int4 layout they read.

Weights are int4, eight per int32 word, interleaved so that one LOP3 per pair decodes them
(``tileship.catalog.w4a16.quantize`` packs them), with one fp16/bf16 scale per ``GROUP``
weights of a row. The kernels (``w4a16_gemv``, ``w4a16_tc``) are ordinary TileLang prim_funcs
that pull these functions in with ``T.import_source``, as TileLang's own dequantize examples do.
"""

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

// Element e (0..7) of word w as (q - 8) * scale: one LOP3 for the pair (e & ~1, e | 1) into the magic
// number's mantissa, no int->float conversion (for a register fragment decoded element by element; the
// pair's LOP3 is shared once inlined). T2/T1: __half2/__half (MAGIC 0x64006400, 1024 + q; BIAS 1024 + 8)
// or __nv_bfloat162/__nv_bfloat16 (0x43004300, 128 + q; 128 + 8). S is any 16-bit type of the same
// format (TileLang passes cutlass::half_t / cutlass::bfloat16_t).
template <typename T2, typename T1, unsigned int MAGIC, unsigned int BIAS, typename S>
__device__ __forceinline__ S ts_w4_elem(int w, int e, S s) {
  const unsigned int lut = (0xf0 & 0xcc) | 0xaa;
  const unsigned int bias = BIAS;
  unsigned int h;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(h) : "r"(((unsigned int)w) >> (4 * (e >> 1))), "n"(0x000f000f),
      "n"(MAGIC), "n"(lut));
  const T2 v = __hsub2(*reinterpret_cast<T2*>(&h), *reinterpret_cast<const T2*>(&bias));
  T1 r = __hmul((e & 1) ? v.y : v.x, *reinterpret_cast<const T1*>(&s));
  return *reinterpret_cast<S*>(&r);
}

// The pair (2p, 2p + 1) of word w as (q - 8) * scale, stored to dst (two adjacent 16-bit elements of a
// register fragment): one LOP3, one packed subtract and one packed multiply for both.
template <typename T2, typename T1, unsigned int MAGIC, unsigned int BIAS, typename S>
__device__ __forceinline__ void ts_w4_pair(void* dst, int w, int p, S s) {
  const unsigned int lut = (0xf0 & 0xcc) | 0xaa;
  const unsigned int bias = BIAS;
  unsigned int h;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(h) : "r"(((unsigned int)w) >> (4 * p)), "n"(0x000f000f),
      "n"(MAGIC), "n"(lut));
  const T1 s1 = *reinterpret_cast<const T1*>(&s);
  T2 s2;
  s2.x = s1;
  s2.y = s1;
  *reinterpret_cast<T2*>(dst) = __hmul2(__hsub2(*reinterpret_cast<T2*>(&h), *reinterpret_cast<const T2*>(&bias)), s2);
}

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

// The same load asking L2 to fetch the whole aligned PF bytes around it (.L2::128B / .L2::256B): where a warp's
// load takes 64 bytes of each of 16 rows, the next groups' bytes of those rows then wait in L2, fetched
// without a register held for them. PF = 0: ts_ldg_stream.
template <int PF> __device__ __forceinline__ uint4 ts_ldg_stream_pf(const void* p) { return ts_ldg_stream(p); }
template <> __device__ __forceinline__ uint4 ts_ldg_stream_pf<128>(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
template <> __device__ __forceinline__ uint4 ts_ldg_stream_pf<256>(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
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


def device_types(dtype: str) -> tuple[str, str, int]:
    """(pair type, scalar type, chain) of the device functions for ``dtype``."""
    if dtype == "float16":
        return "__half2", "__half", 4
    if dtype == "bfloat16":
        return "__nv_bfloat162", "__nv_bfloat16", 2
    raise ValueError(f"w4a16 kernels take float16 or bfloat16 activations, not {dtype}")
