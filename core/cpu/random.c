/* random.c: fills a tensor from Philox counters by global linear index. */
#include "../internal.h"
#include <math.h>

/* uniform in [0, 1) from the top 24 bits (floats) or 53 bits (doubles) */
static double uniform(const uint32_t r[4], int dtype) {
  if (dtype == LM_F64) return ((((uint64_t)r[0] << 32) | r[1]) >> 11) * 0x1p-53;
  return (r[0] >> 8) * 0x1p-24;
}

static double draw(int kind, double a, double b, uint64_t seed, uint64_t counter, int dtype) {
  uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, r[4];
  lm_philox4x32(ctr, key, r);
  if (kind == LM_UNIFORM) return a + (b - a) * uniform(r, dtype);
  if (kind == LM_RANDINT) return a + floor((b - a) * ((((uint64_t)r[0] << 32) | r[1]) >> 11) * 0x1p-53);
  /* Box-Muller on r[2], r[3]: u1 in (0, 1] so the log is finite */
  double u1 = ((r[2] >> 8) + 1) * 0x1p-24, u2 = (r[3] >> 8) * 0x1p-24;
  return a + b * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}

int lm_cpu_random(lm_tensor *t, int kind, double a, double b, uint64_t seed, uint64_t offset,
                  const int64_t *gshape, const int64_t *start) {
  int nd = t->ndim, es = lm_dtype_size(t->dtype_);
  char *base = lm_ptr(t);
#pragma omp parallel for num_threads(lm_threads_for(t->numel_ * 8)) schedule(static)
  for (int64_t i = 0; i < t->numel_; i++) {
    int64_t rem = i, g = 0, gstride = 1, off = 0;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t idx = rem % t->shape[d];
      rem /= t->shape[d];
      off += idx * t->stride_[d];
      g += (idx + (start ? start[d] : 0)) * gstride;
      gstride *= gshape ? gshape[d] : t->shape[d];
    }
    lm_store(base + off * es, t->dtype_, draw(kind, a, b, seed, offset + (uint64_t)g, t->dtype_));
  }
  return 0;
}
