/* test_device_fake.c: the core's side of a device backend, checked on the
 * CPU with a fake CUDA backend that counts what it is asked: asking how
 * many GPUs there are makes none current (the review's item 1: no
 * cudaSetDevice per GPU per rank), and freeing a tensor after the backend
 * started failing to select its device does not crash (item 6: the free
 * path called lm_backend_of(...)->free without a NULL check).
 * Prints "N passed, N failed"; exits non-zero on any failure. */
#include "backend.h"
#include "ops/op.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (cond) passed++;                                                        \
    else { failed++; fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } \
  } while (0)

static int selects, counts, allocs, frees, select_fails;
static int fake_select(int k) {
  selects++;
  return select_fails ? lm_error("fake cuda:%d: an earlier error is sticky", k) : 0;
}
static int fake_count(void) { counts++; return 2; }
static void *fake_alloc(size_t n) { allocs++; return malloc(n ? n : 1); }
static void fake_free(void *p) { frees++; free(p); }
static int copies, checks, check_unsupported;
static char check_head[160], check_tail[160];
static int fake_copy(lm_tensor *d, const lm_tensor *s) { /* contiguous: all the test needs */
  copies++;
  for (int64_t i = 0; i < s->numel_; i++)
    lm_store(lm_ptr(d) + i * lm_dtype_size(d->dtype_), d->dtype_,
             lm_load(lm_ptr(s) + i * lm_dtype_size(s->dtype_), s->dtype_));
  return 0;
}
static int ce_dtype = -1, rope_dtype = -1;
static int fake_rope(lm_tensor *out, const lm_tensor *x, const lm_tensor *cos, const lm_tensor *sin, int sign) {
  (void)out, (void)cos, (void)sin, (void)sign;
  rope_dtype = x->dtype_;
  return 0;
}
static int fake_cross_entropy(lm_tensor *loss, lm_tensor *lse, const lm_tensor *x, const lm_tensor *target,
                              const lm_tensor *w, int64_t ignore, double eps) {
  (void)target, (void)w, (void)ignore, (void)eps;
  ce_dtype = x->dtype_;
  for (int64_t i = 0; i < loss->numel_; i++) ((float *)lm_ptr(loss))[i] = 1, ((float *)lm_ptr(lse))[i] = 2;
  return 0;
}
static int fake_check_ids(const lm_tensor *idx, int64_t n, int skip_ok, int64_t skip, const char *head,
                          const char *tail) {
  (void)idx, (void)n, (void)skip_ok, (void)skip;
  checks++;
  snprintf(check_head, sizeof check_head, "%s", head);
  snprintf(check_tail, sizeof check_tail, "%s", tail);
  return check_unsupported ? lm_error("unsupported: no slots"), LM_UNSUPPORTED : 0;
}
static int fake_fill(lm_tensor *t, double v) { (void)t, (void)v; return 0; }

static void test_count_selects_nothing(void) {
  CHECK(lm_cuda_device_count() == 2);
  CHECK(lm_device_available(LM_CUDA0) == 1);
  CHECK(lm_device_available(LM_CUDA0 + 1) == 1);
  CHECK(lm_device_available(LM_CUDA0 + 2) == 0);
  CHECK(strstr(lm_last_error(), "cuda:0..cuda:1") != NULL);
  CHECK(counts == 4);
  CHECK(selects == 0); /* no device made current by asking */
}

static void test_free_after_failed_select(void) {
  int64_t shape[1] = {1000};
  allocs = frees = selects = 0;
  lm_tensor *t = lm_empty(1, shape, LM_F32, LM_CUDA0 + 1);
  CHECK(t != NULL && allocs == 1 && selects == 1);
  lm_tensor *u = lm_empty(1, shape, LM_F32, LM_CUDA0 + 1);
  select_fails = 1; /* from here the device cannot be selected */
  CHECK(lm_empty(1, shape, LM_F32, LM_CUDA0 + 1) == NULL);
  CHECK(strstr(lm_last_error(), "sticky") != NULL);
  lm_release(t); /* was a NULL call */
  CHECK(frees == 1);
  CHECK(lm_release_data(u) == 0);
  CHECK(frees == 2);
  lm_release(u);
  CHECK(frees == 2); /* released once only */
}

/* item 4: ids on a device are checked there, not copied to the host (a
 * wait for the device per forward); a backend that cannot falls back */
static void test_ids_checked_on_device(void) {
  int64_t shape[1] = {3};
  lm_tensor *ids = lm_empty(1, shape, LM_I64, LM_CUDA0);
  int64_t *p = lm_data(ids);
  p[0] = 0, p[1] = 3, p[2] = 7;
  copies = 0;
  CHECK(lm_check_ids("embedding", 2, "indices", ids, 5, 0, 0, "id") == 0); /* raised later */
  CHECK(checks == 1 && copies == 0);
  CHECK(strcmp(check_head, "embedding: argument #2 (indices) holds id ") == 0);
  CHECK(strstr(check_tail, ", outside [1, 5]") == check_tail);
  check_unsupported = 1;
  CHECK(lm_check_ids("embedding", 2, "indices", ids, 5, 0, 0, "id") < 0);
  CHECK(strstr(lm_last_error(), "holds id 8, outside [1, 5]") != NULL);
  CHECK(checks == 2 && copies == 1);
  check_unsupported = 0;
  lm_release(ids);
}

/* bf16 logits reach a fused cross entropy kernel as bf16 (no N x C f32
 * copy; loss and lse come back in f32), and bf16 q a fused rope as bf16 */
static void test_bf16_logits_stay_bf16(void) {
  int64_t xs[2] = {3, 5}, ts[1] = {3};
  lm_tensor *x = lm_empty(2, xs, LM_BF16, LM_CUDA0), *t = lm_empty(1, ts, LM_I64, LM_CUDA0);
  int64_t *tp = lm_data(t);
  tp[0] = 0, tp[1] = 4, tp[2] = 2;
  lm_attrs a = {.i = {-100, 0}, .ni = 2, .nf = 1};
  lm_tensor *in[2] = {x, t}, *out[2] = {NULL, NULL};
  CHECK(lm_op_call(LM_OP_CROSS_ENTROPY, 2, in, &a, 2, out) == 2);
  CHECK(ce_dtype == LM_BF16);
  CHECK(out[0] && out[0]->dtype_ == LM_BF16 && out[1] && out[1]->dtype_ == LM_F32);
  lm_release(out[0]), lm_release(out[1]), lm_release(x), lm_release(t);
  int64_t qs[4] = {1, 3, 2, 4}, cs[2] = {3, 2};
  lm_tensor *q = lm_empty(4, qs, LM_BF16, LM_CUDA0), *c = lm_empty(2, cs, LM_F32, LM_CUDA0);
  lm_tensor *rin[3] = {q, c, c}, *r = NULL;
  lm_attrs none = {.ni = 0};
  CHECK(lm_op_call(LM_OP_ROPE, 3, rin, &none, 1, &r) == 1);
  CHECK(rope_dtype == LM_BF16 && r && r->dtype_ == LM_BF16);
  lm_release(r), lm_release(q), lm_release(c);
}

int main(void) {
  static lm_backend fake = {.name = "fake cuda", .select = fake_select, .count = fake_count,
                            .alloc = fake_alloc, .free = fake_free, .copy = fake_copy,
                            .fill = fake_fill, .check_ids = fake_check_ids,
                            .cross_entropy = fake_cross_entropy, .rope = fake_rope};
  CHECK(lm_register_backend(LM_KIND_CUDA, &fake) == 0);
  test_count_selects_nothing();
  test_ids_checked_on_device();
  test_bf16_logits_stay_bf16();
  test_free_after_failed_select();
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
