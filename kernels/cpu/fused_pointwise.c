/* fused_pointwise.c: elementwise backward passes in one pass each: a unary
 * op's gradient g * f'(x) (unary_grad) and SwiGLU, silu(a) * b, with its
 * backward. Dense operands of one dtype, f32 or f64 (the op makes them so;
 * SwiGLU takes bf16 and f16 too, with f32 arithmetic);
 * the derivatives are core/unary.h's, or fastmath.h's vectorised ones where
 * pointwise.c's derivative kinds call them too, so the fused and the
 * composed gradients agree. */
#include "simd.h" /* first: its pragma lets exp-bound loops vectorise */
#include "fastmath.h"
#include "kernels.h"
#include "../unary_math.h"
#include <tgmath.h>

/* one loop per kind, so each vectorizes on its own */
#define GRAD_LOOP(EXPR)                                                        \
  _Pragma("omp parallel for simd num_threads(lm_threads_for(n)) schedule(static)") \
  for (int64_t i = 0; i < n; i++) { elem x = X[i], y = Y[i], gi = G[i]; (void)x, (void)y; o[i] = (EXPR); }

/* each kind's loop made from its f'(x) in core/unary.h; in f32 gelu,
 * gelu_tanh and silu take fastmath.h's vectorised derivatives, which
 * pointwise.c's derivative kinds call too */
#define D_CASE(K, F, D, R) case LM_##K: if (R == LM_D_NONE) goto none; GRAD_LOOP(gi * (D)) break;
#define UNARY_GRAD(T, NAME, FAST)                                              \
  static int NAME(int kind, T *o, const T *G, const T *X, const T *Y, int64_t n, const double *p) { \
    typedef T elem, lm_real;                                                   \
    const T k0 = (T)p[0], k1 = (T)p[1];                                        \
    (void)k0, (void)k1;                                                        \
    switch (FAST ? kind : -1) {                                                \
    case LM_GELU: GRAD_LOOP(gi * lm_gelu_df(x)) return 0;                      \
    case LM_GELU_TANH: GRAD_LOOP(gi * lm_gelu_tanh_df(x)) return 0;            \
    case LM_SILU: GRAD_LOOP(gi * lm_silu_df(x)) return 0;                      \
    }                                                                          \
    switch (kind) {                                                            \
      LM_UNARY_KINDS(D_CASE)                                                   \
    default: none: return lm_error("unary_grad kernel: no derivative for unary kind %d", kind); \
    }                                                                          \
    return 0;                                                                  \
  }
UNARY_GRAD(f32, unary_grad_f32, 1)
UNARY_GRAD(f64, unary_grad_f64, 0)

int lm_cpu_unary_grad(int kind, lm_tensor *gx, const lm_tensor *g, const lm_tensor *x,
                      const lm_tensor *y, const double *p) {
  static const double none[2] = {0, 0};
  if (!p) p = none;
#define ARGS(T) kind, (T *)lm_ptr(gx), (const T *)lm_ptr(g), (const T *)lm_ptr(x), (const T *)lm_ptr(y), gx->numel_, p
  switch (gx->dtype_) {
  case LM_F32: return unary_grad_f32(ARGS(f32));
  case LM_F64: return unary_grad_f64(ARGS(f64));
  default: return lm_error("unary_grad kernel: no kernel for dtype %s", lm_dtype_name(gx->dtype_));
  }
#undef ARGS
}

/* ---- SwiGLU: out = silu(a) * b = a * s * b with s = sigmoid(a). X is
 * the operands' element type, T the arithmetic's; LD widens an element, ST
 * rounds it back: bf16 and f16 operands are read and written as they are
 * (a bf16 step moves 2 bytes an element, not a widened copy's 4 and the
 * casts' passes), the f32 arithmetic on each widened element, one rounding
 * on the way out, so the result is the bits the widened path gives ---- */
#define SWIGLU(X, T, NAME, NAME_BWD, LD, ST)                                   \
  static void NAME(X *o, const X *a, const X *b, int64_t n) {                  \
    _Pragma("omp parallel for simd num_threads(lm_threads_for(n)) schedule(static)") \
    for (int64_t i = 0; i < n; i++) { T x = LD(a[i]); o[i] = ST(x / (1 + fexp_##T(-x)) * LD(b[i])); } \
  }                                                                            \
  /* da = g * b * s * (1 + a * (1 - s)), db = g * a * s */                     \
  static void NAME_BWD(X *da, X *db, const X *g, const X *a, const X *b, int64_t n) { \
    _Pragma("omp parallel for simd num_threads(lm_threads_for(n)) schedule(static)") \
    for (int64_t i = 0; i < n; i++) {                                          \
      T x = LD(a[i]), gi = LD(g[i]), e = 1 + fexp_##T(-x), s = 1 / e;          \
      da[i] = ST(gi * LD(b[i]) * ((1 + x * (1 - s)) / e));                     \
      db[i] = ST(gi * (x / e));                                                \
    }                                                                          \
  }
#define SAME(v) (v)
SWIGLU(f32, f32, swiglu_f32, swiglu_bwd_f32, SAME, SAME)
SWIGLU(f64, f64, swiglu_f64, swiglu_bwd_f64, SAME, SAME)
SWIGLU(uint16_t, f32, swiglu_bf16, swiglu_bwd_bf16, lm_bf16_to_f32, lm_f32_to_bf16)
SWIGLU(uint16_t, f32, swiglu_f16, swiglu_bwd_f16, lm_f16_to_f32, lm_f32_to_f16)
#undef SAME

int lm_cpu_swiglu(lm_tensor *out, const lm_tensor *a, const lm_tensor *b) {
#define ARGS(T) (T *)lm_ptr(out), (const T *)lm_ptr(a), (const T *)lm_ptr(b), out->numel_
  switch (out->dtype_) {
  case LM_F32: swiglu_f32(ARGS(f32)); return 0;
  case LM_F64: swiglu_f64(ARGS(f64)); return 0;
  case LM_BF16: swiglu_bf16(ARGS(uint16_t)); return 0;
  case LM_F16: swiglu_f16(ARGS(uint16_t)); return 0;
  default: return lm_error("unsupported: swiglu kernel: no kernel for dtype %s", lm_dtype_name(out->dtype_)), LM_UNSUPPORTED;
  }
#undef ARGS
}

int lm_cpu_swiglu_bwd(lm_tensor *da, lm_tensor *db, const lm_tensor *g, const lm_tensor *a,
                      const lm_tensor *b) {
#define ARGS(T) (T *)lm_ptr(da), (T *)lm_ptr(db), (const T *)lm_ptr(g), (const T *)lm_ptr(a), \
                (const T *)lm_ptr(b), da->numel_
  switch (da->dtype_) {
  case LM_F32: swiglu_bwd_f32(ARGS(f32)); return 0;
  case LM_F64: swiglu_bwd_f64(ARGS(f64)); return 0;
  case LM_BF16: swiglu_bwd_bf16(ARGS(uint16_t)); return 0;
  case LM_F16: swiglu_bwd_f16(ARGS(uint16_t)); return 0;
  default:
    return lm_error("unsupported: swiglu_bwd kernel: no kernel for dtype %s", lm_dtype_name(da->dtype_)), LM_UNSUPPORTED;
  }
#undef ARGS
}
