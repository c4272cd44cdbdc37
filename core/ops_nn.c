/* ops_nn.c: neural-network ops (softmax, norms, embedding, cross entropy,
 * triu/tril, attention, rotary embedding), each with its backward. Floats
 * compute in f32 (f64 stays f64) and round once to the input's dtype.
 * Composite forwards call other ops with grad mode off: the op records one
 * node and its own backward. Ids and dims in attrs are 0-based; messages
 * print them 1-based, as the Lua user wrote them. */
#include "internal.h"
#include <math.h>
#include <string.h>

/* ---- helpers ---- */
static int need_float(const char *op, int k, const char *arg, const lm_tensor *t) {
  if (lm_is_float(t->dtype_)) return 0;
  return lm_error("%s: argument #%d (%s) expected a floating point tensor, got %s", op, k, arg,
                  lm_dtype_name(t->dtype_));
}

/* kernel slot present? (a device backend may not have every kernel yet) */
#define KERNEL(be, op, slot)                                                   \
  ((be) && (be)->slot ? 0 : ((be) ? lm_error("%s: no %s kernel on device %s", op, #slot, (be)->name) : -1))

static lm_tensor *cast_(lm_scope *s, lm_tensor *x, int dt) { return x ? lm_s(s, lm_cast(x, dt)) : NULL; }
static lm_tensor *contig_(lm_scope *s, lm_tensor *x) { return x ? lm_s(s, lm_contiguous(x)) : NULL; }

static lm_tensor *reshape_(lm_scope *s, lm_tensor *x, int nd, const int64_t *shape) {
  lm_attrs a = {.ni = nd};
  memcpy(a.i, shape, nd * sizeof *shape);
  return lm_sop(s, "reshape", 1, &x, &a);
}
static lm_tensor *reshape_as_(lm_scope *s, lm_tensor *x, const lm_tensor *like) {
  return reshape_(s, x, like->ndim, like->shape);
}
static lm_tensor *sum_(lm_scope *s, lm_tensor *x, int d, int keep) {
  lm_attrs a = {.i = {d, keep}, .ni = 2};
  return lm_sop(s, "sum", 1, &x, &a);
}
static lm_tensor *sum_all_(lm_scope *s, lm_tensor *x) { return lm_s1(s, "sum", x); }
static lm_tensor *mean_(lm_scope *s, lm_tensor *x, int d) {
  lm_attrs a = {.i = {d, 1}, .ni = 2};
  return lm_sop(s, "mean", 1, &x, &a);
}
static lm_tensor *transpose_(lm_scope *s, lm_tensor *x, int d0, int d1) {
  lm_attrs a = {.i = {d0, d1}, .ni = 2};
  return lm_sop(s, "transpose", 1, &x, &a);
}
static lm_tensor *where_(lm_scope *s, lm_tensor *c, lm_tensor *a, lm_tensor *b) {
  lm_tensor *in[3] = {c, a, b};
  return lm_sop(s, "where", 3, in, NULL);
}
static lm_tensor *mulk_(lm_scope *s, lm_tensor *x, double k) {
  return lm_s2(s, "mul", x, lm_scalar(s, k, x));
}
static lm_tensor *arange_(lm_scope *s, int64_t n, int device) {
  return lm_s(s, lm_arange(0, (double)n, 1, LM_I64, device));
}

/* *out = a new ref to r cast to dt (r borrowed); 0 or -1 */
static int give_out(lm_tensor *r, int dt, lm_tensor **out) {
  *out = r ? lm_cast(r, dt) : NULL;
  return *out ? 0 : -1;
}

/* gin[i] for input i when it requires grad; g is borrowed */
static int give(const lm_node *n, lm_tensor **gin, int i, lm_tensor *g) {
  if (i >= n->nin || !n->in[i]->needs_grad) return 0;
  gin[i] = lm_grad_like(g, n->in[i]);
  return gin[i] ? 0 : -1;
}

/* The ids of idx (any integer dtype) must lie in [0, n) or equal `skip`;
 * `skip_ok` says whether skip counts. Read on the host. */
static int check_ids(const char *op, int k, const char *arg, lm_tensor *idx, int64_t n,
                     int skip_ok, int64_t skip, const char *what) {
  lm_scope s = {0};
  lm_tensor *c = idx;
  if (idx->device_ != LM_CPU) {
    c = lm_s(&s, lm_empty(idx->ndim, idx->shape, LM_I64, LM_CPU));
    if (!c || lm_copy_(c, idx) < 0) { lm_scope_end(&s); return -1; }
  }
  c = contig_(&s, cast_(&s, c, LM_I64));
  if (!c) { lm_scope_end(&s); return -1; }
  const int64_t *p = (const int64_t *)lm_ptr(c);
  int rc = 0;
  for (int64_t j = 0; j < c->numel_; j++) {
    if ((p[j] >= 0 && p[j] < n) || (skip_ok && p[j] == skip)) continue;
    rc = lm_error("%s: argument #%d (%s) holds %s %lld, outside [1, %lld]", op, k, arg, what,
                  (long long)p[j] + 1, (long long)n);
    break;
  }
  lm_scope_end(&s);
  return rc;
}

#define NO_GRAD_BEGIN int old_grad_ = lm_set_grad_enabled(0)
#define NO_GRAD_END lm_set_grad_enabled(old_grad_)

/* ---- softmax, log_softmax (attrs: i[0] = dim) ---- */
static int softmax_dim(const char *op, const lm_tensor *x, const lm_attrs *a) {
  return lm_wrap_dim(op, "dim", a->ni ? a->i[0] : -1, x->ndim);
}

/* x moved so dim d is last, in dtype cd, contiguous: a new ref */
static lm_tensor *dim_last(lm_tensor *x, int d, int cd) {
  lm_tensor *c = lm_cast(x, cd);
  if (!c) return NULL;
  int last = x->ndim ? x->ndim - 1 : 0;
  if (d == last) {
    lm_tensor *r = lm_contiguous(c);
    lm_release(c);
    return r;
  }
  int64_t shape[LM_MAX_DIMS], stride[LM_MAX_DIMS];
  memcpy(shape, c->shape, sizeof shape), memcpy(stride, c->stride_, sizeof stride);
  shape[d] = c->shape[last], shape[last] = c->shape[d];
  stride[d] = c->stride_[last], stride[last] = c->stride_[d];
  lm_tensor *v = lm_view_of(c, c->ndim, shape, stride, c->offset);
  lm_release(c);
  lm_tensor *r = v ? lm_contiguous(v) : NULL;
  lm_release(v);
  return r;
}

static int softmax_forward(int log, lm_tensor *x, const lm_attrs *a, lm_tensor **out) {
  const char *op = log ? "log_softmax" : "softmax";
  LM_TRY(need_float(op, 1, "input", x));
  int d = softmax_dim(op, x, a);
  if (d < 0) return -1;
  const lm_backend *be = lm_backend_of(x->device_);
  LM_TRY(KERNEL(be, op, softmax));
  int cd = lm_compute_dtype(x->dtype_);
  lm_scope s = {0};
  lm_tensor *c = lm_s(&s, dim_last(x, d, cd));
  lm_tensor *o = c ? lm_s(&s, lm_empty_like(c)) : NULL;
  int rc = o ? be->softmax(o, c, log) : -1;
  lm_tensor *r = NULL;
  if (rc == 0) {
    int last = x->ndim ? x->ndim - 1 : 0;
    r = d == last ? o : lm_s(&s, dim_last(o, d, cd)); /* swapping back is the same move */
  }
  rc = give_out(r, x->dtype_, out);
  lm_scope_end(&s);
  return rc;
}

static int fw_softmax(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  return softmax_forward(0, in[0], a, out);
}
static int fw_log_softmax(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  return softmax_forward(1, in[0], a, out);
}

static int softmax_backward(int log, const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *x = n->in[0];
  int d = softmax_dim("", x, &n->attrs), cd = lm_compute_dtype(x->dtype_);
  lm_scope s = {0};
  lm_tensor *g = cast_(&s, gout[0], cd), *y = cast_(&s, n->out[0], cd), *gx;
  if (log) /* g - exp(y) * sum(g) */
    gx = lm_s2(&s, "sub", g, lm_s2(&s, "mul", lm_s1(&s, "exp", y), sum_(&s, g, d, 1)));
  else /* y * (g - sum(g * y)) */
    gx = lm_s2(&s, "mul", y, lm_s2(&s, "sub", g, sum_(&s, lm_s2(&s, "mul", g, y), d, 1)));
  int rc = gx ? give(n, gin, 0, gx) : -1;
  lm_scope_end(&s);
  return rc;
}
static int bw_softmax(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  return softmax_backward(0, n, g, gin);
}
static int bw_log_softmax(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  return softmax_backward(1, n, g, gin);
}

/* ---- layer_norm(x [, w] [, b]) and rms_norm(x [, w]) ----
 * attrs: i[0] = number of trailing dims normalized (k >= 1), i[1] = 1 when
 * w is given, i[2] = 1 when b is given (layer_norm), f[0] = eps. Without
 * i[1]/i[2] the inputs present are taken in order. w and b have the shape
 * of x's last k dims. Mean and rstd are recomputed in backward. */
typedef struct { int k, has_w, has_b; double eps; int64_t rows, n; } norm_plan;

static double default_eps(int rms, int dtype) {
  if (!rms) return 1e-5;
  switch (dtype) { /* torch.finfo(dtype).eps, as rms_norm's eps=None */
  case LM_F64: return 2.220446049250313e-16;
  case LM_BF16: return 0.0078125;
  case LM_F16: return 0.0009765625;
  default: return 1.1920928955078125e-07;
  }
}

static int norm_plan_of(int rms, lm_tensor *const *in, int nin, const lm_attrs *a, norm_plan *p) {
  const char *op = rms ? "rms_norm" : "layer_norm";
  int maxin = rms ? 2 : 3;
  if (nin < 1 || nin > maxin)
    return lm_error("%s: expected 1 to %d tensor arguments, got %d", op, maxin, nin);
  const lm_tensor *x = in[0];
  LM_TRY(need_float(op, 1, "input", x));
  p->k = a->ni >= 1 ? (int)a->i[0] : 1;
  p->has_w = a->ni >= 2 ? a->i[1] != 0 : nin >= 2;
  p->has_b = rms ? 0 : a->ni >= 3 ? a->i[2] != 0 : nin >= 3;
  p->eps = a->nf >= 1 ? a->f[0] : default_eps(rms, x->dtype_);
  if (1 + p->has_w + p->has_b != nin)
    return lm_error("%s: attrs announce %d tensor arguments (input%s%s), got %d", op,
                    1 + p->has_w + p->has_b, p->has_w ? ", weight" : "", p->has_b ? ", bias" : "",
                    nin);
  if (p->k < 1 || p->k > x->ndim)
    return lm_error("%s: normalized shape expected 1 to %d dims (the input has %d), got %d", op,
                    x->ndim, x->ndim, p->k);
  if (!(p->eps >= 0)) return lm_error("%s: eps expected a number >= 0, got %g", op, p->eps);
  p->n = 1;
  for (int d = x->ndim - p->k; d < x->ndim; d++) p->n *= x->shape[d];
  p->rows = lm_shape_numel(x->ndim - p->k, x->shape);
  for (int j = 1; j < nin; j++) {
    const lm_tensor *t = in[j];
    const char *arg = j == 1 && p->has_w ? "weight" : "bias";
    LM_TRY(need_float(op, j + 1, arg, t));
    bool ok = t->ndim == p->k;
    for (int d = 0; ok && d < p->k; d++) ok = t->shape[d] == x->shape[x->ndim - p->k + d];
    if (!ok)
      return lm_error("%s: argument #%d (%s) expected the shape of the input's last %d dim%s", op,
                      j + 1, arg, p->k, p->k > 1 ? "s" : "");
  }
  return 0;
}

/* x as (rows, n) in cd, and mean/rstd (rows) from the kernel; w/b (n) or NULL */
static int norm_run(lm_scope *s, int rms, const norm_plan *p, lm_tensor *x, lm_tensor *w,
                    lm_tensor *b, int cd, lm_tensor **x2, lm_tensor **out, lm_tensor **mean,
                    lm_tensor **rstd) {
  const lm_backend *be = lm_backend_of(x->device_);
  LM_TRY(KERNEL(be, rms ? "rms_norm" : "layer_norm", norm));
  int64_t shape2[2] = {p->rows, p->n};
  *x2 = reshape_(s, contig_(s, cast_(s, x, cd)), 2, shape2);
  lm_tensor *w1 = w ? reshape_(s, contig_(s, cast_(s, w, cd)), 1, &p->n) : NULL;
  lm_tensor *b1 = b ? reshape_(s, contig_(s, cast_(s, b, cd)), 1, &p->n) : NULL;
  if (!*x2 || (w && !w1) || (b && !b1)) return -1;
  *out = lm_s(s, lm_empty(2, shape2, cd, x->device_));
  *mean = lm_s(s, lm_empty(1, &p->rows, cd, x->device_));
  *rstd = lm_s(s, lm_empty(1, &p->rows, cd, x->device_));
  if (!*out || !*mean || !*rstd) return -1;
  return be->norm(*out, *mean, *rstd, *x2, w1, b1, p->eps, rms);
}

static int norm_forward(int rms, lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  norm_plan p;
  LM_TRY(norm_plan_of(rms, in, nin, a, &p));
  lm_tensor *x = in[0], *w = p.has_w ? in[1] : NULL, *b = p.has_b ? in[1 + p.has_w] : NULL;
  NO_GRAD_BEGIN;
  lm_scope s = {0};
  lm_tensor *x2, *o, *mean, *rstd;
  int rc = norm_run(&s, rms, &p, x, w, b, lm_compute_dtype(x->dtype_), &x2, &o, &mean, &rstd);
  if (rc == 0) rc = give_out(reshape_as_(&s, o, x), x->dtype_, out);
  lm_scope_end(&s);
  NO_GRAD_END;
  return rc;
}

static int norm_backward(int rms, const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  norm_plan p;
  LM_TRY(norm_plan_of(rms, n->in, n->nin, &n->attrs, &p));
  lm_tensor *x = n->in[0], *w = p.has_w ? n->in[1] : NULL, *b = p.has_b ? n->in[1 + p.has_w] : NULL;
  int cd = lm_compute_dtype(x->dtype_);
  lm_scope s = {0};
  lm_tensor *x2, *o, *mean, *rstd;
  int rc = norm_run(&s, rms, &p, x, NULL, NULL, cd, &x2, &o, &mean, &rstd);
  if (rc < 0) { lm_scope_end(&s); return -1; }
  int64_t col[2] = {p.rows, 1}, shape2[2] = {p.rows, p.n};
  lm_tensor *r = reshape_(&s, rstd, 2, col), *xhat = o; /* the kernel without w, b gives xhat */
  lm_tensor *g = reshape_(&s, contig_(&s, cast_(&s, gout[0], cd)), 2, shape2);
  lm_tensor *w1 = w ? reshape_(&s, contig_(&s, cast_(&s, w, cd)), 1, &p.n) : NULL;
  lm_tensor *gh = w ? lm_s2(&s, "mul", g, w1) : g;
  if (x->needs_grad) { /* rstd * (gh - mean(gh) - xhat * mean(gh * xhat)) */
    lm_tensor *t = lm_s2(&s, "sub", gh, lm_s2(&s, "mul", xhat, mean_(&s, lm_s2(&s, "mul", gh, xhat), 1)));
    if (!rms) t = lm_s2(&s, "sub", t, mean_(&s, gh, 1));
    lm_tensor *dx = lm_s2(&s, "mul", t, r);
    rc |= give(n, gin, 0, reshape_as_(&s, dx, x));
  }
  if (w && w->needs_grad)
    rc |= give(n, gin, 1, reshape_as_(&s, sum_(&s, lm_s2(&s, "mul", g, xhat), 0, 0), w));
  if (b && b->needs_grad) rc |= give(n, gin, 1 + p.has_w, reshape_as_(&s, sum_(&s, g, 0, 0), b));
  lm_scope_end(&s);
  return rc ? -1 : 0;
}

static int fw_layer_norm(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  return norm_forward(0, in, nin, a, out);
}
static int fw_rms_norm(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  return norm_forward(1, in, nin, a, out);
}
static int bw_layer_norm(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  return norm_backward(0, n, g, gin);
}
static int bw_rms_norm(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  return norm_backward(1, n, g, gin);
}

/* ---- embedding(w (V, D), idx (any shape, integer, 0-based)): idx.shape + (D) ---- */
static int embedding_check(lm_tensor *const *in) {
  const lm_tensor *w = in[0], *idx = in[1];
  if (w->ndim != 2)
    return lm_error("embedding: argument #1 (weight) expected 2 dims (vocabulary, dim), got %d",
                    w->ndim);
  if (idx->dtype_ != LM_I64 && idx->dtype_ != LM_I32)
    return lm_error("embedding: argument #2 (indices) expected an integer tensor (i64 or i32), got %s",
                    lm_dtype_name(idx->dtype_));
  if (idx->ndim + 1 > LM_MAX_DIMS)
    return lm_error("embedding: argument #2 (indices) expected at most %d dims, got %d",
                    LM_MAX_DIMS - 1, idx->ndim);
  return 0;
}

/* A vocabulary shard (attrs i[0] = its first row, i[1] = 1): ids become
 * rows of the shard; ids outside it read row 0 and *inside says which to
 * keep. Without attrs the ids are used as they are. */
static lm_tensor *shard_ids(lm_scope *s, lm_tensor *idx, const lm_attrs *a, int64_t rows,
                            lm_tensor **inside) {
  lm_tensor *ids = cast_(s, idx, LM_I64);
  *inside = NULL;
  if (a->ni < 2 || !a->i[1] || !ids) return ids;
  lm_tensor *shifted = lm_s2(s, "sub", ids, lm_scalar(s, (double)a->i[0], ids));
  *inside = lm_s2(s, "logical_and", lm_s2(s, "ge", shifted, lm_scalar(s, 0, ids)),
                  lm_s2(s, "lt", shifted, lm_scalar(s, (double)rows, ids)));
  lm_tensor *w[3] = {*inside, shifted, lm_scalar(s, 0, ids)};
  return lm_sop(s, "where", 3, w, NULL);
}

/* rows of out (ids.shape + (D)) whose id was outside the shard, zeroed */
static lm_tensor *keep_rows(lm_scope *s, lm_tensor *out, lm_tensor *inside) {
  if (!inside) return out;
  lm_attrs last = {.i = {-1}, .ni = 1};
  lm_tensor *w[3] = {lm_sop(s, "unsqueeze", 1, &inside, &last), out, lm_scalar(s, 0, out)};
  return lm_sop(s, "where", 3, w, NULL);
}

static int fw_embedding(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  LM_TRY(embedding_check(in));
  lm_tensor *w = in[0], *idx = in[1];
  bool sharded = a->ni >= 2 && a->i[1];
  if (!sharded) LM_TRY(check_ids("embedding", 2, "indices", idx, w->shape[0], 0, 0, "id"));
  const lm_backend *be = lm_backend_of(w->device_);
  LM_TRY(KERNEL(be, "embedding", embedding));
  int64_t shape[LM_MAX_DIMS];
  memcpy(shape, idx->shape, idx->ndim * sizeof *shape);
  shape[idx->ndim] = w->shape[1];
  int old = lm_set_grad_enabled(0);
  lm_scope s = {0};
  lm_tensor *inside, *ids = shard_ids(&s, idx, a, w->shape[0], &inside);
  lm_tensor *wc = contig_(&s, w), *ic = contig_(&s, ids);
  lm_tensor *o = lm_s(&s, lm_empty_as(w, idx->ndim + 1, shape, w->dtype_));
  int rc = o && wc && ic ? be->embedding(o, wc, ic) : -1;
  lm_tensor *r = rc == 0 ? keep_rows(&s, o, inside) : NULL;
  if (r) lm_retain(r);
  lm_scope_end(&s);
  lm_set_grad_enabled(old);
  return (*out = r) ? 0 : -1;
}

static lm_tensor *index_add_rows(lm_scope *s, lm_tensor *g, lm_tensor *idx, int64_t V, int cd) {
  const lm_backend *be = lm_backend_of(g->device_);
  if (KERNEL(be, "embedding", index_add) < 0) return NULL;
  int64_t D = g->ndim ? g->shape[g->ndim - 1] : 1, shape[2] = {V, D}, rows = idx->numel_;
  int64_t gshape[2] = {rows, D};
  lm_tensor *dw = lm_s(s, lm_empty(2, shape, cd, g->device_));
  lm_tensor *g2 = reshape_(s, contig_(s, cast_(s, g, cd)), 2, gshape);
  lm_tensor *ic = contig_(s, cast_(s, idx, LM_I64));
  if (!dw || !g2 || !ic || lm_fill_(dw, 0) < 0 || be->index_add(dw, ic, g2) < 0) return NULL;
  return dw;
}

static int bw_embedding(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *w = n->in[0];
  if (!w->needs_grad) return 0;
  lm_scope s = {0};
  lm_tensor *inside, *ids = shard_ids(&s, n->in[1], &n->attrs, w->shape[0], &inside);
  lm_tensor *g = keep_rows(&s, gout[0], inside);
  lm_tensor *dw = g && ids ? index_add_rows(&s, g, ids, w->shape[0], lm_compute_dtype(w->dtype_)) : NULL;
  int rc = dw ? give(n, gin, 0, dw) : -1;
  lm_scope_end(&s);
  return rc;
}

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

static int ce_plan_of(lm_tensor *const *in, int nin, const lm_attrs *a, ce_plan *p) {
  const char *op = "cross_entropy";
  if (nin < 2 || nin > 3) return lm_error("%s: expected 2 or 3 tensor arguments, got %d", op, nin);
  const lm_tensor *x = in[0], *t = in[1];
  LM_TRY(need_float(op, 1, "input", x));
  if (x->ndim != 1 && x->ndim != 2)
    return lm_error("%s: argument #1 (input) expected logits of shape (N, C) or (C), got %d dims "
                    "(reshape (B, T, C) to (B*T, C) first)", op, x->ndim);
  p->C = x->shape[x->ndim - 1];
  p->N = x->ndim == 2 ? x->shape[0] : 1;
  p->cd = lm_compute_dtype(x->dtype_);
  p->ignore = a->ni >= 1 ? a->i[0] : -100;
  p->red = a->ni >= 2 ? (int)a->i[1] : 1;
  p->eps = a->nf >= 1 ? a->f[0] : 0;
  if (p->red < 0 || p->red > 2)
    return lm_error("%s: reduction expected 0 (none), 1 (mean) or 2 (sum), got %d", op, p->red);
  if (!(p->eps >= 0 && p->eps <= 1))
    return lm_error("%s: label_smoothing expected a number in [0, 1], got %g", op, p->eps);
  p->probs = lm_is_float(t->dtype_);
  if (p->probs) {
    if (t->ndim != x->ndim || memcmp(t->shape, x->shape, x->ndim * sizeof *x->shape))
      return lm_error("%s: argument #2 (target) holds probabilities and expected the input's shape", op);
  } else {
    if (t->dtype_ != LM_I64 && t->dtype_ != LM_I32)
      return lm_error("%s: argument #2 (target) expected integer class ids or float probabilities, got %s",
                      op, lm_dtype_name(t->dtype_));
    if (x->ndim == 2 ? t->ndim != 1 || t->shape[0] != p->N : t->ndim != 0)
      return lm_error("%s: argument #2 (target) expected class ids of shape %s, got %d dims%s", op,
                      x->ndim == 2 ? "(N) for input (N, C)" : "() for input (C)", t->ndim,
                      t->ndim == 1 && x->ndim == 2 ? " with another N" : "");
  }
  if (nin == 3) {
    const lm_tensor *w = in[2];
    LM_TRY(need_float(op, 3, "weight", w));
    if (w->ndim != 1 || w->shape[0] != p->C)
      return lm_error("%s: argument #3 (weight) expected shape (%lld), one weight per class", op,
                      (long long)p->C);
  }
  return 0;
}

/* What forward and backward share: logits (N, C) in cd; for class ids the
 * ids made safe (N) i64, the mask of kept targets vb (N, 1) bool, wt = the
 * target's weight (N, 1) (1 without weight, 0 where ignored), sumw = the
 * summed weights (scalar); w (1, C) in cd or NULL; q (N, C), the target
 * distribution with smoothing and weights (probabilities only). */
typedef struct { lm_tensor *x, *ids, *vb, *wt, *w, *q; double sumw; } ce_parts;

/* rows (R, 1) of a contiguous table picked by ids (N): (N, 1) */
static lm_tensor *pick_rows(lm_scope *s, lm_tensor *table, lm_tensor *ids) {
  const lm_backend *be = lm_backend_of(table->device_);
  if (KERNEL(be, "cross_entropy", embedding) < 0 || !ids) return NULL;
  int64_t shape[2] = {table->numel_, 1}, oshape[2] = {ids->numel_, 1};
  lm_tensor *t = reshape_(s, contig_(s, table), 2, shape);
  lm_tensor *o = lm_s(s, lm_empty(2, oshape, table->dtype_, table->device_));
  if (!t || !o || be->embedding(o, t, ids) < 0) return NULL;
  return o;
}

static int ce_prepare(lm_scope *s, const ce_plan *p, lm_tensor *const *in, int nin, ce_parts *c) {
  memset(c, 0, sizeof *c);
  int64_t shape2[2] = {p->N, p->C}, col[2] = {p->N, 1}, row[2] = {1, p->C};
  c->x = reshape_(s, cast_(s, in[0], p->cd), 2, shape2);
  if (nin == 3) c->w = reshape_(s, cast_(s, in[2], p->cd), 2, row);
  if (!c->x || (nin == 3 && !c->w)) return -1;
  double eps = p->eps, C = (double)p->C;
  if (p->probs) { /* q = w * ((1 - eps) * t + eps / C) */
    lm_tensor *t = reshape_(s, cast_(s, in[1], p->cd), 2, shape2);
    lm_tensor *q = eps > 0 ? lm_s2(s, "add", mulk_(s, t, 1 - eps), lm_scalar(s, eps / C, c->x)) : t;
    c->q = c->w ? lm_s2(s, "mul", q, c->w) : q;
    return c->q ? 0 : -1;
  }
  lm_tensor *t = reshape_(s, cast_(s, in[1], LM_I64), 2, col);
  c->vb = lm_s2(s, "ne", t, lm_scalar(s, (double)p->ignore, t));
  lm_tensor *safe = contig_(s, where_(s, c->vb, t, lm_scalar(s, 0, t)));
  /* ids into the flattened (N*C) logits: n*C + t */
  lm_tensor *base = reshape_(s, mulk_(s, arange_(s, p->N, in[0]->device_), (double)p->C), 2, col);
  c->ids = contig_(s, lm_s2(s, "add", base, safe));
  lm_tensor *tw = c->w ? pick_rows(s, c->w, safe) : lm_scalar(s, 1, c->x);
  c->wt = where_(s, c->vb, tw, lm_scalar(s, 0, c->x));
  c->sumw = eps > 0 && c->w ? 0 : C;
  if (eps > 0 && c->w) { /* the scalar sum of the weights, read once */
    lm_tensor *sw = cast_(s, sum_all_(s, c->w), LM_F64), *h = NULL;
    if (sw && sw->device_ != LM_CPU) {
      h = lm_s(s, lm_empty(0, NULL, LM_F64, LM_CPU));
      if (h && lm_copy_(h, sw) < 0) h = NULL;
    } else h = sw;
    if (!h) return -1;
    c->sumw = *(const double *)lm_ptr(h);
  }
  return c->ids && c->wt ? 0 : -1;
}

/* the divisor of reduction mean, as a 0-dim tensor in cd */
static lm_tensor *ce_divisor(lm_scope *s, const ce_plan *p, const ce_parts *c) {
  if (p->probs) return lm_scalar(s, (double)p->N, c->x);
  return sum_all_(s, c->wt);
}

static int fw_cross_entropy(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  ce_plan p;
  LM_TRY(ce_plan_of(in, nin, a, &p));
  if (!p.probs) LM_TRY(check_ids("cross_entropy", 2, "target", in[1], p.C, 1, p.ignore, "class"));
  NO_GRAD_BEGIN;
  lm_scope s = {0};
  ce_parts c;
  lm_tensor *loss = NULL; /* (N, 1) */
  int rc = ce_prepare(&s, &p, in, nin, &c);
  lm_attrs last = {.i = {-1}, .ni = 1};
  lm_tensor *logp = rc == 0 ? lm_sop(&s, "log_softmax", 1, &c.x, &last) : NULL;
  if (p.probs) {
    loss = lm_s1(&s, "neg", sum_(&s, lm_s2(&s, "mul", c.q, logp), 1, 1));
  } else if (logp) { /* -(1-eps) wt logp[t] - eps/C sum_c w_c logp_c, 0 where ignored */
    lm_tensor *picked = pick_rows(&s, logp, c.ids);
    lm_tensor *l = lm_s2(&s, "mul", mulk_(&s, c.wt, -(1 - p.eps)), picked);
    if (p.eps > 0) {
      lm_tensor *lw = c.w ? lm_s2(&s, "mul", logp, c.w) : logp;
      l = lm_s2(&s, "sub", l, mulk_(&s, sum_(&s, lw, 1, 1), p.eps / (double)p.C));
    }
    loss = where_(&s, c.vb, l, lm_scalar(&s, 0, c.x));
  }
  lm_tensor *r = NULL;
  if (loss) {
    if (p.red == 0) r = reshape_(&s, loss, in[0]->ndim - 1, &p.N);
    else {
      r = sum_all_(&s, loss);
      if (p.red == 1) r = lm_s2(&s, "div", r, ce_divisor(&s, &p, &c));
    }
  }
  rc = give_out(r, in[0]->dtype_, out);
  lm_scope_end(&s);
  NO_GRAD_END;
  return rc;
}

static int bw_cross_entropy(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  ce_plan p;
  LM_TRY(ce_plan_of(n->in, n->nin, &n->attrs, &p));
  lm_tensor *const *in = n->in;
  bool dx = in[0]->needs_grad, dt = p.probs && in[1]->needs_grad;
  if (!dx && !dt) return 0;
  lm_scope s = {0};
  ce_parts c;
  int rc = ce_prepare(&s, &p, in, n->nin, &c);
  int64_t col[2] = {p.N, 1};
  lm_tensor *g = cast_(&s, gout[0], p.cd); /* the scale of each row's loss: (N, 1) or () */
  if (p.red == 0) g = reshape_(&s, g, 2, col);
  else if (p.red == 1) g = lm_s2(&s, "div", g, ce_divisor(&s, &p, &c));
  lm_attrs last = {.i = {-1}, .ni = 1};
  if (rc == 0 && dx) {
    lm_tensor *sm = lm_sop(&s, "softmax", 1, &c.x, &last), *d = NULL;
    if (p.probs) { /* g * (softmax * sum(q) - q) */
      d = lm_s2(&s, "mul", g, lm_s2(&s, "sub", lm_s2(&s, "mul", sm, sum_(&s, c.q, 1, 1)), c.q));
    } else { /* gv * (softmax * sumq - eps/C w - (1-eps) wt onehot) */
      lm_tensor *gv = where_(&s, c.vb, lm_s2(&s, "mul", g, lm_scalar(&s, 1, c.x)), lm_scalar(&s, 0, c.x));
      double k = p.eps / (double)p.C;
      lm_tensor *sumq = lm_s2(&s, "add", mulk_(&s, c.wt, 1 - p.eps), lm_scalar(&s, k * c.sumw, c.x));
      sumq = where_(&s, c.vb, sumq, lm_scalar(&s, 0, c.x));
      d = lm_s2(&s, "mul", sm, lm_s2(&s, "mul", gv, sumq));
      if (p.eps > 0) d = lm_s2(&s, "sub", d, mulk_(&s, c.w ? lm_s2(&s, "mul", gv, c.w) : gv, k));
      d = contig_(&s, d);
      if (d && p.eps < 1) {
        int64_t flat[2] = {p.N * p.C, 1};
        lm_tensor *src = contig_(&s, lm_s2(&s, "mul", mulk_(&s, gv, -(1 - p.eps)), c.wt));
        lm_tensor *dflat = reshape_(&s, d, 2, flat);
        const lm_backend *be = lm_backend_of(d->device_);
        if (!src || !dflat || KERNEL(be, "cross_entropy", index_add) < 0 ||
            be->index_add(dflat, c.ids, src) < 0)
          d = NULL;
      }
    }
    rc = d ? give(n, gin, 0, reshape_as_(&s, d, in[0])) : -1;
  }
  if (rc == 0 && dt) { /* -g (1-eps) w logp */
    lm_tensor *logp = lm_sop(&s, "log_softmax", 1, &c.x, &last);
    lm_tensor *d = mulk_(&s, lm_s2(&s, "mul", g, c.w ? lm_s2(&s, "mul", logp, c.w) : logp), -(1 - p.eps));
    rc = d ? give(n, gin, 1, reshape_as_(&s, d, in[1])) : -1;
  }
  lm_scope_end(&s);
  return rc;
}

/* ---- triu, tril (attrs: i[0] = diagonal k) over the last two dims ---- */
static lm_tensor *tri_mask(lm_scope *s, int upper, const lm_tensor *x, int64_t k) {
  int64_t R = x->shape[x->ndim - 2], C = x->shape[x->ndim - 1], rs[2] = {R, 1}, cs[2] = {1, C};
  lm_tensor *r = reshape_(s, arange_(s, R, x->device_), 2, rs);
  lm_tensor *c = reshape_(s, arange_(s, C, x->device_), 2, cs);
  lm_tensor *diff = lm_s2(s, "sub", c, r);
  return lm_s2(s, upper ? "ge" : "le", diff, lm_scalar(s, (double)k, diff));
}

static int tri_forward(int upper, lm_tensor *x, const lm_attrs *a, lm_tensor **out) {
  if (x->ndim < 2)
    return lm_error("%s: argument #1 (input) expected at least 2 dims, got %d",
                    upper ? "triu" : "tril", x->ndim);
  NO_GRAD_BEGIN;
  lm_scope s = {0};
  lm_tensor *m = tri_mask(&s, upper, x, a->ni ? a->i[0] : 0);
  int rc = give_out(where_(&s, m, x, lm_scalar(&s, 0, x)), x->dtype_, out);
  lm_scope_end(&s);
  NO_GRAD_END;
  return rc;
}

static int tri_backward(int upper, const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  lm_tensor *x = n->in[0], *g = gout[0];
  lm_tensor *m = tri_mask(&s, upper, x, n->attrs.ni ? n->attrs.i[0] : 0);
  lm_tensor *d = where_(&s, m, g, lm_scalar(&s, 0, g));
  int rc = d ? give(n, gin, 0, d) : -1;
  lm_scope_end(&s);
  return rc;
}
static int fw_triu(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  return tri_forward(1, in[0], a, out);
}
static int fw_tril(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  return tri_forward(0, in[0], a, out);
}
static int bw_triu(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  return tri_backward(1, n, g, gin);
}
static int bw_tril(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  return tri_backward(0, n, g, gin);
}

/* ---- scaled_dot_product_attention(q, k, v [, attn_mask]) ----
 * q (..., L, E), k (..., S, E), v (..., S, Ev); batch dims broadcast as in
 * matmul (repeat k/v heads for GQA first). attrs: i[0] = is_causal (keep
 * j <= i, top-left aligned as PyTorch), f[0] = scale (0: 1/sqrt(E)).
 * attn_mask broadcasts to (..., L, S): bool keeps where true, a float mask
 * is added to the scores. Backward recomputes the probabilities. */
static int sdpa_check(lm_tensor *const *in, int nin, const lm_attrs *a) {
  const char *op = "scaled_dot_product_attention", *names[4] = {"query", "key", "value", "attn_mask"};
  if (nin < 3 || nin > 4) return lm_error("%s: expected 3 or 4 tensor arguments, got %d", op, nin);
  for (int i = 0; i < 3; i++) {
    LM_TRY(need_float(op, i + 1, names[i], in[i]));
    if (in[i]->ndim < 2)
      return lm_error("%s: argument #%d (%s) expected at least 2 dims (..., length, dim), got %d",
                      op, i + 1, names[i], in[i]->ndim);
  }
  const lm_tensor *q = in[0], *k = in[1], *v = in[2];
  if (q->shape[q->ndim - 1] != k->shape[k->ndim - 1])
    return lm_error("%s: argument #2 (key) expected the query's last dim %lld, got %lld", op,
                    (long long)q->shape[q->ndim - 1], (long long)k->shape[k->ndim - 1]);
  if (k->shape[k->ndim - 2] != v->shape[v->ndim - 2])
    return lm_error("%s: argument #3 (value) expected the key's length %lld, got %lld", op,
                    (long long)k->shape[k->ndim - 2], (long long)v->shape[v->ndim - 2]);
  if (nin == 4) {
    const lm_tensor *m = in[3];
    if (m->dtype_ != LM_BOOL && !lm_is_float(m->dtype_))
      return lm_error("%s: argument #4 (attn_mask) expected a bool or float tensor, got %s", op,
                      lm_dtype_name(m->dtype_));
    if (a->ni >= 1 && a->i[0])
      return lm_error("%s: attn_mask and is_causal cannot both be set", op);
    int64_t L = q->shape[q->ndim - 2], S = k->shape[k->ndim - 2];
    int64_t ml = m->ndim >= 2 ? m->shape[m->ndim - 2] : 1, ms = m->ndim >= 1 ? m->shape[m->ndim - 1] : 1;
    if ((ml != 1 && ml != L) || (ms != 1 && ms != S))
      return lm_error("%s: argument #4 (attn_mask) expected to broadcast to (..., %lld, %lld), "
                      "its last dims are (%lld, %lld)", op, (long long)L, (long long)S,
                      (long long)ml, (long long)ms);
  }
  return 0;
}

/* the attention probabilities (..., L, S) in cd, and q, k, v in cd */
static lm_tensor *sdpa_probs(lm_scope *s, lm_tensor *const *in, int nin, const lm_attrs *a,
                             int cd, lm_tensor **q, lm_tensor **k, lm_tensor **v, double *scale) {
  *q = cast_(s, in[0], cd), *k = cast_(s, in[1], cd), *v = cast_(s, in[2], cd);
  int64_t E = in[0]->shape[in[0]->ndim - 1];
  *scale = a->nf >= 1 && a->f[0] != 0 ? a->f[0] : 1 / sqrt((double)(E ? E : 1));
  lm_tensor *sc = mulk_(s, lm_s2(s, "matmul", *q, transpose_(s, *k, -2, -1)), *scale);
  if (!sc) return NULL;
  if (a->ni >= 1 && a->i[0]) {
    int64_t L = sc->shape[sc->ndim - 2], S = sc->shape[sc->ndim - 1], rs[2] = {L, 1}, cs[2] = {1, S};
    lm_tensor *keep = lm_s2(s, "le", reshape_(s, arange_(s, S, sc->device_), 2, cs),
                            reshape_(s, arange_(s, L, sc->device_), 2, rs));
    sc = where_(s, keep, sc, lm_scalar(s, -INFINITY, sc));
  } else if (nin == 4) {
    lm_tensor *m = in[3];
    sc = m->dtype_ == LM_BOOL ? where_(s, m, sc, lm_scalar(s, -INFINITY, sc))
                              : lm_s2(s, "add", sc, cast_(s, m, cd));
  }
  lm_attrs last = {.i = {-1}, .ni = 1};
  return lm_sop(s, "softmax", 1, &sc, &last);
}

static int fw_scaled_dot_product_attention(lm_tensor *const *in, int nin, const lm_attrs *a,
                                           lm_tensor **out) {
  LM_TRY(sdpa_check(in, nin, a));
  NO_GRAD_BEGIN;
  lm_scope s = {0};
  lm_tensor *q, *k, *v;
  double scale;
  int dt = lm_promote(lm_promote(in[0]->dtype_, in[1]->dtype_), in[2]->dtype_);
  lm_tensor *p = sdpa_probs(&s, in, nin, a, lm_compute_dtype(dt), &q, &k, &v, &scale);
  int rc = give_out(lm_s2(&s, "matmul", p, v), dt, out);
  lm_scope_end(&s);
  NO_GRAD_END;
  return rc;
}

static int bw_scaled_dot_product_attention(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  lm_tensor *q, *k, *v;
  double scale;
  int cd = lm_compute_dtype(n->out[0]->dtype_);
  lm_tensor *p = sdpa_probs(&s, n->in, n->nin, &n->attrs, cd, &q, &k, &v, &scale);
  lm_tensor *g = cast_(&s, gout[0], cd);
  int rc = p && g ? 0 : -1;
  if (rc == 0 && n->in[2]->needs_grad) /* dv = p^T g */
    rc = give(n, gin, 2, lm_s2(&s, "matmul", transpose_(&s, p, -2, -1), g));
  bool need_ds = n->in[0]->needs_grad || n->in[1]->needs_grad ||
                 (n->nin == 4 && n->in[3]->needs_grad);
  if (rc == 0 && need_ds) { /* ds = p * (dp - sum(dp * p)), dp = g v^T */
    lm_tensor *dp = lm_s2(&s, "matmul", g, transpose_(&s, v, -2, -1));
    lm_tensor *ds = lm_s2(&s, "mul", p, lm_s2(&s, "sub", dp, sum_(&s, lm_s2(&s, "mul", dp, p), -1, 1)));
    if (n->in[0]->needs_grad) rc |= give(n, gin, 0, mulk_(&s, lm_s2(&s, "matmul", ds, k), scale));
    if (n->in[1]->needs_grad)
      rc |= give(n, gin, 1, mulk_(&s, lm_s2(&s, "matmul", transpose_(&s, ds, -2, -1), q), scale));
    if (n->nin == 4 && n->in[3]->needs_grad && lm_is_float(n->in[3]->dtype_))
      rc |= give(n, gin, 3, ds);
  }
  lm_scope_end(&s);
  return rc ? -1 : 0;
}

/* ---- rope(x (..., T, H, D), cos (T, D/2), sin (T, D/2)) ----
 * Llama's apply_rotary_emb: pairs (x[2i], x[2i+1]) rotate by angle_{t,i}
 * as a complex product. Backward rotates by the opposite angle. */
static int rope_check(lm_tensor *const *in) {
  const char *op = "rope";
  const lm_tensor *x = in[0];
  LM_TRY(need_float(op, 1, "input", x));
  if (x->ndim < 3 || x->ndim > LM_MAX_DIMS - 1)
    return lm_error("%s: argument #1 (input) expected 3 to %d dims (..., seq, heads, head_dim), got %d",
                    op, LM_MAX_DIMS - 1, x->ndim);
  int64_t T = x->shape[x->ndim - 3], D = x->shape[x->ndim - 1];
  if (D % 2) return lm_error("%s: argument #1 (input) expected an even head_dim, got %lld", op, (long long)D);
  for (int i = 1; i < 3; i++) {
    const lm_tensor *t = in[i];
    const char *arg = i == 1 ? "cos" : "sin";
    LM_TRY(need_float(op, i + 1, arg, t));
    if (t->ndim != 2 || t->shape[0] != T || t->shape[1] != D / 2)
      return lm_error("%s: argument #%d (%s) expected shape (%lld, %lld) (seq, head_dim/2)", op, i + 1,
                      arg, (long long)T, (long long)(D / 2));
  }
  return 0;
}

/* x rotated by sign * angle, in cd, x's shape */
static lm_tensor *rope_rotate(lm_scope *s, lm_tensor *x, lm_tensor *cos, lm_tensor *sin, double sign,
                              int cd) {
  int nd = x->ndim;
  int64_t shape[LM_MAX_DIMS], T = x->shape[nd - 3], D = x->shape[nd - 1], cs[4] = {T, 1, D / 2, 1};
  memcpy(shape, x->shape, nd * sizeof *shape);
  shape[nd - 1] = D / 2, shape[nd] = 2;
  lm_tensor *x5 = reshape_(s, cast_(s, x, cd), nd + 1, shape);
  lm_attrs n0 = {.i = {-1, 0, 1}, .ni = 3}, n1 = {.i = {-1, 1, 1}, .ni = 3};
  lm_tensor *a = lm_sop(s, "narrow", 1, &x5, &n0), *b = lm_sop(s, "narrow", 1, &x5, &n1);
  lm_tensor *c = reshape_(s, cast_(s, cos, cd), 4, cs);
  lm_tensor *sn = reshape_(s, cast_(s, sin, cd), 4, cs);
  if (sign < 0) sn = lm_s1(s, "neg", sn);
  lm_tensor *o[2] = {lm_s2(s, "sub", lm_s2(s, "mul", a, c), lm_s2(s, "mul", b, sn)),
                     lm_s2(s, "add", lm_s2(s, "mul", a, sn), lm_s2(s, "mul", b, c))};
  lm_attrs cat = {.i = {-1}, .ni = 1};
  return reshape_as_(s, lm_sop(s, "cat", 2, o, &cat), x);
}

static int fw_rope(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin, (void)a;
  LM_TRY(rope_check(in));
  NO_GRAD_BEGIN;
  lm_scope s = {0};
  int rc = give_out(rope_rotate(&s, in[0], in[1], in[2], 1, lm_compute_dtype(in[0]->dtype_)),
                    in[0]->dtype_, out);
  lm_scope_end(&s);
  NO_GRAD_END;
  return rc;
}

static int bw_rope(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  if (!n->in[0]->needs_grad) return 0;
  lm_scope s = {0};
  lm_tensor *d = rope_rotate(&s, gout[0], n->in[1], n->in[2], -1, lm_compute_dtype(n->in[0]->dtype_));
  int rc = d ? give(n, gin, 0, d) : -1;
  lm_scope_end(&s);
  return rc;
}

#define OP(NAME, NIN, BW, RULE) {#NAME, NIN, 1, fw_##NAME, BW, RULE, 0}
const lm_op_def lm_ops_nn[] = {
    OP(softmax, 1, bw_softmax, lm_rule_rows),
    OP(log_softmax, 1, bw_log_softmax, lm_rule_rows),
    OP(layer_norm, -1, bw_layer_norm, lm_rule_rows),
    OP(rms_norm, -1, bw_rms_norm, lm_rule_rows),
    OP(embedding, 2, bw_embedding, lm_rule_embedding),
    OP(cross_entropy, -1, bw_cross_entropy, lm_rule_cross_entropy),
    OP(triu, 1, bw_triu, lm_rule_last2),
    OP(tril, 1, bw_tril, lm_rule_last2),
    OP(scaled_dot_product_attention, -1, bw_scaled_dot_product_attention, lm_rule_sdpa),
    OP(rope, 3, bw_rope, lm_rule_rope),
    {0}};
