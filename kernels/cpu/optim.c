/* optim.c: the fused AdamW update (one pass instead of ten elementwise ops). */
#include "kernels.h"
#include <math.h>

/* The update runs in blocks that stay in L1, each followed by its rounding
 * into low (the cast kernel itself, so the bits of a cast). */
enum { BLOCK = 2048 };

#define ADAMW(T, NAME)                                                                         \
  static void NAME(T *p, const T *g, T *m, T *v, int64_t n, const double *h, char *low, int ld) { \
    const T b1 = (T)h[1], b2 = (T)h[2], eps = (T)h[3];                                         \
    const T decay = (T)(1 - h[0] * h[4]), step = (T)(h[0] / h[5]);                             \
    const T rbc2 = (T)(1 / sqrt(h[6]));                                                        \
    _Pragma("omp parallel for num_threads(lm_threads_for(n)) schedule(static)")                \
    for (int64_t b = 0; b < n; b += BLOCK) {                                                   \
      int64_t e = n - b < BLOCK ? n : b + BLOCK;                                               \
      _Pragma("omp simd")                                                                      \
      for (int64_t i = b; i < e; i++) {                                                        \
        T gi = g[i];                                                                           \
        m[i] = b1 * m[i] + (1 - b1) * gi;                                                      \
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;                                                 \
        p[i] = p[i] * decay - step * m[i] / (sqrt(v[i]) * rbc2 + eps);                         \
      }                                                                                        \
      if (low) lm_cpu_convert(e - b, low + 2 * b, ld, p + b, LM_F32);                          \
    }                                                                                          \
  }
ADAMW(float, adamw_f32)
ADAMW(double, adamw_f64)

int lm_cpu_adamw(lm_tensor *p, const lm_tensor *g, lm_tensor *m, lm_tensor *v, const double *h,
                 lm_tensor *low) {
#define ARGS(T) (T *)lm_ptr(p), (const T *)lm_ptr(g), (T *)lm_ptr(m), (T *)lm_ptr(v), p->numel_, h
  if (p->dtype_ == LM_F64) adamw_f64(ARGS(double), NULL, 0);
  else adamw_f32(ARGS(float), low ? lm_ptr(low) : NULL, low ? low->dtype_ : 0);
#undef ARGS
  return 0;
}
