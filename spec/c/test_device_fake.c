/* test_device_fake.c: the core's side of a device backend, checked on the
 * CPU with a fake CUDA backend that counts what it is asked: asking how
 * many GPUs there are makes none current (the review's item 1: no
 * cudaSetDevice per GPU per rank), and freeing a tensor after the backend
 * started failing to select its device does not crash (item 6: the free
 * path called lm_backend_of(...)->free without a NULL check).
 * Prints "N passed, N failed"; exits non-zero on any failure. */
#include "backend.h"
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
static int fake_copy(lm_tensor *d, const lm_tensor *s) { (void)d, (void)s; return 0; }
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

int main(void) {
  static lm_backend fake = {.name = "fake cuda", .select = fake_select, .count = fake_count,
                            .alloc = fake_alloc, .free = fake_free, .copy = fake_copy,
                            .fill = fake_fill};
  CHECK(lm_register_backend(LM_KIND_CUDA, &fake) == 0);
  test_count_selects_nothing();
  test_free_after_failed_select();
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
