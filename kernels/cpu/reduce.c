/* reduce.c: reductions of a contiguous (outer, n, inner) tensor over its
 * middle dim into (outer, inner). Sums accumulate in double. */
#include "simd.h"
#include "kernels.h"
#include <stdlib.h>
#include <string.h>

/* Sums accumulate in double. Over the last dim: 16 partial sums, so the
 * vectorised loop is not held up by the latency of one add chain. Over an
 * inner dim: rows of up to COLS columns are added into as many double
 * accumulators (16 KiB, in L1/L2), reading each row once and in order; the
 * (outer, column block) pairs are spread over threads, and the summed dim
 * too when they are fewer than the threads (then the partial sums are added
 * up in a fixed order). */
enum { LANES = 16, COLS = 2048 };
#define SUM(T, NAME)                                                           \
  static int NAME(T *out, const T *x, int64_t outer, int64_t n, int64_t inner) { \
    if (inner == 1) {                                                          \
      _Pragma("omp parallel for num_threads(lm_threads_for(outer * n)) schedule(static)") \
      for (int64_t o = 0; o < outer; o++) {                                    \
        const T *p = x + o * n;                                                \
        double a[LANES] = {0}, acc = 0;                                        \
        int64_t j = 0;                                                         \
        for (; j + LANES <= n; j += LANES)                                     \
          for (int q = 0; q < LANES; q++) a[q] += p[j + q];                    \
        for (; j < n; j++) acc += p[j];                                        \
        for (int q = 0; q < LANES; q++) acc += a[q];                           \
        out[o] = (T)acc;                                                       \
      }                                                                        \
      return 0;                                                                \
    }                                                                          \
    if (outer * inner == 0) return 0; /* no outputs */                         \
    int nt = lm_threads_for(outer * n * inner);                                \
    int64_t blocks = (inner + COLS - 1) / COLS, tasks = outer * blocks;        \
    int64_t split = tasks >= nt ? 1 : (nt + tasks - 1) / tasks;                \
    if (split > n) split = n > 0 ? n : 1;                                      \
    double *part = NULL;                                                       \
    if (split > 1 && !(part = malloc(sizeof(double) * split * outer * inner))) \
      return lm_error("sum: out of memory");                                   \
    _Pragma("omp parallel for num_threads(nt) schedule(static)")               \
    for (int64_t job = 0; job < tasks * split; job++) {                        \
      int64_t task = job / split, h = job % split;                             \
      int64_t o = task / blocks, c0 = task % blocks * COLS;                    \
      int64_t m = inner - c0 < COLS ? inner - c0 : COLS;                       \
      int64_t j0 = n * h / split, j1 = n * (h + 1) / split;                    \
      double a[COLS];                                                          \
      for (int64_t i = 0; i < m; i++) a[i] = 0;                                \
      for (int64_t j = j0; j < j1; j++) {                                      \
        const T *p = x + (o * n + j) * inner + c0;                             \
        for (int64_t i = 0; i < m; i++) a[i] += p[i];                          \
      }                                                                        \
      if (part) memcpy(part + (h * outer + o) * inner + c0, a, sizeof(double) * m); \
      else for (int64_t i = 0; i < m; i++) out[o * inner + c0 + i] = (T)a[i];  \
    }                                                                          \
    if (part) {                                                                \
      for (int64_t k = 0; k < outer * inner; k++) {                            \
        double acc = 0;                                                        \
        for (int64_t h = 0; h < split; h++) acc += part[h * outer * inner + k]; \
        out[k] = (T)acc;                                                       \
      }                                                                        \
      free(part);                                                              \
    }                                                                          \
    return 0;                                                                  \
  }
SUM(float, sum_f32)
SUM(double, sum_f64)
SUM(int64_t, sum_i64)

/* max, min and their indices: NaN wins, the first of equal values wins */
#define PICK(T, NAME)                                                          \
  static void NAME(int kind, void *out, const T *x, int64_t outer, int64_t n, int64_t inner) { \
    _Pragma("omp parallel for num_threads(lm_threads_for(outer * n * inner)) schedule(static)") \
    for (int64_t o = 0; o < outer; o++)                                        \
      for (int64_t i = 0; i < inner; i++) {                                    \
        const T *p = x + o * n * inner + i;                                    \
        T acc = p[0];                                                          \
        int64_t best = 0;                                                      \
        for (int64_t j = 1; j < n && acc == acc; j++) {                        \
          T v = p[j * inner];                                                  \
          if (v != v || ((kind == LM_MAX || kind == LM_ARGMAX) ? v > acc : v < acc)) acc = v, best = j; \
        }                                                                      \
        if (kind == LM_ARGMAX || kind == LM_ARGMIN) ((int64_t *)out)[o * inner + i] = best; \
        else ((T *)out)[o * inner + i] = acc;                                  \
      }                                                                        \
  }
PICK(float, pick_f32)
PICK(double, pick_f64)
PICK(int64_t, pick_i64)

int lm_cpu_reduce(int kind, lm_tensor *out, const lm_tensor *x, int64_t outer, int64_t n,
                  int64_t inner) {
  void *o = lm_ptr(out);
  const void *p = lm_ptr(x);
  bool sum = kind == LM_SUM;
  switch (x->dtype_) {
  case LM_F32: if (sum) return sum_f32(o, p, outer, n, inner); pick_f32(kind, o, p, outer, n, inner); return 0;
  case LM_F64: if (sum) return sum_f64(o, p, outer, n, inner); pick_f64(kind, o, p, outer, n, inner); return 0;
  case LM_I64: if (sum) return sum_i64(o, p, outer, n, inner); pick_i64(kind, o, p, outer, n, inner); return 0;
  default: return lm_error("reduce kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_));
  }
}
