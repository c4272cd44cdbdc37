/* norm.c: layer_norm and rms_norm with their backward passes (fused per
 * row where the backend has the kernels). Floats compute in f32 (f64 stays
 * f64) and round once to the input's dtype. */
#include "op.h"
#include <string.h>

/* ---- layer_norm(x [, w] [, b]) and rms_norm(x [, w]) ----
 * attrs: i[0] = number of trailing dims normalized (k >= 1), i[1] = 1 when
 * w is given, i[2] = 1 when b is given (layer_norm), f[0] = eps. Without
 * i[1]/i[2] the inputs present are taken in order. w and b have the shape
 * of x's last k dims. A second output, stats (2, x's leading dims) in the
 * compute dtype, holds each row's mean (0 for rms_norm) and rstd: the fused
 * backward reads them, as PyTorch's native_layer_norm saves them. It is
 * not differentiable (a gradient reaching it is ignored); the Lua faces
 * return the first output only. The composed backward recomputes them. */
typedef struct { int rms, k, has_w, has_b; double eps; int64_t rows, n; } norm_plan;

static double default_eps(int rms, int dtype) {
  if (!rms) return 1e-5;
  switch (dtype) { /* torch.finfo(dtype).eps, as rms_norm's eps=None */
  case LM_F64: return 2.220446049250313e-16;
  case LM_BF16: return 0.0078125;
  case LM_F16: return 0.0009765625;
  default: return 1.1920928955078125e-07;
  }
}

static int norm_plan_of(int op, int nin, const lm_meta *in, const lm_attrs *a, norm_plan *p) {
  const char *name = lm_op_table[op].name;
  int rms = op == LM_OP_RMS_NORM, maxin = rms ? 2 : 3;
  if (nin < 1 || nin > maxin)
    return lm_error("%s: expected 1 to %d tensor arguments, got %d", name, maxin, nin);
  const lm_meta *x = &in[0];
  LM_TRY(lm_need_float(name, 1, "input", x));
  p->rms = rms;
  p->k = a->ni >= 1 ? (int)a->i[0] : 1;
  p->has_w = a->ni >= 2 ? a->i[1] != 0 : nin >= 2;
  p->has_b = rms ? 0 : a->ni >= 3 ? a->i[2] != 0 : nin >= 3;
  p->eps = a->nf >= 1 ? a->f[0] : default_eps(rms, x->dtype);
  if (1 + p->has_w + p->has_b != nin)
    return lm_error("%s: attrs announce %d tensor arguments (input%s%s), got %d", name,
                    1 + p->has_w + p->has_b, p->has_w ? ", weight" : "", p->has_b ? ", bias" : "",
                    nin);
  if (p->k < 1 || p->k > x->ndim)
    return lm_error("%s: normalized shape expected 1 to %d dims (the input has %d), got %d", name,
                    x->ndim, x->ndim, p->k);
  if (!(p->eps >= 0)) return lm_error("%s: eps expected a number >= 0, got %g", name, p->eps);
  p->n = lm_shape_numel(p->k, x->shape + x->ndim - p->k);
  p->rows = lm_shape_numel(x->ndim - p->k, x->shape);
  for (int j = 1; j < nin; j++) {
    const lm_meta *t = &in[j];
    const char *arg = j == 1 && p->has_w ? "weight" : "bias";
    LM_TRY(lm_need_float(name, j + 1, arg, t));
    bool ok = t->ndim == p->k && !memcmp(t->shape, x->shape + x->ndim - p->k, p->k * sizeof *t->shape);
    if (!ok)
      return lm_error("%s: argument #%d (%s) expected the shape of the input's last %d dim%s", name,
                      j + 1, arg, p->k, p->k > 1 ? "s" : "");
  }
  return 0;
}

int lm_shape_norm(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  norm_plan p;
  LM_TRY(norm_plan_of(op, nin, in, a, &p));
  out[0] = in[0];
  int lead = in[0].ndim - p.k;
  out[1] = (lm_meta){.ndim = lead + 1, .dtype = lm_compute_dtype(in[0].dtype), .shape = {2}};
  memcpy(out[1].shape + 1, in[0].shape, lead * sizeof *in[0].shape);
  return 0;
}

/* row r of a contiguous (2, rows) tensor: a contiguous (rows) view */
static lm_tensor *stats_row(lm_scope *s, lm_tensor *st, int r) {
  int64_t rows = st->numel_ / 2;
  return lm_s(s, lm_view_of(st, 1, &rows, NULL, st->offset + r * rows));
}

static int plan_of_tensors(int op, int nin, lm_tensor *const *in, const lm_attrs *a, norm_plan *p) {
  lm_meta m[3];
  for (int i = 0; i < nin && i < 3; i++) m[i] = lm_meta_of(in[i]);
  return norm_plan_of(op, nin, m, a, p);
}

/* t (w or b) as a dense (n) vector in cd, or NULL for NULL */
static lm_tensor *vec_of(lm_scope *s, lm_tensor *t, int cd, const int64_t *n) {
  return t ? lm_s_reshape(s, lm_s_contig(s, lm_s_cast(s, t, cd)), 1, n) : NULL;
}

/* x as (rows, n) in cd, and stats (2, rows) = mean, rstd from the kernel;
 * w/b (n) or NULL */
static int norm_run(lm_scope *s, int op, const norm_plan *p, lm_tensor *x, lm_tensor *w,
                    lm_tensor *b, int cd, lm_tensor **x2, lm_tensor **out, lm_tensor **stats) {
  const lm_backend *be = LM_KERNEL(op, x, norm);
  if (!be) return -1;
  int64_t shape2[2] = {p->rows, p->n}, sshape[2] = {2, p->rows};
  *x2 = lm_s_reshape(s, lm_s_contig(s, lm_s_cast(s, x, cd)), 2, shape2);
  lm_tensor *w1 = vec_of(s, w, cd, &p->n), *b1 = vec_of(s, b, cd, &p->n);
  if (!*x2 || (w && !w1) || (b && !b1)) return -1;
  *out = lm_s(s, lm_empty(2, shape2, cd, x->device_));
  *stats = lm_s(s, lm_empty(2, sshape, cd, x->device_));
  lm_tensor *mean = *stats ? stats_row(s, *stats, 0) : NULL, *rstd = *stats ? stats_row(s, *stats, 1) : NULL;
  if (!*out || !mean || !rstd) return -1;
  return be->norm(*out, mean, rstd, *x2, w1, b1, p->eps, p->rms);
}

int lm_fw_norm(const lm_call *c, lm_tensor **out) {
  norm_plan p;
  LM_TRY(plan_of_tensors(c->op, c->nin, c->in, c->a, &p));
  lm_tensor *x = c->in[0], *w = p.has_w ? c->in[1] : NULL, *b = p.has_b ? c->in[1 + p.has_w] : NULL;
  lm_scope s = {0};
  lm_tensor *x2, *o, *st;
  int rc = norm_run(&s, c->op, &p, x, w, b, lm_compute_dtype(x->dtype_), &x2, &o, &st);
  lm_tensor *r = rc == 0 ? lm_s_reshape(&s, o, x->ndim, x->shape_) : NULL;
  lm_tensor *r1 = rc == 0 ? lm_s_reshape(&s, st, c->out[1].ndim, c->out[1].shape) : NULL;
  out[0] = r ? lm_cast(r, x->dtype_) : NULL;
  if ((out[1] = r1)) lm_retain(r1);
  lm_scope_end(&s);
  return out[0] && out[1] ? 0 : -1;
}

/* dx, dw, db in one pass of the backend's norm_bwd kernel, from the stats
 * the forward saved */
static int norm_bwd_fused(const lm_backend *be, const lm_saved *n, const norm_plan *p,
                          lm_tensor *g, lm_tensor **gin) {
  lm_tensor *x = n->in[0], *w = p->has_w ? n->in[1] : NULL, *b = p->has_b ? n->in[1 + p->has_w] : NULL;
  int cd = lm_compute_dtype(x->dtype_);
  int64_t shape2[2] = {p->rows, p->n}, sshape[2] = {2, p->rows};
  lm_scope s = {0};
  lm_tensor *x2 = lm_s_reshape(&s, lm_s_contig(&s, lm_s_cast(&s, x, cd)), 2, shape2);
  lm_tensor *g2 = lm_s_reshape(&s, lm_s_contig(&s, lm_s_cast(&s, g, cd)), 2, shape2);
  lm_tensor *st = lm_s_reshape(&s, lm_s_contig(&s, lm_s_cast(&s, n->out[1], cd)), 2, sshape);
  lm_tensor *w1 = vec_of(&s, w, cd, &p->n), *dw = NULL, *db = NULL;
  lm_tensor *dx = x2 ? lm_s(&s, lm_empty(2, shape2, cd, x->device_)) : NULL;
  lm_tensor *mean = st ? stats_row(&s, st, 0) : NULL, *rstd = st ? stats_row(&s, st, 1) : NULL;
  bool ok = g2 && dx && mean && rstd && (!w || w1);
  if (ok && w && w->needs_grad) ok = (dw = lm_s(&s, lm_empty(1, &p->n, cd, x->device_))) != NULL;
  if (ok && b && b->needs_grad) ok = (db = lm_s(&s, lm_empty(1, &p->n, cd, x->device_))) != NULL;
  int rc = ok ? be->norm_bwd(dx, dw, db, g2, x2, w1, mean, rstd, p->rms) : -1;
  if (rc == 0) rc = lm_give(n, gin, 0, lm_s_reshape(&s, dx, x->ndim, x->shape_));
  if (rc == 0 && dw) rc = lm_give(n, gin, 1, lm_s_reshape(&s, dw, w->ndim, w->shape_));
  if (rc == 0 && db) rc = lm_give(n, gin, 1 + p->has_w, lm_s_reshape(&s, db, b->ndim, b->shape_));
  lm_scope_end(&s);
  return rc;
}

int lm_bw_norm(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  norm_plan p;
  LM_TRY(plan_of_tensors(n->op, n->nin, n->in, &n->attrs, &p));
  lm_tensor *x = n->in[0], *w = p.has_w ? n->in[1] : NULL, *b = p.has_b ? n->in[1 + p.has_w] : NULL;
  const lm_backend *be = LM_FUSED(x, norm_bwd);
  if (be) return norm_bwd_fused(be, n, &p, gout[0], gin);
  int cd = lm_compute_dtype(x->dtype_);
  lm_scope s = {0};
  lm_tensor *x2, *xhat, *st; /* the kernel without w, b gives xhat */
  int rc = norm_run(&s, n->op, &p, x, NULL, NULL, cd, &x2, &xhat, &st);
  if (rc < 0) { lm_scope_end(&s); return -1; }
  int64_t col[2] = {p.rows, 1}, shape2[2] = {p.rows, p.n};
  lm_tensor *r = lm_s_reshape(&s, stats_row(&s, st, 1), 2, col);
  lm_tensor *g = lm_s_reshape(&s, lm_s_contig(&s, lm_s_cast(&s, gout[0], cd)), 2, shape2);
  lm_tensor *w1 = w ? lm_s_reshape(&s, lm_s_contig(&s, lm_s_cast(&s, w, cd)), 1, &p.n) : NULL;
  lm_tensor *gh = w ? lm_s2(&s, LM_OP_MUL, g, w1) : g;
  if (x->needs_grad) { /* rstd * (gh - mean(gh) - xhat * mean(gh * xhat)) */
    lm_attrs mean1 = {.i = {1, 1}, .ni = 2};
    lm_tensor *ghx = lm_s2(&s, LM_OP_MUL, gh, xhat);
    lm_tensor *t = lm_s2(&s, LM_OP_SUB, gh, lm_s2(&s, LM_OP_MUL, xhat, lm_sop(&s, LM_OP_MEAN, 1, &ghx, &mean1)));
    if (!p.rms) t = lm_s2(&s, LM_OP_SUB, t, lm_sop(&s, LM_OP_MEAN, 1, &gh, &mean1));
    lm_tensor *dx = lm_s2(&s, LM_OP_MUL, t, r);
    rc |= lm_give(n, gin, 0, dx ? lm_s_reshape(&s, dx, x->ndim, x->shape_) : NULL);
  }
  if (w && w->needs_grad) {
    lm_tensor *dw = lm_s_sum(&s, lm_s2(&s, LM_OP_MUL, g, xhat), 0, 0);
    rc |= lm_give(n, gin, 1, dw ? lm_s_reshape(&s, dw, w->ndim, w->shape_) : NULL);
  }
  if (b && b->needs_grad) {
    lm_tensor *db = lm_s_sum(&s, g, 0, 0);
    rc |= lm_give(n, gin, 1 + p.has_w, db ? lm_s_reshape(&s, db, b->ndim, b->shape_) : NULL);
  }
  lm_scope_end(&s);
  return rc ? -1 : 0;
}
