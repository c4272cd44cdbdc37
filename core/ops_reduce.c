/* ops_reduce.c: sum, mean, max, min, argmax, argmin over one dim (attrs
 * i[0] = dim, i[1] = keepdim) or over all elements (no attrs). max and
 * min return (values, indices); indices are 0-based i64 in C. */
#include "internal.h"
#include <string.h>

typedef struct {
  int dim; /* -1: all elements */
  int64_t outer, n, inner;
  int nd;
  int64_t shape[LM_MAX_DIMS]; /* the result's */
} plan;

static int plan_of(const char *op, const lm_tensor *x, const lm_attrs *a, plan *p) {
  if (a->ni == 0) {
    *p = (plan){.dim = -1, .outer = 1, .n = x->numel_, .inner = 1, .nd = 0};
    return 0;
  }
  int d = lm_wrap_dim(op, "dim", a->i[0], x->ndim);
  if (d < 0) return -1;
  *p = (plan){.dim = d, .outer = 1, .n = x->ndim ? x->shape[d] : 1, .inner = 1, .nd = 0};
  for (int k = 0; k < x->ndim; k++) {
    if (k < d) p->outer *= x->shape[k];
    if (k > d) p->inner *= x->shape[k];
    if (k != d || a->i[1]) p->shape[p->nd++] = k == d ? 1 : x->shape[k];
  }
  return 0;
}

/* Runs one kernel kind: out has dtype `dt` (or i64 for the arg kinds). */
static lm_tensor *run(int kind, const char *op, lm_tensor *x, const plan *p, int dt) {
  int cd = lm_compute_dtype(x->dtype_ == LM_BOOL ? LM_I64 : x->dtype_);
  bool arg = kind == LM_ARGMAX || kind == LM_ARGMIN;
  if (p->n == 0 && kind != LM_SUM) {
    lm_error("%s: cannot reduce over an empty dim", op);
    return NULL;
  }
  lm_tensor *c = lm_cast(x, cd), *cc = c ? lm_contiguous(c) : NULL;
  lm_release(c);
  lm_tensor *out = cc ? lm_empty_as(x, p->nd, p->shape, arg ? LM_I64 : cd) : NULL;
  int rc = out ? lm_backend_of(x->device_)->reduce(kind, out, cc, p->outer, p->n, p->inner) : -1;
  lm_release(cc);
  if (rc < 0) { lm_release(out); return NULL; }
  if (arg) return out;
  lm_tensor *r = lm_cast(out, dt);
  lm_release(out);
  return r;
}

static int fw_sum(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  plan p;
  LM_TRY(plan_of("sum", in[0], a, &p));
  int dt = lm_is_float(in[0]->dtype_) ? in[0]->dtype_ : LM_I64;
  return (*out = run(LM_SUM, "sum", in[0], &p, dt)) ? 0 : -1;
}

static int fw_mean(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  if (!lm_is_float(in[0]->dtype_))
    return lm_error("mean: expected a floating point tensor, got %s", lm_dtype_name(in[0]->dtype_));
  plan p;
  LM_TRY(plan_of("mean", in[0], a, &p));
  lm_scope s = {0};
  lm_tensor *sum = lm_s(&s, run(LM_SUM, "mean", in[0], &p, lm_compute_dtype(in[0]->dtype_)));
  lm_tensor *m = lm_s2(&s, "div", sum, lm_scalar(&s, (double)p.n, sum));
  *out = m ? lm_cast(m, in[0]->dtype_) : NULL;
  lm_scope_end(&s);
  return *out ? 0 : -1;
}

static int minmax(int kind, int argkind, const char *op, lm_tensor *const *in, const lm_attrs *a,
                  lm_tensor **out) {
  plan p;
  LM_TRY(plan_of(op, in[0], a, &p));
  int dt = in[0]->dtype_ == LM_BOOL ? LM_I64 : in[0]->dtype_;
  out[0] = run(kind, op, in[0], &p, dt);
  out[1] = out[0] ? run(argkind, op, in[0], &p, LM_I64) : NULL;
  return out[1] ? 0 : -1;
}
static int fw_max(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  return minmax(LM_MAX, LM_ARGMAX, "max", in, a, out);
}
static int fw_min(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  return minmax(LM_MIN, LM_ARGMIN, "min", in, a, out);
}
static int fw_argmax(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  plan p;
  LM_TRY(plan_of("argmax", in[0], a, &p));
  return (*out = run(LM_ARGMAX, "argmax", in[0], &p, LM_I64)) ? 0 : -1;
}
static int fw_argmin(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  plan p;
  LM_TRY(plan_of("argmin", in[0], a, &p));
  return (*out = run(LM_ARGMIN, "argmin", in[0], &p, LM_I64)) ? 0 : -1;
}

/* t (the reduced shape) viewed with the reduced dim kept, so it broadcasts
 * against the input. */
static lm_tensor *keepdim_view(lm_scope *s, lm_tensor *t, const lm_tensor *x, const lm_attrs *a) {
  if (!t) return NULL;
  int64_t shape[LM_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  if (a->ni == 0) for (int d = 0; d < x->ndim; d++) shape[d] = 1;
  else shape[lm_wrap_dim("", "", a->i[0], x->ndim)] = 1;
  return lm_s(s, lm_view_of(t, x->ndim, shape, NULL, t->offset));
}

static lm_tensor *expand_to(lm_scope *s, lm_tensor *g, const lm_tensor *x) {
  if (!g) return NULL;
  lm_attrs e = {.ni = x->ndim};
  memcpy(e.i, x->shape, x->ndim * sizeof *x->shape);
  return lm_sop(s, "expand", 1, &g, &e);
}

static int bw_sum(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  lm_tensor *g = lm_s(&s, lm_contiguous(gout[0]));
  gin[0] = lm_grad_like(expand_to(&s, keepdim_view(&s, g, n->in[0], &n->attrs), n->in[0]), n->in[0]);
  lm_scope_end(&s);
  return gin[0] ? 0 : -1;
}

static int bw_mean(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  const lm_tensor *x = n->in[0];
  double count = n->attrs.ni == 0 ? (double)x->numel_ : (double)x->shape[lm_wrap_dim("", "", n->attrs.i[0], x->ndim)];
  lm_tensor *g = lm_s2(&s, "div", gout[0], lm_scalar(&s, count, gout[0]));
  g = g ? lm_s(&s, lm_contiguous(g)) : NULL;
  gin[0] = lm_grad_like(expand_to(&s, keepdim_view(&s, g, x, &n->attrs), x), x);
  lm_scope_end(&s);
  return gin[0] ? 0 : -1;
}

/* The gradient goes to the one element each index picked. */
static int bw_minmax(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  lm_tensor *x = n->in[0], *idx = lm_s(&s, lm_contiguous(n->out[1]));
  int64_t len = n->attrs.ni == 0 ? x->numel_ : x->shape[lm_wrap_dim("", "", n->attrs.i[0], x->ndim)];
  lm_tensor *pos = lm_s(&s, lm_arange(0, (double)len, 1, LM_I64, x->device_));
  int64_t shape[LM_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) shape[d] = 1;
  if (n->attrs.ni == 0) memcpy(shape, x->shape, sizeof shape);
  else shape[lm_wrap_dim("", "", n->attrs.i[0], x->ndim)] = len;
  lm_tensor *posv = pos ? lm_s(&s, lm_view_of(pos, x->ndim, shape, NULL, 0)) : NULL;
  lm_tensor *mask = lm_s2(&s, "eq", posv, keepdim_view(&s, idx, x, &n->attrs));
  lm_tensor *g = gout[0] ? lm_s(&s, lm_contiguous(gout[0])) : NULL;
  lm_tensor *w[3] = {mask, keepdim_view(&s, g, x, &n->attrs), lm_scalar(&s, 0, x)};
  gin[0] = lm_grad_like(lm_sop(&s, "where", 3, w, NULL), x);
  lm_scope_end(&s);
  return gin[0] ? 0 : -1;
}

#define OP(NAME, NOUT, BW) {#NAME, 1, NOUT, fw_##NAME, BW, lm_rule_reduce, 0}
const lm_op_def lm_ops_reduce[] = {
    OP(sum, 1, bw_sum), OP(mean, 1, bw_mean), OP(max, 2, bw_minmax), OP(min, 2, bw_minmax),
    OP(argmax, 1, NULL), OP(argmin, 1, NULL), {0}};
