/* rng.c: the (seed, offset) state of this process's counter-based RNG.
 * A random tensor of N global elements uses counters offset..offset+N-1
 * and then advances the offset by N, on every rank alike. */
#include "tensor.h"
#include "../philox.h"

static uint64_t rng_seed = 0x853c49e6748fea9bULL, rng_offset;

void lm_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  lm_philox(ctr, key, out);
}

void lm_manual_seed(uint64_t seed) { rng_seed = seed, rng_offset = 0; }
void lm_rng_get_state(uint64_t *seed, uint64_t *offset) { *seed = rng_seed, *offset = rng_offset; }
void lm_rng_set_state(uint64_t seed, uint64_t offset) { rng_seed = seed, rng_offset = offset; }

int lm_random_(lm_tensor *t, int kind, double a, double b, const int64_t *global_shape,
               const int64_t *local_start) {
  if (!t) return lm_error("random: tensor is nil");
  if (t->freed) return lm_error("random: the tensor was freed (t:free())");
  if (kind < LM_UNIFORM || kind > LM_RANDINT) return lm_error("random: unknown kind %d", kind);
  if (kind == LM_RANDINT && !(b > a))
    return lm_error("randint: expected low < high, got low %g high %g", a, b);
  if (kind == LM_NORMAL && b < 0) return lm_error("randn: expected std >= 0, got %g", b);
  const lm_backend *be = lm_backend_of(t->device_);
  if (!be) return -1;
  if (!be->random && t->device_ != LM_META) return lm_error("random: no random kernel on device %s", be->name);
  int64_t gnumel = global_shape ? lm_shape_numel(t->ndim, global_shape) : t->numel_;
  /* a meta tensor draws nothing but uses its counters, so that what comes
   * next draws what it would have */
  int rc = t->device_ == LM_META ? 0 : be->random(t, kind, a, b, rng_seed, rng_offset, global_shape, local_start);
  rng_offset += (uint64_t)gnumel;
  lm_bump_version(t);
  return rc;
}
