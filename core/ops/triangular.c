/* triangular.c: triu and tril, the masks of causal attention. */
#include "op.h"

/* ---- triu, tril (attrs: i[0] = diagonal k) over the last two dims ---- */
int lm_shape_tri(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)nin, (void)a;
  if (in[0].ndim < 2)
    return lm_error("%s: argument #1 (input) expected at least 2 dims, got %d", lm_op_table[op].name,
                    in[0].ndim);
  *out = in[0];
  return 0;
}

static lm_tensor *tri_mask(lm_scope *s, int op, const lm_tensor *x, const lm_attrs *a) {
  int64_t R = x->shape_[x->ndim - 2], C = x->shape_[x->ndim - 1], rs[2] = {R, 1}, cs[2] = {1, C};
  lm_tensor *r = lm_s_reshape(s, lm_s_arange(s, R, x->device_), 2, rs);
  lm_tensor *c = lm_s_reshape(s, lm_s_arange(s, C, x->device_), 2, cs);
  lm_tensor *diff = lm_s2(s, LM_OP_SUB, c, r);
  double k = a->ni ? (double)a->i[0] : 0;
  return lm_s2(s, op == LM_OP_TRIU ? LM_OP_GE : LM_OP_LE, diff, lm_scalar(s, k, diff));
}

int lm_fw_tri(const lm_call *c, lm_tensor **out) {
  lm_tensor *x = c->in[0];
  lm_scope s = {0};
  lm_tensor *r = lm_s_where(&s, tri_mask(&s, c->op, x, c->a), x, lm_scalar(&s, 0, x));
  *out = r ? lm_cast(r, x->dtype_) : NULL;
  lm_scope_end(&s);
  return *out ? 0 : -1;
}

int lm_bw_tri(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_scope s = {0};
  lm_tensor *g = gout[0], *d = lm_s_where(&s, tri_mask(&s, n->op, n->in[0], &n->attrs), g, lm_scalar(&s, 0, g));
  int rc = d ? lm_give(n, gin, 0, d) : -1;
  lm_scope_end(&s);
  return rc;
}
