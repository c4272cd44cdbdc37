/* philox.h: Philox4x32-10 and the draw of one random number from a counter,
 * compiled alike for C (tensor/rng.c, cpu/random.c) and CUDA (kernels/):
 * a CUDA tensor's uniform and integer draws are the bits its CPU twin
 * draws. Sums and products round one at a time (no FMA): on CUDA through
 * round-to-nearest intrinsics, in C because the files including this are
 * built with -ffp-contract=off. Normal draws go through log, sqrt and cos,
 * whose CUDA double versions may differ from the C library's by an ulp: CPU
 * and GPU normals agree to about 1e-15 in f64 and may differ in the last
 * bit in f32 (spec/cuda_spec.lua compares them to 1e-6, uniforms exactly). */
#ifndef LOOM_PHILOX_H
#define LOOM_PHILOX_H
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LM_HD __host__ __device__ inline
#else
#define LM_HD static inline
#endif
#ifdef __CUDA_ARCH__
#define LM_DMUL(x, y) __dmul_rn((x), (y))
#define LM_DADD(x, y) __dadd_rn((x), (y))
#else
#define LM_DMUL(x, y) ((x) * (y))
#define LM_DADD(x, y) ((x) + (y))
#endif

LM_HD void lm_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1, c3 = (uint32_t)p0, c0 = n0, c2 = n2;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* One number of `kind` (enum lm_random_kind: uniform in [a, b), normal of
 * mean a and std b, integer in [a, b)) for a counter; uniform floats use
 * the top 24 bits, f64 (dtype 1) 53 bits. */
LM_HD double lm_philox_draw(int kind, double a, double b, uint64_t seed, uint64_t counter,
                            int dtype) {
  uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, r[4];
  lm_philox(ctr, key, r);
  uint64_t r53 = ((((uint64_t)r[0] << 32) | r[1]) >> 11);
  if (kind == 0) { /* uniform */
    double u = dtype == 1 ? (double)r53 * 0x1p-53 : (double)(r[0] >> 8) * 0x1p-24;
    return LM_DADD(a, LM_DMUL(b - a, u));
  }
  if (kind == 2) return LM_DADD(a, floor(LM_DMUL(LM_DMUL(b - a, (double)r53), 0x1p-53)));
  /* normal: Box-Muller on r[2], r[3]; u1 in (0, 1] so the log is finite */
  double u1 = (double)((r[2] >> 8) + 1) * 0x1p-24, u2 = (double)(r[3] >> 8) * 0x1p-24;
  const double two_pi = 2 * 3.14159265358979323846;
  return LM_DADD(a, LM_DMUL(LM_DMUL(b, sqrt(LM_DMUL(-2.0, log(u1)))), cos(LM_DMUL(two_pi, u2))));
}
#endif
