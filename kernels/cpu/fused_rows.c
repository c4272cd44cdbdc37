/* fused_rows.c: backward passes of the row kernels (softmax, log_softmax,
 * layer/rms norm) and the rotary embedding, each one pass over its rows.
 * Contiguous f32 or f64 operands (the ops make them so; the rotary
 * embedding takes bf16 and f16 too, with f32 tables); row sums
 * accumulate in double, as nn.c's forwards do. */
#include "simd.h" /* first: its pragma lets exp-bound loops vectorise */
#include "fastmath.h"
#include "kernels.h"
#include <math.h>
#include <stdlib.h>


/* softmax: gx = y * (g - sum(g * y)); log_softmax: gx = g - exp(y) * sum(g) */
#define SOFTMAX_BWD(T, NAME)                                                   \
  static void NAME(T *gx, const T *g, const T *y, int64_t rows, int64_t n, int lg) { \
    _Pragma("omp parallel for num_threads(lm_threads_for(rows * n)) schedule(static)") \
    for (int64_t r = 0; r < rows; r++) {                                       \
      const T *gr = g + r * n, *yr = y + r * n;                                \
      T *o = gx + r * n;                                                       \
      double sum = 0;                                                          \
      if (lg) {                                                                \
        _Pragma("omp simd reduction(+:sum)")                                   \
        for (int64_t j = 0; j < n; j++) sum += gr[j];                          \
        const T k = (T)sum;                                                    \
        _Pragma("omp simd")                                                    \
        for (int64_t j = 0; j < n; j++) o[j] = gr[j] - fexp_##T(yr[j]) * k;    \
      } else {                                                                 \
        _Pragma("omp simd reduction(+:sum)")                                   \
        for (int64_t j = 0; j < n; j++) sum += (double)gr[j] * yr[j];          \
        const T k = (T)sum;                                                    \
        _Pragma("omp simd")                                                    \
        for (int64_t j = 0; j < n; j++) o[j] = yr[j] * (gr[j] - k);            \
      }                                                                        \
    }                                                                          \
  }
SOFTMAX_BWD(f32, softmax_bwd_f32)
SOFTMAX_BWD(f64, softmax_bwd_f64)

int lm_cpu_softmax_bwd(lm_tensor *gx, const lm_tensor *g, const lm_tensor *y, int log) {
  int64_t n = y->ndim ? y->shape_[y->ndim - 1] : 1, rows = n ? y->numel_ / n : 0;
#define ARGS(T) (T *)lm_ptr(gx), (const T *)lm_ptr(g), (const T *)lm_ptr(y), rows, n, log
  switch (y->dtype_) {
  case LM_F32: softmax_bwd_f32(ARGS(f32)); return 0;
  case LM_F64: softmax_bwd_f64(ARGS(f64)); return 0;
  default: return lm_error("softmax_bwd kernel: no kernel for dtype %s", lm_dtype_name(y->dtype_));
  }
#undef ARGS
}

/* Norm backward. With xhat = (x - mean) * rstd (mean 0 for rms) and
 * gh = g * w: dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), without
 * the mean(gh) term for rms; dw = sum over rows of g * xhat, db = sum of g.
 * Rows split into nt fixed blocks; each block sums its dw, db into its own
 * double row, and the blocks are added in order: the result does not depend
 * on how threads are scheduled. */
#define NORM_BWD(T, NAME)                                                      \
  static void NAME(T *dx, T *dw, T *db, const T *g, const T *x, const T *w, const T *mean, \
                   const T *rstd, int64_t rows, int64_t n, int rms, int nt, double *part) { \
    _Pragma("omp parallel for num_threads(nt) schedule(static)")               \
    for (int t = 0; t < nt; t++) {                                             \
      double *pw = part ? part + (size_t)t * 2 * n : NULL, *pb = pw ? pw + n : NULL; \
      if (pw) for (int64_t j = 0; j < 2 * n; j++) pw[j] = 0;                   \
      for (int64_t r = rows * t / nt; r < rows * (t + 1) / nt; r++) {          \
        const T *gr = g + r * n, *xr = x + r * n;                              \
        const double mu = rms ? 0 : mean[r], rs = rstd[r];                     \
        double sg = 0, sgx = 0;                                                \
        _Pragma("omp simd reduction(+:sg, sgx)")                               \
        for (int64_t j = 0; j < n; j++) {                                      \
          double gh = w ? (double)gr[j] * w[j] : gr[j];                        \
          sg += gh, sgx += gh * ((xr[j] - mu) * rs);                           \
        }                                                                      \
        const T a = (T)(rms ? 0 : sg / n), b = (T)(sgx / n), m = (T)mu, s = (T)rs; \
        T *o = dx + r * n;                                                     \
        _Pragma("omp simd")                                                    \
        for (int64_t j = 0; j < n; j++) {                                      \
          T gh = w ? gr[j] * w[j] : gr[j];                                     \
          o[j] = s * (gh - a - (xr[j] - m) * s * b);                           \
        }                                                                      \
        if (pw) {                                                              \
          _Pragma("omp simd")                                                  \
          for (int64_t j = 0; j < n; j++) {                                    \
            pw[j] += (double)gr[j] * ((xr[j] - m) * s);                        \
            pb[j] += gr[j];                                                    \
          }                                                                    \
        }                                                                      \
      }                                                                        \
    }                                                                          \
    if (!part) return;                                                         \
    for (int64_t j = 0; j < n; j++) {                                          \
      double sw = 0, sb = 0;                                                   \
      for (int t = 0; t < nt; t++) sw += part[(size_t)t * 2 * n + j], sb += part[(size_t)t * 2 * n + n + j]; \
      if (dw) dw[j] = (T)sw;                                                   \
      if (db) db[j] = (T)sb;                                                   \
    }                                                                          \
  }
NORM_BWD(f32, norm_bwd_f32)
NORM_BWD(f64, norm_bwd_f64)

int lm_cpu_norm_bwd(lm_tensor *dx, lm_tensor *dw, lm_tensor *db, const lm_tensor *g,
                    const lm_tensor *x, const lm_tensor *w, const lm_tensor *mean,
                    const lm_tensor *rstd, int rms) {
  int64_t n = x->ndim ? x->shape_[x->ndim - 1] : 1, rows = n ? x->numel_ / n : 0;
  int nt = lm_threads_for(rows * n);
  if (nt > rows) nt = rows > 0 ? (int)rows : 1;
  double *part = NULL;
  if (dw || db) {
    if (!(part = malloc(sizeof *part * 2 * (size_t)n * nt + 1)))
      return lm_error("norm_bwd kernel: out of memory for %d partial sums of %lld", nt, (long long)n);
  }
#define P(t, T) ((t) ? (T *)lm_ptr(t) : NULL)
#define ARGS(T) P(dx, T), P(dw, T), P(db, T), P(g, const T), P(x, const T), P(w, const T), \
                P(mean, const T), P(rstd, const T), rows, n, rms, nt, part
  int rc = 0;
  switch (x->dtype_) {
  case LM_F32: norm_bwd_f32(ARGS(f32)); break;
  case LM_F64: norm_bwd_f64(ARGS(f64)); break;
  default: rc = lm_error("norm_bwd kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_));
  }
#undef ARGS
#undef P
  free(part);
  return rc;
}

/* rotary embedding: pair i of (t, h) turns by sign * angle(t, i). X is
 * x's element type, T the arithmetic's (and the tables'); LD widens an
 * element, ST rounds it back: bf16 and f16 x run the f32 arithmetic on
 * widened pairs and round once (the widened path's bits) */
#define ROPE(X, T, NAME, LD, ST)                                               \
  static void NAME(X *o, const X *x, const T *cs, const T *sn, int64_t outer, int64_t nt_, \
                   int64_t nh, int64_t half, T sign) {                         \
    _Pragma("omp parallel for num_threads(lm_threads_for(outer * nt_ * nh * half * 2)) schedule(static)") \
    for (int64_t r = 0; r < outer * nt_; r++) {                                \
      const int64_t t = r % nt_;                                               \
      const T *c = cs + t * half, *s = sn + t * half;                          \
      for (int64_t h = 0; h < nh; h++) {                                       \
        const X *xr = x + (r * nh + h) * 2 * half;                             \
        X *or_ = o + (r * nh + h) * 2 * half;                                  \
        _Pragma("omp simd")                                                    \
        for (int64_t i = 0; i < half; i++) {                                   \
          T a = LD(xr[2 * i]), b = LD(xr[2 * i + 1]), si = sign * s[i];        \
          or_[2 * i] = ST(a * c[i] - b * si);                                  \
          or_[2 * i + 1] = ST(a * si + b * c[i]);                              \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }
#define SAME(v) (v)
ROPE(f32, f32, rope_f32, SAME, SAME)
ROPE(f64, f64, rope_f64, SAME, SAME)
ROPE(uint16_t, f32, rope_bf16, lm_bf16_to_f32, lm_f32_to_bf16)
ROPE(uint16_t, f32, rope_f16, lm_f16_to_f32, lm_f32_to_f16)
#undef SAME

int lm_cpu_rope(lm_tensor *out, const lm_tensor *x, const lm_tensor *cos, const lm_tensor *sin,
                int sign) {
  if (x->ndim != 4) return lm_error("rope kernel: expected x of 4 dims (outer, T, H, D), got %d", x->ndim);
  int64_t outer = x->shape_[0], T_ = x->shape_[1], H = x->shape_[2], half = x->shape_[3] / 2;
#define ARGS(T) (T *)lm_ptr(out), (const T *)lm_ptr(x), (const T *)lm_ptr(cos), (const T *)lm_ptr(sin), \
                outer, T_, H, half, (T)sign
#define ARGS16 (uint16_t *)lm_ptr(out), (const uint16_t *)lm_ptr(x), (const float *)lm_ptr(cos), \
               (const float *)lm_ptr(sin), outer, T_, H, half, (float)sign
  int f32_tables = cos->dtype_ == LM_F32 && sin->dtype_ == LM_F32;
  switch (x->dtype_) {
  case LM_F32: rope_f32(ARGS(f32)); return 0;
  case LM_F64: rope_f64(ARGS(f64)); return 0;
  case LM_BF16: if (f32_tables) { rope_bf16(ARGS16); return 0; } break;
  case LM_F16: if (f32_tables) { rope_f16(ARGS16); return 0; } break;
  default: break;
  }
  /* the op casts to f32 and calls again */
  return lm_error("unsupported: rope kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_)), LM_UNSUPPORTED;
#undef ARGS
#undef ARGS16
}
