/* reduce.c: reductions of a contiguous (outer, n, inner) tensor over its
 * middle dim into (outer, inner). Sums accumulate in double. */
#include "kernels.h"

#define REDUCE(T, NAME)                                                        \
  static void NAME(int kind, void *out, const T *x, int64_t outer, int64_t n, int64_t inner) { \
    _Pragma("omp parallel for num_threads(lm_threads_for(outer * n * inner)) schedule(static)") \
    for (int64_t o = 0; o < outer; o++)                                        \
      for (int64_t i = 0; i < inner; i++) {                                    \
        const T *p = x + o * n * inner + i;                                    \
        double acc = kind == LM_SUM ? 0 : (double)p[0];                        \
        int64_t best = 0;                                                      \
        for (int64_t j = 0; j < n; j++) {                                      \
          double v = (double)p[j * inner];                                     \
          if (kind == LM_SUM) acc += v;                                        \
          else if (v != v) { if (acc == acc) acc = v, best = j; }              \
          else if ((kind == LM_MAX || kind == LM_ARGMAX) ? v > acc : v < acc) acc = v, best = j; \
        }                                                                      \
        if (kind == LM_ARGMAX || kind == LM_ARGMIN) ((int64_t *)out)[o * inner + i] = best; \
        else ((T *)out)[o * inner + i] = (T)acc;                               \
      }                                                                        \
  }
REDUCE(float, reduce_f32)
REDUCE(double, reduce_f64)
REDUCE(int64_t, reduce_i64)

int lm_cpu_reduce(int kind, lm_tensor *out, const lm_tensor *x, int64_t outer, int64_t n,
                  int64_t inner) {
  void *o = lm_ptr(out);
  switch (x->dtype_) {
  case LM_F32: reduce_f32(kind, o, (const float *)lm_ptr(x), outer, n, inner); return 0;
  case LM_F64: reduce_f64(kind, o, (const double *)lm_ptr(x), outer, n, inner); return 0;
  case LM_I64: reduce_i64(kind, o, (const int64_t *)lm_ptr(x), outer, n, inner); return 0;
  default: return lm_error("reduce kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_));
  }
}
