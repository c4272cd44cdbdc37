/* fastmath.h: branch-free f32 math that loops vectorise (libm's does not):
 * exp, tanh, erf/erfc and the activations built on them. Only + - * /,
 * compares and bit operations (contracted to FMA where the target has it),
 * so every target clone vectorises, plain SSE2 included; a file using it
 * starts with simd.h (its loops need -fno-trapping-math to if-convert).
 * Largest errors against double math on the f32 inputs (2^22 points per
 * range; ulp of the result, or of 1 for the derivatives, which cross 0):
 * exp 1.0, tanh 1.3, erf 1.0, sigmoid 2.4, silu 2.4, silu' 1.9, gelu 5.4
 * (x near -1.2 and -5: 1 + erf cancels), gelu' 1.2, gelu_tanh' 1.8,
 * gelu_tanh 9 on |x| < 2.5 (its exponent 2z carries z's rounding; in the
 * tail, where it is below 1e-6, more). libm-based f32 gelu, 0.5 x (1 +
 * erf(x / sqrt 2)), was 44 ulp near -5.5 and 0 instead of 1e-8 beyond. */
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
static inline float lm_expf(float x) {
  float lo = lm_f32_bits(lm_expf_bounds[0]), hi = lm_f32_bits(lm_expf_bounds[1]);
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  float t = xc * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: n in t's low bits */
  float n = t - 12582912.0f;
  float r = xc - n * 0.693359375f; /* n * C1 is exact: C1 has 9 bits */
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * r) * r + r + 1.0f;
  /* 2^n, n in [-127, 128]: 2^min(n, 127), doubled when n is 128 */
  /* n as an integer from t's bits, not (int32_t)n: defined for NaN too */
  int32_t ni = (int32_t)(lm_bits_f32(t) - 0x4B400000u);
  float res = p * lm_f32_bits((uint32_t)((ni > 127 ? 127 : ni) + 127) << 23);
  return ni > 127 ? res + res : res;
}

/* Cephes' tanhf: an odd polynomial below 0.625, else 1 - 2/(e^2|x| + 1). */
static inline float lm_tanhf(float x) {
  float a = fabsf(x), z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = (p * z) * x + x;
  float big = 1.0f - 2.0f / (lm_expf(2.0f * a) + 1.0f);
  big = copysignf(big, x);
  return a > 0.625f ? big : small; /* NaN takes the polynomial: NaN */
}

/* erf below LM_ERF_T: x + x P(x^2), P a degree-6 least-squares fit of
 * erf(x)/x - 1 (relative error 4e-10 in exact arithmetic): x itself is the
 * exact leading term. */
#define LM_ERF_T 0.921875f
static inline float lm_erf_small(float x) {
  float z = x * x;
  float p = 8.365006092283043e-05f;
  p = p * z - 0.0008141391987454656f;
  p = p * z + 0.005200905220496468f;
  p = p * z - 0.026859341362097885f;
  p = p * z + 0.11283694336734984f;
  p = p * z - 0.3761263364837871f;
  p = p * z + 0.1283791666267591f;
  return x + x * p;
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
  return lm_expf(-k * hi) * (1.0f - k * lo);
}

/* erfc(t) e^(t^2) for t >= LM_ERF_T: g(1/t) / t, g(w) = t erfc(t) e^(t^2) a
 * degree-11 fit in w - 0.595 on t in [0.92, 9.5] (relative error 2e-8).
 * Past 9.5 (where e^(-t^2) is 0 in f32) t is held at 9.5. */
static inline float lm_erfcx_big(float t) {
  float tc = t < 9.5f ? t : 9.5f;
  float w = 1.0f / tc, s = w - 0.5950044603033007f;
  float g = 0.062068957013466736f;
  g = g * s - 0.014177697706250098f;
  g = g * s - 0.07752886615525631f;
  g = g * s + 0.07517274712366097f;
  g = g * s - 0.03435073193883928f;
  g = g * s - 0.005826580408667581f;
  g = g * s + 0.05072647896214273f;
  g = g * s - 0.08546511684064699f;
  g = g * s + 0.08192016346433907f;
  g = g * s - 0.008220114411066919f;
  g = g * s - 0.17130477006153405f;
  g = g * s + 0.49466842550983336f;
  return g * w;
}

static inline float lm_erff(float x) {
  float t = fabsf(x);
  float big = copysignf(1.0f - lm_exp_neg_sq(t, 1.0f) * lm_erfcx_big(t), x);
  return t >= LM_ERF_T ? big : lm_erf_small(x); /* NaN: small, NaN */
}

/* 1 + erf(x / sqrt 2) = 2 Phi(x), without cancellation for negative x;
 * e = exp(-x^2 / 2), which gelu' needs too. */
static inline float lm_gelu_phi2_e(float x, float e) {
  float u = x * 0.70710678118654752f, t = fabsf(u);
  float c = e * lm_erfcx_big(t);
  float big = u > 0 ? 2.0f - c : c;
  return t >= LM_ERF_T ? big : 1.0f + lm_erf_small(u);
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
/* exp by element type, for kernels written once per type (T##_f32) */
static inline f32 fexp_f32(f32 x) { return lm_expf(x); }
static inline f64 fexp_f64(f64 x) { return exp(x); }

#endif
