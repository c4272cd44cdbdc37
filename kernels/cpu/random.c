/* random.c: fills a tensor from Philox counters by global linear index
 * (philox.h draws; built with -ffp-contract=off so it matches CUDA). */
#include "kernels.h"
#include "../../core/philox.h"

int lm_cpu_random(lm_tensor *t, int kind, double a, double b, uint64_t seed, uint64_t offset,
                  const int64_t *gshape, const int64_t *start) {
  int nd = t->ndim, es = lm_dtype_size(t->dtype_);
  char *base = lm_ptr(t);
#pragma omp parallel for num_threads(lm_threads_for(t->numel_ * 8)) schedule(static)
  for (int64_t i = 0; i < t->numel_; i++) {
    int64_t rem = i, g = 0, gstride = 1, off = 0;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t idx = rem % t->shape_[d];
      rem /= t->shape_[d];
      off += idx * t->stride_[d];
      g += (idx + (start ? start[d] : 0)) * gstride;
      gstride *= gshape ? gshape[d] : t->shape_[d];
    }
    double v = lm_philox_draw(kind, a, b, seed, offset + (uint64_t)g, t->dtype_);
    lm_store(base + off * es, t->dtype_, v);
  }
  return 0;
}
