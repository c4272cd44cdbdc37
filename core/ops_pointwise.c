/* ops_pointwise.c: elementwise ops with broadcasting and type promotion,
 * and their gradients. Kernels compute in f32, f64 or i64 (bool for logic);
 * bf16/f16 inputs compute in f32 and round once on the way out. */
#include "cpu/iter.h"
#include <string.h>

static int broadcast_shape(const char *op, int n, lm_tensor *const *t, int *nd, int64_t *shape) {
  *nd = 0;
  for (int k = 0; k < n; k++) *nd = t[k]->ndim > *nd ? t[k]->ndim : *nd;
  for (int d = 0; d < *nd; d++) shape[d] = 1;
  for (int k = 0; k < n; k++)
    for (int d = 0; d < t[k]->ndim; d++) {
      int64_t *s = &shape[*nd - t[k]->ndim + d], v = t[k]->shape[d];
      if (v == *s || v == 1) continue;
      if (*s != 1)
        return lm_error("%s: shapes cannot broadcast: argument #%d has size %lld in dim %d, "
                        "another argument has %lld", op, k + 1, (long long)v,
                        d + 1, (long long)*s);
      *s = v;
    }
  return 0;
}

/* PyTorch's rule: a 0-dim tensor (a Lua number) does not widen a tensor of
 * its own category (float or integer). */
static int result_dtype(const lm_tensor *a, const lm_tensor *b) {
  bool fa = lm_is_float(a->dtype_), fb = lm_is_float(b->dtype_);
  if (fa == fb && a->ndim == 0 && b->ndim > 0) return b->dtype_;
  if (fa == fb && b->ndim == 0 && a->ndim > 0) return a->dtype_;
  if (fa != fb && (a->ndim == 0 || b->ndim == 0)) {
    const lm_tensor *t = fa ? a : b, *o = fa ? b : a;
    return t->ndim == 0 && o->ndim > 0 ? LM_F32 : t->dtype_;
  }
  return lm_promote(a->dtype_, b->dtype_);
}

/* Casts in[k] to dtype cd and broadcasts it to shape: v[k] is in[k] itself
 * (borrowed) when it already is both, else a new ref (see release_all). */
static int prepare(const char *op, int n, lm_tensor *const *in, int cd, int nd,
                   const int64_t *shape, lm_tensor **v) {
  static const char *names[] = {"argument #1", "argument #2", "argument #3"};
  for (int k = 0; k < n; k++) v[k] = NULL;
  for (int k = 0; k < n; k++) {
    lm_tensor *t = in[k];
    if (t->dtype_ == cd && t->ndim == nd && !memcmp(t->shape, shape, nd * sizeof *shape)) {
      v[k] = t;
      continue;
    }
    lm_tensor *c = lm_cast(t, cd);
    if (!c) return -1;
    v[k] = lm_broadcast_to(op, names[k], c, nd, shape);
    lm_release(c);
    if (!v[k]) return -1;
  }
  return 0;
}

static void release_all(int n, lm_tensor **v, lm_tensor *const *in) {
  for (int k = 0; k < n; k++)
    if (v[k] != in[k]) lm_release(v[k]);
}

/* Runs the kernel into a tensor of the compute dtype, then casts to dtype. */
static int finish(lm_tensor *tmp, int dtype, lm_tensor **out) {
  if (tmp->dtype_ == dtype) { *out = tmp; return 0; }
  *out = lm_cast(tmp, dtype);
  lm_release(tmp);
  return *out ? 0 : -1;
}

/* ---- binary ---- */
static const char *bin_names[LM_NBINARY] = {
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne",
    "lt", "le", "gt", "ge", "logical_and", "logical_or"};

static int binary_forward(int kind, lm_tensor *const *in, lm_tensor **out) {
  const char *op = bin_names[kind];
  int nd, dt = result_dtype(in[0], in[1]);
  int64_t shape[LM_MAX_DIMS];
  LM_TRY(broadcast_shape(op, 2, in, &nd, shape));
  bool compare = kind >= LM_EQ, logic = kind >= LM_AND;
  if ((kind == LM_DIV || kind == LM_POW) && !lm_is_float(dt)) dt = LM_F32;
  if (logic) dt = LM_BOOL;
  else if (dt == LM_BOOL && !compare) dt = LM_I64;
  int cd = logic ? LM_BOOL : lm_compute_dtype(dt);
  lm_tensor *v[2];
  lm_tensor *tmp = NULL;
  int rc = prepare(op, 2, in, cd, nd, shape, v);
  if (rc == 0) rc = (tmp = lm_empty_as(in[0], nd, shape, compare ? LM_BOOL : cd)) ? 0 : -1;
  if (rc == 0) rc = lm_backend_of(in[0]->device_)->binary(kind, tmp, v[0], v[1]);
  release_all(2, v, in);
  if (rc < 0) { lm_release(tmp); return -1; }
  return finish(tmp, compare ? LM_BOOL : dt, out);
}

/* Each backward returns gin[i] = lm_grad_like(formula, input i). */
static int give(lm_tensor **gin, int i, lm_tensor *g, const lm_node *n) {
  if (!n->in[i]->needs_grad) return 0;
  gin[i] = lm_grad_like(g, n->in[i]);
  return gin[i] ? 0 : -1;
}

static int binary_backward(int kind, const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *g = gout[0], *a = n->in[0], *b = n->in[1], *y = n->out[0], *da, *db;
  lm_scope s = {0};
  switch (kind) {
  case LM_ADD: da = g, db = g; break;
  case LM_SUB: da = g, db = lm_s1(&s, "neg", g); break;
  case LM_MUL: da = lm_s2(&s, "mul", g, b), db = lm_s2(&s, "mul", g, a); break;
  case LM_DIV: /* g/b and -g*y/b */
    da = lm_s2(&s, "div", g, b);
    db = lm_s1(&s, "neg", lm_s2(&s, "mul", da, y));
    break;
  case LM_POW: /* g*b*a^(b-1) and g*y*log(a) */
    da = lm_s2(&s, "mul", lm_s2(&s, "mul", g, b),
               lm_s2(&s, "pow", a, lm_s2(&s, "sub", b, lm_scalar(&s, 1, b))));
    db = lm_s2(&s, "mul", lm_s2(&s, "mul", g, y), lm_s1(&s, "log", a));
    break;
  default: { /* maximum, minimum: the gradient goes to the input picked */
    lm_tensor *pick = lm_s2(&s, kind == LM_MAXIMUM ? "ge" : "le", a, b), *z = lm_scalar(&s, 0, g);
    lm_tensor *w1[3] = {pick, g, z}, *w2[3] = {pick, z, g};
    da = lm_sop(&s, "where", 3, w1, NULL), db = lm_sop(&s, "where", 3, w2, NULL);
  }
  }
  int rc = give(gin, 0, da, n) | give(gin, 1, db, n);
  lm_scope_end(&s);
  return rc;
}

#define BINARY_OP(KIND, NAME)                                                  \
  static int fw_##NAME(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) { \
    (void)nin, (void)a;                                                        \
    return binary_forward(KIND, in, out);                                      \
  }
#define BINARY_BW(KIND, NAME)                                                  \
  static int bw_##NAME(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) { \
    return binary_backward(KIND, n, g, gin);                                   \
  }
BINARY_OP(LM_ADD, add)
BINARY_BW(LM_ADD, add)
BINARY_OP(LM_SUB, sub)
BINARY_BW(LM_SUB, sub)
BINARY_OP(LM_MUL, mul)
BINARY_BW(LM_MUL, mul)
BINARY_OP(LM_DIV, div)
BINARY_BW(LM_DIV, div)
BINARY_OP(LM_POW, pow)
BINARY_BW(LM_POW, pow)
BINARY_OP(LM_MAXIMUM, maximum)
BINARY_BW(LM_MAXIMUM, maximum)
BINARY_OP(LM_MINIMUM, minimum)
BINARY_BW(LM_MINIMUM, minimum)
BINARY_OP(LM_EQ, eq)
BINARY_OP(LM_NE, ne)
BINARY_OP(LM_LT, lt)
BINARY_OP(LM_LE, le)
BINARY_OP(LM_GT, gt)
BINARY_OP(LM_GE, ge)
BINARY_OP(LM_AND, logical_and)
BINARY_OP(LM_OR, logical_or)

/* ---- unary (attrs: f[0], f[1] for pow_scalar's exponent and clamp's bounds) ---- */
static const char *un_names[LM_NUNARY] = {
    "neg", "abs", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "relu", "gelu",
    "gelu_tanh", "silu", "sin", "cos", "pow_scalar", "clamp", "logical_not", "sign",
    "_gelu_d", "_gelu_tanh_d", "_silu_d"};

/* kinds that also make sense on integers */
static bool int_ok(int kind) {
  return kind == LM_NEG || kind == LM_ABS || kind == LM_RELU || kind == LM_CLAMP ||
         kind == LM_SIGN || kind == LM_NOT;
}

static int unary_forward(int kind, lm_tensor *x, const lm_attrs *a, lm_tensor **out) {
  const char *op = un_names[kind];
  int dt = x->dtype_, cd;
  if (kind == LM_NOT) dt = cd = LM_BOOL;
  else if (!lm_is_float(dt) && !int_ok(kind))
    return lm_error("%s: expected a floating point tensor, got %s", op, lm_dtype_name(dt));
  else {
    if (dt == LM_BOOL) dt = LM_I64;
    cd = lm_compute_dtype(dt);
  }
  double p[2] = {a->f[0], a->f[1]};
  if (kind == LM_CLAMP) { /* a missing (or NaN) bound is open */
    if (a->nf < 1 || p[0] != p[0]) p[0] = -1.0 / 0.0;
    if (a->nf < 2 || p[1] != p[1]) p[1] = 1.0 / 0.0;
  }
  lm_tensor *c = x->dtype_ == cd ? x : lm_cast(x, cd);
  if (!c) return -1;
  lm_tensor *tmp = lm_empty_as(x, x->ndim, x->shape, cd);
  int rc = tmp ? lm_backend_of(x->device_)->unary(kind, tmp, c, p) : -1;
  if (c != x) lm_release(c);
  if (rc < 0) { lm_release(tmp); return -1; }
  return finish(tmp, dt, out);
}

static int unary_backward(int kind, const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *g = gout[0], *x = n->in[0], *y = n->out[0], *d = NULL;
  double p = n->attrs.f[0];
  lm_scope s = {0};
  switch (kind) { /* d = dy/dx */
  case LM_NEG: d = lm_scalar(&s, -1, g); break;
  case LM_ABS: d = lm_s1(&s, "sign", x); break;
  case LM_SQRT: d = lm_s1f(&s, "pow_scalar", lm_s2(&s, "mul", y, lm_scalar(&s, 2, y)), -1); break;
  case LM_RSQRT: d = lm_s2(&s, "mul", lm_s1f(&s, "pow_scalar", y, 3), lm_scalar(&s, -0.5, y)); break;
  case LM_EXP: d = y; break;
  case LM_LOG: d = lm_s1f(&s, "pow_scalar", x, -1); break;
  case LM_TANH: d = lm_s2(&s, "sub", lm_scalar(&s, 1, y), lm_s2(&s, "mul", y, y)); break;
  case LM_SIGMOID: d = lm_s2(&s, "mul", y, lm_s2(&s, "sub", lm_scalar(&s, 1, y), y)); break;
  case LM_RELU: d = lm_s2(&s, "gt", x, lm_scalar(&s, 0, x)); break;
  case LM_GELU: d = lm_s1(&s, "_gelu_d", x); break;
  case LM_GELU_TANH: d = lm_s1(&s, "_gelu_tanh_d", x); break;
  case LM_SILU: d = lm_s1(&s, "_silu_d", x); break;
  case LM_SIN: d = lm_s1(&s, "cos", x); break;
  case LM_COS: d = lm_s1(&s, "neg", lm_s1(&s, "sin", x)); break;
  case LM_POW_SCALAR:
    d = lm_s2(&s, "mul", lm_s1f(&s, "pow_scalar", x, p - 1), lm_scalar(&s, p, x));
    break;
  case LM_CLAMP: { /* 1 inside [lo, hi], 0 outside */
    lm_tensor *in[1] = {x}, *c = lm_sop(&s, "clamp", 1, in, &n->attrs);
    d = lm_s2(&s, "eq", c, x);
    break;
  }
  default: lm_scope_end(&s); return lm_error("%s: not differentiable", un_names[kind]);
  }
  int rc = give(gin, 0, lm_s2(&s, "mul", g, d), n);
  lm_scope_end(&s);
  return rc;
}

#define UNARY_OP(KIND, NAME)                                                   \
  static int fw_##NAME(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) { \
    (void)nin;                                                                 \
    return unary_forward(KIND, in[0], a, out);                                 \
  }
#define UNARY_BW(KIND, NAME)                                                   \
  static int bw_##NAME(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) { \
    return unary_backward(KIND, n, g, gin);                                    \
  }
UNARY_OP(LM_NEG, neg)
UNARY_BW(LM_NEG, neg)
UNARY_OP(LM_ABS, abs)
UNARY_BW(LM_ABS, abs)
UNARY_OP(LM_SQRT, sqrt)
UNARY_BW(LM_SQRT, sqrt)
UNARY_OP(LM_RSQRT, rsqrt)
UNARY_BW(LM_RSQRT, rsqrt)
UNARY_OP(LM_EXP, exp)
UNARY_BW(LM_EXP, exp)
UNARY_OP(LM_LOG, log)
UNARY_BW(LM_LOG, log)
UNARY_OP(LM_TANH, tanh)
UNARY_BW(LM_TANH, tanh)
UNARY_OP(LM_SIGMOID, sigmoid)
UNARY_BW(LM_SIGMOID, sigmoid)
UNARY_OP(LM_RELU, relu)
UNARY_BW(LM_RELU, relu)
UNARY_OP(LM_GELU, gelu)
UNARY_BW(LM_GELU, gelu)
UNARY_OP(LM_GELU_TANH, gelu_tanh)
UNARY_BW(LM_GELU_TANH, gelu_tanh)
UNARY_OP(LM_SILU, silu)
UNARY_BW(LM_SILU, silu)
UNARY_OP(LM_SIN, sin)
UNARY_BW(LM_SIN, sin)
UNARY_OP(LM_COS, cos)
UNARY_BW(LM_COS, cos)
UNARY_OP(LM_POW_SCALAR, pow_scalar)
UNARY_BW(LM_POW_SCALAR, pow_scalar)
UNARY_OP(LM_CLAMP, clamp)
UNARY_BW(LM_CLAMP, clamp)
UNARY_OP(LM_NOT, logical_not)
UNARY_OP(LM_SIGN, sign)
UNARY_OP(LM_GELU_D, gelu_d)
UNARY_OP(LM_GELU_TANH_D, gelu_tanh_d)
UNARY_OP(LM_SILU_D, silu_d)

/* ---- where(cond, a, b): cond is bool; a and b promote like a binary op ---- */
static int fw_where(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin, (void)a;
  if (in[0]->dtype_ != LM_BOOL)
    return lm_error("where: argument #1 (condition) expected bool, got %s",
                    lm_dtype_name(in[0]->dtype_));
  int nd, dt = result_dtype(in[1], in[2]);
  int64_t shape[LM_MAX_DIMS];
  LM_TRY(broadcast_shape("where", 3, in, &nd, shape));
  lm_tensor *v[3], *tmp = NULL, *c = NULL;
  int rc = prepare("where", 1, in, LM_BOOL, nd, shape, v);
  if (rc == 0) rc = prepare("where", 2, in + 1, dt, nd, shape, v + 1);
  else v[1] = v[2] = NULL;
  (void)c;
  if (rc == 0) rc = (tmp = lm_empty_as(in[1], nd, shape, dt)) ? 0 : -1;
  if (rc == 0) rc = lm_backend_of(in[0]->device_)->where(tmp, v[0], v[1], v[2]);
  release_all(3, v, in);
  if (rc < 0) { lm_release(tmp); return -1; }
  *out = tmp;
  return 0;
}

static int bw_where(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  lm_tensor *g = gout[0], *z = lm_scalar(&s, 0, g);
  lm_tensor *w1[3] = {n->in[0], g, z}, *w2[3] = {n->in[0], z, g};
  int rc = give(gin, 1, lm_sop(&s, "where", 3, w1, NULL), n) |
           give(gin, 2, lm_sop(&s, "where", 3, w2, NULL), n);
  lm_scope_end(&s);
  return rc;
}

#define OP(NAME, NIN, BW) {#NAME, NIN, 1, fw_##NAME, BW, lm_rule_pointwise, 0}
#define LIN(NAME, NIN, BW) {#NAME, NIN, 1, fw_##NAME, BW, lm_rule_linear_pw, 0}
#define MUL(NAME, NIN, BW) {#NAME, NIN, 1, fw_##NAME, BW, lm_rule_mul, 0}
const lm_op_def lm_ops_pointwise[] = {
    LIN(add, 2, bw_add), LIN(sub, 2, bw_sub), MUL(mul, 2, bw_mul), MUL(div, 2, bw_div),
    OP(pow, 2, bw_pow), OP(maximum, 2, bw_maximum), OP(minimum, 2, bw_minimum),
    OP(eq, 2, NULL), OP(ne, 2, NULL), OP(lt, 2, NULL), OP(le, 2, NULL), OP(gt, 2, NULL),
    OP(ge, 2, NULL), OP(logical_and, 2, NULL), OP(logical_or, 2, NULL),
    LIN(neg, 1, bw_neg), OP(abs, 1, bw_abs), OP(sqrt, 1, bw_sqrt), OP(rsqrt, 1, bw_rsqrt),
    OP(exp, 1, bw_exp), OP(log, 1, bw_log), OP(tanh, 1, bw_tanh), OP(sigmoid, 1, bw_sigmoid),
    OP(relu, 1, bw_relu), OP(gelu, 1, bw_gelu), OP(gelu_tanh, 1, bw_gelu_tanh),
    OP(silu, 1, bw_silu), OP(sin, 1, bw_sin), OP(cos, 1, bw_cos),
    OP(pow_scalar, 1, bw_pow_scalar), OP(clamp, 1, bw_clamp), OP(logical_not, 1, NULL),
    OP(sign, 1, NULL), {"_gelu_d", 1, 1, fw_gelu_d, NULL, NULL, 0},
    {"_gelu_tanh_d", 1, 1, fw_gelu_tanh_d, NULL, NULL, 0}, {"_silu_d", 1, 1, fw_silu_d, NULL, NULL, 0},
    OP(where, 3, bw_where), {0}};
