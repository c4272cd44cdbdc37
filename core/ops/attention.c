/* attention.c: scaled dot-product attention (fused where the backend has
 * the kernel) and rotary embeddings, with their backward passes. They are
 * built from other ops, so they run on every device those ops run on. */
#include "op.h"
#include <math.h>
#include <string.h>

/* ---- scaled_dot_product_attention(q, k, v [, attn_mask]) ----
 * q (..., L, E), k (..., S, E), v (..., S, Ev); batch dims broadcast as in
 * matmul (repeat k/v heads for GQA first). attrs: i[0] = is_causal (keep
 * j <= i, top-left aligned as PyTorch), f[0] = scale (0: 1/sqrt(E)).
 * attn_mask broadcasts to (..., L, S): bool keeps where true, a float mask
 * is added to the scores. A second output, lse (..., L) in the compute
 * dtype, holds the log-sum-exp of each row of scaled scores: the fused
 * backward (flash attention's) rebuilds the probabilities of a tile from it
 * without the (L, S) matrix. Keeping it (L values per row of output) costs
 * less than recomputing it, which would mean a second pass of Q K^T. It
 * is not differentiable (as PyTorch's _scaled_dot_product_flash_attention's
 * logsumexp: a gradient reaching it is ignored); loom.F returns the
 * attention only. q, k, v of one float dtype and equal batch dims run the
 * backend's attention kernels when it has them (with a mask that needs no
 * gradient: its masked ones, attention_bias); else
 * the composed form (matmul, softmax, matmul), whose backward recomputes
 * the probabilities. */
int lm_shape_sdpa(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op;
  const char *name = "scaled_dot_product_attention", *args[4] = {"query", "key", "value", "attn_mask"};
  if (nin < 3 || nin > 4) return lm_error("%s: expected 3 or 4 tensor arguments, got %d", name, nin);
  for (int i = 0; i < 3; i++) {
    LM_TRY(lm_need_float(name, i + 1, args[i], &in[i]));
    if (in[i].ndim < 2)
      return lm_error("%s: argument #%d (%s) expected at least 2 dims (..., length, dim), got %d",
                      name, i + 1, args[i], in[i].ndim);
  }
  LM_TRY(lm_need_same_low(name, 3, in, args));
  const lm_meta *q = &in[0], *k = &in[1], *v = &in[2];
  if (q->shape[q->ndim - 1] != k->shape[k->ndim - 1])
    return lm_error("%s: argument #2 (key) expected the query's last dim %lld, got %lld", name,
                    (long long)q->shape[q->ndim - 1], (long long)k->shape[k->ndim - 1]);
  if (k->shape[k->ndim - 2] != v->shape[v->ndim - 2])
    return lm_error("%s: argument #3 (value) expected the key's length %lld, got %lld", name,
                    (long long)k->shape[k->ndim - 2], (long long)v->shape[v->ndim - 2]);
  if (nin == 4) {
    const lm_meta *m = &in[3];
    if (m->dtype != LM_BOOL && !lm_is_float(m->dtype))
      return lm_error("%s: argument #4 (attn_mask) expected a bool or float tensor, got %s", name,
                      lm_dtype_name(m->dtype));
    if (a->ni >= 1 && a->i[0]) return lm_error("%s: attn_mask and is_causal cannot both be set", name);
    int64_t L = q->shape[q->ndim - 2], S = k->shape[k->ndim - 2];
    int64_t ml = m->ndim >= 2 ? m->shape[m->ndim - 2] : 1, ms = m->ndim >= 1 ? m->shape[m->ndim - 1] : 1;
    if ((ml != 1 && ml != L) || (ms != 1 && ms != S))
      return lm_error("%s: argument #4 (attn_mask) expected to broadcast to (..., %lld, %lld), "
                      "its last dims are (%lld, %lld)", name, (long long)L, (long long)S,
                      (long long)ml, (long long)ms);
  }
  out[0] = *q;
  out[0].shape[q->ndim - 1] = v->shape[v->ndim - 1];
  out[0].dtype = lm_promote(lm_promote(q->dtype, k->dtype), v->dtype);
  out[1] = *q;
  out[1].ndim = q->ndim - 1;
  out[1].dtype = lm_compute_dtype(out[0].dtype);
  return 0;
}

static double sdpa_scale(const lm_tensor *q, const lm_attrs *a) {
  int64_t E = q->shape_[q->ndim - 1];
  return a->nf >= 1 && a->f[0] != 0 ? a->f[0] : 1 / sqrt((double)(E ? E : 1));
}

/* the attention probabilities (..., L, S) in cd, and q, k, v in cd; the
 * scores before softmax in *scores when not NULL */
static lm_tensor *sdpa_probs(lm_scope *s, lm_tensor *const *in, int nin, const lm_attrs *a,
                             int cd, lm_tensor **q, lm_tensor **k, lm_tensor **v, double *scale,
                             lm_tensor **scores) {
  *q = lm_s_cast(s, in[0], cd), *k = lm_s_cast(s, in[1], cd), *v = lm_s_cast(s, in[2], cd);
  *scale = sdpa_scale(in[0], a);
  lm_tensor *sc = lm_s_mulk(s, lm_s2(s, LM_OP_MATMUL, *q, lm_s_transpose(s, *k, -2, -1)), *scale);
  if (!sc) return NULL;
  if (a->ni >= 1 && a->i[0]) {
    int64_t L = sc->shape_[sc->ndim - 2], S = sc->shape_[sc->ndim - 1], rs[2] = {L, 1}, cs[2] = {1, S};
    lm_tensor *keep = lm_s2(s, LM_OP_LE, lm_s_reshape(s, lm_s_arange(s, S, sc->device_), 2, cs),
                            lm_s_reshape(s, lm_s_arange(s, L, sc->device_), 2, rs));
    sc = lm_s_where(s, keep, sc, lm_scalar(s, -INFINITY, sc));
  } else if (nin == 4) {
    lm_tensor *m = in[3];
    sc = m->dtype_ == LM_BOOL ? lm_s_where(s, m, sc, lm_scalar(s, -INFINITY, sc))
                              : lm_s2(s, LM_OP_ADD, sc, lm_s_cast(s, m, cd));
  }
  if (scores) *scores = sc;
  lm_tensor *p = lm_sop(s, LM_OP_SOFTMAX, 1, &sc, &(lm_attrs){.i = {-1}, .ni = 1});
  if (nin < 4 || (a->ni >= 1 && a->i[0])) return p; /* causal: key 0 is always kept */
  /* a row whose keys are all masked attends to nothing: zeros, not NaN (the
   * fused kernels' answer, and PyTorch's safe softmax since 2.5) */
  lm_tensor *none = lm_s2(s, LM_OP_EQ, lm_sop(s, LM_OP_MAX, 1, &sc, &(lm_attrs){.i = {-1, 1}, .ni = 2}),
                          lm_scalar(s, -INFINITY, sc));
  return lm_s_where(s, none, lm_scalar(s, 0, p), p);
}

/* ---- the fused path: q, k, v as (B, L, E), (B, S, E), (B, S, Ev) ---- */

/* One float dtype, the same batch dims, keys to attend to; a mask only
 * where the backend has the masked kernels (attention_bias) and no gradient
 * flows to the mask. The slot's dtypes are f32, bf16 and f16; f64 (for
 * gradient checks) goes to the CPU's kernel only, which takes it too (lse
 * then in f64). */
static bool sdpa_fusable(int nin, lm_tensor *const *in) {
  if (nin == 4 && (in[3]->needs_grad || !LM_FUSED(in[0], attention_bias))) return false;
  const lm_tensor *q = in[0], *k = in[1], *v = in[2];
  if (k->dtype_ != q->dtype_ || v->dtype_ != q->dtype_ || !lm_is_float(q->dtype_)) return false;
  if (q->dtype_ == LM_F64 && lm_device_kind(q->device_) != LM_KIND_CPU) return false;
  if (k->ndim != q->ndim || v->ndim != q->ndim || k->shape_[k->ndim - 2] == 0) return false;
  for (int d = 0; d < q->ndim - 2; d++)
    if (k->shape_[d] != q->shape_[d] || v->shape_[d] != q->shape_[d]) return false;
  return true;
}

/* The mask as the kernels' additive f32 bias (B, L, S) on the scaled
 * scores: a bool mask as 0 / -inf; broadcast over q's batch dims by
 * strides (no copy) where they fold into one batch stride, else dense.
 * NULL with no mask; *rc LM_UNSUPPORTED when it cannot be made. */
static lm_tensor *sdpa_bias(lm_scope *s, int nin, lm_tensor *const *in, int *rc) {
  *rc = 0;
  if (nin != 4) return NULL;
  lm_tensor *q = in[0], *m = in[3];
  lm_tensor *f = m->dtype_ == LM_BOOL ? lm_s_where(s, m, lm_scalar(s, 0, q), lm_scalar(s, -INFINITY, q)) : m;
  f = lm_s_cast(s, f, LM_F32);
  int nb = q->ndim - 2;
  int64_t shape[LM_MAX_DIMS], L = q->shape_[nb], S = in[1]->shape_[nb];
  memcpy(shape, q->shape_, nb * sizeof *shape);
  shape[nb] = L, shape[nb + 1] = S;
  lm_tensor *b = f ? lm_s(s, lm_broadcast_to("scaled_dot_product_attention", "attn_mask", f, nb + 2, shape)) : NULL;
  if (!b) { lm_clear_error(); *rc = LM_UNSUPPORTED; return NULL; }
  /* one batch stride sb with stride[d] == sb * (the batch dims inside d), or a dense copy */
  int64_t sb = -1, inner = 1, B = lm_shape_numel(nb, shape);
  bool folds = true;
  for (int d = nb - 1; d >= 0; inner *= shape[d--]) {
    if (shape[d] == 1) continue;
    if (sb < 0) sb = b->stride_[d] % inner ? -2 : b->stride_[d] / inner;
    if (sb < 0 || b->stride_[d] != sb * inner) { folds = false; break; }
  }
  if (!folds) b = lm_s_contig(s, b);
  int64_t bs[3] = {B, L, S};
  if (!folds) return lm_s_reshape(s, b, 3, bs);
  int64_t st[3] = {sb < 0 ? 0 : sb, b->stride_[nb], b->stride_[nb + 1]};
  return lm_s(s, lm_view_of(b, 3, bs, st, b->offset));
}

/* t (..., R, C) dense as (B, R, C) in its dtype */
static lm_tensor *as_batch3(lm_scope *s, lm_tensor *t) {
  if (!t) return NULL;
  int64_t shape[3] = {lm_shape_numel(t->ndim - 2, t->shape_), t->shape_[t->ndim - 2], t->shape_[t->ndim - 1]};
  return lm_s_reshape(s, lm_s_contig(s, t), 3, shape);
}

/* t as the kernel takes it: where the backend takes strided operands
 * (attention_strided), a 4-D t with dense rows as it is (the transposed
 * heads of a projection: no copy), else dense (B, R, C) */
static lm_tensor *as_operand(lm_scope *s, lm_tensor *t, bool strided) {
  if (strided && t && t->ndim == 4 && t->stride_[3] == 1) return t;
  return as_batch3(s, t);
}

/* an empty tensor shaped and laid out as t where t's strides lay its
 * elements densely in some order (a gradient then keeps its input's
 * layout, and the transpose back to (B, R, H, E) is free), else dense */
static lm_tensor *empty_laid_as(lm_scope *s, const lm_tensor *t) {
  int n = t->ndim, order[LM_MAX_DIMS];
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = 1; i < n; i++) /* by stride, largest first */
    for (int j = i; j > 0 && t->stride_[order[j]] > t->stride_[order[j - 1]]; j--) {
      int x = order[j];
      order[j] = order[j - 1], order[j - 1] = x;
    }
  int64_t expect = 1;
  for (int i = n - 1; i >= 0; i--) {
    int d = order[i];
    if (t->shape_[d] == 1) continue;
    if (t->stride_[d] != expect) return lm_s(s, lm_empty_like(t));
    expect *= t->shape_[d];
  }
  int64_t numel = lm_shape_numel(n, t->shape_);
  lm_tensor *z = lm_s(s, lm_empty(1, &numel, t->dtype_, t->device_));
  return z ? lm_s(s, lm_view_of(z, n, t->shape_, t->stride_, 0)) : NULL;
}

/* A kernel that answers LM_UNSUPPORTED for a head dim E (or the operands'
 * alignment) gets one more try on fresh copies padded with zeros to Dp, the
 * width it is asked with next: E itself (a fresh, aligned copy), else 64,
 * 128, 192 or 256 above it (a multiple of 8 up to 256; q and v of the same
 * head dim).
 * Zero columns leave q k^T, and so the probabilities and lse, unchanged,
 * and give zero output columns; the scale stays E's. 0: no retry. */
static int64_t sdpa_pad_dim(const lm_tensor *q, const lm_tensor *v) {
  int64_t E = q->shape_[q->ndim - 1];
  if (E != v->shape_[v->ndim - 1] || E % 8 || E <= 0 || E > 256) return 0;
  return E <= 64 ? 64 : E <= 128 ? 128 : E <= 192 ? 192 : 256;
}

/* t (B, R, E) as a fresh (B, R, Dp) whose first E columns are t's, the rest
 * zeros (Dp 0: t itself) */
static lm_tensor *pad_cols(lm_scope *s, lm_tensor *t, int64_t Dp) {
  if (!t || Dp == 0) return t;
  int64_t shape[3] = {t->shape_[0], t->shape_[1], Dp};
  lm_tensor *z = lm_s(s, lm_empty(3, shape, t->dtype_, t->device_));
  lm_tensor *head = z ? lm_s(s, lm_view_of(z, 3, t->shape_, z->stride_, z->offset)) : NULL;
  return head && lm_fill_(z, 0) == 0 && lm_copy_(head, t) == 0 ? z : NULL;
}

/* the first E columns of a padded (B, R, Dp) result, dense */
static lm_tensor *unpad_cols(lm_scope *s, lm_tensor *t, int64_t E) {
  if (!t || t->shape_[2] == E) return t;
  int64_t shape[3] = {t->shape_[0], t->shape_[1], E};
  return lm_s_contig(s, lm_s(s, lm_view_of(t, 3, shape, t->stride_, t->offset)));
}

static int sdpa_fw_fused_at(const lm_backend *be, const lm_call *c, int64_t Dp, lm_tensor **out) {
  lm_scope s = {0};
  int brc;
  lm_tensor *bias = sdpa_bias(&s, c->nin, c->in, &brc);
  if (brc) { lm_scope_end(&s); return brc; }
  bool strided = be->attention_strided && !Dp && !bias;
  lm_tensor *q = as_operand(&s, c->in[0], strided), *k = as_operand(&s, c->in[1], strided),
            *v = as_operand(&s, c->in[2], strided);
  const lm_tensor *q0 = c->in[0];
  int64_t B = lm_shape_numel(q0->ndim - 2, q0->shape_), L = q0->shape_[q0->ndim - 2];
  int64_t Ev = c->in[2]->shape_[c->in[2]->ndim - 1];
  q = pad_cols(&s, q, Dp), k = pad_cols(&s, k, Dp), v = pad_cols(&s, v, Dp);
  lm_tensor *o = NULL, *lse = NULL;
  if (q && k && v) {
    int64_t oshape[3] = {B, L, v->shape_[v->ndim - 1]}, lshape[2] = {B, L};
    o = lm_s(&s, lm_empty(3, oshape, q->dtype_, q->device_));
    lse = lm_s(&s, lm_empty(2, lshape, c->out[1].dtype, q->device_));
  }
  int causal = c->a->ni >= 1 && c->a->i[0];
  double scale = sdpa_scale(c->in[0], c->a);
  int rc = !(o && lse && (bias || c->nin == 3)) ? -1
           : bias ? be->attention_bias(o, lse, q, k, v, bias, scale) : be->attention(o, lse, q, k, v, scale, causal);
  lm_tensor *r0 = rc == 0 ? lm_s_reshape(&s, unpad_cols(&s, o, Ev), c->out[0].ndim, c->out[0].shape) : NULL;
  lm_tensor *r1 = r0 ? lm_s_reshape(&s, lse, c->out[1].ndim, c->out[1].shape) : NULL;
  if (r1) lm_retain(out[0] = r0), lm_retain(out[1] = r1);
  lm_scope_end(&s);
  return r1 ? 0 : rc == LM_UNSUPPORTED ? rc : -1;
}

static int sdpa_fw_fused(const lm_backend *be, const lm_call *c, lm_tensor **out) {
  int rc = sdpa_fw_fused_at(be, c, 0, out);
  int64_t Dp = rc == LM_UNSUPPORTED ? sdpa_pad_dim(c->in[0], c->in[2]) : 0;
  if (Dp) lm_clear_error(), rc = sdpa_fw_fused_at(be, c, Dp, out);
  return rc;
}

static int sdpa_bw_fused_at(const lm_backend *be, const lm_saved *n, lm_tensor *g, int64_t Dp, lm_tensor **gin) {
  lm_scope s = {0};
  int brc;
  lm_tensor *bias = sdpa_bias(&s, n->nin, n->in, &brc);
  if (brc) { lm_scope_end(&s); return brc; }
  int dt = n->in[0]->dtype_;
  bool strided = be->attention_strided && !Dp && !bias;
  lm_tensor *q = as_operand(&s, n->in[0], strided), *k = as_operand(&s, n->in[1], strided),
            *v = as_operand(&s, n->in[2], strided);
  lm_tensor *o = as_operand(&s, lm_s_cast(&s, n->out[0], dt), strided),
            *g3 = as_operand(&s, lm_s_cast(&s, g, dt), strided);
  const lm_tensor *q0 = n->in[0];
  int64_t lshape[2] = {lm_shape_numel(q0->ndim - 2, q0->shape_), q0->shape_[q0->ndim - 2]};
  lm_tensor *lse = lm_s_reshape(&s, lm_s_contig(&s, n->out[1]), 2, lshape);
  int64_t E[3];
  for (int i = 0; i < 3; i++) E[i] = n->in[i]->shape_[n->in[i]->ndim - 1];
  q = pad_cols(&s, q, Dp), k = pad_cols(&s, k, Dp), v = pad_cols(&s, v, Dp);
  o = pad_cols(&s, o, Dp), g3 = pad_cols(&s, g3, Dp);
  lm_tensor *dq = NULL, *dk = NULL, *dv = NULL;
  if (q && k && v && o && g3 && lse) {
    dq = empty_laid_as(&s, q), dk = empty_laid_as(&s, k), dv = empty_laid_as(&s, v);
  }
  int causal = n->attrs.ni >= 1 && n->attrs.i[0];
  double scale = sdpa_scale(n->in[0], &n->attrs);
  int rc = !(dq && dk && dv && (bias || n->nin == 3)) ? -1
           : bias ? be->attention_bias_bwd(dq, dk, dv, g3, q, k, v, o, lse, bias, scale)
                  : be->attention_bwd(dq, dk, dv, g3, q, k, v, o, lse, scale, causal);
  for (int i = 0; i < 3 && rc == 0; i++) {
    lm_tensor *d = i == 0 ? dq : i == 1 ? dk : dv;
    if (Dp) d = unpad_cols(&s, d, E[i]);
    if (d && d->ndim != n->in[i]->ndim) d = lm_s_reshape(&s, d, n->in[i]->ndim, n->in[i]->shape_);
    rc = d ? lm_give(n, gin, i, d) : -1;
  }
  lm_scope_end(&s);
  return rc;
}

static int sdpa_bw_fused(const lm_backend *be, const lm_saved *n, lm_tensor *g, lm_tensor **gin) {
  int rc = sdpa_bw_fused_at(be, n, g, 0, gin);
  int64_t Dp = rc == LM_UNSUPPORTED ? sdpa_pad_dim(n->in[0], n->in[2]) : 0;
  if (Dp) lm_clear_error(), rc = sdpa_bw_fused_at(be, n, g, Dp, gin);
  return rc;
}

int lm_fw_sdpa(const lm_call *c, lm_tensor **out) {
  const lm_backend *be = sdpa_fusable(c->nin, c->in) ? LM_FUSED(c->in[0], attention) : NULL; /* and attention_bias */
  int rc = be ? sdpa_fw_fused(be, c, out) : LM_UNSUPPORTED;
  if (rc != LM_UNSUPPORTED) return rc;
  if (be) lm_clear_error(); /* the kernel does not cover these: compose */
  lm_scope s = {0};
  lm_tensor *q, *k, *v, *sc = NULL;
  double scale;
  int dt = c->out[0].dtype;
  lm_tensor *p = sdpa_probs(&s, c->in, c->nin, c->a, lm_compute_dtype(dt), &q, &k, &v, &scale, &sc);
  lm_tensor *r = lm_s2(&s, LM_OP_MATMUL, p, v);
  lm_tensor *lse = r ? lm_s_reshape(&s, lm_s_logsumexp(&s, sc, -1), c->out[1].ndim, c->out[1].shape) : NULL;
  out[0] = lse ? lm_cast(r, dt) : NULL;
  if (out[0]) lm_retain(out[1] = lse);
  lm_scope_end(&s);
  return out[0] ? 0 : -1;
}

int lm_bw_sdpa(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  const lm_backend *be = sdpa_fusable(n->nin, n->in) && (n->nin == 3 || LM_FUSED(n->in[0], attention_bias_bwd))
                            ? LM_FUSED(n->in[0], attention_bwd) : NULL;
  int fused = be ? sdpa_bw_fused(be, n, gout[0], gin) : LM_UNSUPPORTED;
  if (fused != LM_UNSUPPORTED) return fused;
  if (be) lm_clear_error(); /* the kernel does not cover these: compose */
  lm_scope s = {0};
  lm_tensor *q, *k, *v;
  double scale;
  int cd = lm_compute_dtype(n->out[0]->dtype_);
  lm_tensor *p = sdpa_probs(&s, n->in, n->nin, &n->attrs, cd, &q, &k, &v, &scale, NULL);
  lm_tensor *g = lm_s_cast(&s, gout[0], cd);
  int rc = p && g ? 0 : -1;
  if (rc == 0 && n->in[2]->needs_grad) /* dv = p^T g */
    rc = lm_give(n, gin, 2, lm_s2(&s, LM_OP_MATMUL, lm_s_transpose(&s, p, -2, -1), g));
  bool need_ds = n->in[0]->needs_grad || n->in[1]->needs_grad || (n->nin == 4 && n->in[3]->needs_grad);
  if (rc == 0 && need_ds) { /* ds = p * (dp - sum(dp * p)), dp = g v^T */
    lm_tensor *dp = lm_s2(&s, LM_OP_MATMUL, g, lm_s_transpose(&s, v, -2, -1));
    lm_tensor *ds = lm_s2(&s, LM_OP_MUL, p, lm_s2(&s, LM_OP_SUB, dp, lm_s_sum(&s, lm_s2(&s, LM_OP_MUL, dp, p), -1, 1)));
    if (n->in[0]->needs_grad) rc |= lm_give(n, gin, 0, lm_s_mulk(&s, lm_s2(&s, LM_OP_MATMUL, ds, k), scale));
    if (n->in[1]->needs_grad)
      rc |= lm_give(n, gin, 1, lm_s_mulk(&s, lm_s2(&s, LM_OP_MATMUL, lm_s_transpose(&s, ds, -2, -1), q), scale));
    if (n->nin == 4 && n->in[3]->needs_grad && lm_is_float(n->in[3]->dtype_)) rc |= lm_give(n, gin, 3, ds);
  }
  lm_scope_end(&s);
  return rc ? -1 : 0;
}

/* ---- rope(x (..., T, H, D), cos (T, D/2), sin (T, D/2)) ----
 * Llama's apply_rotary_emb: pairs (x[2i], x[2i+1]) rotate by angle_{t,i}
 * as a complex product. Backward rotates by the opposite angle. */
int lm_shape_rope(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin, (void)a;
  const lm_meta *x = &in[0];
  LM_TRY(lm_need_float("rope", 1, "input", x));
  if (x->ndim < 3 || x->ndim > LM_MAX_DIMS - 1)
    return lm_error("rope: argument #1 (input) expected 3 to %d dims (..., seq, heads, head_dim), got %d",
                    LM_MAX_DIMS - 1, x->ndim);
  int64_t T = x->shape[x->ndim - 3], D = x->shape[x->ndim - 1];
  if (D % 2) return lm_error("rope: argument #1 (input) expected an even head_dim, got %lld", (long long)D);
  for (int i = 1; i < 3; i++) {
    const lm_meta *t = &in[i];
    const char *arg = i == 1 ? "cos" : "sin";
    LM_TRY(lm_need_float("rope", i + 1, arg, t));
    if (t->ndim != 2 || t->shape[0] != T || t->shape[1] != D / 2)
      return lm_error("rope: argument #%d (%s) expected shape (%lld, %lld) (seq, head_dim/2)", i + 1,
                      arg, (long long)T, (long long)(D / 2));
  }
  *out = *x;
  return 0;
}

/* x rotated by sign * angle, in cd, x's shape */
static lm_tensor *rope_rotate(lm_scope *s, lm_tensor *x, lm_tensor *cos, lm_tensor *sin, double sign, int cd) {
  int nd = x->ndim;
  int64_t shape[LM_MAX_DIMS], T = x->shape_[nd - 3], D = x->shape_[nd - 1], cs[4] = {T, 1, D / 2, 1};
  memcpy(shape, x->shape_, nd * sizeof *shape);
  shape[nd - 1] = D / 2, shape[nd] = 2;
  lm_tensor *x5 = lm_s_reshape(s, lm_s_cast(s, x, cd), nd + 1, shape);
  lm_attrs n0 = {.i = {-1, 0, 1}, .ni = 3}, n1 = {.i = {-1, 1, 1}, .ni = 3};
  lm_tensor *a = lm_sop(s, LM_OP_NARROW, 1, &x5, &n0), *b = lm_sop(s, LM_OP_NARROW, 1, &x5, &n1);
  lm_tensor *c = lm_s_reshape(s, lm_s_cast(s, cos, cd), 4, cs);
  lm_tensor *sn = lm_s_reshape(s, lm_s_cast(s, sin, cd), 4, cs);
  if (sign < 0) sn = lm_s1(s, LM_OP_NEG, sn);
  lm_tensor *o[2] = {lm_s2(s, LM_OP_SUB, lm_s2(s, LM_OP_MUL, a, c), lm_s2(s, LM_OP_MUL, b, sn)),
                     lm_s2(s, LM_OP_ADD, lm_s2(s, LM_OP_MUL, a, sn), lm_s2(s, LM_OP_MUL, b, c))};
  lm_tensor *r = lm_sop(s, LM_OP_CAT, 2, o, &(lm_attrs){.i = {-1}, .ni = 1});
  return lm_s_reshape(s, r, x->ndim, x->shape_);
}

/* the same in one pass of the backend's rope kernel, on x viewed as
 * (outer, T, H, D) in xdt, cos and sin in cd; -1 or LM_UNSUPPORTED (a
 * kernel without xdt) in *rc when NULL */
static lm_tensor *rope_fused_as(lm_scope *s, const lm_backend *be, lm_tensor *x, lm_tensor *cos,
                                lm_tensor *sin, int sign, int xdt, int cd, int *rc) {
  int nd = x->ndim;
  int64_t T = x->shape_[nd - 3], H = x->shape_[nd - 2], D = x->shape_[nd - 1];
  int64_t inner = T * H * D, shape4[4] = {inner ? x->numel_ / inner : 0, T, H, D};
  lm_tensor *x4 = lm_s_reshape(s, lm_s_contig(s, lm_s_cast(s, x, xdt)), 4, shape4);
  lm_tensor *c = lm_s_contig(s, lm_s_cast(s, cos, cd)), *sn = lm_s_contig(s, lm_s_cast(s, sin, cd));
  lm_tensor *o = x4 && c && sn ? lm_s(s, lm_empty_like(x4)) : NULL;
  *rc = o ? be->rope(o, x4, c, sn, sign) : -1;
  return *rc == 0 ? lm_s_reshape(s, o, nd, x->shape_) : NULL;
}

/* bf16/f16 x rotates in its own dtype where the kernel takes it (no f32
 * copy; the CUDA kernel computes in f32), else in cd */
static lm_tensor *rope_fused(lm_scope *s, const lm_backend *be, lm_tensor *x, lm_tensor *cos,
                             lm_tensor *sin, int sign, int cd) {
  int rc, xdt = x->dtype_ == LM_BF16 || x->dtype_ == LM_F16 ? x->dtype_ : cd;
  lm_tensor *r = rope_fused_as(s, be, x, cos, sin, sign, xdt, cd, &rc);
  if (!r && rc == LM_UNSUPPORTED && xdt != cd) r = rope_fused_as(s, be, x, cos, sin, sign, cd, cd, &rc);
  return r;
}

static lm_tensor *rope_any(lm_scope *s, lm_tensor *x, lm_tensor *cos, lm_tensor *sin, int sign, int cd) {
  const lm_backend *be = LM_FUSED(x, rope);
  return be ? rope_fused(s, be, x, cos, sin, sign, cd) : rope_rotate(s, x, cos, sin, sign, cd);
}

int lm_fw_rope(const lm_call *c, lm_tensor **out) {
  lm_scope s = {0};
  lm_tensor *x = c->in[0], *r = rope_any(&s, x, c->in[1], c->in[2], 1, lm_compute_dtype(x->dtype_));
  *out = r ? lm_cast(r, x->dtype_) : NULL;
  lm_scope_end(&s);
  return *out ? 0 : -1;
}

int lm_bw_rope(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  if (!n->in[0]->needs_grad) return 0;
  lm_scope s = {0};
  lm_tensor *d = rope_any(&s, gout[0], n->in[1], n->in[2], -1, lm_compute_dtype(n->in[0]->dtype_));
  int rc = d ? lm_give(n, gin, 0, d) : -1;
  lm_scope_end(&s);
  return rc;
}
