/* test_core.c: C tests of the core: Philox known answers, layout math,
 * refcounting and errors. Prints "N passed, N failed" and exits non-zero
 * on any failure. */
#include "check.h"
#include "dtensor/dtensor.h"
#include <stdio.h>
#include <string.h>

/* Random123's published known-answer vectors (kat_vectors). */
static void test_philox(void) {
  static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                     {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                                     {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}};
  static const uint32_t key[3][2] = {{0, 0}, {0xffffffff, 0xffffffff}, {0xa4093822, 0x299f31d0}};
  static const uint32_t want[3][4] = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                                      {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                                      {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
  for (int k = 0; k < 3; k++) {
    uint32_t out[4];
    lm_philox4x32(ctr[k], key[k], out);
    CHECK(memcmp(out, want[k], sizeof out) == 0);
  }
}

/* A shard drawn with its global offset equals the slice of the full draw. */
static void test_random_shards(void) {
  int64_t full_shape[2] = {6, 5}, part_shape[2] = {2, 5}, start[2] = {2, 0};
  lm_manual_seed(42);
  lm_tensor *full = lm_empty(2, full_shape, LM_F32, LM_CPU);
  CHECK(lm_random_(full, LM_NORMAL, 0, 1, NULL, NULL) == 0);
  lm_manual_seed(42);
  lm_tensor *part = lm_empty(2, part_shape, LM_F32, LM_CPU);
  CHECK(lm_random_(part, LM_NORMAL, 0, 1, full_shape, start) == 0);
  uint64_t seed, offset;
  lm_rng_get_state(&seed, &offset);
  CHECK(offset == 30); /* advanced by the global numel */
  const float *f = lm_data(full), *p = lm_data(part);
  CHECK(memcmp(f + 10, p, 10 * sizeof *f) == 0);
  lm_release(full), lm_release(part);
}

static void test_layout(void) {
  int64_t shape[3] = {2, 3, 4}, stride[3];
  lm_contiguous_strides(3, shape, stride);
  CHECK(stride[0] == 12 && stride[1] == 4 && stride[2] == 1);
  CHECK(lm_shape_numel(3, shape) == 24);
  CHECK(lm_wrap_dim("t", "dim", -1, 3) == 2);
  CHECK(lm_wrap_dim("t", "dim", 3, 3) < 0);
  CHECK(strstr(lm_last_error(), "dim") != NULL);
  lm_tensor *t = lm_empty(3, shape, LM_F32, LM_CPU);
  lm_attrs a = {.i = {0, 2}, .ni = 2};
  lm_tensor *tr = lm_run(LM_OP_TRANSPOSE, 1, &t, &a);
  CHECK(tr && tr->shape_[0] == 4 && tr->stride_[0] == 1 && tr->stride_[2] == 12);
  CHECK(tr && !lm_is_contiguous(tr) && lm_is_contiguous(t));
  lm_release(tr), lm_release(t);
}

static void test_refcount(void) {
  int64_t before = lm_storage_count(), n = 8;
  lm_tensor *t = lm_empty(1, &n, LM_F64, LM_CPU);
  CHECK(lm_storage_count() == before + 1);
  CHECK(lm_allocated_bytes() >= 64);
  lm_attrs a = {.i = {0, 2, 4}, .ni = 3};
  lm_tensor *v = lm_run(LM_OP_NARROW, 1, &t, &a); /* a view keeps the storage */
  lm_release(t);
  CHECK(lm_storage_count() == before + 1);
  CHECK(v && v->offset == 2 && v->shape_[0] == 4);
  lm_release(v);
  CHECK(lm_storage_count() == before);
  /* the same past the small-buffer size, reading through the view after
   * its owner is gone (valgrind, in scripts/leakcheck.sh, sees any misuse) */
  int64_t big = 1000;
  lm_tensor *b = lm_empty(1, &big, LM_F32, LM_CPU);
  CHECK(b && lm_fill_(b, 2.5) == 0);
  lm_attrs tail = {.i = {0, 990, 10}, .ni = 3};
  lm_tensor *bv = b ? lm_run(LM_OP_NARROW, 1, &b, &tail) : NULL;
  lm_release(b);
  CHECK(bv && ((const float *)lm_data(bv))[9] == 2.5f);
  lm_release(bv);
  CHECK(lm_storage_count() == before);
}

static void test_errors(void) {
  int64_t bad[1] = {-3};
  CHECK(lm_empty(1, bad, LM_F32, LM_CPU) == NULL);
  CHECK(strstr(lm_last_error(), "-3") != NULL);
  CHECK(lm_dtype_from_name("f128") < 0);
  CHECK(strstr(lm_last_error(), "f128") != NULL);
  CHECK(lm_op_find("no_such_op") < 0);
  lm_tensor *in[1] = {NULL};
  CHECK(lm_op_call(LM_OP_NEG, 1, in, NULL, 1, in) < 0);
  CHECK(strstr(lm_last_error(), "argument #1") != NULL);
  /* the registry's own checks: op id, argument count, room for outputs */
  int64_t n = 3, big[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  lm_tensor *t = lm_empty(1, &n, LM_F32, LM_CPU), *out[2];
  CHECK(lm_op_call(-1, 1, &t, NULL, 1, out) < 0 && strstr(lm_last_error(), "no such op"));
  CHECK(lm_op_call(LM_OP_ADD, 1, &t, NULL, 1, out) < 0 &&
        strstr(lm_last_error(), "expected 2 tensor arguments, got 1"));
  CHECK(lm_op_call(LM_OP_NEG, 1, &t, NULL, 0, out) < 0 && strstr(lm_last_error(), "room"));
  /* creation and copies */
  CHECK(lm_empty(9, big, LM_F32, LM_CPU) == NULL && strstr(lm_last_error(), "9"));
  CHECK(lm_empty(1, NULL, LM_F32, LM_CPU) == NULL && strstr(lm_last_error(), "NULL"));
  CHECK(lm_empty(1, &n, 42, LM_CPU) == NULL && strstr(lm_last_error(), "dtype 42"));
  int64_t m = 4;
  lm_tensor *u = lm_empty(1, &m, LM_F64, LM_CPU);
  CHECK(lm_copy_(t, u) < 0 && strstr(lm_last_error(), "shapes differ"));
  CHECK(lm_copy_(NULL, u) < 0 && lm_fill_(NULL, 1) < 0);
  lm_release(t), lm_release(u);
}

/* Shard layout follows torch.chunk: 6 rows on 4 ranks are 2, 2, 2, 0;
 * nested shards on a 2x2 mesh split the shard of the outer mesh dim. */
static void test_shard_layout(void) {
  int64_t mshape[1] = {4}, coord[1] = {0}, gshape[2] = {6, 5}, ls[2], off[2];
  lm_comm *comms[1] = {NULL}; /* layout math needs no communicator */
  lm_mesh *m = lm_mesh_new(1, mshape, coord, comms, LM_CPU);
  lm_placement shard0[1] = {{LM_SHARD, 0, 0}};
  const int64_t want[4] = {2, 2, 2, 0}, want_off[4] = {0, 2, 4, 6};
  for (int r = 0; r < 4; r++) {
    int64_t c[1] = {r};
    CHECK(lm_shard_layout(m, 2, gshape, shard0, c, ls, off) == 0);
    CHECK(ls[0] == want[r] && off[0] == want_off[r] && ls[1] == 5 && off[1] == 0);
  }
  lm_mesh_release(m);
  int64_t m2[2] = {2, 2}, c2[2] = {1, 1};
  lm_comm *comms2[2] = {NULL, NULL};
  lm_mesh *mm = lm_mesh_new(2, m2, c2, comms2, LM_CPU);
  lm_placement nested[2] = {{LM_SHARD, 0, 0}, {LM_SHARD, 0, 0}}, mixed[2] = {{LM_REPLICATE, 0, 0}, {LM_SHARD, 1, 0}};
  int64_t g7[2] = {7, 5};
  CHECK(lm_shard_layout(mm, 2, g7, nested, NULL, ls, off) == 0); /* rows 4..6 -> second half: 6 */
  CHECK(ls[0] == 1 && off[0] == 6);
  CHECK(lm_shard_layout(mm, 2, g7, mixed, NULL, ls, off) == 0); /* cols 3..4 */
  CHECK(ls[0] == 7 && ls[1] == 2 && off[1] == 3);
  lm_mesh_release(mm);
}

/* a GEMM with K = 0 (review item 8): c = beta * c, and zeros for beta 0
 * even where c held NaN */
static void test_gemm_empty_k(void) {
  int64_t sa[3] = {2, 3, 0}, sb[3] = {2, 0, 4}, sc[3] = {2, 3, 4};
  lm_tensor *a = lm_empty(3, sa, LM_F32, LM_CPU), *b = lm_empty(3, sb, LM_F32, LM_CPU);
  lm_tensor *c = lm_empty(3, sc, LM_F32, LM_CPU);
  const lm_backend *be = lm_backend_of(LM_CPU);
  float *p = lm_data(c);
  for (int i = 0; i < 24; i++) p[i] = 3;
  CHECK(be->gemm(c, a, b, 1, 2) == 0 && p[0] == 6 && p[23] == 6);
  for (int i = 0; i < 24; i++) p[i] = 0.0f / 0.0f;
  CHECK(be->gemm(c, a, b, 1, 0) == 0 && p[0] == 0 && p[23] == 0);
  lm_release(a), lm_release(b), lm_release(c);
}

int main(void) {
  test_philox();
  test_random_shards();
  test_layout();
  test_refcount();
  test_errors();
  test_shard_layout();
  test_gemm_empty_k();
  return check_report();
}
