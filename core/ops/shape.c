/* shape.c: helpers the shape inference functions share. */
#include "op.h"

int lm_broadcast_metas(const char *op, int n, const lm_meta *in, lm_meta *out) {
  int nd = 0;
  for (int k = 0; k < n; k++) nd = in[k].ndim > nd ? in[k].ndim : nd;
  out->ndim = nd;
  for (int d = 0; d < nd; d++) out->shape[d] = 1;
  for (int k = 0; k < n; k++)
    for (int d = 0; d < in[k].ndim; d++) {
      int64_t *s = &out->shape[nd - in[k].ndim + d], v = in[k].shape[d];
      if (v == *s || v == 1) continue;
      if (*s != 1)
        return lm_error("%s: shapes cannot broadcast: argument #%d has size %lld in dim %d, "
                        "another argument has %lld", op, k + 1, (long long)v, d + 1, (long long)*s);
      *s = v;
    }
  return 0;
}

int lm_need_ints(const char *op, const lm_attrs *a, int n, const char *what) {
  if (a->ni >= n) return 0;
  return lm_error("%s: expected %d integer attrs (%s), got %d", op, n, what, a->ni);
}

int lm_need_float(const char *op, int k, const char *arg, const lm_meta *m) {
  if (lm_is_float(m->dtype)) return 0;
  return lm_error("%s: argument #%d (%s) expected a floating point tensor, got %s", op, k, arg,
                  lm_dtype_name(m->dtype));
}

/* The ids of idx (any integer dtype) must lie in [0, n) or equal `skip`
 * when skip_ok. Read on the host. */
int lm_check_ids(const char *op, int k, const char *arg, lm_tensor *idx, int64_t n,
                     int skip_ok, int64_t skip, const char *what) {
  lm_scope s = {0};
  lm_tensor *c = idx;
  if (idx->device_ != LM_CPU) {
    c = lm_s(&s, lm_empty(idx->ndim, idx->shape_, LM_I64, LM_CPU));
    if (!c || lm_copy_(c, idx) < 0) { lm_scope_end(&s); return -1; }
  }
  c = lm_s_contig(&s, lm_s_cast(&s, c, LM_I64));
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
