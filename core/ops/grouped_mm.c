/* grouped_mm.c: grouped_mm(x (N, K), w (E, K, M), group_sizes (E)) -> (N, M),
 * the GEMM of a mixture of experts: x's rows sorted by expert, the rows of
 * group e (the group_sizes[e] rows after those of groups < e) times w[e].
 * One op over all experts, run by the backend's grouped_gemm kernel; w may
 * be a transposed view (an (E, M, K) weight seen through transpose(2, 3)),
 * which the GEMMs read as it is. Backward: dx = grouped_mm(g, w^T), and
 * dw[e] = x_e^T @ g_e, in w's layout when w is a transposed view. */
#include "op.h"
#include <stdlib.h>

int lm_shape_grouped_mm(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin, (void)a;
  const lm_meta *x = &in[0], *w = &in[1], *gs = &in[2];
  if (x->ndim != 2)
    return lm_error("grouped_mm: argument #1 (input) expected 2 dims (rows, K), got %d", x->ndim);
  if (w->ndim != 3)
    return lm_error("grouped_mm: argument #2 (weight) expected 3 dims (groups, K, M), got %d", w->ndim);
  if (!lm_is_float(x->dtype) || !lm_is_float(w->dtype))
    return lm_error("grouped_mm: expected floating point input and weight, got %s and %s",
                    lm_dtype_name(x->dtype), lm_dtype_name(w->dtype));
  static const char *const names[2] = {"input", "weight"};
  LM_TRY(lm_need_same_low("grouped_mm", 2, in, names));
  if (x->shape[1] != w->shape[1])
    return lm_error("grouped_mm: argument #1 (input) has %lld columns but argument #2 (weight) is "
                    "(%lld, %lld, %lld): expected (groups, %lld, M)", (long long)x->shape[1],
                    (long long)w->shape[0], (long long)w->shape[1], (long long)w->shape[2],
                    (long long)x->shape[1]);
  if (gs->dtype != LM_I64 || gs->ndim != 1 || gs->shape[0] != w->shape[0])
    return lm_error("grouped_mm: argument #3 (group_sizes) expected an i64 tensor of %lld row counts "
                    "(one per group of the weight), got %s with %d dims of size %lld",
                    (long long)w->shape[0], lm_dtype_name(gs->dtype), gs->ndim,
                    (long long)(gs->ndim ? gs->shape[0] : 0));
  *out = (lm_meta){.ndim = 2, .dtype = lm_promote(x->dtype, w->dtype), .shape = {x->shape[0], w->shape[2]}};
  return 0;
}

/* The E + 1 row offsets of the groups (malloc'd, host), from group_sizes
 * (copied from its device), each size >= 0 and the sizes summing to rows. */
static int64_t *offsets_of(lm_tensor *gs, int64_t rows) {
  int64_t E = gs->shape_[0], *offs = malloc(sizeof *offs * (size_t)(E + 1));
  lm_tensor *h = offs ? lm_empty(1, gs->shape_, LM_I64, LM_CPU) : NULL;
  int rc = !offs ? lm_error("grouped_mm: out of memory") : !h || lm_copy_(h, gs) < 0 ? -1 : 0;
  const int64_t *n = rc == 0 ? lm_data(h) : NULL;
  if (offs) offs[0] = 0;
  for (int64_t e = 0; rc == 0 && e < E; e++) {
    if (n[e] < 0)
      rc = lm_error("grouped_mm: argument #3 (group_sizes) holds %lld at %lld, expected row counts >= 0",
                    (long long)n[e], (long long)e + 1);
    offs[e + 1] = offs[e] + n[e];
  }
  if (rc == 0 && offs[E] != rows)
    rc = lm_error("grouped_mm: argument #3 (group_sizes) sums to %lld rows, but the input has %lld",
                  (long long)offs[E], (long long)rows);
  lm_release(h);
  if (rc == 0) return offs;
  free(offs);
  return NULL;
}

/* t as the GEMMs read it: unit stride in one of its last two dims and no
 * broadcast (stride 0) matrix dim, else a contiguous copy (borrowed) */
static lm_tensor *gemm_ready(lm_scope *s, lm_tensor *t) {
  if (!t) return NULL;
  int nd = t->ndim;
  int64_t rs = t->stride_[nd - 2], cs = t->stride_[nd - 1];
  int ok = (cs == 1 || rs == 1) && !(rs == 0 && t->shape_[nd - 2] > 1) && !(cs == 0 && t->shape_[nd - 1] > 1);
  return ok ? t : lm_s_contig(s, t);
}

/* the backend's grouped GEMM of x and w (both read as they are) into a
 * new c of shape (d0, d1, d2) (d0 = 0: 2-D (d1, d2)) in dtype cd */
static lm_tensor *grouped(lm_scope *s, int op, lm_tensor *x, lm_tensor *w, const int64_t *offs,
                          int64_t E, int wgrad, const int64_t *cshape, int cnd, int cd) {
  const lm_backend *be = x ? LM_KERNEL(op, x, grouped_gemm) : NULL;
  lm_tensor *xc = gemm_ready(s, lm_s_cast(s, x, cd)), *wc = gemm_ready(s, lm_s_cast(s, w, cd));
  lm_tensor *c = be && xc && wc ? lm_s(s, lm_empty(cnd, cshape, cd, x->device_)) : NULL;
  return c && be->grouped_gemm(c, xc, wc, offs, E, wgrad) == 0 ? c : NULL;
}

int lm_fw_grouped_mm(const lm_call *c, lm_tensor **out) {
  lm_tensor *x = c->in[0], *w = c->in[1];
  int64_t *offs = offsets_of(c->in[2], x->shape_[0]);
  if (!offs) return -1;
  lm_scope s = {0};
  lm_tensor *r = grouped(&s, c->op, x, w, offs, w->shape_[0], 0, c->out[0].shape, 2, c->out[0].dtype);
  if (r) lm_retain(r);
  lm_scope_end(&s);
  free(offs);
  return (*out = r) ? 0 : -1;
}

/* w seen through transpose(2, 3) of a contiguous (E, M, K) tensor */
static int transposed_weight(const lm_tensor *w) {
  return w->shape_[2] > 1 && w->stride_[1] == 1 && w->stride_[2] == w->shape_[1] &&
         w->stride_[0] == w->shape_[1] * w->shape_[2];
}

int lm_bw_grouped_mm(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *x = n->in[0], *w = n->in[1], *g = gout[0];
  int64_t E = w->shape_[0], K = x->shape_[1], M = w->shape_[2];
  int64_t *offs = offsets_of(n->in[2], x->shape_[0]);
  if (!offs) return -1;
  int cd = lm_promote(x->dtype_, w->dtype_), rc = 0;
  lm_scope s = {0};
  lm_attrs tr = {.i = {1, 2}, .ni = 2};
  if (x->needs_grad) { /* dx = grouped_mm(g, w^T) */
    int64_t sh[2] = {x->shape_[0], K};
    lm_tensor *dx = grouped(&s, n->op, g, lm_sop(&s, LM_OP_TRANSPOSE, 1, &w, &tr), offs, E, 0, sh, 2, cd);
    if (!(gin[0] = lm_grad_like(dx, x))) rc = -1;
  }
  if (w->needs_grad && transposed_weight(w)) { /* dw^T[e] = g_e^T @ x_e, dense as the weight is */
    int64_t sh[3] = {E, M, K};
    lm_tensor *dwt = grouped(&s, n->op, g, x, offs, E, 1, sh, 3, cd);
    if (!(gin[1] = lm_grad_like(dwt ? lm_sop(&s, LM_OP_TRANSPOSE, 1, &dwt, &tr) : NULL, w))) rc = -1;
  } else if (w->needs_grad) { /* dw[e] = x_e^T @ g_e */
    int64_t sh[3] = {E, K, M};
    if (!(gin[1] = lm_grad_like(grouped(&s, n->op, x, g, offs, E, 1, sh, 3, cd), w))) rc = -1;
  }
  lm_scope_end(&s);
  free(offs);
  return rc;
}
