"""Foreign kernels: TileLang's own examples and tests, copied as they are upstream (github.com/tile-ai/tilelang,
tree a35008a42), declared through tileship's public API as ``docs/declaring.md`` shows, with no edit to a kernel.
``tests/test_foreign.py`` builds them (CUDA sm_90a with nvcc, and the CPU "c" target), loads the releases with no
JIT and calls them. Each kernel names the upstream file it comes from; the references are ours."""

import itertools

import tilelang
import tilelang.language as T
import torch

from tileship import DynamicRange, Operator, ScalarArg, TensorArg, Tolerance

# --------------------------------------------------------------------------------------------------------------
# CUDA kernels (sm_90a)
# --------------------------------------------------------------------------------------------------------------


# examples/elementwise/example_elementwise_add.py: an eager kernel, its tensors are parameters and its dims T.const
@tilelang.jit
def elementwise_add(A, B, block_M, block_N, in_dtype, out_dtype, threads):
    M, N = T.const("M, N")

    A: T.Tensor((M, N), in_dtype)
    B: T.Tensor((M, N), in_dtype)
    C = T.empty((M, N), out_dtype)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_N), in_dtype)
        B_shared = T.alloc_shared((block_M, block_N), in_dtype)
        C_local = T.alloc_fragment((block_M, block_N), out_dtype)
        C_shared = T.alloc_shared((block_M, block_N), out_dtype)

        T.copy(A[by * block_M, bx * block_N], A_shared)
        T.copy(B[by * block_M, bx * block_N], B_shared)
        for local_y, local_x in T.Parallel(block_M, block_N):
            C_local[local_y, local_x] = A_shared[local_y, local_x] + B_shared[local_y, local_x]
        T.copy(C_local, C_shared)
        T.copy(C_shared, C[by * block_M, bx * block_N])

    return C


# examples/gemv/example_gemv.py: eager, keyword tile configs, the dtype a T.dtype parameter
@tilelang.jit
def naive_gemv(
    A,
    B,
    BLOCK_N: int,
    BLOCK_K: int,
    dtype: T.dtype = T.float16,
    accum_dtype: T.dtype = T.float,
):
    N, K = T.const("N, K")
    A: T.Tensor((K,), dtype)
    B: T.Tensor((N, K), dtype)
    C = T.empty((N,), dtype)

    with T.Kernel(T.ceildiv(N, BLOCK_N)) as bn:
        tn = T.get_thread_binding(0)  # tn = threadIdx.x
        A_shared = T.alloc_shared((BLOCK_K,), dtype)
        B_shared = T.alloc_shared((BLOCK_N, BLOCK_K), dtype)
        C_reg = T.alloc_local((1,), accum_dtype)
        T.clear(C_reg)
        for bk in T.serial(T.ceildiv(K, BLOCK_K)):
            for tk in T.serial(BLOCK_K):
                A_shared[tk] = A[bk * BLOCK_K + tk]
                B_shared[tn, tk] = B[bn * BLOCK_N + tn, bk * BLOCK_K + tk]
            for tk in T.serial(BLOCK_K):
                C_reg[0] += A_shared[tk].astype(accum_dtype) * B_shared[tn, tk].astype(accum_dtype)
        C[bn * BLOCK_N + tn] = C_reg[0]

    return C


# examples/norm/rms_norm.py: eager, the dtype hard-coded, pass configs on the decorator
@tilelang.jit(pass_configs={"tl.disable_tma_lower": True})
def rms_norm(A, blk_m):
    M, N = T.const("M, N")
    dtype = T.float

    A: T.Tensor((M, N), dtype)
    B = T.empty((M, N), dtype)

    with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
        A_local = T.alloc_fragment((blk_m, N), dtype)
        A_pow_local = T.alloc_fragment((blk_m, N), dtype)
        A_powsum = T.alloc_fragment((blk_m,), dtype)

        T.copy(A[bx * blk_m : (bx + 1) * blk_m, :], A_local)
        for i, j in T.Parallel(blk_m, N):
            A_pow_local[i, j] = A_local[i, j] * A_local[i, j]
        T.reduce_sum(A_pow_local, A_powsum, dim=1)
        for i in T.Parallel(blk_m):
            A_powsum[i] = T.rsqrt(A_powsum[i] / N + 1e-12)
        for i, j in T.Parallel(blk_m, N):
            A_local[i, j] *= A_powsum[i]
        T.copy(A_local, B[bx * blk_m : (bx + 1) * blk_m, :])

    return B


# examples/norm/layernorm.py: three outputs (two float32) by out_idx, in_dtype and out_dtype both the operator dtype
@tilelang.jit(out_idx=[-3, -2, -1])
def _layernorm_fwd(N, D, eps=1e-5, blk_m=1, threads=256, in_dtype="bfloat16", out_dtype="bfloat16"):
    accum_dtype = "float"

    @T.prim_func
    def main(
        X: T.Tensor((N, D), in_dtype),
        gamma: T.Tensor((D,), in_dtype),
        beta: T.Tensor((D,), in_dtype),
        Y: T.Tensor((N, D), out_dtype),
        Mean: T.Tensor((N,), accum_dtype),
        Rstd: T.Tensor((N,), accum_dtype),
    ):
        with T.Kernel(T.ceildiv(N, blk_m), threads=threads) as bx:
            X_smem = T.alloc_shared((blk_m, D), in_dtype)
            G_smem = T.alloc_shared((D,), in_dtype)
            B_smem = T.alloc_shared((D,), in_dtype)
            X_local = T.alloc_fragment((blk_m, D), accum_dtype)
            X_sq_local = T.alloc_fragment((blk_m, D), accum_dtype)
            sum_row = T.alloc_fragment((blk_m,), accum_dtype)
            sumsq_row = T.alloc_fragment((blk_m,), accum_dtype)
            mean_row = T.alloc_fragment((blk_m,), accum_dtype)
            rstd_row = T.alloc_fragment((blk_m,), accum_dtype)

            T.copy(X[bx * blk_m, 0], X_smem)
            T.copy(gamma, G_smem)
            T.copy(beta, B_smem)

            for i, j in T.Parallel(blk_m, D):
                X_local[i, j] = T.Cast(accum_dtype, X_smem[i, j])
            for i, j in T.Parallel(blk_m, D):
                X_sq_local[i, j] = X_local[i, j] * X_local[i, j]

            T.reduce_sum(X_local, sum_row, dim=1)
            T.reduce_sum(X_sq_local, sumsq_row, dim=1)

            inv_D = T.float32(1.0) / T.Cast(accum_dtype, D)
            for i in T.Parallel(blk_m):
                mean_row[i] = sum_row[i] * inv_D
                rstd_row[i] = T.rsqrt(sumsq_row[i] * inv_D - mean_row[i] * mean_row[i] + T.Cast(accum_dtype, eps))
                Mean[bx * blk_m + i] = mean_row[i]
                Rstd[bx * blk_m + i] = rstd_row[i]

            for i, j in T.Parallel(blk_m, D):
                norm = (X_local[i, j] - mean_row[i]) * rstd_row[i]
                X_smem[i, j] = T.Cast(
                    out_dtype,
                    norm * T.Cast(accum_dtype, G_smem[j]) + T.Cast(accum_dtype, B_smem[j]),
                )

            T.copy(X_smem, Y[bx * blk_m, 0])

    return main


# examples/norm/layernorm.py: out_idx=[-3], the output DX before DGamma and DBeta, which it accumulates into in place
@tilelang.jit(out_idx=[-3])
def _layernorm_bwd(N, D, blk_m=32, threads=256, in_dtype="bfloat16"):
    assert N % blk_m == 0, f"N={N} must be a multiple of blk_m={blk_m}"
    accum_dtype = "float"

    @T.prim_func
    def main(
        DY: T.Tensor((N, D), in_dtype),
        X: T.Tensor((N, D), in_dtype),
        gamma: T.Tensor((D,), in_dtype),
        Mean: T.Tensor((N,), accum_dtype),
        Rstd: T.Tensor((N,), accum_dtype),
        DX: T.Tensor((N, D), in_dtype),
        DGamma: T.Tensor((D,), accum_dtype),
        DBeta: T.Tensor((D,), accum_dtype),
    ):
        with T.Kernel(T.ceildiv(N, blk_m), threads=threads) as bx:
            DY_smem = T.alloc_shared((1, D), in_dtype)
            X_smem = T.alloc_shared((1, D), in_dtype)
            G_smem = T.alloc_shared((D,), in_dtype)
            DX_smem = T.alloc_shared((1, D), in_dtype)

            x_hat = T.alloc_fragment((1, D), accum_dtype)
            dx_hat = T.alloc_fragment((1, D), accum_dtype)
            dx_hat_x_hat = T.alloc_fragment((1, D), accum_dtype)
            sum_dx_hat = T.alloc_fragment((1,), accum_dtype)
            sum_dx_hat_x_hat = T.alloc_fragment((1,), accum_dtype)
            dgamma_acc = T.alloc_fragment((D,), accum_dtype)
            dbeta_acc = T.alloc_fragment((D,), accum_dtype)

            T.copy(gamma, G_smem)
            T.clear(dgamma_acc)
            T.clear(dbeta_acc)

            inv_D = T.float32(1.0) / T.Cast(accum_dtype, D)

            for k in T.serial(blk_m):
                row = bx * blk_m + k
                T.copy(DY[row, 0], DY_smem)
                T.copy(X[row, 0], X_smem)
                m_v = Mean[row]
                r_v = Rstd[row]

                for i, j in T.Parallel(1, D):
                    xv = T.Cast(accum_dtype, X_smem[i, j])
                    dy_v = T.Cast(accum_dtype, DY_smem[i, j])
                    g_v = T.Cast(accum_dtype, G_smem[j])
                    x_hat[i, j] = (xv - m_v) * r_v
                    dx_hat[i, j] = dy_v * g_v
                    dx_hat_x_hat[i, j] = dx_hat[i, j] * x_hat[i, j]

                T.reduce_sum(dx_hat, sum_dx_hat, dim=1)
                T.reduce_sum(dx_hat_x_hat, sum_dx_hat_x_hat, dim=1)

                for i, j in T.Parallel(1, D):
                    c1 = sum_dx_hat_x_hat[0] * inv_D
                    c2 = sum_dx_hat[0] * inv_D
                    dx_v = r_v * (dx_hat[i, j] - c2 - x_hat[i, j] * c1)
                    DX_smem[i, j] = T.Cast(in_dtype, dx_v)
                    dy_v = T.Cast(accum_dtype, DY_smem[i, j])
                    dgamma_acc[j] += dy_v * x_hat[i, j]
                    dbeta_acc[j] += dy_v

                T.copy(DX_smem, DX[row, 0])

            for j in T.Parallel(D):
                T.atomic_add(DGamma[j], dgamma_acc[j], memory_order="relaxed")
                T.atomic_add(DBeta[j], dbeta_acc[j], memory_order="relaxed")

    return main


# examples/cast/example_per_token_cast_to_fp8.py: eager, two T.empty outputs, one of them float8_e4m3fn
@tilelang.jit
def per_token_cast_to_fp8(X, blk_m):
    M, N = T.const("M, N")
    dtype = T.float
    group_size = 128
    fp8_min = -448.0
    fp8_max = 448.0

    X: T.Tensor((M, N), dtype)
    X_fp8 = T.empty((M, N), T.float8_e4m3fn)
    X_amax = T.empty((M, T.ceildiv(N, group_size)), dtype)

    with T.Kernel(T.ceildiv(M, blk_m), T.ceildiv(N, group_size), threads=128) as (bx, by):
        row = bx
        row_g_id = by
        y_local = T.alloc_fragment((blk_m, group_size), dtype)
        y_amax_local = T.alloc_fragment((blk_m,), dtype)
        y_s_local = T.alloc_fragment((blk_m,), dtype)
        y_q_local = T.alloc_fragment((blk_m, group_size), dtype)
        y_q_local_fp8 = T.alloc_fragment((blk_m, group_size), T.float8_e4m3fn)

        T.copy(X[row * blk_m : (row + 1) * blk_m, row_g_id * group_size : (row_g_id + 1) * group_size], y_local)
        T.reduce_absmax(y_local, y_amax_local, dim=1)
        for i in T.Parallel(blk_m):
            y_amax_local[i] = T.max(y_amax_local[i], 1e-4)
            y_s_local[i] = y_amax_local[i] / fp8_max
        for i, j in T.Parallel(blk_m, group_size):
            y_q_local[i, j] = T.clamp(y_local[i, j] / y_s_local[i], fp8_min, fp8_max)
        T.copy(y_q_local, y_q_local_fp8)
        for i in T.Parallel(blk_m):
            X_amax[row * blk_m + i, row_g_id] = y_s_local[i]
        T.copy(y_q_local_fp8, X_fp8[row * blk_m : (row + 1) * blk_m, row_g_id * group_size : (row_g_id + 1) * group_size])

    return X_fp8, X_amax


# examples/topk/example_topk.py: @autotune over an eager kernel; its outputs are (M, topk), topk a config: six columns
def get_configs():
    iter_params = dict(
        blk_m=[64, 128, 256],
        threads=[128, 256, 512],
    )
    return [dict(zip(iter_params, values)) for values in itertools.product(*iter_params.values())]


@tilelang.autotune(configs=get_configs())
@tilelang.jit
def tl_topk(logits, topk, blk_m, threads=128):
    M, N = T.const("M, N")
    dtype = T.float32

    logits: T.Tensor([M, N], dtype)
    topk_gates = T.empty([M, topk], dtype)
    topk_indices = T.empty([M, topk], T.int32)

    with T.Kernel(T.ceildiv(M, blk_m), threads=threads) as bx:
        logits_frag = T.alloc_fragment([blk_m, N], dtype=dtype)
        max_val = T.alloc_fragment([blk_m], dtype=dtype)
        expand_max_idx = T.alloc_fragment([blk_m, N], T.int32)
        max_idx = T.alloc_fragment([blk_m], T.int32)

        T.copy(logits[bx * blk_m, 0], logits_frag)

        for k in T.serial(topk):
            T.fill(expand_max_idx, -1)
            T.reduce_max(logits_frag, max_val, dim=1, clear=True)

            for i, j in T.Parallel(blk_m, N):
                expand_max_idx[i, j] = T.if_then_else(max_val[i] == logits_frag[i, j], j, expand_max_idx[i, j])

            T.reduce_max(expand_max_idx, max_idx, dim=1, clear=True)

            for i, j in T.Parallel(blk_m, N):
                logits_frag[i, j] = T.if_then_else(max_val[i] == logits_frag[i, j], -10000.0, logits_frag[i, j])

            for i in T.Parallel(blk_m):
                topk_gates[bx * blk_m + i, k] = max_val[i]
                topk_indices[bx * blk_m + i, k] = max_idx[i]

    return topk_gates, topk_indices


# examples/dynamic_shape/example_dynamic.py: eager, every dim T.dynamic inside the kernel, trans flags as configs
@tilelang.jit
def matmul_dynamic_mnk(
    A,
    B,
    block_M,
    block_N,
    block_K,
    trans_A,
    trans_B,
    in_dtype,
    out_dtype,
    accum_dtype,
    num_stages,
    threads,
):
    M = T.dynamic("m")
    N = T.dynamic("n")
    K = T.dynamic("k")

    A_shape = (K, M) if trans_A else (M, K)
    B_shape = (N, K) if trans_B else (K, N)

    A_shared_shape = (block_K, block_M) if trans_A else (block_M, block_K)
    B_shared_shape = (block_N, block_K) if trans_B else (block_K, block_N)

    A: T.Tensor(A_shape, in_dtype)
    B: T.Tensor(B_shape, in_dtype)
    C = T.empty((M, N), out_dtype)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
        A_shared = T.alloc_shared(A_shared_shape, in_dtype)
        B_shared = T.alloc_shared(B_shared_shape, in_dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        T.clear(C_local)
        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
            if trans_A:
                T.copy(A[k * block_K, by * block_M], A_shared)
            else:
                T.copy(A[by * block_M, k * block_K], A_shared)
            if trans_B:
                T.copy(B[bx * block_N, k * block_K], B_shared)
            else:
                T.copy(B[k * block_K, bx * block_N], B_shared)
            T.gemm(A_shared, B_shared, C_local, trans_A, trans_B)
        T.copy(C_local, C[by * block_M, bx * block_N])

    return C


# testing/python/jit/test_tilelang_jit_gemm_cython.py: a plain factory, the output C before a scalar (offset);
# upstream compiles it with out_idx=2 and calls kernel(a, b, 1)
def matmul_int_variable(
    M,
    N,
    K,
    block_M,
    block_N,
    block_K,
    trans_A,
    trans_B,
    in_dtype,
    out_dtype,
    accum_dtype,
    num_stages,
    threads,
):
    A_shape = (K, M) if trans_A else (M, K)
    B_shape = (N, K) if trans_B else (K, N)
    A_shared_shape = (block_K, block_M) if trans_A else (block_M, block_K)
    B_shared_shape = (block_N, block_K) if trans_B else (block_K, block_N)

    @T.prim_func
    def main(
        A: T.Tensor(A_shape, in_dtype),
        B: T.Tensor(B_shape, in_dtype),
        C: T.Tensor((M, N), out_dtype),
        offset: T.int32,
    ):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared(A_shared_shape, in_dtype)
            B_shared = T.alloc_shared(B_shared_shape, in_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                if trans_A:
                    T.copy(A[k * block_K, by * block_M], A_shared)
                else:
                    T.copy(A[by * block_M, k * block_K], A_shared)
                if trans_B:
                    T.copy(B[bx * block_N, k * block_K], B_shared)
                else:
                    T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local, trans_A, trans_B)
            for i, j in T.Parallel(block_M, block_N):
                C_local[i, j] = C_local[i, j] + offset
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


# --------------------------------------------------------------------------------------------------------------
# CPU ("c" target) kernels
# --------------------------------------------------------------------------------------------------------------


# testing/python/cpu/test_tilelang_cpu_reduce.py: a plain factory with string, int and bool keyword configs
def _emit_reduce(T, op: str, src, dst, dim: int, clear: bool):
    if op == "sum":
        T.reduce_sum(src, dst, dim=dim, clear=clear)
    elif op == "max":
        T.reduce_max(src, dst, dim=dim, clear=clear)
    elif op == "min":
        T.reduce_min(src, dst, dim=dim, clear=clear)
    elif op == "abssum":
        T.reduce_abssum(src, dst, dim=dim)
    elif op == "absmax":
        T.reduce_absmax(src, dst, dim=dim, clear=clear)
    elif op == "bitand":
        T.reduce_bitand(src, dst, dim=dim, clear=clear)
    elif op == "bitor":
        T.reduce_bitor(src, dst, dim=dim, clear=clear)
    elif op == "bitxor":
        T.reduce_bitxor(src, dst, dim=dim, clear=clear)
    else:
        raise ValueError(op)


def _make_kernel_2d(op: str, M: int, N: int, dim: int, dtype: str, clear: bool):
    legal = dim if dim >= 0 else 2 + dim
    dst_shape = (N,) if legal == 0 else (M,)

    @T.prim_func
    def main(
        A: T.Tensor((M, N), dtype),
        Init: T.Tensor(dst_shape, dtype),
        B: T.Tensor(dst_shape, dtype),
    ):
        with T.Kernel(1):
            src = T.alloc_local((M, N), dtype)
            dst = T.alloc_local(dst_shape, dtype)
            for i, j in T.grid(M, N):
                src[i, j] = A[i, j]
            for i in T.grid(dst_shape[0]):
                dst[i] = Init[i]
            _emit_reduce(T, op, src, dst, dim=legal, clear=clear)
            for i in T.grid(dst_shape[0]):
                B[i] = dst[i]

    return main


# testing/python/language/test_tilelang_language_parallel.py: out_idx=[1], the output B before a scalar
@tilelang.jit(out_idx=[1])
def parallel_elementwise_dynamic(max_len=512, threads=256, dtype=T.float32):
    @T.prim_func
    def main(
        A: T.Tensor((max_len,), dtype),
        B: T.Tensor((max_len,), dtype),
        valid_len: T.int32,
    ):
        with T.Kernel(1, threads=threads) as _:
            for i in T.Parallel(max_len):
                B[i] = 0.0
            span = T.min(valid_len, max_len)
            for i in T.Parallel(span):
                B[i] = A[i] - 1.0

    return main


# --------------------------------------------------------------------------------------------------------------
# references (ours) and declarations
# --------------------------------------------------------------------------------------------------------------


def add_ref(a, b):
    return a + b


def gemv_ref(a, b):
    return b @ a


def rms_ref(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-12)


def ln_fwd_ref(x, g, b):
    xf = x.float()
    y = torch.nn.functional.layer_norm(xf, (x.shape[-1],), g.float(), b.float(), 1e-5).to(x.dtype)
    return y, xf.mean(-1), torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)


def ln_bwd_ref(dy, x, gamma, mean, rstd, dgamma, dbeta):
    """DX returned; DGamma and DBeta accumulated into in place, as the kernel does."""
    xf, dyf = x.float(), dy.float()
    x_hat = (xf - mean[:, None]) * rstd[:, None]
    dx_hat = dyf * gamma.float()
    dx = rstd[:, None] * (dx_hat - dx_hat.mean(-1, keepdim=True) - x_hat * (dx_hat * x_hat).mean(-1, keepdim=True))
    dgamma += (dyf * x_hat).sum(0)
    dbeta += dyf.sum(0)
    return dx.to(x.dtype)


def cast_fp8_ref(x):
    """The upstream example's ref_program for N a multiple of 128."""
    m, n = x.shape
    x_view = x.view(m, -1, 128)
    x_amax = x_view.abs().float().amax(dim=2).view(m, -1).clamp(1e-4)
    x_fp8 = (x_view * (448.0 / x_amax.unsqueeze(2))).to(torch.float8_e4m3fn)
    return x_fp8.view(m, n), (x_amax / 448.0).view(m, -1)


def topk_ref(logits):
    gates, indices = logits.topk(6, dim=1)
    return gates, indices.to(torch.int32)


def matmul_ref(a, b):
    return (a.float() @ b.float()).to(a.dtype)


def matmul_offset_ref(a, b, offset):
    return (a.float() @ b.float() + offset).to(a.dtype)


def parallel_ref(a, valid_len):
    out = torch.zeros_like(a)
    n = min(max(int(valid_len), 0), a.shape[0])
    out[:n] = a[:n] - 1.0
    return out


def reduce_sum_ref(a, init):
    return init + a.sum(dim=1).to(a.dtype)


def reduce_xor_ref(a, init):
    out = init.clone()
    for j in range(a.shape[1]):
        out = out ^ a[:, j]
    return out


def ln_sample(dims, dtype, device):
    """DY, X, gamma, and X's own mean and rstd (what the forward saved), DGamma and DBeta to accumulate into."""
    n, d = dims["N"], dims["D"]
    dt = getattr(torch, dtype)
    x = torch.randn(n, d, device=device).to(dt)
    xf = x.float()
    dy, gamma = torch.randn(n, d, device=device).to(dt), torch.randn(d, device=device).to(dt)
    rstd = torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)
    return dy, x, gamma, xf.mean(-1), rstd, torch.randn(d, device=device), torch.randn(d, device=device)


SM90 = ("cuda-sm90a",)

# no outputs=: C is the kernel's T.empty tensor; "dtype" goes to both in_dtype and out_dtype
ew_add = Operator(name="ew_add", factory=elementwise_add, reference=add_ref,
                  inputs=(TensorArg("A", ("M", "N")), TensorArg("B", ("M", "N"))),
                  dtypes=("float32",), targets=SM90, params={"dtype": ("in_dtype", "out_dtype")},
                  config={"block_M": 32, "block_N": 32, "threads": 128}, shapes=({"M": 128, "N": 256},))
gemv = Operator(name="gemv", factory=naive_gemv, reference=gemv_ref,
                inputs=(TensorArg("A", ("K",)), TensorArg("B", ("N", "K"))),
                dtypes=("float16",), targets=SM90, config={"BLOCK_N": 128, "BLOCK_K": 128},
                shapes=({"N": 256, "K": 128},))
# T.const M of an eager kernel made T.dynamic by the range
rms = Operator(name="rms", factory=rms_norm, reference=rms_ref, inputs=(TensorArg("A", ("M", "N")),),
               dtypes=("float32",), targets=SM90, params={"dtype": None}, config={"blk_m": 1},
               ranges=(DynamicRange("M", 1, 4096, {"N": 256}),))
ln_fwd = Operator(name="ln_fwd", factory=_layernorm_fwd, reference=ln_fwd_ref,
                  inputs=(TensorArg("X", ("N", "D")), TensorArg("gamma", ("D",)), TensorArg("beta", ("D",))),
                  outputs=(TensorArg("Y", ("N", "D")), TensorArg("Mean", ("N",), dtype="float32"),
                           TensorArg("Rstd", ("N",), dtype="float32")),
                  dtypes=("float16",), targets=SM90, params={"dtype": ("in_dtype", "out_dtype")},
                  shapes=({"N": 64, "D": 256},))
# outputs read from the T.empty tensors: X_fp8 (M, N) float8_e4m3fn, X_amax (M, N/128)
cast_fp8 = Operator(name="cast_fp8", factory=per_token_cast_to_fp8, reference=cast_fp8_ref,
                    inputs=(TensorArg("X", ("M", "N")),), dtypes=("float32",), targets=SM90, params={"dtype": None},
                    config={"blk_m": 8}, shapes=({"M": 40, "N": 512},))
# outputs read from the T.empty tensors: (M, 6) each, 6 a size the kernel fixes (topk=6)
topk = Operator(name="topk", factory=tl_topk, reference=topk_ref, inputs=(TensorArg("logits", ("M", "N")),),
                dtypes=("float32",), targets=SM90, params={"dtype": None},
                config={"topk": 6, "blk_m": 64, "threads": 128}, shapes=({"M": 320, "N": 128},))
# the output is parameter 5 of 8: the inputs are the other seven, in the kernel's order
ln_bwd = Operator(name="ln_bwd", factory=_layernorm_bwd, reference=ln_bwd_ref,
                  inputs=(TensorArg("DY", ("N", "D")), TensorArg("X", ("N", "D")), TensorArg("gamma", ("D",)),
                          TensorArg("Mean", ("N",), dtype="float32"), TensorArg("Rstd", ("N",), dtype="float32"),
                          TensorArg("DGamma", ("D",), dtype="float32"), TensorArg("DBeta", ("D",), dtype="float32")),
                  outputs=(TensorArg("DX", ("N", "D")),), mutates=("DGamma", "DBeta"),
                  dtypes=("bfloat16",), targets=SM90, params={"dtype": "in_dtype"},
                  shapes=({"N": 64, "D": 256},), sample=ln_sample,
                  tolerances={"bfloat16": Tolerance(3e-2, 3e-2), "DGamma": Tolerance(1e-2, 1e-2),
                              "DBeta": Tolerance(1e-2, 1e-2)})
# its T.dynamic("m"), ("n"), ("k") name the declared dims: the T.empty output C reads as (M, N)
mm_dynamic = Operator(name="mm_dynamic", factory=matmul_dynamic_mnk, reference=matmul_ref,
                      inputs=(TensorArg("A", ("M", "K")), TensorArg("B", ("K", "N"))),
                      dtypes=("float16",), targets=SM90, params={"dtype": ("in_dtype", "out_dtype")},
                      config={"block_M": 128, "block_N": 128, "block_K": 32, "trans_A": False, "trans_B": False,
                              "accum_dtype": "float32", "num_stages": 3, "threads": 128},
                      ranges=(DynamicRange("M", 1, 4096, {"N": 256, "K": 128}),))

# CPU: the static shape builds; the T.dynamic range does not lower for "c" (alloc_local((M, N)) needs constants)
reduce_sum = Operator(name="reduce_sum", factory=_make_kernel_2d, reference=reduce_sum_ref,
                      inputs=(TensorArg("A", ("M", "N")), TensorArg("Init", ("M",))),
                      outputs=(TensorArg("B", ("M",)),), dtypes=("float32",), targets=("c",),
                      config={"op": "sum", "dim": 1, "clear": False},
                      shapes=({"M": 3, "N": 17},), ranges=(DynamicRange("M", 1, 64, {"N": 8}),))
# int32 builds; bool is a dtype the "c" target cannot pass (bool* for int8_t*): refused apart, the reference serves
reduce_xor = Operator(name="reduce_xor", factory=_make_kernel_2d, reference=reduce_xor_ref,
                      inputs=(TensorArg("A", ("M", "N")), TensorArg("Init", ("M",))),
                      outputs=(TensorArg("B", ("M",)),), dtypes=("int32", "bool"), targets=("c",),
                      config={"op": "bitxor", "dim": 1, "clear": False}, shapes=({"M": 4, "N": 8},))
# the output B is parameter 1 of 3 (out_idx=[1]), the int32 scalar after it
parallel = Operator(name="parallel", factory=parallel_elementwise_dynamic, reference=parallel_ref,
                    inputs=(TensorArg("A", ("N",)), ScalarArg("valid_len", dtype="int32")),
                    outputs=(TensorArg("B", ("N",)),), dtypes=("float32",), targets=("c",), params={"N": "max_len"},
                    config={"threads": 1}, shapes=({"N": 64},))
# a plain factory says nothing about its outputs: C is found among the parameters by name (A, B, C, offset)
mm_offset = Operator(name="mm_offset", factory=matmul_int_variable, reference=matmul_offset_ref,
                     inputs=(TensorArg("A", ("M", "K")), TensorArg("B", ("K", "N")),
                             ScalarArg("offset", dtype="int32")),
                     outputs=(TensorArg("C", ("M", "N")),), dtypes=("float16",), targets=SM90,
                     params={"dtype": ("in_dtype", "out_dtype")},
                     config={"block_M": 128, "block_N": 128, "block_K": 32, "trans_A": False, "trans_B": False,
                             "accum_dtype": "float32", "num_stages": 0, "threads": 128},
                     shapes=({"M": 256, "N": 256, "K": 256},))
