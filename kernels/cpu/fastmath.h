/* fastmath.h: branch-free f32 math that loops vectorise (libm's does not):
 * exp, tanh, erfc and the activations built on them. Only + - * /,
 * compares and bit operations (contracted to FMA where the target has it),
 * so every target clone vectorises, plain SSE2 included; a file using it
 * starts with simd.h (its loops need -fno-trapping-math to if-convert).
 * Largest errors against double math on the f32 inputs (2^22 points per
 * range; ulp of the result, or of 1 for the derivatives, which cross 0):
 * exp 1.0, tanh 1.5, sigmoid 2.4, silu 2.4, silu' 1.9, gelu 6.7 on
 * [-5, 5] (4.3 near 0; 8.9 on [-13, -5]), gelu' 1.25, gelu_tanh' 1.8,
 * gelu_tanh 9 on |x| < 2.5 (its exponent 2z carries z's rounding; in the
 * tail, where it is below 1e-6, more). libm-based f32 gelu, 0.5 x (1 +
 * erf(x / sqrt 2)), was 44 ulp near -5.5 and 0 instead of 1e-8 beyond;
 * PyTorch 2.15's f32 gelu on this CPU is 9.6 ulp near 0, 6.7e5 near -5. */
#ifndef LOOM_CPU_FASTMATH_H
#define LOOM_CPU_FASTMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* the element types by the names the kernels' macros paste */
typedef float f32;
typedef double f64;

static inline float lm_f32_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t lm_bits_f32(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

/* Cephes' expf: n = round(x / ln 2) (the 1.5 * 2^23 trick), r = x - n ln 2
 * in two exact steps, a degree-6 polynomial, then 2^n from the exponent
 * bits. x is first clamped to [-88, 89] (max and min; NaN passes through
 * and stays NaN): at -88, n = -127 makes the scale 0, so results below
 * FLT_MIN (x < -87.34) flush to 0; at 89, n = 128 overflows to inf. */
/* The bounds are read from memory (fastmath.c): as constants GCC folds the
 * clamped paths through to the end and turns two vmaxps/vminps into a dozen
 * compares and blends (1.6x slower). As uint32_t they cannot alias the
 * floats a loop stores, so the loads leave the loop. */
extern uint32_t lm_expf_bounds[2];
/* e^xc for a clamped xc, as p * 2^n: returns p and sets *n */
static inline float lm_expf_parts(float xc, int32_t *n) {
  float t = xc * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: n in t's low bits */
  float nf = t - 12582912.0f;
  float r = xc - nf * 0.693359375f; /* nf * C1 is exact: C1 has 9 bits */
  r = r + nf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  /* n as an integer from t's bits, not (int32_t)nf: defined for NaN too */
  *n = (int32_t)(lm_bits_f32(t) - 0x4B400000u);
  return (p * r) * r + r + 1.0f;
}
static inline float lm_pow2i(int32_t n) { return lm_f32_bits((uint32_t)(n + 127) << 23); }
static inline float lm_expf(float x) {
  float lo = lm_f32_bits(lm_expf_bounds[0]), hi = lm_f32_bits(lm_expf_bounds[1]);
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  int32_t n;
  float p = lm_expf_parts(xc, &n);
  /* 2^n, n in [-127, 128]: 2^min(n, 127), doubled when n is 128 */
  float res = p * lm_pow2i(n > 127 ? 127 : n);
  return n > 127 ? res + res : res;
}
/* lm_expf for x <= 0 (or NaN), where n <= 0: no upper clamp, no doubling
 * (a sixth fewer instructions in gelu's loop) */
static inline float lm_expf_neg(float x) {
  float lo = lm_f32_bits(lm_expf_bounds[0]);
  int32_t n;
  float p = lm_expf_parts(x < lo ? lo : x, &n);
  return p * lm_pow2i(n);
}

/* Cephes' tanhf: an odd polynomial below 0.625, else (1 - e) / (1 + e) with
 * e = exp(-2|x|) <= 0.29 (no cancellation, and exp's cheaper side). */
static inline float lm_tanhf(float x) {
  float a = fabsf(x), z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = (p * z) * x + x;
  float e = lm_expf_neg(-2.0f * a);
  float big = copysignf((1.0f - e) / (1.0f + e), x);
  return a > 0.625f ? big : small; /* NaN takes the polynomial: NaN */
}

/* a^2 = hi + lo exactly (lo = the rounding error of hi). With FMA that is
 * one fma (a * a - hi rounds once, and is exact); without, a's top 12 bits
 * square exactly, and so do the products with the low 12. Same bits. */
static inline float lm_sq_lo(float a, float hi) {
#if defined(__FMA__)
  return fmaf(a, a, -hi);
#else
  float ah = lm_f32_bits(lm_bits_f32(a) & 0xfffff000u), al = a - ah;
  return ((ah * ah - hi) + 2.0f * ah * al) + al * al;
#endif
}

/* exp(-k a^2) for k = 1 or 1/2, with a^2 = hi + lo exactly, so the large
 * exponent loses nothing to the rounding of a^2 (nor of x / sqrt 2). */
static inline float lm_exp_neg_sq(float a, float k) {
  float hi = a * a, lo = a < 1e19f ? lm_sq_lo(a, hi) : 0.0f; /* not inf - inf */
  return lm_expf_neg(-k * hi) * (1.0f - k * lo);
}

/* erfcx(t) = erfc(t) e^(t^2) for t >= 0: P(t) / Q(t) of degrees 4 and 5, a
 * minimax fit of relative error 5e-9 on [0, 9.5] (scripts/fit_erfcx.py).
 * The coefficients are all positive, so Horner's sums do not cancel; it
 * evaluates to 3.6 ulp. Past 9.5 (where e^(-t^2) is 0 in f32) t is held. */
static inline float lm_erfcx(float t) {
  float tc = t < 9.5f ? t : 9.5f;
  float p = 0.03225344267000069f;
  p = p * tc + 0.22662503229129372f;
  p = p * tc + 0.7261541705209581f;
  p = p * tc + 1.2331962621899206f;
  p = p * tc + 1.0000000050769648f;
  float q = 0.057166945453541104f;
  q = q * tc + 0.401711466947408f;
  q = q * tc + 1.3151961751872927f;
  q = q * tc + 2.39089884654142f;
  q = q * tc + 2.3615759459912957f;
  q = q * tc + 1.0f;
  return p / q;
}

/* 1 + erf(x / sqrt 2) = 2 Phi(x) = erfc(-x / sqrt 2), without cancellation
 * for negative x; e = exp(-x^2 / 2), which gelu' needs too. */
static inline float lm_gelu_phi2_e(float x, float e) {
  float u = x * 0.70710678118654752f;
  float c = e * lm_erfcx(fabsf(u)); /* erfc(|u|) */
  return u > 0 ? 2.0f - c : c;
}
static inline float lm_gelu_phi2(float x) {
  return lm_gelu_phi2_e(x, lm_exp_neg_sq(fabsf(x), 0.5f));
}

static inline float lm_sigmoidf(float x) { return 1.0f / (1.0f + lm_expf(-x)); }
static inline float lm_siluf(float x) { return x / (1.0f + lm_expf(-x)); }
/* silu' = s (1 + x (1 - s)), s = sigmoid(x), with 1 - s = e s (e = exp(-x))
 * so that it keeps its digits where s is near 1 */
static inline float lm_silu_df(float x) {
  float e = lm_expf(-x), s = 1.0f / (1.0f + e);
  float q = e < INFINITY ? e * s : 1.0f;
  return s * (1.0f + x * q);
}
static inline float lm_geluf(float x) { return 0.5f * x * lm_gelu_phi2(x); }
static inline float lm_gelu_df(float x) {
  float e = lm_exp_neg_sq(fabsf(x), 0.5f);
  return 0.5f * lm_gelu_phi2_e(x, e) + x * e * 0.39894228040143268f;
}
/* tanh-approximated gelu: 0.5 x (1 + tanh z) = x sigmoid(2z), which keeps
 * its accuracy where tanh z is near -1; the derivative likewise. */
#define LM_GELU_K 0.79788456080286535588f
static inline float lm_gelu_tanhf(float x) {
  float z2 = x * (2.0f * LM_GELU_K + (2.0f * LM_GELU_K * 0.044715f) * (x * x)); /* 2z */
  return x / (1.0f + lm_expf(-z2));
}
static inline float lm_gelu_tanh_df(float x) {
  float z2 = x * (2.0f * LM_GELU_K + (2.0f * LM_GELU_K * 0.044715f) * (x * x));
  float e = lm_expf(-z2), s = 1.0f / (1.0f + e);
  float q = e < INFINITY ? e * s : 1.0f; /* 1 - s */
  return s + 2.0f * x * s * q * LM_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}
/* by element type, for kernels written once per type (fexp_##T): the math
 * above for f32, libm's for f64 (the reference math of every unary kind is
 * core/unary.h; spec/c/test_unary_math.c checks the f32 functions here
 * against it) */
static inline f32 fexp_f32(f32 x) { return lm_expf(x); }
static inline f64 fexp_f64(f64 x) { return exp(x); }
#endif
