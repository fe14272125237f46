/*
 * tileship fastcall: the dispatcher's kernel path in compiled code (runtime/native.py builds and loads it).
 *
 * A table maps a call's key (each tensor's device, dtype, rank and shape) to a compiled kernel's
 * tvm-ffi entry function. ``fastcall_table(n_args, n_slots)`` returns a tvm-ffi Function bound to a new
 * table. Called with the operator's tensors it either launches the kernel for that key and returns its
 * result (a tensor, or None for a kernel that only updates inputs), or returns an int saying why not:
 *
 *   -1  MISS            no row for this key (or an argument is not a tensor): the Python dispatcher decides
 *   -2  NON_CONTIGUOUS  a tensor is not contiguous: the reference serves it
 *   -3  MISALIGNED      a tensor's address is not a multiple of 16 bytes: the reference serves it
 *   -4  NO_DATA         a tensor's data pointer is null (a FakeTensor has a real tensor's key): the reference serves it
 *
 * A kernel that fails sets the tvm-ffi error as usual; it reaches Python as an exception.
 * Called with an int first, the Function runs a control operation instead:
 *   (1, slot, fn, anchor, *tensors)  PUT: route the key of ``tensors`` to ``fn``; calls are counted under
 *                                    ``slot``; ``anchor`` 1 passes the first tensor again at the end (the
 *                                    allocator anchor of TileLang's callee-allocated output ABI). With
 *                                    ``fn`` None the row is a reference row: calls of that key return
 *                                    ``slot`` (>= 0), the index of the caller's route, with no checks
 *   (5, slot, plan, *tensors)        PUT_C: route the key of ``tensors`` to a "c"-target kernel (TileLang's
 *                                    cython library: ``int32 call(void* ptr..., int64 dim..., void* stream)``);
 *                                    ``plan`` is a CPU int64 tensor (see ``CPlan``) with the call's fixed parts:
 *                                    the parameter order, the output's dtype and shape, the symbolic dims,
 *                                    the ``call`` and ``get_last_error`` addresses. The output is allocated
 *                                    through the caller's tensor allocator (TVMFFIEnvTensorAlloc)
 *   (6, out, *tensors)               OUT: the call above, with the output written into the caller's tensor
 *                                    ``out``: while the kernel runs, the thread's tensor allocator hands it
 *                                    ``out`` for its first allocation of out's dtype, shape and device (both
 *                                    kernel ABIs allocate outputs through TVMFFIEnvTensorAlloc). Returns None
 *                                    when the kernel wrote into ``out``; a tensor when it did not (``out`` not
 *                                    contiguous, misaligned, overlapping an input, or not the kernel's output
 *                                    layout: the caller copies); the ints above when no kernel ran
 *   (2,)                             CLEAR: forget every row (the counts stay)
 *   (3, slot)                        COUNT: kernel calls served under ``slot``
 *   (4,)                             SIZE: rows in the table
 * Thread-safe: rows are read and written under one mutex, released before the kernel runs.
 * Only the tvm-ffi C API and libc are used, so the library needs nothing but libtvm_ffi at load time.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

#define FASTCALL_ABI 3
#define MAX_ARGS 16
#define MAX_KEY 64
#define MISS (-1)
#define NON_CONTIGUOUS (-2)
#define MISALIGNED (-3)
#define NO_DATA (-4)
#define ALIGNMENT 16
#define MAX_CALL 24 /* pointers + symbolic dims + the stream of a "c"-target call */
#define MAX_OUT_NDIM 16

/* A "c"-target call, from the plan tensor: [n_params, n_dyn, out_param, out_dtype, out_ndim, shape[out_ndim]...,
 * source[n_params]..., dyn[n_dyn]..., call address, get_last_error address]; ``source[p]`` is the input index
 * of parameter ``p``, or -1 for the output; ``out_param`` -1 when the kernel has no output. */
typedef struct {
  int32_t n_params, n_dyn, out_param, out_ndim;
  DLDataType out_dtype;
  int64_t out_shape[MAX_OUT_NDIM];
  int32_t source[MAX_CALL];
  int64_t dyn[MAX_CALL];
  void* call;
  const char* (*last_error)(void);
} CPlan;

typedef struct {
  uint64_t hash;
  int32_t len; /* 0: an empty row */
  int32_t slot;
  int32_t anchor;
  TVMFFIObjectHandle fn;
  CPlan* plan; /* a "c"-target row (fn NULL); owned by the row */
  int64_t key[MAX_KEY];
} Row;

typedef struct {
  pthread_mutex_t mu;
  int32_t n_args;
  int32_t n_slots;
  _Atomic uint64_t* counts;
  Row* rows;
  uint32_t cap;
  uint32_t used;
} Table;

static DLTensor* tensor_of(const TVMFFIAny* a) {
  if (a->type_index == kTVMFFITensor) return (DLTensor*)((char*)a->v_obj + sizeof(TVMFFIObject));
  if (a->type_index == kTVMFFIDLTensorPtr) return (DLTensor*)a->v_ptr;
  return NULL;
}

/* The key of ``n`` tensor arguments into ``key``; its length, or -1 when one is not a tensor or it is too long. */
static int encode(const TVMFFIAny* args, int n, int64_t* key, DLTensor** ts) {
  int len = 0;
  for (int i = 0; i < n; ++i) {
    DLTensor* t = tensor_of(&args[i]);
    if (t == NULL || t->ndim < 0 || len + 2 + t->ndim > MAX_KEY) return -1;
    ts[i] = t;
    key[len++] = ((int64_t)t->device.device_type << 32) | (uint32_t)t->device.device_id;
    key[len++] = ((int64_t)t->ndim << 32) | ((int64_t)t->dtype.code << 24) | ((int64_t)t->dtype.bits << 16) |
                 (int64_t)t->dtype.lanes;
    for (int d = 0; d < t->ndim; ++d) key[len++] = t->shape[d];
  }
  return len;
}

static uint64_t hash_key(const int64_t* key, int len) {
  uint64_t h = 1469598103934665603ULL;
  for (int i = 0; i < len; ++i) {
    h ^= (uint64_t)key[i];
    h *= 1099511628211ULL;
    h ^= h >> 29;
  }
  return h | 1; /* never 0 */
}

/* Row-major contiguous as torch defines it: dims of size 1 may have any stride; no elements is contiguous. */
static int contiguous(const DLTensor* t) {
  if (t->strides == NULL) return 1;
  int64_t expected = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] == 0) return 1;
    if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

static Row* find(Table* t, const int64_t* key, int len, uint64_t h) {
  uint32_t mask = t->cap - 1;
  for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
    Row* r = &t->rows[i];
    if (r->len == 0) return r;
    if (r->hash == h && r->len == len && memcmp(r->key, key, sizeof(int64_t) * (size_t)len) == 0) return r;
  }
}

static int grow(Table* t) {
  uint32_t cap = t->cap * 2;
  Row* old = t->rows;
  Row* rows = (Row*)calloc(cap, sizeof(Row));
  if (rows == NULL) return -1;
  uint32_t old_cap = t->cap;
  t->rows = rows;
  t->cap = cap;
  for (uint32_t i = 0; i < old_cap; ++i) {
    if (old[i].len) *find(t, old[i].key, old[i].len, old[i].hash) = old[i];
  }
  free(old);
  return 0;
}

static int ret_int(TVMFFIAny* result, int64_t v) {
  result->type_index = kTVMFFIInt;
  result->zero_padding = 0;
  result->v_int64 = v;
  return 0;
}

static int fail(const char* msg) {
  TVMFFIErrorSetRaisedFromCStr("ValueError", msg);
  return -1;
}

static void clear_rows(Table* t) {
  for (uint32_t i = 0; i < t->cap; ++i) {
    if (t->rows[i].len && t->rows[i].fn != NULL) TVMFFIObjectDecRef(t->rows[i].fn);
    if (t->rows[i].len) free(t->rows[i].plan);
  }
  memset(t->rows, 0, sizeof(Row) * t->cap);
  t->used = 0;
}

/* Write a row (replacing the key's old one); takes over ``fn``'s reference and ``plan``. */
static int store(Table* t, const int64_t* key, int len, int64_t slot, int anchor, TVMFFIObjectHandle fn, CPlan* plan,
                 TVMFFIAny* result) {
  uint64_t h = hash_key(key, len);
  pthread_mutex_lock(&t->mu);
  if ((t->used + 1) * 2 > t->cap && grow(t) != 0) {
    pthread_mutex_unlock(&t->mu);
    if (fn != NULL) TVMFFIObjectDecRef(fn);
    free(plan);
    return fail("fastcall PUT: out of memory");
  }
  Row* r = find(t, key, len, h);
  if (r->len) {
    if (r->fn != NULL) TVMFFIObjectDecRef(r->fn);
    free(r->plan);
  } else {
    t->used += 1;
  }
  r->hash = h;
  r->len = len;
  r->slot = (int32_t)slot;
  r->anchor = anchor;
  r->fn = fn;
  r->plan = plan;
  memcpy(r->key, key, sizeof(int64_t) * (size_t)len);
  int64_t used = t->used;
  pthread_mutex_unlock(&t->mu);
  return ret_int(result, used);
}

static int put(Table* t, const TVMFFIAny* args, int n, TVMFFIAny* result) {
  if (n != 4 + t->n_args || args[1].type_index != kTVMFFIInt || args[3].type_index != kTVMFFIInt ||
      (args[2].type_index != kTVMFFIFunction && args[2].type_index != kTVMFFINone))
    return fail("fastcall PUT takes (1, slot, function or None, anchor, *tensors)");
  int64_t slot = args[1].v_int64;
  TVMFFIObjectHandle fn = args[2].type_index == kTVMFFIFunction ? (TVMFFIObjectHandle)args[2].v_obj : NULL;
  if (slot < 0 || slot > INT32_MAX || (fn != NULL && slot >= t->n_slots)) return fail("fastcall PUT: slot out of range");
  int64_t key[MAX_KEY];
  DLTensor* ts[MAX_ARGS];
  int len = encode(args + 4, t->n_args, key, ts);
  if (len <= 0) return fail("fastcall PUT: the arguments are not tensors, or the key is too long");
  if (fn != NULL) TVMFFIObjectIncRef(fn);
  return store(t, key, len, slot, args[3].v_int64 ? 1 : 0, fn, NULL, result);
}

/* The plan tensor of PUT_C into a CPlan; NULL (with the error set) when it is malformed. */
static CPlan* read_plan(const TVMFFIAny* arg, int n_inputs) {
  DLTensor* p = tensor_of(arg);
  if (p == NULL || p->device.device_type != kDLCPU || p->dtype.code != kDLInt || p->dtype.bits != 64 ||
      p->ndim != 1 || !contiguous(p)) {
    fail("fastcall PUT_C: the plan must be a contiguous 1-d int64 CPU tensor");
    return NULL;
  }
  const int64_t* v = (const int64_t*)((char*)p->data + p->byte_offset);
  int64_t len = p->shape[0];
  if (len < 5) {
    fail("fastcall PUT_C: the plan is too short");
    return NULL;
  }
  int64_t n_params = v[0], n_dyn = v[1], out_param = v[2], out_ndim = v[4];
  if (n_params < 1 || n_dyn < 0 || n_params + n_dyn + 1 > MAX_CALL || out_ndim < 0 || out_ndim > MAX_OUT_NDIM ||
      out_param < -1 || out_param >= n_params || len != 5 + out_ndim + n_params + n_dyn + 2) {
    fail("fastcall PUT_C: the plan's counts are out of range");
    return NULL;
  }
  CPlan* c = (CPlan*)calloc(1, sizeof(CPlan));
  if (c == NULL) {
    fail("fastcall PUT_C: out of memory");
    return NULL;
  }
  c->n_params = (int32_t)n_params;
  c->n_dyn = (int32_t)n_dyn;
  c->out_param = (int32_t)out_param;
  c->out_ndim = (int32_t)out_ndim;
  c->out_dtype.code = (uint8_t)(v[3] & 0xff);
  c->out_dtype.bits = (uint8_t)((v[3] >> 8) & 0xff);
  c->out_dtype.lanes = (uint16_t)((v[3] >> 16) & 0xffff);
  const int64_t* q = v + 5;
  for (int i = 0; i < out_ndim; ++i) c->out_shape[i] = *q++;
  for (int i = 0; i < n_params; ++i) {
    int64_t src = *q++;
    if (src < -1 || src >= n_inputs || (src == -1) != (i == out_param)) {
      free(c);
      fail("fastcall PUT_C: a parameter's source is out of range");
      return NULL;
    }
    c->source[i] = (int32_t)src;
  }
  for (int i = 0; i < n_dyn; ++i) c->dyn[i] = *q++;
  c->call = (void*)(intptr_t)q[0];
  c->last_error = (const char* (*)(void))(intptr_t)q[1];
  if (c->call == NULL) {
    free(c);
    fail("fastcall PUT_C: the call address is NULL");
    return NULL;
  }
  return c;
}

static int put_c(Table* t, const TVMFFIAny* args, int n, TVMFFIAny* result) {
  if (n != 3 + t->n_args || args[1].type_index != kTVMFFIInt)
    return fail("fastcall PUT_C takes (5, slot, plan, *tensors)");
  int64_t slot = args[1].v_int64;
  if (slot < 0 || slot >= t->n_slots) return fail("fastcall PUT_C: slot out of range");
  int64_t key[MAX_KEY];
  DLTensor* ts[MAX_ARGS];
  int len = encode(args + 3, t->n_args, key, ts);
  if (len <= 0) return fail("fastcall PUT_C: the arguments are not tensors, or the key is too long");
  CPlan* plan = read_plan(&args[2], t->n_args);
  if (plan == NULL) return -1;
  return store(t, key, len, slot, 0, NULL, plan, result);
}

/* The library's ``call`` with ``n`` arguments, every one of the integer class (pointers and int64 alike),
 * through a prototype of exactly that arity (2..MAX_CALL; the smallest is one pointer and the stream). */
static int32_t call_n(void* f, int n, const int64_t* a) {
  switch (n) {
    case 2:
      return ((int32_t(*)(int64_t, int64_t))f)(a[0], a[1]);
    case 3:
      return ((int32_t(*)(int64_t, int64_t, int64_t))f)(a[0], a[1], a[2]);
    case 4:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3]);
    case 5:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4]);
    case 6:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5]);
    case 7:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6]);
    case 8:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
    case 9:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]);
    case 10:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
    case 11:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10]);
    case 12:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]);
    case 13:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12]);
    case 14:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13]);
    case 15:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14]);
    case 16:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]);
    case 17:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16]);
    case 18:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17]);
    case 19:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18]);
    case 20:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19]);
    case 21:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20]);
    case 22:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21]);
    case 23:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22]);
    case 24:
      return ((int32_t(*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23]);
    default:
      return INT32_MIN;
  }
}

/* Launch a "c"-target row: allocate the output, place the pointers, call. */
static int call_c(const CPlan* c, DLTensor** ts, TVMFFIAny* result) {
  TVMFFIObjectHandle out = NULL;
  DLTensor* o = NULL;
  if (c->out_param >= 0) {
    DLTensor proto;
    memset(&proto, 0, sizeof(proto));
    proto.device = ts[0]->device;
    proto.ndim = c->out_ndim;
    proto.dtype = c->out_dtype;
    proto.shape = (int64_t*)c->out_shape;
    if (TVMFFIEnvTensorAlloc(&proto, &out) != 0) return -1;
    o = (DLTensor*)((char*)out + sizeof(TVMFFIObject));
  }
  int64_t a[MAX_CALL];
  int k = 0;
  for (int i = 0; i < c->n_params; ++i) {
    const DLTensor* t = c->source[i] < 0 ? o : ts[c->source[i]];
    a[k++] = (int64_t)(intptr_t)((char*)t->data + t->byte_offset);
  }
  for (int i = 0; i < c->n_dyn; ++i) a[k++] = c->dyn[i];
  a[k++] = 0; /* the stream: none on the CPU */
  int32_t rc = call_n(c->call, k, a);
  if (rc != 0) {
    if (out != NULL) TVMFFIObjectDecRef(out);
    const char* msg = c->last_error != NULL ? c->last_error() : NULL;
    TVMFFIErrorSetRaisedFromCStr("RuntimeError", msg != NULL && msg[0] ? msg : "kernel call failed");
    return -1;
  }
  if (out == NULL) {
    result->type_index = kTVMFFINone;
    result->zero_padding = 0;
    result->v_int64 = 0;
    return 0;
  }
  result->type_index = kTVMFFITensor;
  result->zero_padding = 0;
  result->v_obj = (TVMFFIObject*)out;
  return 0;
}

/* OUT: the caller's ``out`` handed to the kernel's output allocation (thread-local while one call runs). */
typedef struct {
  DLManagedTensorVersioned m;
  int64_t shape[MAX_OUT_NDIM];
} OutView;

static _Thread_local DLTensor* tl_out = NULL;
static _Thread_local int tl_used = 0;
static _Thread_local DLPackManagedTensorAllocator tl_orig = NULL;

static void out_view_free(DLManagedTensorVersioned* m) { free(m); }

static int same_layout(const DLTensor* a, const DLTensor* b) {
  if (a->ndim != b->ndim || a->dtype.code != b->dtype.code || a->dtype.bits != b->dtype.bits ||
      a->dtype.lanes != b->dtype.lanes || a->device.device_type != b->device.device_type ||
      a->device.device_id != b->device.device_id)
    return 0;
  for (int d = 0; d < a->ndim; ++d)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

static int out_alloc(DLTensor* proto, DLManagedTensorVersioned** res, void* ctx,
                     void (*set_error)(void*, const char*, const char*)) {
  DLTensor* o = tl_out;
  if (o == NULL || tl_used || !same_layout(proto, o)) return tl_orig(proto, res, ctx, set_error);
  OutView* v = (OutView*)calloc(1, sizeof(OutView));
  if (v == NULL) {
    set_error(ctx, "MemoryError", "fastcall: out of memory");
    return -1;
  }
  v->m.version.major = DLPACK_MAJOR_VERSION;
  v->m.version.minor = DLPACK_MINOR_VERSION;
  v->m.deleter = out_view_free;
  v->m.dl_tensor = *o;
  memcpy(v->shape, o->shape, sizeof(int64_t) * (size_t)o->ndim);
  v->m.dl_tensor.shape = v->shape;
  v->m.dl_tensor.strides = NULL; /* ``out`` was checked contiguous */
  tl_used = 1;
  *res = &v->m;
  return 0;
}

static int64_t nbytes(const DLTensor* t) {
  int64_t n = ((int64_t)t->dtype.bits * t->dtype.lanes + 7) / 8;
  for (int d = 0; d < t->ndim; ++d) n *= t->shape[d];
  return n;
}

/* ``out`` may take the kernel's output: contiguous, aligned, at most MAX_OUT_NDIM dims, no byte shared with an input. */
static int usable_out(const DLTensor* o, DLTensor* const* ts, int n) {
  if (o->ndim > MAX_OUT_NDIM || !contiguous(o)) return 0;
  uintptr_t lo = (uintptr_t)o->data + o->byte_offset, hi = lo + (uintptr_t)nbytes(o);
  if (lo == 0 || lo % ALIGNMENT) return 0; /* 0: a fake tensor's, no memory to write */
  for (int i = 0; i < n; ++i) {
    uintptr_t a = (uintptr_t)ts[i]->data + ts[i]->byte_offset, b = a + (uintptr_t)nbytes(ts[i]);
    if (a < hi && lo < b) return 0;
  }
  return 1;
}

static int serve(Table* t, const TVMFFIAny* args, int n, TVMFFIAny* result, DLTensor* out);

static int control(Table* t, const TVMFFIAny* args, int n, TVMFFIAny* result) {
  switch (args[0].v_int64) {
    case 1:
      return put(t, args, n, result);
    case 5:
      return put_c(t, args, n, result);
    case 6: {
      DLTensor* out = n >= 2 ? tensor_of(&args[1]) : NULL;
      if (out == NULL) return fail("fastcall OUT takes (6, out, *tensors) with out a tensor");
      return serve(t, args + 2, n - 2, result, out);
    }
    case 2:
      pthread_mutex_lock(&t->mu);
      clear_rows(t);
      pthread_mutex_unlock(&t->mu);
      return ret_int(result, 0);
    case 3:
      if (n != 2 || args[1].type_index != kTVMFFIInt || args[1].v_int64 < 0 || args[1].v_int64 >= t->n_slots)
        return fail("fastcall COUNT takes (3, slot) with a slot in range");
      return ret_int(result, (int64_t)atomic_load_explicit(&t->counts[args[1].v_int64], memory_order_relaxed));
    case 4: {
      pthread_mutex_lock(&t->mu);
      int64_t used = t->used;
      pthread_mutex_unlock(&t->mu);
      return ret_int(result, used);
    }
    default:
      return fail("fastcall: unknown control operation");
  }
}

static int table_call(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  Table* t = (Table*)self;
  if (n > 0 && args[0].type_index == kTVMFFIInt) return control(t, args, n, result);
  return serve(t, args, n, result, NULL);
}

/* Run the kernel ``fn`` (or the "c" ``plan``) with ``out`` taking its output when it can (OUT, above). */
static int launch(TVMFFIObjectHandle fn, const CPlan* plan, int anchor, const TVMFFIAny* args, int n, DLTensor** ts,
                  TVMFFIAny* result, DLTensor* out) {
  int into = out != NULL && usable_out(out, ts, n);
  if (into) {
    tl_out = out;
    tl_used = 0;
    TVMFFIEnvSetDLPackManagedTensorAllocator(out_alloc, 0, &tl_orig);
  }
  int rc;
  if (plan != NULL) {
    rc = call_c(plan, ts, result);
  } else {
    TVMFFIAny call_args[MAX_ARGS + 1];
    memcpy(call_args, args, sizeof(TVMFFIAny) * (size_t)n);
    if (anchor) call_args[n] = args[0];
    rc = TVMFFIFunctionCall(fn, call_args, n + anchor, result);
  }
  if (!into) return rc;
  TVMFFIEnvSetDLPackManagedTensorAllocator(tl_orig, 0, NULL);
  tl_out = NULL;
  DLTensor* r = rc == 0 && tl_used ? tensor_of(result) : NULL;
  /* the result is the view of ``out`` (not another allocation the kernel made first): the caller returns ``out`` */
  if (r != NULL && r->data == out->data && r->byte_offset == out->byte_offset) {
    TVMFFIObjectDecRef((TVMFFIObjectHandle)result->v_obj);
    result->type_index = kTVMFFINone;
    result->zero_padding = 0;
    result->v_int64 = 0;
  }
  return rc;
}

static int serve(Table* t, const TVMFFIAny* args, int n, TVMFFIAny* result, DLTensor* out) {
  if (n != t->n_args) return ret_int(result, MISS);
  int64_t key[MAX_KEY];
  DLTensor* ts[MAX_ARGS];
  int len = encode(args, n, key, ts);
  if (len < 0) return ret_int(result, MISS);
  uint64_t h = hash_key(key, len);
  TVMFFIObjectHandle fn = NULL;
  CPlan plan;
  int has_plan = 0;
  int32_t slot = MISS, anchor = 0;
  pthread_mutex_lock(&t->mu);
  Row* r = find(t, key, len, h);
  if (r->len) {
    fn = r->fn;
    slot = r->slot;
    anchor = r->anchor;
    if (fn != NULL) TVMFFIObjectIncRef(fn);
    if (r->plan != NULL) {
      plan = *r->plan; /* a copy: a CLEAR may free the row's while this call runs */
      has_plan = 1;
    }
  }
  pthread_mutex_unlock(&t->mu);
  /* no caller's tensor allocator: the tensors are not torch's (NumPy arrays, say, which tvm-ffi takes by DLPack with
   * a torch tensor's key): the Python path refuses them, for a route row too (its route would get the arrays) */
  if (slot >= 0 && TVMFFIEnvGetDLPackManagedTensorAllocator() == NULL) {
    if (fn != NULL) TVMFFIObjectDecRef(fn);
    return ret_int(result, MISS);
  }
  if (fn == NULL && !has_plan) return ret_int(result, slot); /* MISS, or a route row's index */
  for (int i = 0; i < n; ++i) { /* the Python path's order: contiguity, then alignment, argument by argument */
    if (!contiguous(ts[i])) {
      if (fn != NULL) TVMFFIObjectDecRef(fn);
      return ret_int(result, NON_CONTIGUOUS);
    }
    uintptr_t addr = (uintptr_t)ts[i]->data + ts[i]->byte_offset;
    if (addr == 0 || addr % ALIGNMENT) { /* 0: a fake tensor's null pointer, which the kernel would read */
      if (fn != NULL) TVMFFIObjectDecRef(fn);
      return ret_int(result, addr == 0 ? NO_DATA : MISALIGNED);
    }
  }
  int rc = launch(fn, has_plan ? &plan : NULL, anchor, args, n, ts, result, out);
  if (fn != NULL) TVMFFIObjectDecRef(fn);
  if (rc == 0) atomic_fetch_add_explicit(&t->counts[slot], 1, memory_order_relaxed);
  return rc;
}

static void table_free(void* self) {
  Table* t = (Table*)self;
  clear_rows(t);
  pthread_mutex_destroy(&t->mu);
  free(t->rows);
  free((void*)t->counts);
  free(t);
}

/* fastcall_table(n_args, n_slots) -> Function */
TVM_FFI_DLL_EXPORT int __tvm_ffi_fastcall_table(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  (void)self;
  if (n != 2 || args[0].type_index != kTVMFFIInt || args[1].type_index != kTVMFFIInt)
    return fail("fastcall_table takes (n_args, n_slots)");
  int64_t n_args = args[0].v_int64, n_slots = args[1].v_int64;
  if (n_args < 1 || n_args > MAX_ARGS || n_slots < 1 || n_slots > (1 << 20))
    return fail("fastcall_table: n_args must be 1..16 and n_slots 1..2^20");
  Table* t = (Table*)calloc(1, sizeof(Table));
  if (t == NULL) return fail("fastcall_table: out of memory");
  t->n_args = (int32_t)n_args;
  t->n_slots = (int32_t)n_slots;
  t->cap = 16;
  t->rows = (Row*)calloc(t->cap, sizeof(Row));
  t->counts = (_Atomic uint64_t*)calloc((size_t)n_slots, sizeof(uint64_t));
  if (t->rows == NULL || t->counts == NULL || pthread_mutex_init(&t->mu, NULL) != 0) {
    free(t->rows);
    free((void*)t->counts);
    free(t);
    return fail("fastcall_table: out of memory");
  }
  TVMFFIObjectHandle fn = NULL;
  if (TVMFFIFunctionCreate(t, table_call, table_free, &fn) != 0) {
    table_free(t);
    return -1;
  }
  result->type_index = kTVMFFIFunction;
  result->zero_padding = 0;
  result->v_obj = (TVMFFIObject*)fn;
  return 0;
}

/* fastcall_abi() -> int: the version of the protocol above */
TVM_FFI_DLL_EXPORT int __tvm_ffi_fastcall_abi(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  (void)self;
  (void)args;
  (void)n;
  return ret_int(result, FASTCALL_ABI);
}

/* A kernel for tests on the CPU, with TileLang's callee-allocated output ABI: (a, b, anchor) -> a + b,
 * float32, contiguous, the output allocated through the caller's tensor allocator (TVMFFIEnvTensorAlloc). */
TVM_FFI_DLL_EXPORT int __tvm_ffi_fastcall_selftest_add(void* self, const TVMFFIAny* args, int32_t n,
                                                        TVMFFIAny* result) {
  (void)self;
  if (n != 3) return fail("selftest_add takes (a, b, anchor)");
  DLTensor* a = tensor_of(&args[0]);
  DLTensor* b = tensor_of(&args[1]);
  if (a == NULL || b == NULL || a->device.device_type != kDLCPU || a->dtype.code != kDLFloat ||
      a->dtype.bits != 32 || b->dtype.code != kDLFloat || b->dtype.bits != 32 || a->ndim != b->ndim)
    return fail("selftest_add: two float32 CPU tensors of one shape");
  int64_t numel = 1;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d]) return fail("selftest_add: shapes differ");
    numel *= a->shape[d];
  }
  if (numel < 0 || numel > ((int64_t)1 << 40)) return fail("selftest_add: size out of range");
  DLTensor proto = *a;
  proto.strides = NULL;
  proto.byte_offset = 0;
  TVMFFIObjectHandle out = NULL;
  if (TVMFFIEnvTensorAlloc(&proto, &out) != 0) return -1;
  DLTensor* o = (DLTensor*)((char*)out + sizeof(TVMFFIObject));
  const float* x = (const float*)((char*)a->data + a->byte_offset);
  const float* y = (const float*)((char*)b->data + b->byte_offset);
  float* z = (float*)((char*)o->data + o->byte_offset);
  for (int64_t i = 0; i < numel; ++i) z[i] = x[i] + y[i];
  result->type_index = kTVMFFITensor;
  result->zero_padding = 0;
  result->v_obj = (TVMFFIObject*)out;
  return 0;
}
