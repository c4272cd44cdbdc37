/* pointwise.c: elementwise ops with broadcasting and type promotion, and
 * their gradients. Kernels compute in f32, f64 or i64 (bool for logic);
 * bf16/f16 inputs compute in f32 and round once on the way out. */
#include "op.h"
#include <string.h>

/* PyTorch's rule: a 0-dim tensor (a Lua number) does not widen a tensor of
 * its own category (float or integer). */
static int result_dtype(const lm_meta *a, const lm_meta *b) {
  bool fa = lm_is_float(a->dtype), fb = lm_is_float(b->dtype);
  if (fa == fb && a->ndim == 0 && b->ndim > 0) return b->dtype;
  if (fa == fb && b->ndim == 0 && a->ndim > 0) return a->dtype;
  if (fa != fb && (a->ndim == 0 || b->ndim == 0)) {
    const lm_meta *t = fa ? a : b, *o = fa ? b : a;
    return t->ndim == 0 && o->ndim > 0 ? LM_F32 : t->dtype;
  }
  return lm_promote(a->dtype, b->dtype);
}

/* The result dtype of a binary kind and the dtype its kernel computes in. */
static void binary_dtypes(int kind, const lm_meta *a, const lm_meta *b, int *dt, int *cd) {
  bool compare = kind >= LM_EQ, logic = kind >= LM_AND;
  int t = result_dtype(a, b);
  if ((kind == LM_DIV || kind == LM_POW) && !lm_is_float(t)) t = LM_F32;
  if (logic) t = LM_BOOL;
  else if (t == LM_BOOL && !compare) t = LM_I64;
  *cd = logic ? LM_BOOL : lm_compute_dtype(t);
  *dt = compare ? LM_BOOL : t;
}

/* Casts in[k] to dtype cd (-1: keeps its dtype) and broadcasts it to m's
 * shape: v[k] is in[k] itself (borrowed) when it already is both, else a
 * new ref in s. */
static int prepare(lm_scope *s, const char *op, int n, lm_tensor *const *in, int cd,
                   const lm_meta *m, lm_tensor **v) {
  static const char *names[] = {"argument #1", "argument #2", "argument #3"};
  for (int k = 0; k < n; k++) {
    lm_tensor *t = in[k];
    int to = cd < 0 ? t->dtype_ : cd;
    if (t->dtype_ == to && t->ndim == m->ndim && !memcmp(t->shape_, m->shape, m->ndim * sizeof *m->shape)) {
      v[k] = t;
      continue;
    }
    lm_tensor *c = lm_s_cast(s, t, to);
    if (!c || !(v[k] = lm_s(s, lm_broadcast_to(op, names[k], c, m->ndim, m->shape)))) return -1;
  }
  return 0;
}

/* out = tmp cast to the op's dtype (tmp borrowed from the scope) */
static int finish(lm_tensor *tmp, int dtype, lm_tensor **out) {
  return (*out = tmp ? lm_cast(tmp, dtype) : NULL) ? 0 : -1;
}

/* ---- binary ---- */
int lm_shape_binary(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)nin, (void)a;
  int cd;
  LM_TRY(lm_broadcast_metas(lm_op_table[op].name, 2, in, out));
  binary_dtypes(lm_op_table[op].kind, &in[0], &in[1], &out->dtype, &cd);
  return 0;
}

/* The backend reads bf16/f16 operands and writes a bf16/f16 result of an
 * arithmetic kind itself (binary_low): they go to it as they are, with no
 * casts to f32 and back (the kernel computes in f32 and rounds once: the
 * same bits). */
static bool as_they_are(const lm_backend *be, int kind, int cd, int dt, const lm_meta *a, const lm_meta *b) {
  bool f = lm_is_float(a->dtype) && lm_is_float(b->dtype) && a->dtype != LM_F64 && b->dtype != LM_F64;
  return be->binary_low && kind < LM_EQ && cd == LM_F32 && f && (a->dtype != dt || b->dtype != dt || dt != LM_F32);
}

int lm_fw_binary(const lm_call *c, lm_tensor **out) {
  const lm_op_def *d = &lm_op_table[c->op];
  lm_meta ma = lm_meta_of(c->in[0]), mb = lm_meta_of(c->in[1]);
  int dt, cd;
  binary_dtypes(d->kind, &ma, &mb, &dt, &cd);
  const lm_backend *be = LM_KERNEL(c->op, c->in[0], binary);
  lm_scope s = {0};
  lm_tensor *v[2], *tmp = NULL;
  lm_meta m = c->out[0];
  m.dtype = d->kind >= LM_EQ ? LM_BOOL : cd;
  if (be && as_they_are(be, d->kind, cd, dt, &ma, &mb)) m.dtype = dt, cd = -1;
  int rc = be && prepare(&s, d->name, 2, c->in, cd, &m, v) == 0 ? 0 : -1;
  if (rc == 0) rc = (tmp = lm_s(&s, lm_empty_meta(&m, c->in[0]))) ? be->binary(d->kind, tmp, v[0], v[1]) : -1;
  if (rc == 0) rc = finish(tmp, dt, out);
  lm_scope_end(&s);
  return rc;
}

int lm_bw_binary(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *g = gout[0], *a = n->in[0], *b = n->in[1], *y = n->out[0], *da, *db;
  lm_scope s = {0};
  switch (lm_op_table[n->op].kind) {
  case LM_ADD: da = g, db = g; break;
  case LM_SUB: da = g, db = lm_s1(&s, LM_OP_NEG, g); break;
  case LM_MUL: da = lm_s2(&s, LM_OP_MUL, g, b), db = lm_s2(&s, LM_OP_MUL, g, a); break;
  case LM_DIV: /* g/b and -g*y/b */
    da = lm_s2(&s, LM_OP_DIV, g, b);
    db = lm_s1(&s, LM_OP_NEG, lm_s2(&s, LM_OP_MUL, da, y));
    break;
  case LM_POW: /* g*b*a^(b-1) and g*y*log(a) */
    da = lm_s2(&s, LM_OP_MUL, lm_s2(&s, LM_OP_MUL, g, b),
               lm_s2(&s, LM_OP_POW, a, lm_s2(&s, LM_OP_SUB, b, lm_scalar(&s, 1, b))));
    db = lm_s2(&s, LM_OP_MUL, lm_s2(&s, LM_OP_MUL, g, y), lm_s1(&s, LM_OP_LOG, a));
    break;
  default: { /* maximum, minimum: the gradient goes to the input picked */
    lm_tensor *pick = lm_s2(&s, n->op == LM_OP_MAXIMUM ? LM_OP_GE : LM_OP_LE, a, b);
    lm_tensor *z = lm_scalar(&s, 0, g);
    da = lm_s_where(&s, pick, g, z), db = lm_s_where(&s, pick, z, g);
  }
  }
  int rc = lm_give(n, gin, 0, da) | lm_give(n, gin, 1, db);
  lm_scope_end(&s);
  return rc;
}

/* ---- unary (attrs: f[0], f[1] for pow_scalar's exponent, the *_scalar ops' number and
 * clamp's bounds) ---- */

/* kinds that also make sense on integers */
static bool int_ok(int kind) {
  return kind == LM_NEG || kind == LM_ABS || kind == LM_RELU || kind == LM_CLAMP ||
         kind == LM_SIGN || kind == LM_NOT;
}

int lm_shape_unary(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)nin, (void)a;
  int kind = lm_op_table[op].kind, dt = in[0].dtype;
  if (kind == LM_NOT) dt = LM_BOOL;
  else if (!lm_is_float(dt) && !int_ok(kind))
    return lm_error("%s: expected a floating point tensor, got %s", lm_op_table[op].name,
                    lm_dtype_name(dt));
  else if (dt == LM_BOOL) dt = LM_I64;
  *out = in[0];
  out->dtype = dt;
  return 0;
}

/* the kernel's parameters p[0], p[1] of a unary kind from attrs */
static void unary_params(int kind, const lm_attrs *a, double *p) {
  p[0] = a->f[0], p[1] = a->f[1];
  if (kind == LM_CLAMP) { /* a missing (or NaN) bound is open */
    if (a->nf < 1 || p[0] != p[0]) p[0] = -1.0 / 0.0;
    if (a->nf < 2 || p[1] != p[1]) p[1] = 1.0 / 0.0;
  }
}

int lm_fw_unary(const lm_call *c, lm_tensor **out) {
  int kind = lm_op_table[c->op].kind, dt = c->out[0].dtype;
  int cd = kind == LM_NOT ? LM_BOOL : lm_compute_dtype(dt);
  double p[2];
  unary_params(kind, c->a, p);
  const lm_backend *be = LM_KERNEL(c->op, c->in[0], unary);
  lm_scope s = {0};
  lm_tensor *x = lm_s_cast(&s, c->in[0], cd), *tmp = NULL;
  int rc = be && x && (tmp = lm_s(&s, lm_empty_as(x, x->ndim, x->shape_, cd))) ? be->unary(kind, tmp, x, p) : -1;
  if (rc == 0) rc = finish(tmp, dt, out);
  lm_scope_end(&s);
  return rc;
}

/* g * f'(x) in one pass of the backend's unary_grad kernel, on dense
 * operands in the compute dtype */
static int unary_grad_fused(const lm_backend *be, const lm_saved *n, lm_tensor *g, lm_tensor **gin) {
  int kind = lm_op_table[n->op].kind, cd = lm_compute_dtype(n->in[0]->dtype_);
  double p[2];
  unary_params(kind, &n->attrs, p);
  lm_scope s = {0};
  lm_tensor *gc = lm_s_contig(&s, lm_s_cast(&s, g, cd)), *xc = lm_s_contig(&s, lm_s_cast(&s, n->in[0], cd));
  lm_tensor *yc = lm_s_contig(&s, lm_s_cast(&s, n->out[0], cd));
  lm_tensor *gx = gc && xc && yc ? lm_s(&s, lm_empty_as(xc, xc->ndim, xc->shape_, cd)) : NULL;
  int rc = gx && be->unary_grad(kind, gx, gc, xc, yc, p) == 0 ? lm_give(n, gin, 0, gx) : -1;
  lm_scope_end(&s);
  return rc;
}

int lm_bw_unary(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *g = gout[0], *x = n->in[0], *y = n->out[0], *d = NULL;
  const lm_backend *be = LM_FUSED(x, unary_grad);
  if (be && lm_is_float(x->dtype_)) return unary_grad_fused(be, n, g, gin);
  double p = n->attrs.f[0];
  lm_scope s = {0};
  switch (lm_op_table[n->op].kind) { /* d = dy/dx */
  case LM_NEG: d = lm_scalar(&s, -1, g); break;
  case LM_ABS: d = lm_s1(&s, LM_OP_SIGN, x); break;
  case LM_SQRT: d = lm_s1f(&s, LM_OP_POW_SCALAR, lm_s2(&s, LM_OP_MUL, y, lm_scalar(&s, 2, y)), -1); break;
  case LM_RSQRT: d = lm_s2(&s, LM_OP_MUL, lm_s1f(&s, LM_OP_POW_SCALAR, y, 3), lm_scalar(&s, -0.5, y)); break;
  case LM_EXP: d = y; break;
  case LM_LOG: d = lm_s1f(&s, LM_OP_POW_SCALAR, x, -1); break;
  case LM_TANH: d = lm_s2(&s, LM_OP_SUB, lm_scalar(&s, 1, y), lm_s2(&s, LM_OP_MUL, y, y)); break;
  case LM_SIGMOID: d = lm_s2(&s, LM_OP_MUL, y, lm_s2(&s, LM_OP_SUB, lm_scalar(&s, 1, y), y)); break;
  case LM_RELU: d = lm_s2(&s, LM_OP_GT, x, lm_scalar(&s, 0, x)); break;
  case LM_GELU: d = lm_s1(&s, LM_OP_GELU_D, x); break;
  case LM_GELU_TANH: d = lm_s1(&s, LM_OP_GELU_TANH_D, x); break;
  case LM_SILU: d = lm_s1(&s, LM_OP_SILU_D, x); break;
  case LM_SIN: d = lm_s1(&s, LM_OP_COS, x); break;
  case LM_COS: d = lm_s1(&s, LM_OP_NEG, lm_s1(&s, LM_OP_SIN, x)); break;
  case LM_POW_SCALAR:
    d = lm_s2(&s, LM_OP_MUL, lm_s1f(&s, LM_OP_POW_SCALAR, x, p - 1), lm_scalar(&s, p, x));
    break;
  case LM_ADD_SCALAR: d = lm_scalar(&s, 1, g); break;
  case LM_MUL_SCALAR: d = lm_scalar(&s, p, g); break;
  case LM_DIV_SCALAR: d = lm_scalar(&s, 1 / p, g); break;
  case LM_RSUB_SCALAR: d = lm_scalar(&s, -1, g); break;
  case LM_CLAMP: { /* 1 strictly inside (lo, hi): 0 at a bound, as PyTorch's minimum-norm subgradient */
    double b[2];
    unary_params(LM_CLAMP, &n->attrs, b);
    d = lm_s2(&s, LM_OP_LOGICAL_AND, lm_s2(&s, LM_OP_GT, x, lm_scalar(&s, b[0], x)),
              lm_s2(&s, LM_OP_LT, x, lm_scalar(&s, b[1], x)));
    break;
  }
  default: { /* kinds added since: their gradient is the unary_grad kernel's */
    char dev[32];
    lm_device_name(x->device_, dev, sizeof dev);
    lm_scope_end(&s);
    return lm_error("%s: its gradient needs the backend's unary_grad kernel, which device %s lacks "
                    "(LOOM_CPU_FUSED=0 turns the CPU's off)", lm_op_table[n->op].name, dev);
  }
  }
  int rc = lm_give(n, gin, 0, lm_s2(&s, LM_OP_MUL, g, d));
  lm_scope_end(&s);
  return rc;
}

/* ---- swiglu(a, b) = silu(a) * b: SwiGLU's gate, in one pass where the
 * backend has the fused kernels. a and b broadcast and promote like a
 * binary op; the result is floating point. ---- */
int lm_shape_swiglu(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin, (void)a;
  LM_TRY(lm_need_float("swiglu", 1, "gate", &in[0]));
  LM_TRY(lm_need_float("swiglu", 2, "up", &in[1]));
  LM_TRY(lm_broadcast_metas("swiglu", 2, in, out));
  out->dtype = result_dtype(&in[0], &in[1]);
  return 0;
}

/* a and b cast to cd, broadcast to m's shape and dense: v[0], v[1] */
static int swiglu_operands(lm_scope *s, lm_tensor *const *in, int cd, const lm_meta *m, lm_tensor **v) {
  lm_meta mc = *m;
  mc.dtype = cd;
  LM_TRY(prepare(s, "swiglu", 2, in, cd, &mc, v));
  v[0] = lm_s_contig(s, v[0]), v[1] = lm_s_contig(s, v[1]);
  return v[0] && v[1] ? 0 : -1;
}

/* the dtype a fused SwiGLU kernel runs in: bf16/f16 as they are (the
 * kernels compute in f32 and round once; one that answers LM_UNSUPPORTED
 * gets the widened operands instead), else the compute dtype */
static int swiglu_dtype(int dt) { return dt == LM_BF16 || dt == LM_F16 ? dt : lm_compute_dtype(dt); }

/* silu(a) * b through the backend's kernel in dtype kd: NULL with *rc set */
static lm_tensor *swiglu_fused(lm_scope *s, const lm_backend *be, const lm_call *c, int kd, int *rc) {
  lm_tensor *v[2], *r = NULL;
  *rc = -1;
  if (swiglu_operands(s, c->in, kd, &c->out[0], v) == 0) {
    r = lm_s(s, lm_empty_as(v[0], v[0]->ndim, v[0]->shape_, kd));
    if (r && (*rc = be->swiglu(r, v[0], v[1])) < 0) r = NULL;
  }
  return r;
}

int lm_fw_swiglu(const lm_call *c, lm_tensor **out) {
  int dt = c->out[0].dtype, cd = lm_compute_dtype(dt), kd = swiglu_dtype(dt), rc = 0;
  const lm_backend *be = LM_FUSED(c->in[0], swiglu);
  lm_scope s = {0};
  lm_tensor *v[2], *r = NULL;
  if (be) {
    r = swiglu_fused(&s, be, c, kd, &rc);
    if (!r && rc == LM_UNSUPPORTED && kd != cd) r = swiglu_fused(&s, be, c, cd, &rc);
  } else if (swiglu_operands(&s, c->in, cd, &c->out[0], v) == 0) {
    r = lm_s2(&s, LM_OP_MUL, lm_s1(&s, LM_OP_SILU, v[0]), v[1]);
  }
  rc = r ? finish(r, dt, out) : -1;
  lm_scope_end(&s);
  return rc;
}

/* the fused backward in dtype kd into *da, *db: the kernel's status */
static int swiglu_bwd_fused(lm_scope *s, const lm_backend *be, const lm_saved *n, lm_tensor *gout, int kd,
                            lm_tensor **da, lm_tensor **db) {
  lm_meta m = lm_meta_of(n->out[0]);
  lm_tensor *v[2], *g = lm_s_contig(s, lm_s_cast(s, gout, kd));
  *da = *db = NULL;
  if (!g || swiglu_operands(s, n->in, kd, &m, v) < 0) return -1;
  *da = lm_s(s, lm_empty_as(g, g->ndim, g->shape_, kd));
  *db = lm_s(s, lm_empty_as(g, g->ndim, g->shape_, kd));
  int rc = *da && *db ? be->swiglu_bwd(*da, *db, g, v[0], v[1]) : -1;
  if (rc < 0) *da = *db = NULL;
  return rc;
}

/* da = g * b * silu'(a), db = g * silu(a), summed over broadcast dims */
int lm_bw_swiglu(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  int dt = n->out[0]->dtype_, cd = lm_compute_dtype(dt), kd = swiglu_dtype(dt);
  const lm_backend *be = LM_FUSED(n->in[0], swiglu_bwd);
  lm_meta m = lm_meta_of(n->out[0]);
  lm_scope s = {0};
  lm_tensor *v[2], *g = NULL, *da = NULL, *db = NULL;
  if (be) {
    if (swiglu_bwd_fused(&s, be, n, gout[0], kd, &da, &db) == LM_UNSUPPORTED && kd != cd)
      swiglu_bwd_fused(&s, be, n, gout[0], cd, &da, &db);
  } else if ((g = lm_s_contig(&s, lm_s_cast(&s, gout[0], cd))) && swiglu_operands(&s, n->in, cd, &m, v) == 0) {
    da = lm_s2(&s, LM_OP_MUL, lm_s2(&s, LM_OP_MUL, g, v[1]), lm_s1(&s, LM_OP_SILU_D, v[0]));
    db = lm_s2(&s, LM_OP_MUL, g, lm_s1(&s, LM_OP_SILU, v[0]));
  }
  int rc = da && db ? lm_give(n, gin, 0, da) | lm_give(n, gin, 1, db) : -1;
  lm_scope_end(&s);
  return rc;
}

/* ---- where(cond, a, b): cond is bool; a and b promote like a binary op ---- */
int lm_shape_where(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin, (void)a;
  if (in[0].dtype != LM_BOOL)
    return lm_error("where: argument #1 (condition) expected bool, got %s", lm_dtype_name(in[0].dtype));
  LM_TRY(lm_broadcast_metas("where", 3, in, out));
  out->dtype = result_dtype(&in[1], &in[2]);
  return 0;
}

int lm_fw_where(const lm_call *c, lm_tensor **out) {
  const lm_backend *be = LM_KERNEL(c->op, c->in[0], where);
  lm_scope s = {0};
  lm_tensor *v[3], *r = NULL;
  int rc = be && prepare(&s, "where", 1, c->in, LM_BOOL, &c->out[0], v) == 0 &&
                   prepare(&s, "where", 2, c->in + 1, c->out[0].dtype, &c->out[0], v + 1) == 0 ? 0 : -1;
  if (rc == 0) rc = (r = lm_empty_meta(&c->out[0], c->in[0])) ? be->where(r, v[0], v[1], v[2]) : -1;
  lm_scope_end(&s);
  if (rc < 0) { lm_release(r); return -1; }
  *out = r;
  return 0;
}

int lm_bw_where(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  lm_tensor *g = gout[0], *z = lm_scalar(&s, 0, g);
  int rc = lm_give(n, gin, 1, lm_s_where(&s, n->in[0], g, z)) |
           lm_give(n, gin, 2, lm_s_where(&s, n->in[0], z, g));
  lm_scope_end(&s);
  return rc;
}
