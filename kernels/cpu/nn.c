/* nn.c: row kernels for softmax, layer/rms norm, embedding and its
 * gradient (index_add). Rows are contiguous; f32 and f64 (norm statistics
 * accumulate in double). The ops check shapes, dtypes and ids first. */
#include "simd.h"
#include "fastmath.h"
#include "kernels.h"
#include <math.h>
#include <string.h>

/* sum of x[j] (sq 0) or of (x[j] - mu)^2 (sq 1) in double, over 16
 * partial sums so the vectorised loop is not bound by one add chain */
#define ROWSUM(T)                                                              \
  static inline double sum_##T(const T *x, int64_t n, double mu, int sq) {     \
    double a[16] = {0}, acc = 0;                                               \
    int64_t j = 0;                                                             \
    if (sq) {                                                                  \
      for (; j + 16 <= n; j += 16)                                             \
        for (int q = 0; q < 16; q++) { double d = x[j + q] - mu; a[q] += d * d; } \
      for (; j < n; j++) { double d = x[j] - mu; acc += d * d; }               \
    } else {                                                                   \
      for (; j + 16 <= n; j += 16)                                             \
        for (int q = 0; q < 16; q++) a[q] += x[j + q];                         \
      for (; j < n; j++) acc += x[j];                                          \
    }                                                                          \
    for (int q = 0; q < 16; q++) acc += a[q];                                  \
    return acc;                                                                \
  }
ROWSUM(f32)
ROWSUM(f64)

/* The simd reductions let the compiler vectorize (reordering the sums);
 * a NaN anywhere in a row reaches every output through exp. */
#define SOFTMAX(T, NAME, EXP, LOG)                                             \
  static void NAME(T *out, const T *x, int64_t rows, int64_t n, int lg) {      \
    _Pragma("omp parallel for num_threads(lm_threads_for(rows * n)) schedule(static)") \
    for (int64_t r = 0; r < rows; r++) {                                       \
      const T *xr = x + r * n;                                                 \
      T *o = out + r * n;                                                      \
      T m = -INFINITY;                                                         \
      _Pragma("omp simd reduction(max:m)")                                     \
      for (int64_t j = 0; j < n; j++) m = xr[j] > m ? xr[j] : m;               \
      if (m == -INFINITY) m = 0; /* all -inf: 0/0, NaN as in PyTorch */       \
      _Pragma("omp simd")                                                      \
      for (int64_t j = 0; j < n; j++) o[j] = EXP(xr[j] - m);                   \
      double sum = sum_##T(o, n, 0, 0);                                        \
      if (lg) {                                                                \
        T lse = m + (T)LOG(sum);                                               \
        _Pragma("omp simd")                                                    \
        for (int64_t j = 0; j < n; j++) o[j] = xr[j] - lse;                    \
      } else {                                                                 \
        T inv = (T)(1 / sum);                                                  \
        _Pragma("omp simd")                                                    \
        for (int64_t j = 0; j < n; j++) o[j] *= inv;                           \
      }                                                                        \
    }                                                                          \
  }
SOFTMAX(f32, softmax_f32, lm_expf, log)
SOFTMAX(f64, softmax_f64, exp, log)

int lm_cpu_softmax(lm_tensor *out, const lm_tensor *x, int log) {
  int64_t n = x->ndim ? x->shape_[x->ndim - 1] : 1, rows = n ? x->numel_ / n : 0;
  switch (x->dtype_) {
  case LM_F32: softmax_f32((float *)lm_ptr(out), (const float *)lm_ptr(x), rows, n, log); return 0;
  case LM_F64: softmax_f64((double *)lm_ptr(out), (const double *)lm_ptr(x), rows, n, log); return 0;
  default: return lm_error("softmax kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_));
  }
}

#define NORM(T, NAME)                                                          \
  static void NAME(T *out, T *mean, T *rstd, const T *x, const T *w, const T *b, \
                   int64_t rows, int64_t n, double eps, int rms) {             \
    _Pragma("omp parallel for num_threads(lm_threads_for(rows * n)) schedule(static)") \
    for (int64_t r = 0; r < rows; r++) {                                       \
      const T *xr = x + r * n;                                                 \
      T *o = out + r * n;                                                      \
      double mu = rms || !n ? 0 : sum_##T(xr, n, 0, 0) / n;                    \
      double var = n ? sum_##T(xr, n, mu, 1) / n : 0;                          \
      double rs = 1 / sqrt(var + eps);                                         \
      if (mean) mean[r] = (T)mu;                                               \
      if (rstd) rstd[r] = (T)rs;                                               \
      /* (x - mu) * rs in double: mu may be large next to the spread */        \
      if (w && b) {                                                            \
        _Pragma("omp simd")                                                    \
        for (int64_t j = 0; j < n; j++) o[j] = (T)((xr[j] - mu) * rs) * w[j] + b[j]; \
      } else if (w) {                                                          \
        _Pragma("omp simd")                                                    \
        for (int64_t j = 0; j < n; j++) o[j] = (T)((xr[j] - mu) * rs) * w[j];  \
      } else {                                                                 \
        _Pragma("omp simd")                                                    \
        for (int64_t j = 0; j < n; j++) o[j] = (T)((xr[j] - mu) * rs) + (b ? b[j] : 0); \
      }                                                                        \
    }                                                                          \
  }
NORM(f32, norm_f32)
NORM(f64, norm_f64)

int lm_cpu_norm(lm_tensor *out, lm_tensor *mean, lm_tensor *rstd, const lm_tensor *x,
                const lm_tensor *w, const lm_tensor *b, double eps, int rms) {
  /* the op passes x and out as (rows, n), w and b as (n), mean and rstd as (rows) */
  int64_t n = x->ndim ? x->shape_[x->ndim - 1] : 1, rows = n ? x->numel_ / n : 0;
#define P(t, T) ((t) ? (T *)lm_ptr(t) : NULL)
  switch (x->dtype_) {
  case LM_F32:
    norm_f32(P(out, float), P(mean, float), P(rstd, float), P(x, const float), P(w, const float),
             P(b, const float), rows, n, eps, rms);
    return 0;
  case LM_F64:
    norm_f64(P(out, double), P(mean, double), P(rstd, double), P(x, const double),
             P(w, const double), P(b, const double), rows, n, eps, rms);
    return 0;
  default: return lm_error("norm kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_));
  }
#undef P
}

/* Rows are copied as bytes, so any dtype works. */
int lm_cpu_embedding(lm_tensor *out, const lm_tensor *w, const lm_tensor *idx) {
  int64_t rows = idx->numel_, d = w->ndim == 2 ? w->shape_[1] : 0;
  size_t row = (size_t)d * lm_dtype_size(w->dtype_);
  const int64_t *id = (const int64_t *)lm_ptr(idx);
  const char *src = lm_ptr(w);
  char *dst = lm_ptr(out);
  _Pragma("omp parallel for num_threads(lm_threads_for(rows * d)) schedule(static)")
  for (int64_t r = 0; r < rows; r++) memcpy(dst + r * row, src + id[r] * row, row);
  return 0;
}

/* Rows with the same id add up in order; threads split the columns. */
#define INDEX_ADD(T, NAME)                                                     \
  static void NAME(T *out, const int64_t *id, const T *src, int64_t rows, int64_t d) { \
    int nt = lm_threads_for(rows * d);                                         \
    if (nt > d) nt = d > 0 ? (int)d : 1;                                       \
    _Pragma("omp parallel for num_threads(nt) schedule(static)")               \
    for (int t = 0; t < nt; t++) {                                             \
      int64_t lo = d * t / nt, hi = d * (t + 1) / nt;                          \
      for (int64_t r = 0; r < rows; r++) {                                     \
        T *o = out + id[r] * d;                                                \
        const T *s = src + r * d;                                              \
        for (int64_t j = lo; j < hi; j++) o[j] += s[j];                        \
      }                                                                        \
    }                                                                          \
  }
INDEX_ADD(float, index_add_f32)
INDEX_ADD(double, index_add_f64)

int lm_cpu_index_add(lm_tensor *out, const lm_tensor *idx, const lm_tensor *src) {
  int64_t rows = idx->numel_, d = out->ndim == 2 ? out->shape_[1] : 0;
  const int64_t *id = (const int64_t *)lm_ptr(idx);
  switch (out->dtype_) {
  case LM_F32: index_add_f32((float *)lm_ptr(out), id, (const float *)lm_ptr(src), rows, d); return 0;
  case LM_F64: index_add_f64((double *)lm_ptr(out), id, (const double *)lm_ptr(src), rows, d); return 0;
  default: return lm_error("index_add kernel: no kernel for dtype %s", lm_dtype_name(out->dtype_));
  }
}
