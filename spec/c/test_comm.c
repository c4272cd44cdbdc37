/* test_comm.c: the collectives of core/comm/ on every dtype, even and
 * uneven, on dims 0 and 1, against references computed from rank-determined
 * inputs. Runs as a world of one, or under mpirun -n 2 / -n 4. */
#include "comm/comm.h"
#include "dtensor/dtensor.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures, checks, rank, world;
static const int dtypes[] = {LM_F32, LM_F64, LM_BF16, LM_F16, LM_I32, LM_I64};
#define NDT (int)(sizeof dtypes / sizeof *dtypes)

/* Element [i][j] of rank q's input: small integers, exact in every dtype. */
static double val(int q, int64_t i, int64_t j) { return (q + 1) * 3 + i * 4 + j; }

/* Releases the tensors a test made (NULL ones too, as lm_release does). */
static void release_all(lm_tensor **t, size_t n) {
  for (size_t i = 0; i < n; i++) lm_release(t[i]);
}
#define RELEASE(...) \
  release_all((lm_tensor *[]){__VA_ARGS__}, sizeof((lm_tensor *[]){__VA_ARGS__}) / sizeof(lm_tensor *))

static lm_tensor *input(int q, int64_t n0, int64_t n1, int dtype) {
  int64_t sh[2] = {n0, n1};
  lm_tensor *t = lm_empty(2, sh, dtype, LM_CPU);
  char *p = lm_data(t);
  for (int64_t i = 0; i < n0; i++)
    for (int64_t j = 0; j < n1; j++)
      lm_store(p + (i * n1 + j) * lm_dtype_size(dtype), dtype, val(q, i, j));
  return t;
}

/* The reference after a round trip through dtype (one rounding). */
static double in_dtype(double v, int dtype) {
  char b[8];
  lm_store(b, dtype, v);
  return lm_load(b, dtype);
}

static double at(const lm_tensor *t, int64_t i, int64_t j) {
  const char *p = lm_data(t);
  return lm_load(p + (i * t->stride_[0] + j * t->stride_[1]) * lm_dtype_size(t->dtype_), t->dtype_);
}

static void expect(int ok, const char *what, int dtype, double got, double want) {
  checks++;
  if (ok) return;
  if (failures++ < 20)
    fprintf(stderr, "rank %d: FAIL %s (%s): got %g, want %g\n", rank, what,
            lm_dtype_name(dtype), got, want);
}

static void expect_shape(const lm_tensor *t, int64_t n0, int64_t n1, const char *what) {
  if (!t) {
    expect(0, what, 0, 0, 0);
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, lm_last_error());
    return;
  }
  expect(t->ndim == 2 && t->shape_[0] == n0 && t->shape_[1] == n1, what, t->dtype_,
         (double)t->shape_[0], (double)n0);
}

static void check_all(const lm_tensor *t, int dtype, const char *what,
                      double (*ref)(int64_t, int64_t, const void *), const void *ctx) {
  if (!t) return;
  for (int64_t i = 0; i < t->shape_[0]; i++)
    for (int64_t j = 0; j < t->shape_[1]; j++) {
      double want = in_dtype(ref(i, j, ctx), dtype), got = at(t, i, j);
      expect(got == want, what, dtype, got, want);
    }
}

typedef struct { int op; int64_t row0, col0; } red_ctx;

static double reduce_ref(int64_t i, int64_t j, const void *c) {
  const red_ctx *r = c;
  double acc = r->op == LM_RED_MAX ? -1e300 : r->op == LM_RED_MIN ? 1e300 : 0;
  for (int q = 0; q < world; q++) {
    double v = val(q, i + r->row0, j + r->col0);
    acc = r->op == LM_RED_MAX ? fmax(acc, v) : r->op == LM_RED_MIN ? fmin(acc, v) : acc + v;
  }
  return r->op == LM_RED_AVG ? acc / world : acc;
}

static void test_all_reduce(lm_comm *c, int dtype) {
  for (int op = LM_RED_SUM; op <= LM_RED_MIN; op++) {
    if (op == LM_RED_AVG && dtype >= LM_I32) continue;
    lm_tensor *x = input(rank, 5, 3, dtype);
    lm_tensor *y = lm_all_reduce(c, x, op);
    expect_shape(y, 5, 3, "all_reduce shape");
    red_ctx r = {op, 0, 0};
    check_all(y, dtype, "all_reduce", reduce_ref, &r);
    RELEASE(x, y);
  }
}

typedef struct { int dim; int64_t full, n1; } gat_ctx;

/* Which rank holds global row/col g of a torch.chunk split, and where. */
static int owner(int64_t g, int64_t full, int64_t *local) {
  for (int q = 0; q < world; q++) {
    int64_t o = lm_chunk_offset(full, world, q), s = lm_chunk_size(full, world, q);
    if (g >= o && g < o + s) { *local = g - o; return q; }
  }
  return -1;
}

static double gather_ref(int64_t i, int64_t j, const void *c) {
  const gat_ctx *g = c;
  int64_t l;
  if (g->dim == 0) { int q = owner(i, g->full, &l); return val(q, l, j); }
  int q = owner(j, g->full, &l);
  return val(q, i, l);
}

static void test_all_gather(lm_comm *c, int dtype) {
  int64_t fulls[] = {2 * (int64_t)world, 5, 1};
  for (int dim = 0; dim < 2; dim++)
    for (int f = 0; f < 3; f++) {
      int64_t full = fulls[f], mine = lm_chunk_size(full, world, rank);
      lm_tensor *x = dim == 0 ? input(rank, mine, 3, dtype) : input(rank, 3, mine, dtype);
      lm_tensor *y = lm_all_gather(c, x, dim, full);
      if (dim == 0) expect_shape(y, full, 3, "all_gather shape");
      else expect_shape(y, 3, full, "all_gather shape");
      gat_ctx g = {dim, full, 3};
      check_all(y, dtype, dim ? "all_gather dim 1" : "all_gather dim 0", gather_ref, &g);
      RELEASE(x, y);
    }
}

static void test_reduce_scatter(lm_comm *c, int dtype) {
  int64_t ns[] = {2 * (int64_t)world, 5};
  for (int dim = 0; dim < 2; dim++)
    for (int f = 0; f < 2; f++) {
      int64_t n = ns[f], mine = lm_chunk_size(n, world, rank), off = lm_chunk_offset(n, world, rank);
      lm_tensor *x = dim == 0 ? input(rank, n, 3, dtype) : input(rank, 3, n, dtype);
      lm_tensor *y = lm_reduce_scatter(c, x, LM_RED_SUM, dim);
      if (dim == 0) expect_shape(y, mine, 3, "reduce_scatter shape");
      else expect_shape(y, 3, mine, "reduce_scatter shape");
      red_ctx r = {LM_RED_SUM, dim == 0 ? off : 0, dim == 1 ? off : 0};
      check_all(y, dtype, dim ? "reduce_scatter dim 1" : "reduce_scatter dim 0", reduce_ref, &r);
      RELEASE(x, y);
    }
}

/* all_to_all(split 1, cat 0): rank q holds rows chunk q of `full` and all n1
 * columns; afterwards rank r holds all rows and its chunk of the columns. */
typedef struct { int64_t full, n1; } a2a_ctx;
static double a2a_ref(int64_t i, int64_t j, const void *c) {
  const a2a_ctx *a = c;
  int64_t l;
  int q = owner(i, a->full, &l);
  return val(q, l, j + lm_chunk_offset(a->n1, world, rank));
}

static void test_all_to_all(lm_comm *c, int dtype) {
  int64_t fulls[] = {2 * (int64_t)world, 5}, n1s[] = {2 * (int64_t)world, 3};
  for (int f = 0; f < 2; f++) {
    int64_t full = fulls[f], n1 = n1s[f], mine = lm_chunk_size(full, world, rank);
    lm_tensor *x = input(rank, mine, n1, dtype);
    lm_tensor *y = lm_all_to_all(c, x, 1, 0, full);
    expect_shape(y, full, lm_chunk_size(n1, world, rank), "all_to_all shape");
    a2a_ctx a = {full, n1};
    check_all(y, dtype, "all_to_all split 1 cat 0", a2a_ref, &a);
    /* and back: split 0, cat 1 gives each rank its original rows */
    lm_tensor *z = y ? lm_all_to_all(c, y, 0, 1, n1) : NULL;
    expect_shape(z, mine, n1, "all_to_all back shape");
    for (int64_t i = 0; z && i < mine; i++)
      for (int64_t j = 0; j < n1; j++)
        expect(at(z, i, j) == at(x, i, j), "all_to_all round trip", dtype, at(z, i, j), at(x, i, j));
    RELEASE(x, y, z);
  }
}

static double bcast_ref(int64_t i, int64_t j, const void *c) {
  (void)c;
  return val(world - 1, i, j);
}

static void test_broadcast(lm_comm *c, int dtype) {
  lm_tensor *x = input(rank, 4, 3, dtype);
  lm_tensor *y = lm_broadcast(c, x, world - 1);
  expect_shape(y, 4, 3, "broadcast shape");
  check_all(y, dtype, "broadcast", bcast_ref, NULL);
  RELEASE(x, y);
}

/* A transposed view (non-contiguous) reduces like its contiguous copy. */
static double transposed_ref(int64_t i, int64_t j, const void *c) {
  (void)c;
  double acc = 0;
  for (int q = 0; q < world; q++) acc += val(q, j, i);
  return acc;
}

static void test_non_contiguous(lm_comm *c) {
  lm_tensor *x = input(rank, 3, 5, LM_F32);
  int64_t sh[2] = {5, 3}, st[2] = {1, 5};
  lm_tensor *xt = lm_view_of(x, 2, sh, st, 0);
  expect(!lm_is_contiguous(xt), "view is strided", LM_F32, 0, 1);
  lm_tensor *y = lm_all_reduce(c, xt, LM_RED_SUM);
  check_all(y, LM_F32, "all_reduce of a transposed view", transposed_ref, NULL);
  lm_tensor *g = lm_all_gather(c, xt, 1, -1);
  expect_shape(g, 5, 3 * world, "all_gather of a view shape");
  for (int64_t i = 0; g && i < 5; i++)
    for (int64_t j = 0; j < 3 * world; j++)
      expect(at(g, i, j) == val((int)(j / 3), j % 3, i), "all_gather of a view", LM_F32,
             at(g, i, j), val((int)(j / 3), j % 3, i));
  RELEASE(x, xt, y, g);
}

static void test_async(lm_comm *c) {
  lm_tensor *x = input(rank, 5, 3, LM_F32);
  lm_work *w1 = lm_all_reduce_async(c, x, LM_RED_SUM);
  lm_work *w2 = lm_all_gather_async(c, x, 0, -1);
  lm_work *w3 = lm_barrier_async(c);
  expect(w1 && w2 && w3, "async start", LM_F32, 0, 1);
  expect(lm_work_wait(w3) == 0 && lm_work_result(w3) == NULL, "async barrier", LM_F32, 0, 0);
  lm_tensor *y = lm_work_result(w1), *g = lm_work_result(w2);
  red_ctx r = {LM_RED_SUM, 0, 0};
  check_all(y, LM_F32, "async all_reduce", reduce_ref, &r);
  expect_shape(g, 5 * world, 3, "async all_gather shape");
  expect(lm_work_test(w1) == 1, "async test after wait", LM_F32, lm_work_test(w1), 1);
  lm_work_free(w1);
  lm_work_free(w2);
  lm_work_free(w3);
  RELEASE(x, y, g);
}

static void test_errors(lm_comm *c) {
  lm_tensor *x = input(rank, 5, 3, LM_I32);
  expect(lm_all_reduce(c, x, LM_RED_AVG) == NULL && strstr(lm_last_error(), "avg needs a floating"),
         "avg of ints is an error", LM_I32, 0, 0);
  expect(lm_all_gather(c, x, 2, -1) == NULL && strstr(lm_last_error(), "dim"),
         "bad dim is an error", LM_I32, 0, 0);
  expect(lm_broadcast(c, x, world) == NULL && strstr(lm_last_error(), "root"),
         "bad root is an error", LM_I32, 0, 0);
  expect(lm_all_gather(c, x, 0, 15 * (int64_t)world) == NULL && strstr(lm_last_error(), "chunk"),
         "wrong chunk size is an error", LM_I32, 0, 0);
  lm_release(x);
}

/* the agreement NCCL's setup uses: one rank's failure (rank 0's unique id,
 * the last rank's device) raises on every rank instead of a hang */
static void test_agree(lm_comm *c) {
  expect(lm_comm_agree(c, 1, "setup") == 0, "agree when all are ok", LM_I32, 0, 0);
  for (int bad = 0; bad < world; bad += world > 1 ? world - 1 : 1) {
    if (rank == bad) lm_error("my own reason");
    int rc = lm_comm_agree(c, rank != bad, "setup");
    const char *e = lm_last_error();
    expect(rc < 0, "every rank fails when one does", LM_I32, rc, -1);
    expect(rank == bad ? strstr(e, "my own reason") != NULL : strstr(e, "failed, so every rank stops") != NULL,
           "the failing rank keeps its reason, the others name it", LM_I32, 0, 0);
  }
}

int main(void) {
  if (lm_dist_init() < 0 || lm_dist_init() < 0) {
    fprintf(stderr, "init: %s\n", lm_last_error());
    return 1;
  }
  rank = lm_dist_rank();
  world = lm_dist_world_size();
  lm_comm *c = lm_comm_world();
  for (int d = 0; d < NDT; d++) {
    test_all_reduce(c, dtypes[d]);
    test_all_gather(c, dtypes[d]);
    test_reduce_scatter(c, dtypes[d]);
    test_all_to_all(c, dtypes[d]);
    test_broadcast(c, dtypes[d]);
  }
  test_non_contiguous(c);
  test_async(c);
  test_errors(c);
  test_agree(c);
  /* a split communicator: even and odd ranks */
  lm_comm *half = lm_comm_split(c, rank % 2, rank);
  expect(half && lm_comm_size(half) == (world + 1 - rank % 2) / 2, "split size", LM_I32,
         half ? lm_comm_size(half) : -1, (world + 1 - rank % 2) / 2);
  expect(lm_barrier(half) == 0, "barrier on a split", LM_I32, 0, 0);
  lm_comm_free(half);
  int64_t counts[LM_NCOLL], bytes[LM_NCOLL];
  lm_comm_stats(counts, bytes);
  expect(counts[LM_COLL_ALL_REDUCE] > 0 && bytes[LM_COLL_ALL_REDUCE] > 0, "stats", LM_I64,
         (double)counts[LM_COLL_ALL_REDUCE], 1);
  printf("rank %d/%d: %d checks, %d failures\n", rank, world, checks, failures);
  return failures != 0;
}
