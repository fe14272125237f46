"""Kernel development (GPU host; prepared in round 24, not yet run): an fp16/bf16 MMA-GEMV for the decode ``linear``.

usage: python3 benchmarks/dev/linear_mv.py OUT.json [--ms 4,8,16] [--ops qkv,o,gate_up,down,lm_head] [--jobs 16]

``catalog/w4a16_mma.py``'s design with 16-bit weights: W [N, K] row-major (``nn.Linear``'s layout, the
``linear`` operator's); lane (g, c) loads, per 128-column group, halves ``32c .. 32c + 31`` of rows g and
g + 8 of each row tile (four 16-byte loads a row), and each 16-byte vector is the A fragment of two
k-steps in ``w4a16_mma.mma_order``'s permutation, with no decode and no scale; x's B fragments as there.
On the H200 the catalog's swapped-operand GEMM (``linear_decode`` at M = 3..64) streams 16-bit weights
at about half the copy ceiling at M=8 (``benchmarks/README.md`` round 17: 2.1-2.2 TB/s), the int4
MMA-GEMV streams its weights at up to 2.9 TB/s (round 24). Not the product path: the kernels are timed
alone (``w4a16_sweep.timer``: CUDA events around one call, 512 MiB L2 flush, median of 60) beside
``F.linear`` (cuBLAS) and the catalog's kernel for the shape; error against float32; above 1e-2 a
variant is reported, never ranked. Speedup = baseline us / kernel us (above 1: the kernel faster).
"""

import argparse  # no ``from __future__ import annotations``: TVMScript reads the prim_func's annotations
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET = {"kind": "cuda", "arch": "sm_90a"}
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}

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
    uint4 w[U][RT][2][4];
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
          const unsigned lo[4] = {e0.x, e1.x, e0.y, e1.y};
          const unsigned hi[4] = {e0.z, e1.z, e0.w, e1.w};
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            TsMma<BF16>::run(acc[t][n], lo, x[n][wi].x, x[n][wi].y);
            TsMma<BF16>::run(acc[t][n], hi, x[n][wi].z, x[n][wi].w);
          }
        }
    }
  }
  constexpr int PER = RT * NT * 4;
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
          const int col = 8 * n + 2 * c + (i & 1);
          if (col < M) C[(size_t)col * N + row0 + 16 * t + g + 8 * (i >> 1)] = T1(v);
        }
  }
}
"""


def linear_mv(M: int, N: int, K: int, dtype: str = "float16", rt: int = 1, wn: int = 1, wk: int = 8,
              unroll: int = 1) -> Any:
    """y[M, N] = x[M, K] @ W[N, K]^T for a static M of 1..32 (module doc)."""
    import tilelang.language as T

    from tileship.catalog.w4a16_device import DEVICE_SRC, device_types
    from tileship.catalog.w4a16_mma import MMA_SRC, check

    gpw = check(M, N, K, rt, wn, wk, unroll)
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


def variants(M: int, N: int, K: int) -> list[dict[str, int]]:
    """The tilings tried for one shape: at most 2 groups of 4 uint4 a row in flight a lane per row tile."""
    groups, out = K // 128, []
    for rt in (1, 2):
        for wn in (1, 2):
            for wk in (4, 7, 8, 14, 16):
                for unroll in (1, 2):
                    blocks = N // (16 * rt * wn) if N % (16 * rt * wn) == 0 else 0
                    if 32 * wn * wk > 1024 or blocks < 64 or groups % (wk * unroll) or rt * unroll > 2:
                        continue
                    out.append(dict(rt=rt, wn=wn, wk=wk, unroll=unroll))
    return out


def build(job: tuple) -> tuple[tuple, str | None]:
    import tilelang

    M, N, K, dtype, cfg = job
    try:
        tilelang.compile(linear_mv(M, N, K, dtype, **cfg), out_idx=[2], target=TARGET)
        return job, None
    except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
        return job, repr(e)[-400:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ms", default="4,8,16")
    ap.add_argument("--ops", default=",".join(SHAPES))
    ap.add_argument("--jobs", type=int, default=16)
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    jobs = [(M, *SHAPES[op], "float16", cfg) for op in args.ops.split(",") for M in ms
            for cfg in variants(M, *SHAPES[op])]
    t0 = time.time()
    errors: dict[str, str] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        for job, err in ex.map(build, jobs):
            if err:
                errors[repr(job)] = err
    print(f"compiled {len(jobs)} variants in {time.time() - t0:.1f}s, {len(errors)} failed", flush=True)

    import tilelang
    import torch
    import torch.nn.functional as F
    from w4a16_sweep import timer

    from tileship.catalog.gemv import linear_decode

    timeit = timer(torch)
    rows = []
    for op in args.ops.split(","):
        N, K = SHAPES[op]
        w = (torch.randn(N, K, device="cuda") / K**0.5).half()
        for M in ms:
            x = torch.randn(M, K, device="cuda").half()
            ref = x.float() @ w.float().t()
            cub = timeit(lambda: F.linear(x, w))
            cat = tilelang.compile(linear_decode(M, N, K), out_idx=[2], target=TARGET)
            cat_t = timeit(lambda: cat(x, w))
            cands = []
            for cfg in variants(M, N, K):
                if repr((M, N, K, "float16", cfg)) in errors:
                    cands.append(dict(cfg=cfg, error=errors[repr((M, N, K, "float16", cfg))][-200:]))
                    continue
                kern = tilelang.compile(linear_mv(M, N, K, "float16", **cfg), out_idx=[2], target=TARGET)
                y = kern(x, w)
                err = ((y.float() - ref).norm() / ref.norm()).item()
                t = timeit(lambda: kern(x, w))
                cands.append(dict(cfg=cfg, us=t[0], p10_p90=t[1:], relerr=err, tbps=N * K * 2 / (t[0] * 1e-6) / 1e12))
            ok = [c for c in cands if "us" in c and c["relerr"] < 1e-2]
            best = min(ok, key=lambda c: c["us"]) if ok else None
            row = dict(op=op, M=M, N=N, K=K, cublas_us=cub[0], catalog_us=cat_t[0], best=best, candidates=cands,
                       wrong=sum(1 for c in cands if "us" in c and c["relerr"] >= 1e-2))
            print(f"{op:8s} M={M:3d} cuBLAS {cub[0]:7.1f} catalog {cat_t[0]:7.1f} mv "
                  f"{best['us'] if best else float('nan'):7.1f} {best['cfg'] if best else None} "
                  f"x{cub[0] / best['us'] if best else 0:.2f} cuBLAS, x{cat_t[0] / best['us'] if best else 0:.2f} "
                  f"catalog; wrong {row['wrong']}", flush=True)
            rows.append(row)
    Path(args.out).write_text(json.dumps(dict(script="benchmarks/dev/linear_mv.py", device=torch.cuda.get_device_name(),
                                              torch=torch.__version__, compile_errors=errors, rows=rows), indent=1))


if __name__ == "__main__":
    main()
