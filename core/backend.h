/* backend.h: what a device backend sees of the core, and the one call that
 * registers it. A backend (kernels/cpu/, kernels/cuda/) includes this
 * header, loom.h and philox.h, nothing else of the core; it fills an
 * lm_backend table by slot name and registers it for its device kind. */
#ifndef LOOM_BACKEND_H
#define LOOM_BACKEND_H
#include "loom.h"
#include "unary.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__CUDACC__) || defined(LOOM_CUDA_EMULATE)
#include <cuda_fp16.h> /* f16 as the GPU converts it (lm_f16_to_f32 below) */
#endif
#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (tensor/error.c) ---- */
/* Formats the message into the thread-local buffer; returns -1 so callers
 * can write `return lm_error(...)`. */
int lm_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define LM_TRY(x) do { if ((x) < 0) return -1; } while (0)

/* ---- storage: a refcounted buffer on one device (tensor/tensor.c) ---- */
/* A storage lives in the block of the tensor that made it (owner), which
 * stays allocated until the storage's last reference goes; small CPU
 * buffers live in that block too (data_inline), so a new small tensor is
 * one malloc. */
struct lm_storage {
  int32_t refcount;
  int8_t device;
  uint8_t data_inline;   /* data is inside owner's block, not from the backend */
  uint8_t owner_pinned;  /* the owner was freed early but is still held: keep its block */
  int64_t version;       /* incremented by every in-place write (tensor.h) */
  size_t nbytes;
  void *data;
  lm_tensor *owner;      /* the block to free with the storage */
  /* a bf16/f16 copy of the storage's contiguous view at low_offset, kept
   * for autocast's casts of a weight (tensor/low_copy.c): valid while
   * version == low_version; low_wanted: the dtype asked for, + 1 (0: none) */
  lm_tensor *low;
  int64_t low_version, low_offset;
  int8_t low_wanted;
};
static inline char *lm_ptr(const lm_tensor *t) {
  return (char *)t->storage->data + t->offset * lm_dtype_size(t->dtype_);
}
static inline bool lm_is_float(int dtype) { return dtype <= LM_F16; }
void lm_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);

/* ---- the strided walk both backends use (kernels/cpu/iter.c, kernels/cuda/) ---- */
#define LM_WALK_ARGS 4
/* Up to LM_WALK_ARGS operands over t[0]'s shape (broadcast views carry
 * stride 0): size-1 dims dropped, dims contiguous in every operand merged,
 * strides in bytes; a scalar walks as one dim of size 1, strides 0. Plain
 * data, so CUDA kernels take it by value. */
typedef struct lm_walk {
  int nd, narg;
  int64_t shape[LM_MAX_DIMS];
  int64_t stride_[LM_WALK_ARGS][LM_MAX_DIMS];
  char *base[LM_WALK_ARGS];
} lm_walk;
static inline void lm_walk_init(lm_walk *w, int narg, const lm_tensor *const *t) {
  const lm_tensor *r = t[0];
  w->narg = narg, w->nd = 0;
  for (int k = 0; k < narg; k++) w->base[k] = lm_ptr(t[k]);
  for (int d = 0; d < r->ndim; d++) {
    if (r->shape_[d] == 1) continue;
    int m = w->nd;
    bool merge = m > 0;
    for (int k = 0; k < narg && merge; k++)
      merge = w->stride_[k][m - 1] == t[k]->stride_[d] * r->shape_[d] * lm_dtype_size(t[k]->dtype_);
    if (merge) {
      w->shape[m - 1] *= r->shape_[d];
      for (int k = 0; k < narg; k++) w->stride_[k][m - 1] = t[k]->stride_[d] * lm_dtype_size(t[k]->dtype_);
    } else {
      w->shape[m] = r->shape_[d];
      for (int k = 0; k < narg; k++) w->stride_[k][m] = t[k]->stride_[d] * lm_dtype_size(t[k]->dtype_);
      w->nd++;
    }
  }
  if (w->nd == 0) { /* a scalar */
    w->nd = 1, w->shape[0] = 1;
    for (int k = 0; k < narg; k++) w->stride_[k][0] = 0;
  }
}

/* ---- dtypes ---- */
/* The facts of each dtype of enum lm_dtype (loom.h keeps the enum: LuaJIT
 * reads that file line by line, without '#' lines): its name, the C type
 * its elements are stored as, and the NCCL type it travels as
 * (comm/nccl.c). LM_DTYPES(X) calls X(ID, name, type, nccl) for each. */
#define LM_DTYPES(X)                                                                                 \
  X(LM_F32, "f32", float, ncclFloat32)                                                               \
  X(LM_F64, "f64", double, ncclFloat64)                                                              \
  X(LM_BF16, "bf16", uint16_t, ncclBfloat16)                                                         \
  X(LM_F16, "f16", uint16_t, ncclFloat16)                                                            \
  X(LM_I32, "i32", int32_t, ncclInt32)                                                               \
  X(LM_I64, "i64", int64_t, ncclInt64)                                                               \
  X(LM_BOOL, "bool", uint8_t, ncclUint8)

/* The conversions every backend shares, compiled alike for C (the core,
 * the CPU backend), for CUDA (host and device) and by the emulator's host
 * compiler, so an element reads as the same bits everywhere. f16 goes
 * through the platform's own conversion (cuda_fp16.h where the CUDA
 * headers are, else C's _Float16): exact widening, rounding to nearest
 * even. Storing from double is per backend (tensor/dtype.c saturates
 * ints; kernels/cuda/common.cuh converts as the GPU does). */
#ifdef __CUDACC__
#define LM_ELEM static __host__ __device__ inline
#else
#define LM_ELEM static inline
#endif
LM_ELEM float lm_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
LM_ELEM uint16_t lm_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
  u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even */
  return (uint16_t)(u >> 16);
}
#if defined(__CUDACC__) || defined(LOOM_CUDA_EMULATE)
LM_ELEM float lm_f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
LM_ELEM uint16_t lm_f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
#else
LM_ELEM float lm_f16_to_f32(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
LM_ELEM uint16_t lm_f32_to_f16(float f) { _Float16 x = (_Float16)f; uint16_t h; memcpy(&h, &x, 2); return h; }
#endif
/* one element as double */
LM_ELEM double lm_load(const void *p, int d) {
  switch (d) {
  case LM_F32: return *(const float *)p;
  case LM_F64: return *(const double *)p;
  case LM_BF16: return lm_bf16_to_f32(*(const uint16_t *)p);
  case LM_F16: return lm_f16_to_f32(*(const uint16_t *)p);
  case LM_I32: return *(const int32_t *)p;
  case LM_I64: return (double)*(const int64_t *)p;
  default: return *(const uint8_t *)p;
  }
}
void lm_store(void *p, int dtype, double v);    /* one element from double (tensor/dtype.c) */

/* ---- kernel kinds ---- */
/* Pointwise kinds; unary kinds (enum lm_unary, with their math: unary.h)
 * take p[0], p[1] as parameters k0, k1. */
enum lm_binary { LM_ADD, LM_SUB, LM_MUL, LM_DIV, LM_POW, LM_MAXIMUM, LM_MINIMUM,
                 LM_EQ, LM_NE, LM_LT, LM_LE, LM_GT, LM_GE, LM_AND, LM_OR,
                 LM_NBINARY };
enum lm_reduce { LM_SUM, LM_MAX, LM_MIN, LM_ARGMAX, LM_ARGMIN, LM_NREDUCE };

/* ---- the table of a device's kernels ----
 * Every slot but name, alloc, free, copy and fill may be NULL: an op whose
 * kernel is missing fails with an error naming the slot and device. */
#define LM_UNSUPPORTED (-2)

/* The slots' types, each with what its kernel must do; a backend declares
 * its kernels with them (lm_copy_fn lm_cpu_copy;), so a signature is
 * written once. */
/* makes device `index` of this kind current; NULL for one-device kinds */
typedef int lm_select_fn(int index);
/* how many devices of this kind the process sees, making none current (on
 * CUDA: cudaGetDeviceCount only, no context on any GPU); 0 with an error
 * saying why when there is none; NULL for one-device kinds */
typedef int lm_count_fn(void);
typedef void *lm_alloc_fn(size_t nbytes);
typedef void lm_free_fn(void *p);
/* dst[i] = src[i] for same-shape tensors of any dtypes and strides */
typedef int lm_copy_fn(lm_tensor *dst, const lm_tensor *src);
typedef int lm_fill_fn(lm_tensor *t, double v);
/* out = f(x); x and out have out's shape (x may broadcast via stride 0) */
typedef int lm_unary_fn(int kind, lm_tensor *out, const lm_tensor *x, const double *p);
/* out = a (op) b; a and b are broadcast views of out's shape */
typedef int lm_binary_fn(int kind, lm_tensor *out, const lm_tensor *a, const lm_tensor *b);
/* out = cond ? a : b, all broadcast views of out's shape */
typedef int lm_where_fn(lm_tensor *out, const lm_tensor *cond, const lm_tensor *a,
                        const lm_tensor *b);
/* contiguous x viewed as (outer, n, inner): out is (outer, inner) */
typedef int lm_reduce_fn(int kind, lm_tensor *out, const lm_tensor *x, int64_t outer, int64_t n,
                         int64_t inner);
/* c[b] = alpha * op(a[b]) @ op(b[b]) + beta * c[b] for 3-D strided tensors;
 * a and b share a dtype (f32, f64, bf16 or f16), c has it too or is f32;
 * bf16/f16 are operand formats: products accumulate in f32, rounded once
 * into c. f32 GEMMs may use TF32 when lm_float32_matmul_precision() is
 * LM_PRECISION_HIGH. */
typedef int lm_gemm_fn(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha,
                       double beta);
/* Grouped GEMM (a mixture of experts: each expert's rows against its own
 * weight). Group e = 0..E-1 holds rows [offs[e], offs[e+1]) of the 2-D
 * operands (offs: E + 1 offsets, host memory). wgrad 0: the rows of group
 * e of c (N, M) = its rows of a (N, K) @ b[e], b (E, K, M); wgrad 1: c[e]
 * = (its rows of a)^T @ (its rows of b), a (N, K), b (N, M), c (E, K, M),
 * zeros for a group without rows. Strides, dtypes and accumulation as
 * gemm's; c has unit stride in its last dim. */
typedef int lm_grouped_gemm_fn(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, const int64_t *offs,
                               int64_t groups, int wgrad);
/* random fill by counter (tensor/rng.c keeps the state; backends draw
 * with lm_philox_draw of philox.h) */
typedef int lm_random_fn(lm_tensor *t, int kind, double a, double b, uint64_t seed, uint64_t offset,
                         const int64_t *global_shape, const int64_t *local_start);
/* Row kernels on contiguous (rows, n) tensors of f32 or f64. */
typedef int lm_softmax_fn(lm_tensor *out, const lm_tensor *x, int log);
/* layer_norm (rms=0) or rms_norm (rms=1) over the last n elements of each
 * row; w and b may be NULL; mean/rstd (rows) are saved for backward. */
typedef int lm_norm_fn(lm_tensor *out, lm_tensor *mean, lm_tensor *rstd, const lm_tensor *x,
                       const lm_tensor *w, const lm_tensor *b, double eps, int rms);
/* out[r] = w[idx[r]] (idx i64, 0-based, checked by the op) */
typedef int lm_embedding_fn(lm_tensor *out, const lm_tensor *w, const lm_tensor *idx);
/* out[idx[r]] += src[r] for contiguous out (V, n), idx (rows) i64 (checked
 * by the op) and src (rows, n) of out's dtype, f32 or f64 */
typedef int lm_index_add_fn(lm_tensor *out, const lm_tensor *idx, const lm_tensor *src);
/* one AdamW step in place on contiguous same-dtype (f32 or f64) p, m, v
 * with gradient g; h = {lr, beta1, beta2, eps, weight_decay, bc1, bc2};
 * low, when not NULL (f32 p only), a contiguous bf16/f16 tensor of p's
 * shape that gets the new p rounded to it, the bits a cast would give */
typedef int lm_adamw_fn(lm_tensor *p, const lm_tensor *g, lm_tensor *m, lm_tensor *v,
                        const double *h, lm_tensor *low);
/* checks, without waiting for the device, that the ids of contiguous i64
 * idx lie in [0, n) or equal skip when skip_ok; the first bad id is raised
 * by the next call that waits for the device (a copy to the host) as the
 * error head, the id (1-based), tail. NULL: the core copies the ids to the
 * host and checks them there (one wait per check). */
typedef int lm_check_ids_fn(const lm_tensor *idx, int64_t n, int skip_ok, int64_t skip,
                            const char *head, const char *tail);
/* the allocator's counters (enum lm_memory_stat); NULL: none kept */
typedef int lm_memory_stats_fn(int index, int64_t *stats);
/* hands the allocator's cached blocks back to the OS or driver; NULL: none kept */
typedef void lm_empty_cache_fn(int index);
/* what the backend is built with and sees (versions, devices), lines of
 * text for lm_build_info; NULL: just its name */
typedef const char *lm_info_fn(void);

/* ---- fused kernels: one pass where composed ops take several. An op
 * whose fused slot is NULL runs its composed form (the op in core/ops/); specs
 * compare the two. A fused kernel given arguments it does not cover (a
 * head dim, an alignment) returns LM_UNSUPPORTED with an error starting
 * "unsupported:"; the op then runs the composed form. Float tensors are
 * f32 or f64 unless said otherwise; "rows" are contiguous (rows, n)
 * views. ---- */
/* gx = g * f'(x) for a unary kind, y = f(x) given too (derivatives of
 * exp, tanh, sigmoid, sqrt read it); all of gx's shape and dtype */
typedef int lm_unary_grad_fn(int kind, lm_tensor *gx, const lm_tensor *g, const lm_tensor *x,
                             const lm_tensor *y, const double *p);
/* SwiGLU on same-shape contiguous tensors: out = silu(a) * b; backward
 * da = g * b * silu'(a), db = g * silu(a) */
typedef int lm_swiglu_fn(lm_tensor *out, const lm_tensor *a, const lm_tensor *b);
typedef int lm_swiglu_bwd_fn(lm_tensor *da, lm_tensor *db, const lm_tensor *g, const lm_tensor *a,
                             const lm_tensor *b);
/* softmax backward over rows: gx = y * (g - sum(g * y)); log_softmax's
 * (log = 1): gx = g - exp(y) * sum(g) */
typedef int lm_softmax_bwd_fn(lm_tensor *gx, const lm_tensor *g, const lm_tensor *y, int log);
/* layer/rms norm backward over rows (x, g, dx (rows, n); w (n) or NULL;
 * mean, rstd (rows) as the forward computed them): dx, and dw, db (n)
 * when not NULL */
typedef int lm_norm_bwd_fn(lm_tensor *dx, lm_tensor *dw, lm_tensor *db, const lm_tensor *g,
                           const lm_tensor *x, const lm_tensor *w, const lm_tensor *mean,
                           const lm_tensor *rstd, int rms);
/* rotary embedding of contiguous x (outer, T, H, D) by cos, sin (T, D/2):
 * pairs (x[2i], x[2i+1]) rotate by sign * angle (sign 1 or -1) */
typedef int lm_rope_fn(lm_tensor *out, const lm_tensor *x, const lm_tensor *cos,
                       const lm_tensor *sin, int sign);
/* attention without the (L, S) matrix in memory (flash style) on
 * contiguous q (B, L, E), k (B, S, E), v (B, S, Ev), B = batch x heads,
 * f32 or bf16/f16 (f32 accumulation): o (B, L, Ev) in q's dtype and lse
 * (B, L) f32, the log-sum-exp of each row of scaled scores, for
 * backward; causal keeps key j for query i when j <= i */
typedef int lm_attention_fn(lm_tensor *o, lm_tensor *lse, const lm_tensor *q, const lm_tensor *k,
                            const lm_tensor *v, double scale, int causal);
typedef int lm_attention_bwd_fn(lm_tensor *dq, lm_tensor *dk, lm_tensor *dv, const lm_tensor *g,
                                const lm_tensor *q, const lm_tensor *k, const lm_tensor *v,
                                const lm_tensor *o, const lm_tensor *lse, double scale, int causal);
/* the same with an additive f32 bias (B, L, S) on the scaled scores (an
 * attention mask; -inf drops a key), any strides (0 broadcasts); a row
 * with every key dropped gives zeros and lse -inf. No gradient to bias. */
typedef int lm_attention_bias_fn(lm_tensor *o, lm_tensor *lse, const lm_tensor *q, const lm_tensor *k,
                                 const lm_tensor *v, const lm_tensor *bias, double scale);
typedef int lm_attention_bias_bwd_fn(lm_tensor *dq, lm_tensor *dk, lm_tensor *dv, const lm_tensor *g,
                                     const lm_tensor *q, const lm_tensor *k, const lm_tensor *v,
                                     const lm_tensor *o, const lm_tensor *lse, const lm_tensor *bias,
                                     double scale);
/* cross entropy of contiguous logits x (N, C) against i64 targets (N)
 * (0-based; `ignore` marks rows to skip), class weights w (C) or NULL,
 * label smoothing eps: loss (N) per row (0 where ignored) and lse (N),
 * both in x's compute dtype; backward: dx = gloss[n] * d loss[n] / dx */
typedef int lm_cross_entropy_fn(lm_tensor *loss, lm_tensor *lse, const lm_tensor *x,
                                const lm_tensor *target, const lm_tensor *w, int64_t ignore,
                                double eps);
typedef int lm_cross_entropy_bwd_fn(lm_tensor *dx, const lm_tensor *gloss, const lm_tensor *x,
                                    const lm_tensor *target, const lm_tensor *w,
                                    const lm_tensor *lse, int64_t ignore, double eps);

/* The slots every backend with kernels fills (kernels/cpu/, kernels/cuda/),
 * by name: LM_SLOTS(X) calls X(slot) for each, LM_FUSED_SLOTS(X) for the
 * fused ones. The table's fields, each backend's declarations (lm_copy_fn
 * lm_cpu_copy;) and its table are made from these lists, so a slot both
 * backends have is one entry here (with its type above). */
#define LM_SLOTS(X)                                                                                  \
  X(alloc) X(free) X(empty_cache) X(memory_stats) X(copy) X(fill) X(unary) X(binary) X(where)      \
  X(reduce) X(gemm) X(grouped_gemm) X(random) X(softmax) X(norm) X(embedding) X(index_add) X(adamw)
#define LM_FUSED_SLOTS(X)                                                                            \
  X(unary_grad) X(swiglu) X(swiglu_bwd) X(softmax_bwd) X(norm_bwd) X(rope) X(attention)            \
  X(attention_bwd) X(cross_entropy) X(cross_entropy_bwd)
#define LM_SLOT_FIELD(slot) lm_##slot##_fn *slot;

typedef struct lm_backend {
  const char *name; /* first: a slot offset of 0 means none (ops/op.h) */
  lm_select_fn *select;
  lm_count_fn *count;
  lm_info_fn *info;
  lm_check_ids_fn *check_ids;
  LM_SLOTS(LM_SLOT_FIELD)
  LM_FUSED_SLOTS(LM_SLOT_FIELD)
  /* fused kernels only some backends have */
  lm_attention_bias_fn *attention_bias; /* masked attention (issue 22) */
  lm_attention_bias_bwd_fn *attention_bias_bwd;
  /* 1: attention and attention_bwd also take q, k, v, o, g, dq, dk, dv of
   * 4 dims (B, H, R, E) with any strides but a last of 1 (the heads of a
   * (B, R, H, E) projection, transposed, as they are: no copies) */
  int attention_strided;
  /* 1: binary's arithmetic kinds (add to minimum) also take f32, bf16 and
   * f16 operands and results in any mix, computing in f32 and rounding the
   * result once (no casts to f32 and back around the kernel) */
  int binary_low;
} lm_backend;

/* Device kinds: a device number is its kind's first device plus an index
 * (0 is the CPU, LM_CUDA0 + k is cuda:k). */
enum lm_device_kind { LM_KIND_CPU = 0, LM_KIND_CUDA = 1, LM_KIND_META = 2, LM_NKINDS = 3 };
/* Makes b the backend of every device of `kind` (a backend calls it once,
 * when the library loads); b must outlive the process. */
int lm_register_backend(int kind, const lm_backend *b);

#ifdef __cplusplus
}
#endif
#endif
