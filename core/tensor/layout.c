/* layout.c: arithmetic of shapes, strides, dims and chunks, without data
 * (views that broadcast are made in tensor.c). */
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
  /* the nonzero sizes' product: bounded even where a zero size empties
   * the tensor, so no stride computed from the shape overflows */
  double n = 1;
  bool empty = false;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return lm_error("%s: %s expected sizes >= 0, got %lld in dim %d", op, arg,
                      (long long)shape[d], d + 1);
    if (shape[d] > 0) n *= (double)shape[d];
    else empty = true;
  }
  if (n > (double)(1LL << 40))
    return lm_error("%s: %s has %.0f elements%s, more than loom allows (2^40)", op, arg, n,
                    empty ? " but for its zero sizes" : "");
  return 0;
}

int lm_wrap_dim(const char *op, const char *arg, int64_t dim, int ndim) {
  int64_t n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    return lm_error("%s: %s expected a dim in [%lld, %lld], got %lld", op, arg,
                    (long long)-n, (long long)n, (long long)(dim >= 0 ? dim + 1 : dim));
  return (int)(dim < 0 ? dim + n : dim);
}

/* torch.chunk's arithmetic: n split into k chunks of ceil(n / k), the
 * trailing ones shorter or empty; chunk i's size and offset */
int64_t lm_chunk_size(int64_t n, int k, int i) {
  if (k <= 0 || n <= 0) return 0;
  int64_t c = (n + k - 1) / k, s = n - (int64_t)i * c;
  return s < 0 ? 0 : s < c ? s : c;
}
int64_t lm_chunk_offset(int64_t n, int k, int i) {
  if (k <= 0 || n <= 0) return 0;
  int64_t c = (n + k - 1) / k, o = (int64_t)i * c;
  return o < n ? o : n;
}
