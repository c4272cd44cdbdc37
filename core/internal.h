/* internal.h: what the core's files share and the public header hides:
 * errors, storage, the op registry entry and the device backend table. */
#ifndef LOOM_INTERNAL_H
#define LOOM_INTERNAL_H
#include "loom.h"
#include <stdbool.h>

#define LM_MAX_DIMS 8

/* ---- errors (error.c) ---- */
/* Formats the message into the thread-local buffer; returns -1 so callers
 * can write `return lm_error(...)`. */
int lm_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define LM_TRY(x) do { if ((x) < 0) return -1; } while (0)

/* ---- storage (tensor.c) ---- */
/* A storage lives in the block of the tensor that made it (owner), which
 * stays allocated until the storage's last reference goes; small CPU
 * buffers live in that block too (data_inline), so a new small tensor is
 * one malloc. Storages built elsewhere (on the stack) have owner NULL. */
struct lm_storage {
  int32_t refcount;
  int8_t device;
  uint8_t data_inline;   /* data is inside owner's block, not from the backend */
  size_t nbytes;
  void *data;
  lm_tensor *owner;      /* the block to free with the storage */
};
/* A new tensor sharing t's storage with the given layout (a view). */
lm_tensor *lm_view_of(const lm_tensor *t, int ndim, const int64_t *shape,
                      const int64_t *stride, int64_t offset);
lm_tensor *lm_empty_like(const lm_tensor *t);
lm_tensor *lm_empty_as(const lm_tensor *t, int ndim, const int64_t *shape, int dtype);
lm_tensor *lm_contiguous(lm_tensor *t);   /* new ref: t itself or a copy */
lm_tensor *lm_cast(lm_tensor *t, int dtype); /* new ref: t itself or a copy */
void lm_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);
int64_t lm_shape_numel(int ndim, const int64_t *shape);
int lm_check_shape(const char *op, const char *arg, int ndim, const int64_t *shape);
int lm_wrap_dim(const char *op, const char *arg, int64_t dim, int ndim); /* -1 on error */
static inline char *lm_ptr(const lm_tensor *t) {
  return (char *)t->storage->data + t->offset * lm_dtype_size(t->dtype_);
}
static inline bool lm_is_float(int dtype) { return dtype <= LM_F16; }

/* ---- dtype conversions (dtype.c) ---- */
float lm_bf16_to_f32(uint16_t h);
uint16_t lm_f32_to_bf16(float f);
float lm_f16_to_f32(uint16_t h);
uint16_t lm_f32_to_f16(float f);
double lm_load(const void *p, int dtype);       /* one element as double */
void lm_store(void *p, int dtype, double v);    /* one element from double */
/* The dtype kernels compute in: f64 stays, other floats use f32, ints i64. */
int lm_compute_dtype(int dtype);
int lm_promote(int a, int b);                   /* result dtype of a op b */

/* ---- DTensor (dtensor.c, shard_rules.c) ---- */
#define LM_MAX_MESH 4
struct lm_mesh {
  int32_t refcount;
  int ndim, device;
  int64_t shape[LM_MAX_MESH], coord[LM_MAX_MESH];
  lm_comm *comm[LM_MAX_MESH];
};
/* the spec a DTensor's `dist` points to (each tensor owns its copy) */
typedef struct lm_dspec {
  lm_mesh *mesh;                     /* retained */
  int nd;                            /* global ndim */
  int64_t shape[LM_MAX_DIMS];        /* global shape */
  lm_placement pl[LM_MAX_MESH];
} lm_dspec;
static inline const lm_dspec *lm_spec(const lm_tensor *t) { return (const lm_dspec *)t->dist; }
int lm_attach_spec(lm_tensor *t, const lm_dspec *s);  /* copies s into t->dist */
void lm_free_spec(lm_tensor *t);
bool lm_dist_local_mode(void);     /* inside a forward or backward: no dispatch */
int lm_set_dist_local_mode(int on); /* returns the old mode */

/* A sharding rule sees the input specs (global shapes, placements) and the
 * op's attrs. It writes the placements each input must have before the
 * shard-local op runs (want starts as the inputs' own), attrs for the local
 * op (local starts as a copy), and the output specs. Rules decide each mesh
 * dim on its own, as PyTorch's single-dim strategies do. */
#define LM_RULE_MAX_IN 8
typedef struct lm_rule {
  const char *op;
  int nin, nout;
  const lm_dspec *in[LM_RULE_MAX_IN];
  const lm_attrs *a;
  lm_attrs local;
  lm_placement want[LM_RULE_MAX_IN][LM_MAX_MESH];
  lm_dspec out[4];
} lm_rule;
typedef int (*lm_shard_rule)(lm_rule *r);
typedef struct lm_op_def lm_op_def;
/* Runs op on DTensor inputs (registry.c calls it). */
int lm_dtensor_call(int op, const lm_op_def *d, int nin, lm_tensor *const *in,
                    const lm_attrs *a, lm_tensor **out);
/* rules shared by families of ops (shard_rules.c) */
int lm_rule_pointwise(lm_rule *r);  /* elementwise with broadcasting */
int lm_rule_linear_pw(lm_rule *r);  /* elementwise ops linear in each input (add, sub, neg) */
int lm_rule_mul(lm_rule *r);        /* mul/div: Partial times Replicate stays Partial */
int lm_rule_local(lm_rule *r);      /* runs on the shards as they are (optimizer updates) */
int lm_rule_matmul(lm_rule *r);
int lm_rule_reduce(lm_rule *r);     /* sum, mean (and max/min/arg*: replicate the dim) */
int lm_rule_rows(lm_rule *r);       /* ops over the last k dims (softmax, norms) */
int lm_rule_transpose(lm_rule *r);
int lm_rule_permute(lm_rule *r);
int lm_rule_view(lm_rule *r);
int lm_rule_narrow(lm_rule *r);
int lm_rule_unsqueeze(lm_rule *r);
int lm_rule_squeeze(lm_rule *r);
int lm_rule_expand(lm_rule *r);
int lm_rule_cat(lm_rule *r);
int lm_rule_embedding(lm_rule *r);
int lm_rule_cross_entropy(lm_rule *r);
int lm_rule_sdpa(lm_rule *r);
int lm_rule_rope(lm_rule *r);
int lm_rule_last2(lm_rule *r);      /* triu/tril: the last two dims whole */

/* ---- the op registry (registry.c) ---- */
struct lm_op_def {
  const char *name;
  int nin;  /* tensor inputs; -1 for any number */
  int nout;
  /* Checks its arguments (lm_error naming the op and argument) and fills
   * out[0..nout-1] with new references. Returns 0 or -1. */
  int (*forward)(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out);
  /* Gradients of the inputs from those of the outputs (autograd issue). */
  int (*backward)(const lm_node *node, lm_tensor *const *gout, lm_tensor **gin);
  lm_shard_rule shard_rule; /* how DTensor inputs shard (NULL: not supported) */
  int native;               /* takes DTensors as they are (the collectives) */
};

/* Each ops_*.c file exports one table, ended by an entry with name NULL. */
extern const lm_op_def lm_ops_view[], lm_ops_pointwise[], lm_ops_reduce[],
    lm_ops_linalg[], lm_ops_nn[], lm_ops_optim[], lm_ops_dist[];

const lm_op_def *lm_op_def_of(int op);
/* Calls an op by name from C (ops built from other ops); returns the first
 * output as a new reference, or NULL. */
lm_tensor *lm_call(const char *name, int nin, lm_tensor *const *in, const lm_attrs *a);

/* ---- autograd (autograd.c) ---- */
struct lm_node {
  int32_t refcount;
  int op;
  int nin, nout;
  int64_t seq;          /* creation order: backward visits high to low */
  lm_attrs attrs;
  lm_tensor **in;       /* the inputs (retained) */
  lm_tensor **out;      /* detached aliases of the outputs */
  lm_tensor **retained; /* weak: outputs that asked for retain_grad */
  int visit, pending;   /* scratch of one backward pass */
  lm_tensor **gsum;     /* scratch: gradient summed per output */
};
void lm_node_release(lm_node *n);
void lm_forget_retained(lm_tensor *t);
/* Records op on the tape when grad mode is on and an input requires grad. */
int lm_record(int op, const lm_op_def *def, int nin, lm_tensor *const *in,
              const lm_attrs *a, int nout, lm_tensor **out);
/* g summed over the dims t was broadcast along, in t's dtype (new ref;
 * NULL stays NULL). Every backward returns its gradients through it. */
lm_tensor *lm_grad_like(lm_tensor *g, const lm_tensor *t);

/* A scope owns the intermediate tensors of a formula (backward passes,
 * composite ops) and releases them at lm_scope_end. Every helper returns
 * a borrowed tensor, or NULL if an argument is NULL or the op fails, so a
 * formula can be written as nested calls and checked once at the end. */
typedef struct lm_scope { lm_tensor *t[64]; int n; } lm_scope;
lm_tensor *lm_s(lm_scope *s, lm_tensor *t);          /* adopts a new ref */
lm_tensor *lm_sop(lm_scope *s, const char *op, int nin, lm_tensor *const *in,
                  const lm_attrs *a);
lm_tensor *lm_s1(lm_scope *s, const char *op, lm_tensor *x);
lm_tensor *lm_s1f(lm_scope *s, const char *op, lm_tensor *x, double f0);
lm_tensor *lm_s2(lm_scope *s, const char *op, lm_tensor *a, lm_tensor *b);
lm_tensor *lm_scalar(lm_scope *s, double v, const lm_tensor *like); /* 0-dim */
void lm_scope_end(lm_scope *s);

/* ---- device backends: one table of kernels per device ---- */
/* Pointwise kinds; unary kinds take a->f[0..] as parameters. */
enum lm_unary { LM_NEG, LM_ABS, LM_SQRT, LM_RSQRT, LM_EXP, LM_LOG, LM_TANH,
                LM_SIGMOID, LM_RELU, LM_GELU, LM_GELU_TANH, LM_SILU, LM_SIN,
                LM_COS, LM_POW_SCALAR, LM_CLAMP, LM_NOT, LM_SIGN,
                /* derivatives, for backward passes */
                LM_GELU_D, LM_GELU_TANH_D, LM_SILU_D, LM_NUNARY };
enum lm_binary { LM_ADD, LM_SUB, LM_MUL, LM_DIV, LM_POW, LM_MAXIMUM, LM_MINIMUM,
                 LM_EQ, LM_NE, LM_LT, LM_LE, LM_GT, LM_GE, LM_AND, LM_OR,
                 LM_NBINARY };
enum lm_reduce { LM_SUM, LM_MAX, LM_MIN, LM_ARGMAX, LM_ARGMIN, LM_NREDUCE };

typedef struct lm_backend {
  const char *name;
  void *(*alloc)(size_t nbytes);
  void (*free)(void *p);
  /* dst[i] = src[i] for same-shape tensors of any dtypes and strides */
  int (*copy)(lm_tensor *dst, const lm_tensor *src);
  int (*fill)(lm_tensor *t, double v);
  /* out = f(x); x and out have out's shape (x may broadcast via stride 0) */
  int (*unary)(int kind, lm_tensor *out, const lm_tensor *x, const double *p);
  /* out = a (op) b; a and b are broadcast views of out's shape */
  int (*binary)(int kind, lm_tensor *out, const lm_tensor *a, const lm_tensor *b);
  /* out = cond ? a : b, all broadcast views of out's shape */
  int (*where)(lm_tensor *out, const lm_tensor *cond, const lm_tensor *a, const lm_tensor *b);
  /* contiguous x viewed as (outer, n, inner): out is (outer, inner) */
  int (*reduce)(int kind, lm_tensor *out, const lm_tensor *x, int64_t outer,
                int64_t n, int64_t inner);
  /* c[b] = alpha * op(a[b]) @ op(b[b]) + beta * c[b] for 3-D strided tensors */
  int (*gemm)(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha,
              double beta);
  /* random fill by counter (rng.c computes counters; backends draw) */
  int (*random)(lm_tensor *t, int kind, double a, double b, uint64_t seed,
                uint64_t offset, const int64_t *global_shape, const int64_t *local_start);
  /* Row kernels on contiguous (rows, n) tensors of f32 or f64. */
  int (*softmax)(lm_tensor *out, const lm_tensor *x, int log);
  /* layer_norm (rms=0) or rms_norm (rms=1) over the last n elements of each
   * row; w and b may be NULL; mean/rstd (rows) are saved for backward. */
  int (*norm)(lm_tensor *out, lm_tensor *mean, lm_tensor *rstd, const lm_tensor *x,
              const lm_tensor *w, const lm_tensor *b, double eps, int rms);
  /* out[r] = w[idx[r]] (idx i64, 0-based, checked by the op) */
  int (*embedding)(lm_tensor *out, const lm_tensor *w, const lm_tensor *idx);
  /* out[idx[r]] += src[r] for contiguous out (V, n), idx (rows) i64 (checked
   * by the op) and src (rows, n) of out's dtype, f32 or f64 */
  int (*index_add)(lm_tensor *out, const lm_tensor *idx, const lm_tensor *src);
  /* one AdamW step in place on contiguous same-dtype (f32 or f64) p, m, v
   * with gradient g; h = {lr, beta1, beta2, eps, weight_decay, bc1, bc2} */
  int (*adamw)(lm_tensor *p, const lm_tensor *g, lm_tensor *m, lm_tensor *v, const double *h);
} lm_backend;

const lm_backend *lm_backend_of(int device);   /* NULL with an error if absent */
extern const lm_backend lm_cpu_backend;

/* ---- threads (cpu/threads.c) ---- */
int lm_threads_for(int64_t work); /* threads worth using for `work` elements */

#endif
