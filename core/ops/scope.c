/* scope.c: what formulas (backward passes, forwards built from ops) share:
 * owned intermediates (lm_scope), op helpers with attrs, and gradients
 * summed back over broadcast dims. */
#include "op.h"
#include <math.h>
#include <string.h>

lm_tensor *lm_s(lm_scope *s, lm_tensor *t) {
  if (!t) return NULL;
  if (s->n == (int)(sizeof s->t / sizeof *s->t)) {
    lm_release(t);
    lm_error("scope: more than %d intermediates", s->n);
    return NULL;
  }
  return s->t[s->n++] = t;
}

lm_tensor *lm_sop(lm_scope *s, int op, int nin, lm_tensor *const *in, const lm_attrs *a) {
  for (int i = 0; i < nin; i++) if (!in[i]) return NULL;
  return lm_s(s, lm_run(op, nin, in, a));
}

lm_tensor *lm_s1(lm_scope *s, int op, lm_tensor *x) { return lm_sop(s, op, 1, &x, NULL); }

lm_tensor *lm_s1f(lm_scope *s, int op, lm_tensor *x, double f0) {
  lm_attrs a = {.f = {f0}, .nf = 1};
  return lm_sop(s, op, 1, &x, &a);
}

lm_tensor *lm_s2(lm_scope *s, int op, lm_tensor *a, lm_tensor *b) {
  lm_tensor *in[2] = {a, b};
  return lm_sop(s, op, 2, in, NULL);
}

lm_tensor *lm_scalar(lm_scope *s, double v, const lm_tensor *like) {
  if (!like) return NULL;
  lm_tensor *t = lm_s(s, lm_empty(0, NULL, like->dtype_, like->device_));
  return t && lm_fill_(t, v) == 0 ? t : NULL;
}

void lm_scope_end(lm_scope *s) {
  while (s->n) lm_release(s->t[--s->n]);
}

lm_tensor *lm_s_reshape(lm_scope *s, lm_tensor *x, int nd, const int64_t *shape) {
  lm_attrs a = {.ni = nd};
  memcpy(a.i, shape, nd * sizeof *shape);
  return lm_sop(s, LM_OP_RESHAPE, 1, &x, &a);
}

lm_tensor *lm_s_sum(lm_scope *s, lm_tensor *x, int dim, int keepdim) {
  lm_attrs a = {.i = {dim, keepdim}, .ni = 2};
  return lm_sop(s, LM_OP_SUM, 1, &x, &a);
}

lm_tensor *lm_s_transpose(lm_scope *s, lm_tensor *x, int d0, int d1) {
  lm_attrs a = {.i = {d0, d1}, .ni = 2};
  return lm_sop(s, LM_OP_TRANSPOSE, 1, &x, &a);
}

lm_tensor *lm_s_where(lm_scope *s, lm_tensor *cond, lm_tensor *a, lm_tensor *b) {
  lm_tensor *in[3] = {cond, a, b};
  return lm_sop(s, LM_OP_WHERE, 3, in, NULL);
}

lm_tensor *lm_s_cast(lm_scope *s, lm_tensor *x, int dtype) { return x ? lm_s(s, lm_cast(x, dtype)) : NULL; }
lm_tensor *lm_s_contig(lm_scope *s, lm_tensor *x) { return x ? lm_s(s, lm_contiguous(x)) : NULL; }

lm_tensor *lm_s_mulk(lm_scope *s, lm_tensor *x, double k) {
  return lm_s2(s, LM_OP_MUL, x, lm_scalar(s, k, x));
}

lm_tensor *lm_s_arange(lm_scope *s, int64_t n, int device) {
  return lm_s(s, lm_arange(0, (double)n, 1, LM_I64, device));
}

lm_tensor *lm_s_logsumexp(lm_scope *s, lm_tensor *x, int dim) {
  lm_attrs a = {.i = {dim, 1}, .ni = 2};
  lm_tensor *m = lm_sop(s, LM_OP_MAX, 1, &x, &a);
  /* a row of -inf (or one holding +inf) is shifted by 0: its -inf (inf) comes
   * out of log(sum(exp(x))) and not NaN from inf - inf, as torch.logsumexp */
  m = lm_s_where(s, lm_s2(s, LM_OP_EQ, lm_s1(s, LM_OP_ABS, m), lm_scalar(s, INFINITY, m)), lm_scalar(s, 0, m), m);
  lm_tensor *e = lm_s1(s, LM_OP_EXP, lm_s2(s, LM_OP_SUB, x, m));
  return lm_s2(s, LM_OP_ADD, m, lm_s1(s, LM_OP_LOG, lm_s_sum(s, e, dim, 1)));
}

lm_tensor *lm_grad_like(lm_tensor *g, const lm_tensor *t) { return lm_grad_as(g, t, t->dtype_); }

int lm_grad_dtype(const lm_saved *s, int i) {
  return i < 32 && (s->wide_grad >> i & 1) ? LM_F32 : s->in[i]->dtype_;
}

lm_tensor *lm_grad_as(lm_tensor *g, const lm_tensor *t, int dtype) {
  if (!g) return NULL;
  lm_retain(g);
  int lead = g->ndim - t->ndim;
  for (int d = g->ndim - 1; d >= 0; d--) {
    if (d >= lead && (t->shape_[d - lead] != 1 || g->shape_[d] == 1)) continue;
    lm_attrs a = {.i = {d, 1}, .ni = 2};
    lm_tensor *s = lm_run(LM_OP_SUM, 1, &g, &a);
    lm_release(g);
    if (!(g = s)) return NULL;
  }
  if (g->ndim != t->ndim) {
    lm_attrs a = {.ni = t->ndim};
    memcpy(a.i, t->shape_, t->ndim * sizeof *t->shape_);
    lm_tensor *v = lm_run(LM_OP_RESHAPE, 1, &g, &a);
    lm_release(g);
    if (!(g = v)) return NULL;
  }
  lm_tensor *c = lm_cast(g, dtype);
  lm_release(g);
  return c;
}

int lm_give(const lm_saved *s, lm_tensor **gin, int i, lm_tensor *g) {
  if (i >= s->nin || !s->in[i]->needs_grad) return 0;
  gin[i] = lm_grad_like(g, s->in[i]);
  return gin[i] ? 0 : -1;
}
