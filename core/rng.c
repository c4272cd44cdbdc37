/* rng.c: Philox4x32-10 and the (seed, offset) state of this process.
 * A random tensor of N global elements uses counters offset..offset+N-1
 * and then advances the offset by N, on every rank alike. */
#include "internal.h"

static uint64_t rng_seed = 0x853c49e6748fea9bULL, rng_offset;

void lm_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1, c3 = (uint32_t)p0, c0 = n0, c2 = n2;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

void lm_manual_seed(uint64_t seed) { rng_seed = seed, rng_offset = 0; }
void lm_rng_get_state(uint64_t *seed, uint64_t *offset) { *seed = rng_seed, *offset = rng_offset; }
void lm_rng_set_state(uint64_t seed, uint64_t offset) { rng_seed = seed, rng_offset = offset; }

int lm_random_(lm_tensor *t, int kind, double a, double b, const int64_t *global_shape,
               const int64_t *local_start) {
  if (!t) return lm_error("random: tensor is nil");
  if (kind < LM_UNIFORM || kind > LM_RANDINT) return lm_error("random: unknown kind %d", kind);
  if (kind == LM_RANDINT && !(b > a))
    return lm_error("randint: expected low < high, got low %g high %g", a, b);
  if (kind == LM_NORMAL && b < 0) return lm_error("randn: expected std >= 0, got %g", b);
  int64_t gnumel = global_shape ? lm_shape_numel(t->ndim, global_shape) : t->numel_;
  int rc = lm_backend_of(t->device_)->random(t, kind, a, b, rng_seed, rng_offset,
                                             global_shape, local_start);
  rng_offset += (uint64_t)gnumel;
  return rc;
}
