/* philox.cuh: Philox4x32-10 and one draw, for host and device alike: the
 * same bits as core/rng.c lm_philox4x32 and core/cpu/random.c draw(). */
#ifndef LOOM_CUDA_PHILOX_CUH
#define LOOM_CUDA_PHILOX_CUH
#include <math.h>
#include <stdint.h>
#include "cuda_backend.h"

#ifdef __CUDA_ARCH__ /* no FMA contraction: round each step as the CPU does */
#define LM_DMUL(x, y) __dmul_rn((x), (y))
#define LM_DADD(x, y) __dadd_rn((x), (y))
#else
#define LM_DMUL(x, y) ((x) * (y))
#define LM_DADD(x, y) ((x) + (y))
#endif

__host__ __device__ inline void lm_dev_philox(const uint32_t ctr[4], const uint32_t key[2],
                                              uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1, c3 = (uint32_t)p0, c0 = n0, c2 = n2;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* One number of the given kind (enum lm_random_kind) for a counter. */
__host__ __device__ inline double lm_philox_draw(int kind, double a, double b, uint64_t seed,
                                                 uint64_t counter, int dtype) {
  uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, r[4];
  lm_dev_philox(ctr, key, r);
  uint64_t r53 = ((((uint64_t)r[0] << 32) | r[1]) >> 11);
  if (kind == LM_UNIFORM) {
    double u = dtype == LM_F64 ? (double)r53 * 0x1p-53 : (double)(r[0] >> 8) * 0x1p-24;
    return LM_DADD(a, LM_DMUL(b - a, u));
  }
  if (kind == LM_RANDINT) return LM_DADD(a, floor(LM_DMUL(LM_DMUL(b - a, (double)r53), 0x1p-53)));
  /* Box-Muller on r[2], r[3]: u1 in (0, 1] so the log is finite */
  double u1 = (double)((r[2] >> 8) + 1) * 0x1p-24, u2 = (double)(r[3] >> 8) * 0x1p-24;
  const double two_pi = 2 * 3.14159265358979323846;
  return LM_DADD(a, LM_DMUL(LM_DMUL(b, sqrt(LM_DMUL(-2.0, log(u1)))), cos(LM_DMUL(two_pi, u2))));
}
#endif
