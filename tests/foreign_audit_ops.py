"""Foreign "c"-target kernels of shapes no other test module declares (``tests/test_foreign_audit.py``):
two outputs sized by different dims of an int8 input, a ``T.dynamic`` dim at two positions of two tensors beside
a float and an int scalar and a static dim named like a Python keyword, an in-place update of two tensors of two
dtypes with scalars and no outputs, a lazy ``@tilelang.jit`` gather whose output takes one dim from each input,
a ``sample`` hook that takes its ``dtype`` (a str) for torch's, a dynamic dim named ``class`` with an int64 scalar
and int16/uint8/int64 tensors, a float16 scalar, and an in-place scatter into a tensor of a dim of its own."""

import dataclasses

import tilelang
import tilelang.language as T
import torch

from tileship import DynamicRange, Operator, ScalarArg, TensorArg, Tolerance


# 1. two outputs from different dims, an int8 input beside a float32 one (plain prim_func factory)
def row_col_stats(M, N, dtype="float32"):
    """rowdot[m] = sum_n X[m, n] * w[n] (float32), colmax[n] = max_m X[m, n] (int32)."""

    @T.prim_func
    def main(X: T.Tensor((M, N), "int8"), w: T.Tensor((N,), dtype), rowdot: T.Tensor((M,), dtype),
             colmax: T.Tensor((N,), "int32")):
        with T.Kernel(1):
            for m in T.serial(M):
                rowdot[m] = T.cast(0, dtype)
                for n in T.serial(N):
                    rowdot[m] = rowdot[m] + T.cast(X[m, n], dtype) * w[n]
            for n in T.serial(N):
                colmax[n] = T.int32(-128)
                for m in T.serial(M):
                    colmax[n] = T.max(colmax[n], T.cast(X[m, n], "int32"))

    return main


def row_col_stats_ref(x, w):
    return (x.to(torch.float64) @ w.to(torch.float64)).to(w.dtype), x.to(torch.int32).amax(0)


stats = Operator(name="stats", factory=row_col_stats, reference=row_col_stats_ref,
                 inputs=(TensorArg("X", ("M", "N"), dtype="int8"), TensorArg("w", ("N",))),
                 outputs=(TensorArg("rowdot", ("M",)), TensorArg("colmax", ("N",), dtype="int32")),
                 dtypes=("float32",), targets=("c",), ranges=(DynamicRange("M", 1, 64, {"N": 16}),),
                 tolerances={"float32": Tolerance(1e-4, 1e-4)})


# 2. a dynamic dim at two positions, float and int scalars, a dim named like a Python keyword (plain factory)
def transpose_affine(M, n_in, dtype="float32"):
    """B[j, i] = A[i, j] * alpha + shift."""

    @T.prim_func
    def main(A: T.Tensor((M, n_in), dtype), alpha: T.float32, shift: T.int32, B: T.Tensor((n_in, M), dtype)):
        with T.Kernel(M) as i:
            for j in T.Parallel(n_in):
                B[j, i] = A[i, j] * T.cast(alpha, dtype) + T.cast(shift, dtype)

    return main


def transpose_affine_ref(a, alpha, shift):
    return (a.t() * alpha + shift).contiguous()


transposed = Operator(name="transposed", factory=transpose_affine, reference=transpose_affine_ref,
                      inputs=(TensorArg("A", ("M", "in")), ScalarArg("alpha", dtype="float32"),
                              ScalarArg("shift", dtype="int32")),
                      outputs=(TensorArg("B", ("in", "M")),), params={"in": "n_in"},
                      dtypes=("float32", "float64"), targets=("c",),
                      ranges=(DynamicRange("M", 1, 128, {"in": 8}),), shapes=({"M": 4, "in": 3},))


# 3. two inputs of two dtypes updated in place, two float scalars, no outputs (plain factory)
def clip_count(N, dtype="float32"):
    """X clipped to [lo, hi] in place; hits[0] += how many elements were clipped."""

    @T.prim_func
    def main(X: T.Tensor((N,), dtype), lo: T.float32, hi: T.float32, hits: T.Tensor((1,), "int32")):
        with T.Kernel(1):
            for i in T.serial(N):
                if X[i] < T.cast(lo, dtype):
                    X[i] = T.cast(lo, dtype)
                    hits[0] = hits[0] + 1
                elif X[i] > T.cast(hi, dtype):
                    X[i] = T.cast(hi, dtype)
                    hits[0] = hits[0] + 1

    return main


def clip_count_ref(x, lo, hi, hits):
    clipped = (x < lo) | (x > hi)
    hits += clipped.sum().to(hits.dtype)
    x.clamp_(lo, hi)


def clip_count_sample(dims, dtype, device):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(dims["N"], generator=g) * 2).to(getattr(torch, dtype)).to(device)
    return x, -1.0, 1.0, torch.zeros(1, dtype=torch.int32, device=device)


def clip_count_sample_torch_dtype(dims, dtype, device):
    """The same, written as if ``dtype`` were torch's dtype (it is the name, a str): ``x.to("float32")`` raises
    "Invalid device string: 'float32'" (a user's mistake)."""
    return torch.randn(dims["N"]).to(dtype).to(device), -1.0, 1.0, torch.zeros(1, dtype=torch.int32, device=device)


clip_ = Operator(name="clip_", factory=clip_count, reference=clip_count_ref, sample=clip_count_sample,
                 inputs=(TensorArg("X", ("N",)), ScalarArg("lo", dtype="float32"), ScalarArg("hi", dtype="float32"),
                         TensorArg("hits", (1,), dtype="int32")),
                 mutates=("X", "hits"), dtypes=("float32",), targets=("c",),
                 ranges=(DynamicRange("N", 1, 4096),), tolerances={"float32": Tolerance(0.0, 0.0)})
clip_bad_sample = dataclasses.replace(clip_, name="clip_bad_sample", sample=clip_count_sample_torch_dtype, ranges=(),
                                      shapes=({"N": 8},))


# 4. a lazy @tilelang.jit gather: the output takes M from the int32 index and D from the table
@tilelang.jit(out_idx=-1)
def gather_rows(V, D, M, dtype="float32"):
    @T.prim_func
    def main(table: T.Tensor((V, D), dtype), idx: T.Tensor((M,), "int32"), out: T.Tensor((M, D), dtype)):
        with T.Kernel(M) as m:
            for d in T.Parallel(D):
                out[m, d] = table[idx[m], d]

    return main


def gather_rows_ref(table, idx):
    return table[idx.long()]


def gather_rows_sample(dims, dtype, device):
    g = torch.Generator().manual_seed(0)
    table = torch.randn(dims["V"], dims["D"], generator=g).to(getattr(torch, dtype)).to(device)
    m = dims["M"]
    idx = torch.randint(0, dims["V"], (m,), generator=g, dtype=torch.int32).to(device)
    return table, idx


gather = Operator(name="gather", factory=gather_rows, reference=gather_rows_ref, sample=gather_rows_sample,
                  inputs=(TensorArg("table", ("V", "D")), TensorArg("idx", ("M",), dtype="int32")),
                  outputs=(TensorArg("out", ("M", "D")),), dtypes=("float32",), targets=("c",),
                  ranges=(DynamicRange("M", 1, 256, {"V": 32, "D": 8}),), shapes=({"V": 16, "D": 4, "M": 5},),
                  tolerances={"float32": Tolerance(0.0, 0.0)})


# 5. a dynamic dim named ``class`` (a Python keyword and a C++ one: params= and the T.dynamic var's rename), int16 in,
# an int64 scalar, uint8 and int64 outputs
def bucketize(n_class, W, dtype="int16"):
    """code[c, w] = uint8((X[c, w] + offset) >= 0), total[c] = sum X[c, :] (int64 scalar offset)."""
    @T.prim_func
    def main(X: T.Tensor((n_class, W), dtype), offset: T.int64, code: T.Tensor((n_class, W), "uint8"),
             total: T.Tensor((n_class,), "int64")):
        with T.Kernel(n_class) as c:
            total[c] = T.int64(0)
            for w in T.serial(W):
                code[c, w] = T.if_then_else(T.cast(X[c, w], "int64") + offset >= T.int64(0), T.uint8(1), T.uint8(0))
                total[c] = total[c] + T.cast(X[c, w], "int64")
    return main


def bucketize_ref(x, offset):
    return ((x.to(torch.int64) + offset) >= 0).to(torch.uint8), x.to(torch.int64).sum(1)


bucket = Operator(name="bucket", factory=bucketize, reference=bucketize_ref,
                  inputs=(TensorArg("X", ("class", "W")), ScalarArg("offset", dtype="int64")),
                  outputs=(TensorArg("code", ("class", "W"), dtype="uint8"),
                           TensorArg("total", ("class",), dtype="int64")),
                  params={"class": "n_class"}, dtypes=("int16",), targets=("c",),
                  ranges=(DynamicRange("class", 1, 64, {"W": 8}),))


# 6. a float16 scalar beside float16 tensors: the "c" library takes TileLang's ``half`` by value
def half_axpy(N, dtype="float16"):
    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Y: T.Tensor((N,), dtype), a: T.float16, Z: T.Tensor((N,), dtype)):
        with T.Kernel(1):
            for i in T.serial(N):
                Z[i] = X[i] * a + Y[i]
    return main


def half_axpy_ref(x, y, a):
    return x * a + y


haxpy = Operator(name="haxpy", factory=half_axpy, reference=half_axpy_ref,
                 inputs=(TensorArg("X", ("N",)), TensorArg("Y", ("N",)), ScalarArg("a", dtype="same")),
                 outputs=(TensorArg("Z", ("N",)),), dtypes=("float16",), targets=("c",),
                 ranges=(DynamicRange("N", 1, 1024),), tolerances={"float16": Tolerance(1e-2, 1e-2)})


# 7. an input updated in place whose dim (V) no other tensor has, indexed by an int64 tensor
def scatter_add_(N, V, dtype="float32"):
    """acc[idx[i]] += src[i] in place (serial: duplicates add up); acc is a mutated input with a dim of its own."""
    @T.prim_func
    def main(acc: T.Tensor((V,), dtype), idx: T.Tensor((N,), "int64"), src: T.Tensor((N,), dtype)):
        with T.Kernel(1):
            for i in T.serial(N):
                acc[idx[i]] = acc[idx[i]] + src[i]
    return main


def scatter_add_ref(acc, idx, src):
    acc.index_add_(0, idx, src)


def scatter_sample(dims, dtype, device):
    dt = getattr(torch, dtype)
    idx = torch.randint(0, dims["V"], (dims["N"],), device=device)
    return torch.randn(dims["V"], dtype=dt, device=device), idx, torch.randn(dims["N"], dtype=dt, device=device)


scatter = Operator(name="scatter", factory=scatter_add_, reference=scatter_add_ref, sample=scatter_sample,
                   inputs=(TensorArg("acc", ("V",)), TensorArg("idx", ("N",), dtype="int64"),
                           TensorArg("src", ("N",))),
                   mutates=("acc",), dtypes=("float32",), targets=("c",),
                   ranges=(DynamicRange("N", 1, 512, {"V": 16}),), tolerances={"float32": Tolerance(1e-5, 1e-5)})
