/* softmax.c: softmax and log_softmax over one dim, with their backward
 * passes (fused per row where the backend has the kernels). Floats compute
 * in f32 (f64 stays f64) and round once to the input's dtype. */
#include "op.h"
#include <string.h>

/* ---- softmax, log_softmax (attrs: i[0] = dim) ---- */
static int softmax_dim(int op, int ndim, const lm_attrs *a) {
  return lm_wrap_dim(lm_op_table[op].name, "dim", a->ni ? a->i[0] : -1, ndim);
}

int lm_shape_softmax(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)nin;
  LM_TRY(lm_need_float(lm_op_table[op].name, 1, "input", &in[0]));
  LM_TRY(softmax_dim(op, in[0].ndim, a));
  *out = in[0];
  return 0;
}

/* x moved so dim d is last, in dtype cd, contiguous: a new ref */
static lm_tensor *dim_last(lm_tensor *x, int d, int cd) {
  lm_scope s = {0};
  lm_tensor *c = lm_s_cast(&s, x, cd), *r = NULL;
  int last = x->ndim ? x->ndim - 1 : 0;
  if (c && d != last) c = lm_s_transpose(&s, c, d, last);
  if (c) r = lm_contiguous(c);
  lm_scope_end(&s);
  return r;
}

int lm_fw_softmax(const lm_call *c, lm_tensor **out) {
  lm_tensor *x = c->in[0];
  int d = softmax_dim(c->op, x->ndim, c->a), cd = lm_compute_dtype(x->dtype_);
  int last = x->ndim ? x->ndim - 1 : 0;
  const lm_backend *be = LM_KERNEL(c->op, x, softmax);
  lm_scope s = {0};
  lm_tensor *xc = be ? lm_s(&s, dim_last(x, d, cd)) : NULL;
  lm_tensor *o = xc ? lm_s(&s, lm_empty_like(xc)) : NULL;
  lm_tensor *r = o && be->softmax(o, xc, c->op == LM_OP_LOG_SOFTMAX) == 0 ? o : NULL;
  if (r && d != last) r = lm_s(&s, dim_last(r, d, cd)); /* swapping back is the same move */
  *out = r ? lm_cast(r, x->dtype_) : NULL;
  lm_scope_end(&s);
  return *out ? 0 : -1;
}

/* the backward in one pass over rows of the backend's softmax_bwd kernel */
static int softmax_bwd_fused(const lm_backend *be, const lm_saved *n, lm_tensor *g, lm_tensor **gin) {
  lm_tensor *x = n->in[0];
  int d = softmax_dim(n->op, x->ndim, &n->attrs), cd = lm_compute_dtype(x->dtype_);
  int last = x->ndim ? x->ndim - 1 : 0;
  lm_scope s = {0};
  lm_tensor *gl = lm_s(&s, dim_last(g, d, cd)), *yl = lm_s(&s, dim_last(n->out[0], d, cd));
  lm_tensor *gx = gl && yl ? lm_s(&s, lm_empty_like(gl)) : NULL;
  if (gx && be->softmax_bwd(gx, gl, yl, n->op == LM_OP_LOG_SOFTMAX) < 0) gx = NULL;
  if (gx && d != last) gx = lm_s(&s, dim_last(gx, d, cd));
  int rc = gx ? lm_give(n, gin, 0, gx) : -1;
  lm_scope_end(&s);
  return rc;
}

int lm_bw_softmax(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *x = n->in[0];
  const lm_backend *be = LM_FUSED(x, softmax_bwd);
  if (be) return softmax_bwd_fused(be, n, gout[0], gin);
  int d = softmax_dim(n->op, x->ndim, &n->attrs), cd = lm_compute_dtype(x->dtype_);
  lm_scope s = {0};
  lm_tensor *g = lm_s_cast(&s, gout[0], cd), *y = lm_s_cast(&s, n->out[0], cd), *gx;
  if (n->op == LM_OP_LOG_SOFTMAX) /* g - exp(y) * sum(g) */
    gx = lm_s2(&s, LM_OP_SUB, g, lm_s2(&s, LM_OP_MUL, lm_s1(&s, LM_OP_EXP, y), lm_s_sum(&s, g, d, 1)));
  else /* y * (g - sum(g * y)) */
    gx = lm_s2(&s, LM_OP_MUL, y, lm_s2(&s, LM_OP_SUB, g, lm_s_sum(&s, lm_s2(&s, LM_OP_MUL, g, y), d, 1)));
  int rc = gx ? lm_give(n, gin, 0, gx) : -1;
  lm_scope_end(&s);
  return rc;
}
