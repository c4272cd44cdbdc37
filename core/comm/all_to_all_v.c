/* all_to_all_v.c: all-to-all with uneven splits, PyTorch's all_to_all_single
 * with split sizes (MPI_Alltoallv; on NCCL grouped sends and receives): rows
 * (dim 0) of t go in_splits[q] at a time to rank q, and the result holds
 * out_splits[q] rows from each rank q, in rank order. With the collective
 * fingerprints on (the default), the ranks swap their splits and row counts
 * before any data moves, and every rank checks the whole table: splits a
 * sender and its receiver disagree on, or that do not add up to the input's
 * rows, fail on every rank with the same message naming the ranks, instead
 * of truncating, reading garbage or hanging. */
#include "comm.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *NAME = "all_to_all_single";

/* "rank 1" in a group, "rank 1 (world rank 3)" when the numbers differ */
static const char *who(const lm_comm *c, int q, char *buf, size_t len) {
  if (c->world_ranks[q] == q) snprintf(buf, len, "rank %d", q);
  else snprintf(buf, len, "rank %d (world rank %d)", q, c->world_ranks[q]);
  return buf;
}

/* One rank's arguments as numbers: its input_splits, output_splits and
 * input rows; the sum of in in *sum. -1 with an error when one is wrong. */
static int check_own(const lm_comm *c, int q, const int64_t *in, const int64_t *out, int64_t rows) {
  char r[64];
  int64_t sum = 0;
  for (int p = 0; p < c->size; p++) {
    if (in[p] < 0 || out[p] < 0)
      return lm_error("%s: %s's %s[%d] is %lld, expected a row count >= 0", NAME, who(c, q, r, sizeof r),
                      in[p] < 0 ? "input_splits" : "output_splits", p + 1,
                      (long long)(in[p] < 0 ? in[p] : out[p]));
    sum += in[p];
  }
  if (sum != rows)
    return lm_error("%s: %s's input_splits sum to %lld rows, but its input has %lld rows on dim 1", NAME,
                    who(c, q, r, sizeof r), (long long)sum, (long long)rows);
  return 0;
}

/* The table of every rank's (input_splits, output_splits, rows), checked
 * alike on every rank: each rank's own numbers, then each pair (rank q
 * sends input_splits[r] rows to rank r, which expects output_splits[q]). */
static int check_table(const lm_comm *c, const int64_t *all) {
  int k = c->size, len = 2 * k + 1;
  for (int q = 0; q < k; q++)
    LM_TRY(check_own(c, q, all + (size_t)q * len, all + (size_t)q * len + k, all[(size_t)q * len + 2 * k]));
  for (int q = 0; q < k; q++)
    for (int r = 0; r < k; r++) {
      int64_t sent = all[(size_t)q * len + r], expected = all[(size_t)r * len + k + q];
      if (sent == expected) continue;
      char a[64], b[64];
      return lm_error("%s: splits disagree in a group of %d ranks: %s sends %lld rows to rank %d "
                      "(its input_splits[%d]), but %s expects %lld from rank %d (its output_splits[%d])",
                      NAME, k, who(c, q, a, sizeof a), (long long)sent, r, r + 1, who(c, r, b, sizeof b),
                      (long long)expected, q, q + 1);
    }
  return 0;
}

/* Collective: every rank's splits and rows, swapped and checked. */
static int swap_and_check(lm_comm *c, const int64_t *out_s, const int64_t *in_s, int64_t rows) {
  int k = c->size, len = 2 * k + 1;
  int64_t *mine = malloc(sizeof *mine * (size_t)len * (k + 1));
  if (!mine) return lm_error("%s: out of memory (checking the splits)", NAME);
  int64_t *all = mine + len;
  memcpy(mine, in_s, sizeof *mine * k);
  memcpy(mine + k, out_s, sizeof *mine * k);
  mine[2 * k] = rows;
  int rc = lm_comm_allgather_i64(c, mine, len, all, NAME);
  if (rc == 0) rc = check_table(c, all);
  free(mine);
  return rc;
}

static lm_work *all_to_all_v_w(lm_comm *c, lm_tensor *t, const int64_t *out_s, const int64_t *in_s) {
  if (lm_coll_check(NAME, c, t, 1) < 0) return NULL;
  if (!out_s || !in_s) {
    lm_error("%s: expected output_splits and input_splits, got NULL", NAME);
    return NULL;
  }
  const lm_transport *tr = lm_coll_transport(NAME, t);
  /* op 1 marks the uneven form in the fingerprint; dim 0's size may differ */
  if (!tr || lm_check_fingerprint(c, LM_COLL_ALL_TO_ALL, 1, t, 0, 0, 0, -1) < 0) return NULL;
  if (lm_debug_collectives() ? swap_and_check(c, out_s, in_s, t->shape_[0]) < 0
                             : check_own(c, c->rank, in_s, out_s, t->shape_[0]) < 0)
    return NULL;
  int k = c->size;
  int64_t row = 1, nout = 0; /* elements of one row */
  for (int d = 1; d < t->ndim; d++) row *= t->shape_[d];
  for (int q = 0; q < k; q++) nout += out_s[q];
  if (nout * row > INT_MAX) {
    lm_error("%s: %lld rows of %lld elements is more than one call moves (2^31 elements)", NAME,
             (long long)nout, (long long)row);
    return NULL;
  }
  lm_work *w = lm_work_new(c, LM_COLL_ALL_TO_ALL, tr, 1);
  if (!w) return NULL;
  for (int q = 0; q < k; q++) {
    w->scounts[q] = (int)(in_s[q] * row);
    w->rcounts[q] = (int)(out_s[q] * row);
  }
  int64_t sh[LM_MAX_DIMS];
  memcpy(sh, t->shape_, sizeof sh);
  sh[0] = nout;
  w->uneven = 1; /* every rank takes the v-variant, whatever its counts */
  w->dtype = t->dtype_;
  w->out = lm_empty_as(t, t->ndim, sh, t->dtype_);
  w->send = lm_contiguous(t);
  w->recv = w->out;
  if (w->recv) lm_retain(w->recv);
  if (!w->out || !w->send) { lm_work_free(w); return NULL; }
  return lm_work_launch(w, t);
}

lm_tensor *lm_all_to_all_v(lm_comm *c, lm_tensor *t, const int64_t *out_splits, const int64_t *in_splits) {
  lm_work *w = all_to_all_v_w(c, t, out_splits, in_splits);
  if (!w) return NULL;
  lm_tensor *r = lm_work_result(w);
  lm_work_free(w);
  return r;
}
