/* fastmath.h: a branch-free expf that loops vectorize (libm's does not),
 * accurate to about 2 ulp: Cephes' polynomial after reducing by ln 2. */
#ifndef LOOM_CPU_FASTMATH_H
#define LOOM_CPU_FASTMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float lm_expf(float x) {
  float xc = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  float n = rintf(xc * 1.44269504088896341f);
  float r = fmaf(n, -0.693359375f, xc);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p * r, r, r) + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, 4);
  float res = p * scale;
  res = x < -87.3f ? 0.0f : res;
  res = x > 88.7f ? INFINITY : res;
  return x != x ? x : res;
}
#endif
