"""The kernels of docs/declaring.md, written as TileLang users write them (CPU "c" target style:
``T.Kernel(grid)`` without threads, serial/Parallel loops). The guide declares them; it never
wraps them. ``tests/test_guide.py`` builds, loads and runs every declaration."""

import tilelang
import tilelang.language as T
import torch


# 1. elementwise, a @tilelang.jit object
@tilelang.jit
def elementwise_add(N, dtype="float32", block=256):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block)) as bx:
            for i in T.Parallel(block):
                if bx * block + i < N:
                    C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    return main


def add_ref(a, b):
    return a + b


# 2. LayerNorm forward with float32 mean and rstd beside y
def layer_norm_fwd(M, N, dtype="float32", eps=1e-5):
    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype), Bias: T.Tensor((N,), dtype),
             Y: T.Tensor((M, N), dtype), Mean: T.Tensor((M,), "float32"), Rstd: T.Tensor((M,), "float32")):
        with T.Kernel(M) as row:
            s = T.alloc_local((2,), "float32")
            s[0] = 0.0
            s[1] = 0.0
            for j in T.serial(N):
                s[0] += T.cast(X[row, j], "float32")
            s[0] = s[0] / N
            for j in T.serial(N):
                s[1] += (T.cast(X[row, j], "float32") - s[0]) * (T.cast(X[row, j], "float32") - s[0])
            s[1] = T.rsqrt(s[1] / N + eps)
            Mean[row] = s[0]
            Rstd[row] = s[1]
            for j in T.serial(N):
                Y[row, j] = T.cast((T.cast(X[row, j], "float32") - s[0]) * s[1], dtype) * W[j] + Bias[j]

    return main


def layer_norm_ref(x, w, b):
    xf = x.to(torch.float64)
    mean = xf.mean(-1)
    rstd = torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
    return y, mean.float(), rstd.float()


# 3. GEMV: y = W x, the factory takes in_dtype / accum_dtype
def gemv(N, K, in_dtype="float32", accum_dtype="float32"):
    @T.prim_func
    def main(x: T.Tensor((K,), in_dtype), W: T.Tensor((N, K), in_dtype), y: T.Tensor((N,), in_dtype)):
        with T.Kernel(N) as n:
            acc = T.alloc_local((1,), accum_dtype)
            acc[0] = 0.0
            for k in T.serial(K):
                acc[0] += T.cast(W[n, k], accum_dtype) * T.cast(x[k], accum_dtype)
            y[n] = T.cast(acc[0], in_dtype)

    return main


def gemv_ref(x, w):
    return w @ x


# 4. decode attention with a uint8 key mask (one query per sequence)
def masked_decode(B, S, D, dtype="float32"):
    scale = 1.0 / D**0.5

    @T.prim_func
    def main(Q: T.Tensor((B, D), dtype), K: T.Tensor((B, S, D), dtype), V: T.Tensor((B, S, D), dtype),
             mask: T.Tensor((B, S), "uint8"), O: T.Tensor((B, D), dtype)):
        with T.Kernel(B) as b:
            p = T.alloc_local((S,), "float32")
            r = T.alloc_local((3,), "float32")  # running max, sum, dot
            r[0] = -1e30
            r[1] = 0.0
            for s in T.serial(S):
                r[2] = 0.0
                for d in T.serial(D):
                    r[2] += T.cast(Q[b, d], "float32") * T.cast(K[b, s, d], "float32")
                p[s] = T.if_then_else(mask[b, s] != T.uint8(0), r[2] * scale, T.float32(-1e30))
                r[0] = T.max(r[0], p[s])
            for s in T.serial(S):
                p[s] = T.if_then_else(mask[b, s] != T.uint8(0), T.exp(p[s] - r[0]), T.float32(0))
                r[1] += p[s]
            for d in T.serial(D):
                r[2] = 0.0
                for s in T.serial(S):
                    r[2] += p[s] * T.cast(V[b, s, d], "float32")
                O[b, d] = T.cast(r[2] / r[1], dtype)

    return main


def masked_decode_ref(q, k, v, mask):
    scores = torch.einsum("bd,bsd->bs", q, k) / q.shape[-1] ** 0.5
    p = torch.softmax(scores.masked_fill(mask == 0, float("-inf")), dim=-1)
    return torch.einsum("bs,bsd->bd", p, v)


def masked_decode_sample(dims, dtype, device):
    """Every sequence keeps at least its first key (an all-masked row has no softmax)."""
    b, s, d = dims["B"], dims["S"], dims["D"]
    dt = getattr(torch, dtype)
    lengths = torch.randint(1, s + 1, (b, 1), device=device)
    mask = (torch.arange(s, device=device) < lengths).to(torch.uint8)
    return (torch.randn(b, d, device=device).to(dt), torch.randn(b, s, d, device=device).to(dt),
            torch.randn(b, s, d, device=device).to(dt), mask)


# 5. eager-style: the output is a T.empty tensor the kernel returns
@tilelang.jit
def row_sum(M, N, dtype="float32"):
    @T.prim_func
    def main(X: T.Tensor((M, N), dtype)):
        S = T.empty((M,), dtype)
        with T.Kernel(M) as row:
            acc = T.alloc_local((1,), dtype)
            acc[0] = 0.0
            for j in T.serial(N):
                acc[0] += X[row, j]
            S[row] = acc[0]
        return S

    return main


def row_sum_ref(x):
    return x.sum(-1)
