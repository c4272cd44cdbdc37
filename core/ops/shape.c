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
