/* low_copy.c: a weight's bf16/f16 copy, written by the optimizer and kept
 * on the weight's storage for the next forward's cast (tensor.h). The copy
 * holds the bits a cast gives (the kernels round the stored f32 values the
 * way the cast does), so taking it changes no result, only the pass over
 * memory. One copy per storage: of the contiguous view it was asked for. */
#include "tensor.h"

static bool is_low(int dtype) { return dtype == LM_BF16 || dtype == LM_F16; }

/* the view of t's storage the kept copy is of */
static bool covers(const lm_storage *s, const lm_tensor *t) {
  return s->low_offset == t->offset && s->low->numel_ == t->numel_ && lm_is_contiguous(t);
}

/* Both storages as they were when the copy was written: the weight's, and
 * the copy's own (a cast handed out is a view of it, which its taker may
 * change in place or through a raw pointer). The copy's storage keeps its
 * own version in its low_version, as lm_data leaves it (-1: exposed). */
static bool unchanged(const lm_storage *s) {
  const lm_storage *c = s->low->storage;
  return __atomic_load_n(&s->version, __ATOMIC_RELAXED) == s->low_version &&
         __atomic_load_n(&c->version, __ATOMIC_RELAXED) == c->low_version;
}

static int64_t hits;
int64_t lm_low_copy_hits(void) { return __atomic_load_n(&hits, __ATOMIC_RELAXED); }

lm_tensor *lm_low_copy_of(const lm_tensor *t, int dtype) {
  lm_storage *s = t->storage;
  if (!s || !s->low || t->dtype_ != LM_F32 || s->low->dtype_ != dtype || !unchanged(s) || !covers(s, t))
    return NULL;
  lm_tensor *v = lm_view_of(s->low, t->ndim, t->shape_, NULL, s->low->offset);
  if (v) __atomic_add_fetch(&hits, 1, __ATOMIC_RELAXED);
  return v;
}

void lm_low_copy_want(const lm_tensor *t, int dtype) {
  lm_storage *s = t->storage;
  if (!s || t->dtype_ != LM_F32 || !is_low(dtype) || !lm_is_contiguous(t) || t->device_ == LM_META) return;
  s->low_wanted = (int8_t)(dtype + 1);
  s->low_offset = t->offset;
}

/* Writes in place into the kept copy: only autocast's casts hand it out,
 * to autograd graphs, and a graph made before this step that saved it then
 * refuses its backward (the copy's version moves), as it would in f32 where
 * it saved the weight itself. Out of memory for a new copy, the weight
 * stops keeping one (its casts then run as they would). */
lm_tensor *lm_low_copy_target(const lm_tensor *t) {
  lm_storage *s = t->storage;
  if (!s || !s->low_wanted || t->dtype_ != LM_F32 || s->low_offset != t->offset || !lm_is_contiguous(t))
    return NULL;
  int dtype = s->low_wanted - 1;
  lm_tensor *low = s->low;
  if (low && low->dtype_ == dtype && low->numel_ == t->numel_) {
    lm_bump_version(low);
    return low;
  }
  s->low_version = -1;
  lm_release(s->low);
  s->low = lm_empty(t->ndim, t->shape_, dtype, t->device_);
  if (!s->low) s->low_wanted = 0, lm_clear_error();
  return s->low;
}

void lm_low_copy_done(const lm_tensor *t) {
  lm_storage *s = t->storage;
  if (!s || !s->low) return;
  lm_storage *c = s->low->storage;
  s->low_version = __atomic_load_n(&s->version, __ATOMIC_RELAXED);
  c->low_version = __atomic_load_n(&c->version, __ATOMIC_RELAXED);
}
