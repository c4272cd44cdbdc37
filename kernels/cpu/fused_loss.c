/* fused_loss.c: cross entropy with class ids fused with its log-softmax:
 * per row, the loss and the log-sum-exp in two reads of the logits (max,
 * then the sum of exponentials with the weighted logit sum), and the
 * gradient in one more. PyTorch's semantics: the target's weight w_t,
 * label smoothing eps spread as eps/C * w_c over the classes, rows whose
 * target is `ignore` lose 0 and get no gradient. Contiguous f32 or f64;
 * row sums accumulate in double. The op checks the ids first. */
#include "simd.h" /* first: its pragma lets exp-bound loops vectorise */
#include "fastmath.h"
#include "kernels.h"
#include <math.h>


/* sum of the class weights (C without weights): smoothing's total */
#define SUMW(T)                                                                \
  static double sumw_##T(const T *w, int64_t C) {                              \
    if (!w) return (double)C;                                                  \
    double s = 0;                                                              \
    for (int64_t c = 0; c < C; c++) s += w[c];                                 \
    return s;                                                                  \
  }
SUMW(f32)
SUMW(f64)

/* loss = (1-eps) w_t (lse - x_t) + eps/C sum_c w_c (lse - x_c) */
#define CE_FWD(T, NAME)                                                        \
  static void NAME(T *loss, T *lse, const T *x, const int64_t *t, const T *w, int64_t N, \
                   int64_t C, int64_t ignore, double eps) {                    \
    const double sw = sumw_##T(w, C);                                          \
    _Pragma("omp parallel for num_threads(lm_threads_for(N * C)) schedule(static)") \
    for (int64_t r = 0; r < N; r++) {                                          \
      const T *xr = x + r * C;                                                 \
      T m = -INFINITY;                                                         \
      _Pragma("omp simd reduction(max:m)")                                     \
      for (int64_t c = 0; c < C; c++) m = xr[c] > m ? xr[c] : m;               \
      if (m == -INFINITY) m = 0; /* all -inf: log(0), as the composed form */ \
      double se = 0, sx = 0;                                                   \
      if (w) {                                                                 \
        _Pragma("omp simd reduction(+:se, sx)")                                \
        for (int64_t c = 0; c < C; c++) se += fexp_##T(xr[c] - m), sx += (double)w[c] * xr[c]; \
      } else {                                                                 \
        _Pragma("omp simd reduction(+:se, sx)")                                \
        for (int64_t c = 0; c < C; c++) se += fexp_##T(xr[c] - m), sx += xr[c]; \
      }                                                                        \
      const double l = m + log(se);                                            \
      lse[r] = (T)l;                                                           \
      if (t[r] == ignore) { loss[r] = 0; continue; }                           \
      const double wt = w ? w[t[r]] : 1;                                       \
      double v = (1 - eps) * wt * (l - xr[t[r]]);                              \
      if (eps > 0) v += eps / C * (l * sw - sx);                               \
      loss[r] = (T)v;                                                          \
    }                                                                          \
  }
CE_FWD(f32, ce_f32)
CE_FWD(f64, ce_f64)

/* dx_c = gloss * (k p_c - eps/C w_c - (1-eps) w_t [c == t]), with
 * p = exp(x - lse) and k = (1-eps) w_t + eps/C sum(w) */
#define CE_BWD(T, NAME)                                                        \
  static void NAME(T *dx, const T *gl, const T *x, const int64_t *t, const T *w, const T *lse, \
                   int64_t N, int64_t C, int64_t ignore, double eps) {         \
    const double sw = sumw_##T(w, C);                                          \
    _Pragma("omp parallel for num_threads(lm_threads_for(N * C)) schedule(static)") \
    for (int64_t r = 0; r < N; r++) {                                          \
      const T *xr = x + r * C;                                                 \
      T *d = dx + r * C;                                                       \
      if (t[r] == ignore) {                                                    \
        _Pragma("omp simd")                                                    \
        for (int64_t c = 0; c < C; c++) d[c] = 0;                              \
        continue;                                                              \
      }                                                                        \
      const double wt = w ? w[t[r]] : 1, g = gl[r];                            \
      const T k = (T)(g * ((1 - eps) * wt + eps / C * sw)), l = lse[r];        \
      const T ke = (T)(g * eps / C);                                           \
      if (w && eps > 0) {                                                      \
        _Pragma("omp simd")                                                    \
        for (int64_t c = 0; c < C; c++) d[c] = k * fexp_##T(xr[c] - l) - ke * w[c]; \
      } else {                                                                 \
        _Pragma("omp simd")                                                    \
        for (int64_t c = 0; c < C; c++) d[c] = k * fexp_##T(xr[c] - l) - ke;   \
      }                                                                        \
      d[t[r]] -= (T)(g * (1 - eps) * wt);                                      \
    }                                                                          \
  }
CE_BWD(f32, ce_bwd_f32)
CE_BWD(f64, ce_bwd_f64)

int lm_cpu_cross_entropy(lm_tensor *loss, lm_tensor *lse, const lm_tensor *x, const lm_tensor *target,
                         const lm_tensor *w, int64_t ignore, double eps) {
  int64_t C = x->ndim ? x->shape_[x->ndim - 1] : 1, N = C ? x->numel_ / C : 0;
  const int64_t *t = (const int64_t *)lm_ptr(target);
#define ARGS(T) (T *)lm_ptr(loss), (T *)lm_ptr(lse), (const T *)lm_ptr(x), t, \
                w ? (const T *)lm_ptr(w) : NULL, N, C, ignore, eps
  switch (x->dtype_) {
  case LM_F32: ce_f32(ARGS(f32)); return 0;
  case LM_F64: ce_f64(ARGS(f64)); return 0;
  default: /* bf16/f16 logits: the op casts them to f32 and calls again */
    return lm_error("unsupported: cross_entropy kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_)),
           LM_UNSUPPORTED;
  }
#undef ARGS
}

int lm_cpu_cross_entropy_bwd(lm_tensor *dx, const lm_tensor *gloss, const lm_tensor *x,
                             const lm_tensor *target, const lm_tensor *w, const lm_tensor *lse,
                             int64_t ignore, double eps) {
  int64_t C = x->ndim ? x->shape_[x->ndim - 1] : 1, N = C ? x->numel_ / C : 0;
  const int64_t *t = (const int64_t *)lm_ptr(target);
#define ARGS(T) (T *)lm_ptr(dx), (const T *)lm_ptr(gloss), (const T *)lm_ptr(x), t, \
                w ? (const T *)lm_ptr(w) : NULL, (const T *)lm_ptr(lse), N, C, ignore, eps
  switch (x->dtype_) {
  case LM_F32: ce_bwd_f32(ARGS(f32)); return 0;
  case LM_F64: ce_bwd_f64(ARGS(f64)); return 0;
  default:
    return lm_error("unsupported: cross_entropy_bwd kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_)),
           LM_UNSUPPORTED;
  }
#undef ARGS
}
