/* op.h: the ops layer: the op table (one entry per line of op_list.h),
 * shape inference, and what op implementations share: running other ops
 * by id, scopes of intermediates, gradients summed over broadcast dims.
 * Ops run here without autograd or DTensor dispatch: lm_op_call (entry/)
 * adds those around lm_op_run. */
#ifndef LOOM_OP_H
#define LOOM_OP_H
#include "../tensor/tensor.h"

#define LM_MAX_OUT 2

/* The shape and dtype of a tensor without its data: what shape inference
 * reads and writes, for local tensors and for a DTensor's global shape. */
typedef struct lm_meta {
  int32_t ndim, dtype;
  int64_t shape[LM_MAX_DIMS];
} lm_meta;
lm_meta lm_meta_of(const lm_tensor *t);
/* a new tensor of meta's shape and dtype on like's device */
lm_tensor *lm_empty_meta(const lm_meta *m, const lm_tensor *like);

/* One call of a forward: the op, its inputs and attrs, and the outputs'
 * shapes and dtypes as shape inference gave them. */
typedef struct lm_call {
  int op, nin;
  lm_tensor *const *in;
  const lm_attrs *a;
  lm_meta out[LM_MAX_OUT];
} lm_call;

/* What a backward formula sees of a recorded call: its inputs and
 * (detached) outputs as autograd saved them, and its attrs. */
typedef struct lm_saved {
  int op, nin, nout;
  lm_attrs attrs;
  lm_tensor **in, **out;
  /* bit i: input i is a bf16/f16 cast of an f32 tensor (autocast's cast of
   * a weight), so its gradient may be given in f32: a GEMM then writes it
   * in f32 and the cast's backward has nothing left to do */
  uint32_t wide_grad;
} lm_saved;

/* Shape inference: checks the arguments (errors name the op and the
 * argument) and fills out[0..nout-1]. The forward and the sharding rule
 * (on global shapes) call the same function. */
typedef int (*lm_shape_fn)(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out);
/* Fills out[0..nout-1] with new references; 0 or -1. */
typedef int (*lm_forward_fn)(const lm_call *c, lm_tensor **out);
/* gin[i] (NULL for inputs that need none) from the outputs' gradients. */
typedef int (*lm_backward_fn)(const lm_saved *s, lm_tensor *const *gout, lm_tensor **gin);

enum lm_op_flags {
  LM_OPF_NATIVE = 1,  /* takes DTensors as they are (the collectives) */
  LM_OPF_INPLACE = 2, /* updates its inputs, makes no outputs */
  LM_OPF_NOSAVE = 4,  /* its backward reads no input's or output's values, only shapes */
  LM_OPF_AMP_LOW = 8, /* under autocast: float inputs in the low-precision dtype (GEMMs) */
  LM_OPF_AMP_F32 = 16, /* under autocast: low-precision inputs in f32 (softmax, norms, losses) */
  LM_OPF_META_FW = 32, /* its forward handles meta tensors itself */
};

typedef struct lm_op_def {
  const char *name;
  int8_t nin, nout;      /* nin -1: any number */
  int16_t kind;          /* backend kernel kind (enum lm_unary, lm_binary, lm_reduce) */
  uint8_t flags;         /* enum lm_op_flags */
  uint16_t slot;         /* offset of its kernel in lm_backend, 0: none */
  lm_shape_fn shape;
  lm_forward_fn forward;
  lm_backward_fn backward; /* NULL: not differentiable */
} lm_op_def;

extern const lm_op_def lm_op_table[LM_NOPS]; /* op_table.c; sharding rules: dtensor/ */
static inline const lm_op_def *lm_op_def_of(int op) { return &lm_op_table[op]; }

/* Every function the list names, declared once from it. */
#define LM_OP(ID, NAME, NIN, NOUT, KIND, FLAGS, SHAPE, FW, BW, RULE, SLOT)                   \
  int lm_shape_##SHAPE(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out); \
  int lm_fw_##FW(const lm_call *c, lm_tensor **out);                                         \
  int lm_bw_##BW(const lm_saved *s, lm_tensor *const *gout, lm_tensor **gin);
#include "../op_list.h"
#undef LM_OP

/* ---- running ops inside the core (registry.c) ----
 * No autograd, no DTensor dispatch: for forwards built from other ops and
 * for backward formulas, which run on plain (local) tensors. */
int lm_op_run(int op, int nin, lm_tensor *const *in, const lm_attrs *a, lm_tensor **out);
lm_tensor *lm_run(int op, int nin, lm_tensor *const *in, const lm_attrs *a); /* first output */
/* The backend of t's device with kernel `slot` present, else NULL with an
 * error naming the op, the slot and the device. */
const lm_backend *lm_kernel_of(int op, const lm_tensor *t, size_t slot, const char *slot_name);
#define LM_KERNEL(op, t, slot) lm_kernel_of((op), (t), offsetof(lm_backend, slot), #slot)
/* The backend of t's device when it has the fused kernel `slot`, else NULL
 * without an error: the op then runs its composed form. */
const lm_backend *lm_fused_of(const lm_tensor *t, size_t slot);
#define LM_FUSED(t, slot) lm_fused_of((t), offsetof(lm_backend, slot))

/* ---- attrs holding a communicator (collective.c) ---- */
/* The communicator handle k of attrs, checked to be a live one (else NULL
 * with an error naming op). */
lm_comm *lm_attr_comm(const lm_attrs *a, int k, const char *op);
lm_attrs lm_comm_attrs(lm_comm *c); /* attrs holding one communicator handle */

/* ---- scopes (scope.c) ----
 * A scope owns the intermediate tensors of a formula and releases them at
 * lm_scope_end. Every helper returns a borrowed tensor, or NULL if an
 * argument is NULL or the op fails, so a formula can be written as nested
 * calls and checked once at the end. */
typedef struct lm_scope { lm_tensor *t[64]; int n; } lm_scope;
lm_tensor *lm_s(lm_scope *s, lm_tensor *t);          /* adopts a new ref */
lm_tensor *lm_sop(lm_scope *s, int op, int nin, lm_tensor *const *in, const lm_attrs *a);
lm_tensor *lm_s1(lm_scope *s, int op, lm_tensor *x);
lm_tensor *lm_s1f(lm_scope *s, int op, lm_tensor *x, double f0);
lm_tensor *lm_s2(lm_scope *s, int op, lm_tensor *a, lm_tensor *b);
lm_tensor *lm_scalar(lm_scope *s, double v, const lm_tensor *like); /* 0-dim */
void lm_scope_end(lm_scope *s);
/* formula helpers on ops with attrs (dims 0-based, negative from the end) */
lm_tensor *lm_s_reshape(lm_scope *s, lm_tensor *x, int nd, const int64_t *shape);
lm_tensor *lm_s_sum(lm_scope *s, lm_tensor *x, int dim, int keepdim);
lm_tensor *lm_s_transpose(lm_scope *s, lm_tensor *x, int d0, int d1);
lm_tensor *lm_s_where(lm_scope *s, lm_tensor *cond, lm_tensor *a, lm_tensor *b);
lm_tensor *lm_s_cast(lm_scope *s, lm_tensor *x, int dtype);
lm_tensor *lm_s_contig(lm_scope *s, lm_tensor *x);
lm_tensor *lm_s_mulk(lm_scope *s, lm_tensor *x, double k);        /* x * k */
lm_tensor *lm_s_arange(lm_scope *s, int64_t n, int device);       /* 0..n-1, i64 */
/* log(sum(exp(x))) over dim, kept as a size-1 dim (max-shifted) */
lm_tensor *lm_s_logsumexp(lm_scope *s, lm_tensor *x, int dim);

/* g summed over the dims t was broadcast along, reshaped and cast to t's
 * (new ref; NULL stays NULL). Every backward returns its gradients through it. */
lm_tensor *lm_grad_like(lm_tensor *g, const lm_tensor *t);
/* the same, cast to dtype instead (a gradient given wide: lm_saved.wide_grad) */
lm_tensor *lm_grad_as(lm_tensor *g, const lm_tensor *t, int dtype);
/* the dtype input i's gradient is best given in: f32 where wide_grad allows */
int lm_grad_dtype(const lm_saved *s, int i);
/* gin[i] = lm_grad_like(g, input i) when input i requires grad */
int lm_give(const lm_saved *s, lm_tensor **gin, int i, lm_tensor *g);

/* ---- shape inference helpers (shape.c) ---- */
/* the broadcast of n metas' shapes into out (dtype untouched) */
int lm_broadcast_metas(const char *op, int n, const lm_meta *in, lm_meta *out);
int lm_need_float(const char *op, int k, const char *arg, const lm_meta *m);
/* error unless attrs carry at least n ints (what: their names, for the message) */
int lm_need_ints(const char *op, const lm_attrs *a, int n, const char *what);
/* error when a bf16/f16 operand of a GEMM meets another dtype (names: the
 * arguments' names) */
int lm_need_same_low(const char *op, int n, const lm_meta *in, const char *const *names);
/* error unless the ids of idx (any integer dtype) lie in [0, n), or equal
 * skip when skip_ok; argument #k named arg, its values called `what` */
int lm_check_ids(const char *op, int k, const char *arg, lm_tensor *idx, int64_t n, int skip_ok,
                 int64_t skip, const char *what);

#endif
