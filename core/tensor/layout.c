/* layout.c: shapes, strides, dims and broadcasting, without data. */
#include "tensor.h"

int64_t lm_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

void lm_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    stride[d] = s;
    s *= shape[d] > 1 ? shape[d] : 1;
  }
}

int lm_is_contiguous(const lm_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape_[d] != 1 && t->stride_[d] != s) return 0;
    s *= t->shape_[d];
  }
  return 1;
}

int lm_check_shape(const char *op, const char *arg, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > LM_MAX_DIMS)
    return lm_error("%s: %s expected 0 to %d dims, got %d", op, arg, LM_MAX_DIMS, ndim);
  double n = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return lm_error("%s: %s expected sizes >= 0, got %lld in dim %d", op, arg,
                      (long long)shape[d], d + 1);
    n *= (double)shape[d];
  }
  if (n > (double)(1LL << 40))
    return lm_error("%s: %s has %.0f elements, more than loom allows (2^40)", op, arg, n);
  return 0;
}

int lm_wrap_dim(const char *op, const char *arg, int64_t dim, int ndim) {
  int64_t n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    return lm_error("%s: %s expected a dim in [%lld, %lld], got %lld", op, arg,
                    (long long)-n, (long long)n, (long long)(dim >= 0 ? dim + 1 : dim));
  return (int)(dim < 0 ? dim + n : dim);
}

lm_tensor *lm_broadcast_to(const char *op, const char *arg, const lm_tensor *t, int ndim,
                           const int64_t *shape) {
  int64_t stride[LM_MAX_DIMS];
  int lead = ndim - t->ndim;
  if (lead < 0) {
    lm_error("%s: %s has %d dims, cannot broadcast to %d", op, arg, t->ndim, ndim);
    return NULL;
  }
  for (int d = 0; d < ndim; d++) {
    int s = d - lead;
    if (s < 0) { stride[d] = 0; continue; }
    if (t->shape_[s] == shape[d]) stride[d] = shape[d] == 1 ? 0 : t->stride_[s];
    else if (t->shape_[s] == 1) stride[d] = 0;
    else {
      lm_error("%s: %s has size %lld in dim %d, cannot broadcast to %lld", op, arg,
               (long long)t->shape_[s], s + 1, (long long)shape[d]);
      return NULL;
    }
  }
  return lm_view_of(t, ndim, shape, stride, t->offset);
}
