/* nn.c: row kernels for softmax, layer/rms norm, embedding and its
 * gradient (index_add). Rows are contiguous; f32 and f64 (norm statistics
 * accumulate in double). The ops check shapes, dtypes and ids first. */
#include "simd.h"
#include "fastmath.h"
#include "kernels.h"
#include <math.h>
#include <string.h>

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
      double sum = 0;                                                          \
      _Pragma("omp simd")                                                      \
      for (int64_t j = 0; j < n; j++) o[j] = EXP(xr[j] - m);                   \
      _Pragma("omp simd reduction(+:sum)")                                     \
      for (int64_t j = 0; j < n; j++) sum += o[j];                             \
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
SOFTMAX(float, softmax_f32, lm_expf, log)
SOFTMAX(double, softmax_f64, exp, log)

int lm_cpu_softmax(lm_tensor *out, const lm_tensor *x, int log) {
  int64_t n = x->ndim ? x->shape[x->ndim - 1] : 1, rows = n ? x->numel_ / n : 0;
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
      double mu = 0, var = 0;                                                  \
      if (!rms) {                                                              \
        _Pragma("omp simd reduction(+:mu)")                                    \
        for (int64_t j = 0; j < n; j++) mu += xr[j];                           \
        mu = n ? mu / n : 0;                                                   \
      }                                                                        \
      _Pragma("omp simd reduction(+:var)")                                     \
      for (int64_t j = 0; j < n; j++) { double d = xr[j] - mu; var += d * d; } \
      var = n ? var / n : 0;                                                   \
      double rs = 1 / sqrt(var + eps);                                         \
      if (mean) mean[r] = (T)mu;                                               \
      if (rstd) rstd[r] = (T)rs;                                               \
      _Pragma("omp simd")                                                      \
      for (int64_t j = 0; j < n; j++) {                                        \
        double v = (xr[j] - mu) * rs;                                          \
        if (w) v *= w[j];                                                      \
        if (b) v += b[j];                                                      \
        o[j] = (T)v;                                                           \
      }                                                                        \
    }                                                                          \
  }
NORM(float, norm_f32)
NORM(double, norm_f64)

int lm_cpu_norm(lm_tensor *out, lm_tensor *mean, lm_tensor *rstd, const lm_tensor *x,
                const lm_tensor *w, const lm_tensor *b, double eps, int rms) {
  /* the op passes x and out as (rows, n), w and b as (n), mean and rstd as (rows) */
  int64_t n = x->ndim ? x->shape[x->ndim - 1] : 1, rows = n ? x->numel_ / n : 0;
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
  int64_t rows = idx->numel_, d = w->ndim == 2 ? w->shape[1] : 0;
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
  int64_t rows = idx->numel_, d = out->ndim == 2 ? out->shape[1] : 0;
  const int64_t *id = (const int64_t *)lm_ptr(idx);
  switch (out->dtype_) {
  case LM_F32: index_add_f32((float *)lm_ptr(out), id, (const float *)lm_ptr(src), rows, d); return 0;
  case LM_F64: index_add_f64((double *)lm_ptr(out), id, (const double *)lm_ptr(src), rows, d); return 0;
  default: return lm_error("index_add kernel: no kernel for dtype %s", lm_dtype_name(out->dtype_));
  }
}
