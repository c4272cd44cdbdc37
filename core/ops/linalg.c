/* linalg.c: matmul with torch.matmul's rules (1-D operands, batch
 * broadcasting), through the backend's batched GEMM. Transposed views go
 * to BLAS as they are; only layouts BLAS cannot read are copied. */
#include "op.h"
#include <string.h>

/* A (batch, rows, cols) strided view of x, whose leading dims are merged;
 * x must already have shape (batch..., rows, cols). Copies when the batch
 * dims do not merge or neither matrix dim has unit stride. */
static lm_tensor *as_3d(lm_tensor *x) {
  int nd = x->ndim, nb = nd - 2;
  int64_t B = 1, bs = 0;
  bool merge = true;
  for (int d = nb - 1; d >= 0; d--) {
    if (x->shape_[d] == 1) continue;
    if (B == 1) bs = x->stride_[d];
    else if (x->stride_[d] != bs * B) merge = false;
    B *= x->shape_[d];
  }
  int64_t rs = x->stride_[nd - 2], cs = x->stride_[nd - 1];
  bool blas_ok = cs == 1 || rs == 1 || x->shape_[nd - 1] == 1 || x->shape_[nd - 2] == 1;
  /* an expanded (stride 0) matrix dim is not a BLAS layout, even in a
   * single row or column (e.g. the gradient of sum() flowing into matmul) */
  if ((rs == 0 && x->shape_[nd - 2] > 1) || (cs == 0 && x->shape_[nd - 1] > 1)) blas_ok = false;
  if (merge && blas_ok) {
    int64_t shape[3] = {B, x->shape_[nd - 2], x->shape_[nd - 1]}, stride[3] = {bs, rs, cs};
    if (shape[2] == 1) stride[2] = 1;
    else if (shape[1] == 1) stride[1] = cs == 1 ? shape[2] : 1;
    return lm_view_of(x, 3, shape, stride, x->offset);
  }
  lm_tensor *c = lm_contiguous(x);
  if (!c) return NULL;
  int64_t shape[3] = {B, x->shape_[nd - 2], x->shape_[nd - 1]};
  lm_tensor *v = lm_view_of(c, 3, shape, NULL, c->offset);
  lm_release(c);
  return v;
}

/* x (..., K) as a (rows, K) matrix: a view when the leading dims merge
 * and rows are dense, else a contiguous copy. */
static lm_tensor *fold_rows(lm_tensor *x) {
  int nd = x->ndim;
  int64_t rows = 1, rs = 0, K = x->shape_[nd - 1];
  bool merge = x->stride_[nd - 1] == 1 || K == 1;
  for (int d = nd - 2; d >= 0 && merge; d--) {
    if (x->shape_[d] == 1) continue;
    if (rows == 1) rs = x->stride_[d];
    else if (x->stride_[d] != rs * rows) merge = false;
    rows *= x->shape_[d];
  }
  int64_t shape[2] = {x->numel_ / (K ? K : 1), K}, stride[2] = {rows == 1 ? K : rs, 1};
  if (K == 0) shape[0] = lm_shape_numel(nd - 1, x->shape_);
  if (merge) return lm_view_of(x, 2, shape, stride, x->offset);
  lm_tensor *c = lm_contiguous(x), *v = c ? lm_view_of(c, 2, shape, NULL, c->offset) : NULL;
  lm_release(c);
  return v;
}

/* The result's dtype: the operands' promoted, or attrs i[0] when given,
 * which may only widen bf16/f16 operands to f32 (torch.mm's out_dtype: the
 * GEMM accumulates in f32 and writes it without rounding). */
static int result_dtype(const lm_meta *a, const lm_meta *b, const lm_attrs *at) {
  int dt = lm_promote(a->dtype, b->dtype);
  if (at->ni < 1 || at->i[0] == dt) return dt;
  if (at->i[0] == LM_F32 && (dt == LM_BF16 || dt == LM_F16)) return LM_F32;
  return lm_error("matmul: out_dtype must be the operands' dtype %s, or f32 for bf16/f16 operands, got %s",
                  lm_dtype_name(dt), at->i[0] >= 0 && at->i[0] < LM_NDTYPES ? lm_dtype_name((int)at->i[0]) : "no dtype");
}

/* (..., m, k) @ (..., k, n): batch dims broadcast; a 1-D operand is a
 * row (first) or a column (second) and its dim is dropped from the result. */
int lm_shape_matmul(int op, int nin, const lm_meta *in, const lm_attrs *at, lm_meta *out) {
  (void)op, (void)nin;
  const lm_meta *a = &in[0], *b = &in[1];
  if (a->ndim == 0 || b->ndim == 0)
    return lm_error("matmul: expected tensors with at least 1 dim, got argument #%d with 0",
                    a->ndim == 0 ? 1 : 2);
  if (!lm_is_float(a->dtype) || !lm_is_float(b->dtype))
    return lm_error("matmul: expected floating point tensors, got %s and %s",
                    lm_dtype_name(a->dtype), lm_dtype_name(b->dtype));
  static const char *const names[2] = {"input", "other"};
  LM_TRY(lm_need_same_low("matmul", 2, in, names));
  int64_t K = a->shape[a->ndim - 1], Kb = b->ndim == 1 ? b->shape[0] : b->shape[b->ndim - 2];
  if (K != Kb)
    return lm_error("matmul: argument #1 has %lld columns but argument #2 has %lld rows "
                    "(shapes must be (..., m, k) and (..., k, n))", (long long)K, (long long)Kb);
  int na = a->ndim > 2 ? a->ndim - 2 : 0, nb = b->ndim > 2 ? b->ndim - 2 : 0;
  int nbatch = na > nb ? na : nb, dt = result_dtype(a, b, at);
  if (dt < 0) return -1;
  *out = (lm_meta){.ndim = nbatch, .dtype = dt};
  for (int d = 0; d < nbatch; d++) {
    int da = d - (nbatch - na), db = d - (nbatch - nb);
    int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
    if (sa != sb && sa != 1 && sb != 1)
      return lm_error("matmul: batch dims cannot broadcast: %lld against %lld in batch dim %d",
                      (long long)sa, (long long)sb, d + 1);
    out->shape[d] = sa == 1 ? sb : sa; /* 0 against 1 is 0 */
  }
  if (a->ndim > 1) out->shape[out->ndim++] = a->shape[a->ndim - 2];
  if (b->ndim > 1) out->shape[out->ndim++] = b->shape[b->ndim - 1];
  return 0;
}

/* (..., M, K) @ (K, N): one GEMM over all rows instead of one per batch */
static int matmul_folded(const lm_call *c, lm_tensor **out) {
  lm_tensor *a = c->in[0], *b = c->in[1];
  lm_tensor *a2 = fold_rows(a);
  if (!a2) return -1;
  lm_tensor *in2[2] = {a2, b};
  lm_tensor *r = lm_run(LM_OP_MATMUL, 2, in2, c->a);
  lm_release(a2);
  *out = r ? lm_view_of(r, c->out[0].ndim, c->out[0].shape, NULL, r->offset) : NULL;
  lm_release(r);
  return *out ? 0 : -1;
}

int lm_fw_matmul(const lm_call *c, lm_tensor **out) {
  lm_tensor *a = c->in[0], *b = c->in[1];
  if (a->ndim > 2 && b->ndim == 2 && a->numel_ > 0) return matmul_folded(c, out);
  const lm_backend *be = LM_KERNEL(c->op, a, gemm);
  if (!be) return -1;
  int64_t M = a->ndim == 1 ? 1 : a->shape_[a->ndim - 2], K = a->shape_[a->ndim - 1];
  int64_t N = b->ndim == 1 ? 1 : b->shape_[b->ndim - 1];
  /* the batch shape: the result's leading dims */
  int nbatch = c->out[0].ndim - (a->ndim > 1) - (b->ndim > 1);
  /* operands in their promoted dtype (bf16 stays bf16: the GEMM takes it
   * as an operand format and accumulates in f32), the result in its own */
  int od = lm_promote(a->dtype_, b->dtype_), cd = c->out[0].dtype;
  int64_t sa[LM_MAX_DIMS], sb[LM_MAX_DIMS];
  memcpy(sa, c->out[0].shape, nbatch * sizeof *sa), memcpy(sb, c->out[0].shape, nbatch * sizeof *sb);
  sa[nbatch] = M, sa[nbatch + 1] = K, sb[nbatch] = K, sb[nbatch + 1] = N;
  lm_scope s = {0};
  lm_tensor *ca = lm_s_cast(&s, a, od), *cb = lm_s_cast(&s, b, od), *r = NULL;
  if (ca && a->ndim == 1) { /* (k) -> (1, k) */
    int64_t one[2] = {1, K}, st[2] = {K * ca->stride_[0], ca->stride_[0]};
    ca = lm_s(&s, lm_view_of(ca, 2, one, st, ca->offset));
  }
  if (cb && b->ndim == 1) { /* (k) -> (k, 1) */
    int64_t one[2] = {K, 1}, st[2] = {cb->stride_[0], 1};
    cb = lm_s(&s, lm_view_of(cb, 2, one, st, cb->offset));
  }
  lm_tensor *ea = ca ? lm_s(&s, lm_broadcast_to("matmul", "argument #1", ca, nbatch + 2, sa)) : NULL;
  lm_tensor *eb = cb ? lm_s(&s, lm_broadcast_to("matmul", "argument #2", cb, nbatch + 2, sb)) : NULL;
  lm_tensor *a3 = ea ? lm_s(&s, as_3d(ea)) : NULL, *b3 = eb ? lm_s(&s, as_3d(eb)) : NULL;
  int64_t B = a3 ? a3->shape_[0] : 0, cshape[3] = {B, M, N};
  lm_tensor *c3 = a3 && b3 ? lm_s(&s, lm_empty_as(a, 3, cshape, cd)) : NULL;
  if (c3 && be->gemm(c3, a3, b3, 1, 0) == 0) r = lm_view_of(c3, c->out[0].ndim, c->out[0].shape, NULL, 0);
  lm_scope_end(&s);
  return (*out = r) ? 0 : -1;
}

/* x @ y with the result in dtype dt (attrs i[0]) */
static lm_tensor *product(lm_scope *s, lm_tensor *x, lm_tensor *y, const lm_attrs *dt) {
  lm_tensor *in[2] = {x, y};
  return x && y ? lm_sop(s, LM_OP_MATMUL, 2, in, dt) : NULL;
}

/* A^T @ G, in the layout of b when b is a transposed dense matrix (a
 * weight seen through .t(), as Linear does): then as (G^T @ A)^T, so the
 * weight's own gradient comes out dense and the optimizer, clipping and
 * casts need no transposing copy (PyTorch's mm_mat2_backward does the same). */
static lm_tensor *at_g(lm_scope *s, lm_tensor *a, lm_tensor *g, const lm_tensor *b, lm_attrs *tr,
                       const lm_attrs *dt) {
  if (b->ndim == 2 && b->shape_[0] > 1 && b->stride_[0] == 1 && b->stride_[1] == b->shape_[0]) {
    lm_tensor *gt_a = product(s, lm_sop(s, LM_OP_TRANSPOSE, 1, &g, tr), a, dt);
    return gt_a ? lm_sop(s, LM_OP_TRANSPOSE, 1, &gt_a, tr) : NULL;
  }
  return product(s, lm_sop(s, LM_OP_TRANSPOSE, 1, &a, tr), g, dt);
}

/* dA = g @ B^T, dB = A^T @ g, with 1-D operands lifted to matrices so the
 * same two products serve every case. Each product writes its gradient
 * in the dtype autograd wants it in (f32 for autocast's cast of an f32
 * weight: no bf16 rounding, no cast back). */
int lm_bw_matmul(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *a = n->in[0], *b = n->in[1], *g = gout[0];
  lm_scope s = {0};
  int od = lm_promote(a->dtype_, b->dtype_);   /* a forward given out_dtype f32 */
  if (g->dtype_ != od) g = lm_s_cast(&s, g, od);
  lm_attrs dta = {.i = {lm_grad_dtype(n, 0)}, .ni = 1}, dtb = {.i = {lm_grad_dtype(n, 1)}, .ni = 1};
  lm_attrs last = {.i = {-1}, .ni = 1}, before_last = {.i = {-2}, .ni = 1};
  lm_attrs tr = {.i = {-1, -2}, .ni = 2};
  lm_tensor *a2 = a->ndim == 1 ? lm_sop(&s, LM_OP_UNSQUEEZE, 1, &a, &(lm_attrs){.i = {0}, .ni = 1}) : a;
  lm_tensor *b2 = b->ndim == 1 ? lm_sop(&s, LM_OP_UNSQUEEZE, 1, &b, &last) : b;
  lm_tensor *g2 = g;
  if (a->ndim == 1) g2 = lm_sop(&s, LM_OP_UNSQUEEZE, 1, &g2, b->ndim == 1 ? &(lm_attrs){.i = {0}, .ni = 1} : &before_last);
  if (b->ndim == 1) g2 = lm_sop(&s, LM_OP_UNSQUEEZE, 1, &g2, &last);
  int rc = 0;
  if (a->needs_grad) {
    lm_tensor *da = product(&s, g2, lm_sop(&s, LM_OP_TRANSPOSE, 1, &b2, &tr), &dta);
    if (!(gin[0] = lm_grad_as(da, a, dta.i[0]))) rc = -1;
  }
  if (b->needs_grad && a->ndim > 2 && b->ndim == 2) { /* rows folded: one GEMM, no batch sum */
    lm_tensor *af = lm_s(&s, fold_rows(a)), *gf = g ? lm_s(&s, fold_rows(g)) : NULL;
    if (!(gin[1] = lm_grad_as(at_g(&s, af, gf, b, &tr, &dtb), b, dtb.i[0]))) rc = -1;
  } else if (b->needs_grad) {
    lm_tensor *db = at_g(&s, a2, g2, b2, &tr, &dtb);
    if (b->ndim == 1 && db) db = lm_sop(&s, LM_OP_SQUEEZE, 1, &db, &last);
    if (!(gin[1] = lm_grad_as(db, b, dtb.i[0]))) rc = -1;
  }
  lm_scope_end(&s);
  return rc;
}

