/* reduce.c: sum, mean, max, min, argmax, argmin over one dim (attrs
 * i[0] = dim, i[1] = keepdim) or over all elements (no attrs). max and
 * min return (values, indices); indices are 0-based i64 in C. */
#include "op.h"
#include <string.h>

/* The dtype of a reduction's result. */
static int result_dtype(int op, int dtype) {
  switch (op) {
  case LM_OP_SUM: return lm_is_float(dtype) ? dtype : LM_I64;
  case LM_OP_ARGMAX: case LM_OP_ARGMIN: return LM_I64;
  default: return dtype == LM_BOOL ? LM_I64 : dtype;
  }
}

int lm_shape_reduce(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)nin;
  const lm_meta *x = &in[0];
  const char *name = lm_op_table[op].name;
  if (op == LM_OP_MEAN && !lm_is_float(x->dtype))
    return lm_error("mean: expected a floating point tensor, got %s", lm_dtype_name(x->dtype));
  out[0] = (lm_meta){.dtype = result_dtype(op, x->dtype)};
  if (a->ni > 0) {
    int d = lm_wrap_dim(name, "dim", a->i[0], x->ndim);
    if (d < 0) return -1;
    for (int k = 0; k < x->ndim; k++)
      if (k != d || (a->ni > 1 && a->i[1])) out->shape[out->ndim++] = k == d ? 1 : x->shape[k];
  }
  if (lm_op_table[op].nout == 2) out[1] = out[0], out[1].dtype = LM_I64;
  return 0;
}

typedef struct {
  int64_t outer, n, inner;
} plan;

static plan plan_of(const lm_tensor *x, const lm_attrs *a) {
  if (a->ni == 0) return (plan){1, x->numel_, 1};
  int d = lm_wrap_dim("", "", a->i[0], x->ndim);
  plan p = {1, x->ndim ? x->shape_[d] : 1, 1};
  for (int k = 0; k < x->ndim; k++) {
    if (k < d) p.outer *= x->shape_[k];
    if (k > d) p.inner *= x->shape_[k];
  }
  return p;
}

/* Runs one kernel kind into a tensor of meta m's shape and dtype. */
static lm_tensor *run(int op, int kind, lm_tensor *x, const lm_attrs *a, const lm_meta *m) {
  plan p = plan_of(x, a);
  int cd = lm_compute_dtype(x->dtype_ == LM_BOOL ? LM_I64 : x->dtype_);
  bool arg = kind == LM_ARGMAX || kind == LM_ARGMIN;
  if (p.n == 0 && kind != LM_SUM) {
    lm_error("%s: cannot reduce over an empty dim", lm_op_table[op].name);
    return NULL;
  }
  const lm_backend *be = LM_KERNEL(op, x, reduce);
  lm_scope s = {0};
  lm_tensor *c = be ? lm_s_contig(&s, lm_s_cast(&s, x, cd)) : NULL;
  lm_tensor *o = c ? lm_s(&s, lm_empty_as(x, m->ndim, m->shape, arg ? LM_I64 : cd)) : NULL;
  lm_tensor *r = o && be->reduce(kind, o, c, p.outer, p.n, p.inner) == 0 ? lm_cast(o, m->dtype) : NULL;
  lm_scope_end(&s);
  return r;
}

int lm_fw_sum(const lm_call *c, lm_tensor **out) {
  return (*out = run(c->op, LM_SUM, c->in[0], c->a, &c->out[0])) ? 0 : -1;
}

int lm_fw_mean(const lm_call *c, lm_tensor **out) {
  lm_tensor *x = c->in[0];
  lm_meta m = c->out[0];
  m.dtype = lm_compute_dtype(x->dtype_);
  lm_scope s = {0};
  lm_tensor *sum = lm_s(&s, run(c->op, LM_SUM, x, c->a, &m));
  lm_tensor *r = lm_s2(&s, LM_OP_DIV, sum, lm_scalar(&s, (double)plan_of(x, c->a).n, sum));
  *out = r ? lm_cast(r, c->out[0].dtype) : NULL;
  lm_scope_end(&s);
  return *out ? 0 : -1;
}

int lm_fw_minmax(const lm_call *c, lm_tensor **out) {
  int kind = lm_op_table[c->op].kind;
  out[0] = run(c->op, kind, c->in[0], c->a, &c->out[0]);
  out[1] = out[0] ? run(c->op, kind == LM_MAX ? LM_ARGMAX : LM_ARGMIN, c->in[0], c->a, &c->out[1]) : NULL;
  return out[1] ? 0 : -1;
}

int lm_fw_arg(const lm_call *c, lm_tensor **out) {
  return (*out = run(c->op, lm_op_table[c->op].kind, c->in[0], c->a, &c->out[0])) ? 0 : -1;
}

/* t (the reduced shape) viewed with the reduced dim kept, so it broadcasts
 * against the input. */
static lm_tensor *keepdim_view(lm_scope *s, lm_tensor *t, const lm_tensor *x, const lm_attrs *a) {
  if (!t) return NULL;
  int64_t shape[LM_MAX_DIMS];
  memcpy(shape, x->shape_, sizeof shape);
  if (a->ni == 0) for (int d = 0; d < x->ndim; d++) shape[d] = 1;
  else shape[lm_wrap_dim("", "", a->i[0], x->ndim)] = 1;
  return lm_s(s, lm_view_of(t, x->ndim, shape, NULL, t->offset));
}

static lm_tensor *expand_to(lm_scope *s, lm_tensor *g, const lm_tensor *x) {
  if (!g) return NULL;
  lm_attrs e = {.ni = x->ndim};
  memcpy(e.i, x->shape_, x->ndim * sizeof *x->shape_);
  return lm_sop(s, LM_OP_EXPAND, 1, &g, &e);
}

int lm_bw_sum(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  lm_tensor *g = lm_s(&s, lm_contiguous(gout[0]));
  gin[0] = lm_grad_like(expand_to(&s, keepdim_view(&s, g, n->in[0], &n->attrs), n->in[0]), n->in[0]);
  lm_scope_end(&s);
  return gin[0] ? 0 : -1;
}

int lm_bw_mean(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  const lm_tensor *x = n->in[0];
  double count = n->attrs.ni == 0 ? (double)x->numel_ : (double)x->shape_[lm_wrap_dim("", "", n->attrs.i[0], x->ndim)];
  lm_tensor *g = lm_s2(&s, LM_OP_DIV, gout[0], lm_scalar(&s, count, gout[0]));
  g = g ? lm_s(&s, lm_contiguous(g)) : NULL;
  gin[0] = lm_grad_like(expand_to(&s, keepdim_view(&s, g, x, &n->attrs), x), x);
  lm_scope_end(&s);
  return gin[0] ? 0 : -1;
}

/* The gradient goes to the one element each index picked. */
int lm_bw_minmax(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  lm_tensor *x = n->in[0], *idx = lm_s(&s, lm_contiguous(n->out[1]));
  int64_t len = n->attrs.ni == 0 ? x->numel_ : x->shape_[lm_wrap_dim("", "", n->attrs.i[0], x->ndim)];
  lm_tensor *pos = lm_s(&s, lm_arange(0, (double)len, 1, LM_I64, x->device_));
  int64_t shape[LM_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) shape[d] = 1;
  if (n->attrs.ni == 0) memcpy(shape, x->shape_, sizeof shape);
  else shape[lm_wrap_dim("", "", n->attrs.i[0], x->ndim)] = len;
  lm_tensor *posv = pos ? lm_s(&s, lm_view_of(pos, x->ndim, shape, NULL, 0)) : NULL;
  lm_tensor *mask = lm_s2(&s, LM_OP_EQ, posv, keepdim_view(&s, idx, x, &n->attrs));
  lm_tensor *g = gout[0] ? lm_s(&s, lm_contiguous(gout[0])) : NULL;
  lm_tensor *w[3] = {mask, keepdim_view(&s, g, x, &n->attrs), lm_scalar(&s, 0, x)};
  gin[0] = lm_grad_like(lm_sop(&s, LM_OP_WHERE, 3, w, NULL), x);
  lm_scope_end(&s);
  return gin[0] ? 0 : -1;
}

