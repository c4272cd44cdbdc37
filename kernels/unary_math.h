/* unary_math.h: the functions every backend evaluates the unary kinds with,
 * made from the one list in core/unary.h: lm_unary_f32/f64(kind, x, k0, k1)
 * = f(x) and lm_unary_d_f32/f64(kind, x, y, k0, k1) = f'(x) (y = f(x)),
 * plus lm_unary / lm_unary_d overloaded by type in C++. Compiled as C (the
 * CPU backend), as CUDA (host and device) and by the emulator's host
 * compiler. */
#ifndef LOOM_UNARY_MATH_H
#define LOOM_UNARY_MATH_H
#include "../core/unary.h"
#ifdef __cplusplus
#include <cmath> /* float overloads of exp, erfc, ... */
#else
#include <tgmath.h> /* exp, erfc, ... of the argument's type */
#endif
#ifdef __CUDACC__
#define LM_HD __host__ __device__
#else
#define LM_HD
#endif

#define LM_UNARY_F_CASE_(K, F, D, R) case LM_##K: return (lm_real)(F);
#define LM_UNARY_D_CASE_(K, F, D, R) case LM_##K: return (lm_real)(D);
#define LM_UNARY_FUNCTIONS_(T, S)                                                     \
  static inline LM_HD T lm_unary_##S(int kind, T x, T k0, T k1) {                     \
    typedef T lm_real;                                                                \
    (void)k0, (void)k1;                                                               \
    switch (kind) { LM_UNARY_KINDS(LM_UNARY_F_CASE_) default: return x; }            \
  }                                                                                   \
  static inline LM_HD T lm_unary_d_##S(int kind, T x, T y, T k0, T k1) {              \
    typedef T lm_real;                                                                \
    (void)x, (void)y, (void)k0, (void)k1;                                             \
    switch (kind) { LM_UNARY_KINDS(LM_UNARY_D_CASE_) default: return 0; }            \
  }
LM_UNARY_FUNCTIONS_(float, f32)
LM_UNARY_FUNCTIONS_(double, f64)

/* what kind's derivative reads (enum lm_unary_grad); LM_D_NONE: none */
#define LM_UNARY_R_CASE_(K, F, D, R) case LM_##K: return R;
static inline LM_HD int lm_unary_grad_reads(int kind) {
  switch (kind) { LM_UNARY_KINDS(LM_UNARY_R_CASE_) default: return LM_D_NONE; }
}

#ifdef __cplusplus
static inline LM_HD float lm_unary(int kind, float x, float k0, float k1) { return lm_unary_f32(kind, x, k0, k1); }
static inline LM_HD double lm_unary(int kind, double x, double k0, double k1) { return lm_unary_f64(kind, x, k0, k1); }
static inline LM_HD float lm_unary_d(int kind, float x, float y, float k0, float k1) {
  return lm_unary_d_f32(kind, x, y, k0, k1);
}
static inline LM_HD double lm_unary_d(int kind, double x, double y, double k0, double k1) {
  return lm_unary_d_f64(kind, x, y, k0, k1);
}
#endif
#endif
