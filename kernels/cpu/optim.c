/* optim.c: the fused AdamW update (one pass instead of ten elementwise ops). */
#include "kernels.h"
#include <math.h>

#define ADAMW(T, NAME)                                                         \
  static void NAME(T *p, const T *g, T *m, T *v, int64_t n, const double *h) { \
    const T b1 = (T)h[1], b2 = (T)h[2], eps = (T)h[3];                         \
    const T decay = (T)(1 - h[0] * h[4]), step = (T)(h[0] / h[5]);             \
    const T rbc2 = (T)(1 / sqrt(h[6]));                                        \
    _Pragma("omp parallel for simd num_threads(lm_threads_for(n)) schedule(static)") \
    for (int64_t i = 0; i < n; i++) {                                          \
      T gi = g[i];                                                             \
      m[i] = b1 * m[i] + (1 - b1) * gi;                                        \
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;                                   \
      p[i] = p[i] * decay - step * m[i] / (sqrt(v[i]) * rbc2 + eps);           \
    }                                                                          \
  }
ADAMW(float, adamw_f32)
ADAMW(double, adamw_f64)

int lm_cpu_adamw(lm_tensor *p, const lm_tensor *g, lm_tensor *m, lm_tensor *v, const double *h) {
#define ARGS(T) (T *)lm_ptr(p), (const T *)lm_ptr(g), (T *)lm_ptr(m), (T *)lm_ptr(v), p->numel_, h
  if (p->dtype_ == LM_F64) adamw_f64(ARGS(double));
  else adamw_f32(ARGS(float));
#undef ARGS
  return 0;
}
