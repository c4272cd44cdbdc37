/* cross_entropy.c: cross entropy over class ids or probabilities, with
 * class weights, ignore_index and label smoothing, and its backward: one
 * pass per row where the backend has the fused kernel, else composed of
 * log_softmax and reductions. Class ids are 0-based here; messages print
 * them 1-based. Floats compute in f32 (f64 stays f64). */
#include "op.h"
#include <string.h>

/* ---- cross_entropy(logits, target [, weight]) ----
 * logits (N, C) or (C); target: integer class ids (N) or () 0-based, or
 * float probabilities of the logits' shape; weight (C). attrs: i[0] =
 * ignore_index (-100), i[1] = reduction (0 none, 1 mean, 2 sum), f[0] =
 * label_smoothing. PyTorch's semantics: with class ids, mean divides by the
 * summed weights of the targets not ignored, and smoothing spreads
 * eps/C * weight_c over the classes (zero for ignored targets). */
typedef struct {
  int probs, red, cd;
  int64_t N, C, ignore;
  double eps;
} ce_plan;

static int ce_plan_of(int nin, const lm_meta *in, const lm_attrs *a, ce_plan *p) {
  const char *op = "cross_entropy";
  if (nin < 2 || nin > 3) return lm_error("%s: expected 2 or 3 tensor arguments, got %d", op, nin);
  const lm_meta *x = &in[0], *t = &in[1];
  LM_TRY(lm_need_float(op, 1, "input", x));
  if (x->ndim != 1 && x->ndim != 2)
    return lm_error("%s: argument #1 (input) expected logits of shape (N, C) or (C), got %d dims "
                    "(reshape (B, T, C) to (B*T, C) first)", op, x->ndim);
  p->C = x->shape[x->ndim - 1];
  p->N = x->ndim == 2 ? x->shape[0] : 1;
  p->cd = lm_compute_dtype(x->dtype);
  p->ignore = a->ni >= 1 ? a->i[0] : -100;
  p->red = a->ni >= 2 ? (int)a->i[1] : 1;
  p->eps = a->nf >= 1 ? a->f[0] : 0;
  if (p->red < 0 || p->red > 2)
    return lm_error("%s: reduction expected 0 (none), 1 (mean) or 2 (sum), got %d", op, p->red);
  if (!(p->eps >= 0 && p->eps <= 1))
    return lm_error("%s: label_smoothing expected a number in [0, 1], got %g", op, p->eps);
  p->probs = lm_is_float(t->dtype);
  if (p->probs) {
    if (t->ndim != x->ndim || memcmp(t->shape, x->shape, x->ndim * sizeof *x->shape))
      return lm_error("%s: argument #2 (target) holds probabilities and expected the input's shape", op);
  } else {
    if (t->dtype != LM_I64 && t->dtype != LM_I32)
      return lm_error("%s: argument #2 (target) expected integer class ids or float probabilities, got %s",
                      op, lm_dtype_name(t->dtype));
    if (x->ndim == 2 ? t->ndim != 1 || t->shape[0] != p->N : t->ndim != 0)
      return lm_error("%s: argument #2 (target) expected class ids of shape %s, got %d dims%s", op,
                      x->ndim == 2 ? "(N) for input (N, C)" : "() for input (C)", t->ndim,
                      t->ndim == 1 && x->ndim == 2 ? " with another N" : "");
  }
  if (nin == 3) {
    LM_TRY(lm_need_float(op, 3, "weight", &in[2]));
    if (in[2].ndim != 1 || in[2].shape[0] != p->C)
      return lm_error("%s: argument #3 (weight) expected shape (%lld), one weight per class", op,
                      (long long)p->C);
  }
  return 0;
}

/* Outputs: the loss, and lse (N) or () in cd, the log-sum-exp of each row of
 * logits, which the fused backward reads (not differentiable: a gradient
 * reaching it is ignored; loom.F returns the loss only). */
int lm_shape_cross_entropy(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op;
  ce_plan p = {0};
  LM_TRY(ce_plan_of(nin, in, a, &p));
  out[0] = (lm_meta){.ndim = p.red == 0 ? in[0].ndim - 1 : 0, .dtype = in[0].dtype};
  if (p.red == 0 && in[0].ndim == 2) out[0].shape[0] = p.N;
  out[1] = (lm_meta){.ndim = in[0].ndim - 1, .dtype = p.cd, .shape = {p.N}};
  return 0;
}

static int ce_plan_tensors(int nin, lm_tensor *const *in, const lm_attrs *a, ce_plan *p) {
  lm_meta m[3];
  for (int i = 0; i < nin && i < 3; i++) m[i] = lm_meta_of(in[i]);
  return ce_plan_of(nin, m, a, p);
}

/* What forward and backward share: logits (N, C) in cd; for class ids the
 * ids made safe (N) i64, the mask of kept targets vb (N, 1) bool, wt = the
 * target's weight (N, 1) (1 without weight, 0 where ignored), sumw = the
 * summed weights (scalar); w (1, C) in cd or NULL; q (N, C), the target
 * distribution with smoothing and weights (probabilities only). */
typedef struct { lm_tensor *x, *ids, *vb, *wt, *w, *q; double sumw; } ce_parts;

/* rows (R, 1) of a contiguous table picked by ids (N): (N, 1) */
static lm_tensor *pick_rows(lm_scope *s, lm_tensor *table, lm_tensor *ids) {
  const lm_backend *be = LM_KERNEL(LM_OP_CROSS_ENTROPY, table, embedding);
  if (!be || !ids) return NULL;
  int64_t shape[2] = {table->numel_, 1}, oshape[2] = {ids->numel_, 1};
  lm_tensor *t = lm_s_reshape(s, lm_s_contig(s, table), 2, shape);
  lm_tensor *o = lm_s(s, lm_empty(2, oshape, table->dtype_, table->device_));
  if (!t || !o || be->embedding(o, t, ids) < 0) return NULL;
  return o;
}

/* the scalar sum of the weights, read on the host */
static int sum_of_weights(lm_scope *s, lm_tensor *w, double *sumw) {
  lm_tensor *sw = lm_s_cast(s, lm_s1(s, LM_OP_SUM, w), LM_F64), *h = sw;
  if (sw && sw->device_ != LM_CPU) {
    h = lm_s(s, lm_empty(0, NULL, LM_F64, LM_CPU));
    if (h && lm_copy_(h, sw) < 0) h = NULL;
  }
  if (!h) return -1;
  *sumw = *(const double *)lm_ptr(h);
  return 0;
}

/* For class ids target (N) or (): the mask of kept targets vb (N, 1) bool,
 * the ids made safe (N, 1) i64, and wt (N, 1) in like's dtype, the target's
 * weight (1 without w, 0 where ignored); w (1, C) or NULL. */
static int ce_targets(lm_scope *s, const ce_plan *p, lm_tensor *target, lm_tensor *w, lm_tensor *like,
                      lm_tensor **vb, lm_tensor **safe, lm_tensor **wt) {
  int64_t col[2] = {p->N, 1};
  lm_tensor *t = lm_s_reshape(s, lm_s_cast(s, target, LM_I64), 2, col);
  *vb = lm_s2(s, LM_OP_NE, t, lm_scalar(s, (double)p->ignore, t));
  *safe = lm_s_contig(s, lm_s_where(s, *vb, t, lm_scalar(s, 0, t)));
  lm_tensor *tw = w ? pick_rows(s, w, *safe) : lm_scalar(s, 1, like);
  *wt = lm_s_where(s, *vb, tw, lm_scalar(s, 0, like));
  return *wt ? 0 : -1;
}

static int ce_prepare(lm_scope *s, const ce_plan *p, lm_tensor *const *in, int nin, ce_parts *c) {
  memset(c, 0, sizeof *c);
  int64_t shape2[2] = {p->N, p->C}, col[2] = {p->N, 1}, row[2] = {1, p->C};
  c->x = lm_s_reshape(s, lm_s_cast(s, in[0], p->cd), 2, shape2);
  if (nin == 3) c->w = lm_s_reshape(s, lm_s_cast(s, in[2], p->cd), 2, row);
  if (!c->x || (nin == 3 && !c->w)) return -1;
  double eps = p->eps, C = (double)p->C;
  if (p->probs) { /* q = w * ((1 - eps) * t + eps / C) */
    lm_tensor *t = lm_s_reshape(s, lm_s_cast(s, in[1], p->cd), 2, shape2);
    lm_tensor *q = eps > 0 ? lm_s2(s, LM_OP_ADD, lm_s_mulk(s, t, 1 - eps), lm_scalar(s, eps / C, c->x)) : t;
    c->q = c->w ? lm_s2(s, LM_OP_MUL, q, c->w) : q;
    return c->q ? 0 : -1;
  }
  lm_tensor *safe;
  LM_TRY(ce_targets(s, p, in[1], c->w, c->x, &c->vb, &safe, &c->wt));
  /* ids into the flattened (N*C) logits: n*C + t */
  lm_tensor *base = lm_s_reshape(s, lm_s_mulk(s, lm_s_arange(s, p->N, in[0]->device_), C), 2, col);
  c->ids = lm_s_contig(s, lm_s2(s, LM_OP_ADD, base, safe));
  c->sumw = C;
  if (eps > 0 && c->w && sum_of_weights(s, c->w, &c->sumw) < 0) return -1;
  return c->ids && c->wt ? 0 : -1;
}

/* the divisor of reduction mean, as a 0-dim tensor in cd */
static lm_tensor *ce_divisor(lm_scope *s, const ce_plan *p, const ce_parts *c) {
  if (p->probs) return lm_scalar(s, (double)p->N, c->x);
  return lm_s1(s, LM_OP_SUM, c->wt);
}

/* ---- the fused path (class ids): one pass per row of logits ---- */

/* dense operands in cd: x (N, C), target (N) i64, w (C) or NULL */
/* the dense operands of the fused kernels: logits in xdt (their own
 * bf16/f16 where the kernel takes it: no N x C f32 copy), weights in cd */
static int ce_dense(lm_scope *s, const ce_plan *p, lm_tensor *const *in, int nin, int xdt, lm_tensor **x,
                    lm_tensor **t, lm_tensor **w) {
  int64_t shape2[2] = {p->N, p->C};
  *x = lm_s_reshape(s, lm_s_contig(s, lm_s_cast(s, in[0], xdt)), 2, shape2);
  *t = lm_s_reshape(s, lm_s_contig(s, lm_s_cast(s, in[1], LM_I64)), 1, &p->N);
  *w = nin == 3 ? lm_s_contig(s, lm_s_cast(s, in[2], p->cd)) : NULL;
  return *x && *t && (nin < 3 || *w) ? 0 : -1;
}

/* the dtype to try the fused kernels with first: the logits' own when low
 * precision, then (a kernel answering LM_UNSUPPORTED) the compute dtype */
static int ce_first_dtype(const ce_plan *p, const lm_tensor *x) {
  return x->dtype_ == LM_BF16 || x->dtype_ == LM_F16 ? x->dtype_ : p->cd;
}

/* the divisor of reduction mean for class ids: the summed target weights */
static lm_tensor *ce_id_divisor(lm_scope *s, const ce_plan *p, lm_tensor *const *in, int nin, lm_tensor *like) {
  int64_t row[2] = {1, p->C};
  lm_tensor *w = nin == 3 ? lm_s_reshape(s, lm_s_cast(s, in[2], p->cd), 2, row) : NULL, *vb, *safe, *wt;
  if ((nin == 3 && !w) || ce_targets(s, p, in[1], w, like, &vb, &safe, &wt) < 0) return NULL;
  return lm_s1(s, LM_OP_SUM, wt);
}

static int ce_fw_fused_as(const lm_backend *be, const lm_call *call, const ce_plan *p, int xdt, lm_tensor **out) {
  lm_tensor *const *in = call->in;
  lm_scope s = {0};
  lm_tensor *x, *t, *w, *loss = NULL, *lse = NULL, *r = NULL;
  if (ce_dense(&s, p, in, call->nin, xdt, &x, &t, &w) == 0) {
    loss = lm_s(&s, lm_empty(1, &p->N, p->cd, x->device_));
    lse = lm_s(&s, lm_empty(1, &p->N, p->cd, x->device_));
  }
  int rc = loss && lse ? be->cross_entropy(loss, lse, x, t, w, p->ignore, p->eps) : -1;
  if (rc == 0) {
    if (p->red == 0) r = lm_s_reshape(&s, loss, call->out[0].ndim, call->out[0].shape);
    else r = lm_s1(&s, LM_OP_SUM, loss);
    if (r && p->red == 1) r = lm_s2(&s, LM_OP_DIV, r, ce_id_divisor(&s, p, in, call->nin, loss)); /* in cd */
  }
  lm_tensor *l1 = r ? lm_s_reshape(&s, lse, call->out[1].ndim, call->out[1].shape) : NULL;
  out[0] = l1 ? lm_cast(r, in[0]->dtype_) : NULL;
  if (out[0]) lm_retain(out[1] = l1);
  lm_scope_end(&s);
  return out[0] ? 0 : rc == LM_UNSUPPORTED ? rc : -1;
}

static int ce_fw_fused(const lm_backend *be, const lm_call *call, const ce_plan *p, lm_tensor **out) {
  int xdt = ce_first_dtype(p, call->in[0]);
  int rc = ce_fw_fused_as(be, call, p, xdt, out);
  return rc == LM_UNSUPPORTED && xdt != p->cd ? ce_fw_fused_as(be, call, p, p->cd, out) : rc;
}

/* the loss's gradient per row, (N) dense in cd, from g (the reduced or
 * per-row loss's) */
static lm_tensor *ce_row_grad(lm_scope *s, const ce_plan *p, const lm_saved *n, lm_tensor *g, lm_tensor *like) {
  g = lm_s_cast(s, g, p->cd);
  if (p->red == 0) return lm_s_reshape(s, lm_s_contig(s, g), 1, &p->N);
  if (p->red == 1) g = lm_s2(s, LM_OP_DIV, g, ce_id_divisor(s, p, n->in, n->nin, like));
  return g ? lm_s_contig(s, lm_s(s, lm_broadcast_to("cross_entropy", "gradient", g, 1, &p->N))) : NULL;
}

static int ce_bw_fused_as(const lm_backend *be, const lm_saved *n, const ce_plan *p, lm_tensor *g, int xdt,
                          lm_tensor **gin) {
  lm_scope s = {0};
  lm_tensor *x, *t, *w, *dx = NULL;
  lm_tensor *lse = lm_s_reshape(&s, lm_s_contig(&s, lm_s_cast(&s, n->out[1], p->cd)), 1, &p->N);
  lm_tensor *gr = lse && ce_dense(&s, p, n->in, n->nin, xdt, &x, &t, &w) == 0 ? ce_row_grad(&s, p, n, g, lse) : NULL;
  if (gr) dx = lm_s(&s, lm_empty_like(x));
  int rc = dx ? be->cross_entropy_bwd(dx, gr, x, t, w, lse, p->ignore, p->eps) : -1;
  if (rc == 0) rc = lm_give(n, gin, 0, lm_s_reshape(&s, dx, n->in[0]->ndim, n->in[0]->shape_));
  lm_scope_end(&s);
  return rc;
}

static int ce_bw_fused(const lm_backend *be, const lm_saved *n, const ce_plan *p, lm_tensor *g, lm_tensor **gin) {
  int xdt = ce_first_dtype(p, n->in[0]);
  int rc = ce_bw_fused_as(be, n, p, g, xdt, gin);
  return rc == LM_UNSUPPORTED && xdt != p->cd ? ce_bw_fused_as(be, n, p, g, p->cd, gin) : rc;
}

int lm_fw_cross_entropy(const lm_call *call, lm_tensor **out) {
  lm_tensor *const *in = call->in;
  ce_plan p;
  LM_TRY(ce_plan_tensors(call->nin, in, call->a, &p));
  if (!p.probs) LM_TRY(lm_check_ids("cross_entropy", 2, "target", in[1], p.C, 1, p.ignore, "class"));
  const lm_backend *be = p.probs ? NULL : LM_FUSED(in[0], cross_entropy);
  if (be) return ce_fw_fused(be, call, &p, out);
  lm_scope s = {0};
  ce_parts c;
  lm_tensor *loss = NULL; /* (N, 1) */
  int rc = ce_prepare(&s, &p, in, call->nin, &c);
  lm_tensor *logp = rc == 0 ? lm_sop(&s, LM_OP_LOG_SOFTMAX, 1, &c.x, &(lm_attrs){.i = {-1}, .ni = 1}) : NULL;
  if (p.probs) {
    loss = lm_s1(&s, LM_OP_NEG, lm_s_sum(&s, lm_s2(&s, LM_OP_MUL, c.q, logp), 1, 1));
  } else if (logp) { /* -(1-eps) wt logp[t] - eps/C sum_c w_c logp_c, 0 where ignored */
    lm_tensor *picked = pick_rows(&s, logp, c.ids);
    lm_tensor *l = lm_s2(&s, LM_OP_MUL, lm_s_mulk(&s, c.wt, -(1 - p.eps)), picked);
    if (p.eps > 0) {
      lm_tensor *lw = c.w ? lm_s2(&s, LM_OP_MUL, logp, c.w) : logp;
      l = lm_s2(&s, LM_OP_SUB, l, lm_s_mulk(&s, lm_s_sum(&s, lw, 1, 1), p.eps / (double)p.C));
    }
    loss = lm_s_where(&s, c.vb, l, lm_scalar(&s, 0, c.x));
  }
  lm_tensor *r = NULL;
  if (loss && p.red == 0) r = lm_s_reshape(&s, loss, call->out[0].ndim, call->out[0].shape);
  else if (loss) {
    r = lm_s1(&s, LM_OP_SUM, loss);
    if (p.red == 1) r = lm_s2(&s, LM_OP_DIV, r, ce_divisor(&s, &p, &c));
  }
  lm_tensor *lse = r ? lm_s_reshape(&s, lm_s_logsumexp(&s, c.x, -1), call->out[1].ndim, call->out[1].shape) : NULL;
  out[0] = lse ? lm_cast(r, in[0]->dtype_) : NULL;
  if (out[0]) lm_retain(out[1] = lse);
  lm_scope_end(&s);
  return out[0] ? 0 : -1;
}

/* d logits for class ids: gv * (softmax * sumq - eps/C w - (1-eps) wt onehot) */
static lm_tensor *ce_grad_ids(lm_scope *s, const ce_plan *p, const ce_parts *c, lm_tensor *g) {
  lm_tensor *sm = lm_sop(s, LM_OP_SOFTMAX, 1, (lm_tensor **)&c->x, &(lm_attrs){.i = {-1}, .ni = 1});
  lm_tensor *gv = lm_s_where(s, c->vb, lm_s2(s, LM_OP_MUL, g, lm_scalar(s, 1, c->x)), lm_scalar(s, 0, c->x));
  double k = p->eps / (double)p->C;
  lm_tensor *sumq = lm_s2(s, LM_OP_ADD, lm_s_mulk(s, c->wt, 1 - p->eps), lm_scalar(s, k * c->sumw, c->x));
  sumq = lm_s_where(s, c->vb, sumq, lm_scalar(s, 0, c->x));
  lm_tensor *d = lm_s2(s, LM_OP_MUL, sm, lm_s2(s, LM_OP_MUL, gv, sumq));
  if (p->eps > 0) d = lm_s2(s, LM_OP_SUB, d, lm_s_mulk(s, c->w ? lm_s2(s, LM_OP_MUL, gv, c->w) : gv, k));
  d = lm_s_contig(s, d);
  if (!d || p->eps >= 1) return d;
  int64_t flat[2] = {p->N * p->C, 1};
  lm_tensor *src = lm_s_contig(s, lm_s2(s, LM_OP_MUL, lm_s_mulk(s, gv, -(1 - p->eps)), c->wt));
  lm_tensor *dflat = lm_s_reshape(s, d, 2, flat);
  const lm_backend *be = LM_KERNEL(LM_OP_CROSS_ENTROPY, d, index_add);
  if (!src || !dflat || !be || be->index_add(dflat, c->ids, src) < 0) return NULL;
  return d;
}

int lm_bw_cross_entropy(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  ce_plan p;
  LM_TRY(ce_plan_tensors(n->nin, n->in, &n->attrs, &p));
  lm_tensor *const *in = n->in;
  bool dx = in[0]->needs_grad, dt = p.probs && in[1]->needs_grad;
  if (!dx && !dt) return 0;
  const lm_backend *be = p.probs ? NULL : LM_FUSED(in[0], cross_entropy_bwd);
  if (be) return ce_bw_fused(be, n, &p, gout[0], gin);
  lm_scope s = {0};
  ce_parts c;
  int rc = ce_prepare(&s, &p, in, n->nin, &c);
  int64_t col[2] = {p.N, 1};
  lm_tensor *g = lm_s_cast(&s, gout[0], p.cd); /* the scale of each row's loss: (N, 1) or () */
  if (p.red == 0) g = lm_s_reshape(&s, g, 2, col);
  else if (p.red == 1) g = lm_s2(&s, LM_OP_DIV, g, ce_divisor(&s, &p, &c));
  if (rc == 0 && dx) {
    lm_tensor *d = NULL;
    if (p.probs) { /* g * (softmax * sum(q) - q) */
      lm_tensor *sm = lm_sop(&s, LM_OP_SOFTMAX, 1, &c.x, &(lm_attrs){.i = {-1}, .ni = 1});
      d = lm_s2(&s, LM_OP_MUL, g, lm_s2(&s, LM_OP_SUB, lm_s2(&s, LM_OP_MUL, sm, lm_s_sum(&s, c.q, 1, 1)), c.q));
    } else d = ce_grad_ids(&s, &p, &c, g);
    rc = d ? lm_give(n, gin, 0, lm_s_reshape(&s, d, in[0]->ndim, in[0]->shape_)) : -1;
  }
  if (rc == 0 && dt) { /* -g (1-eps) w logp */
    lm_tensor *logp = lm_sop(&s, LM_OP_LOG_SOFTMAX, 1, &c.x, &(lm_attrs){.i = {-1}, .ni = 1});
    lm_tensor *d = lm_s_mulk(&s, lm_s2(&s, LM_OP_MUL, g, c.w ? lm_s2(&s, LM_OP_MUL, logp, c.w) : logp), -(1 - p.eps));
    rc = d ? lm_give(n, gin, 1, lm_s_reshape(&s, d, in[1]->ndim, in[1]->shape_)) : -1;
  }
  lm_scope_end(&s);
  return rc;
}
