/* fingerprint.c: before each collective the ranks of the communicator swap a
 * fingerprint (call number, kind, op, dtype, shape) and fail with a message
 * naming both calls when they disagree, instead of hanging or returning
 * garbage. The fingerprint also carries each rank's Ctrl-C vote in a SPMD
 * REPL: when any member's says stop, every member fails this collective
 * as interrupted, all at the same point. On by default;
 * LOOM_CHECK_COLLECTIVES=0 turns it off (not in the REPL). */
#include "comm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FP_STOP: the rank's Ctrl-C vote (tensor/interrupt.c), not compared */
enum { FP_RANK, FP_CALL, FP_KIND, FP_OP, FP_DTYPE, FP_NDIM, FP_A1, FP_A2, FP_FULL, FP_SHAPE,
       FP_STOP = FP_SHAPE + LM_MAX_DIMS, FP_LEN };

static const char *kinds[LM_NCOLL] = {"all_reduce", "all_gather", "reduce_scatter",
                                      "all_to_all", "broadcast", "barrier",
                                      "send", "recv"};
static const char *ops[] = {"sum", "avg", "max", "min"};

/* e.g. "call #3 all_gather(dim 2, full 5) of f32 [2, *]"; dims 1-based as in Lua */
static void describe(const int64_t *fp, char *buf, size_t len) {
  int k = (int)fp[FP_KIND];
  int uneven = k == LM_COLL_ALL_TO_ALL && fp[FP_OP] == 1; /* all_to_all_v.c's mark */
  int n = snprintf(buf, len, "call #%lld %s(", (long long)fp[FP_CALL], uneven ? "all_to_all_single" : kinds[k]);
  if (k == LM_COLL_ALL_REDUCE) n += snprintf(buf + n, len - n, "%s", ops[fp[FP_OP]]);
  if (k == LM_COLL_REDUCE_SCATTER)
    n += snprintf(buf + n, len - n, "%s, dim %lld", ops[fp[FP_OP]], (long long)fp[FP_A1] + 1);
  if (k == LM_COLL_ALL_GATHER)
    n += snprintf(buf + n, len - n, "dim %lld", (long long)fp[FP_A1] + 1);
  if (uneven) n += snprintf(buf + n, len - n, "rows by splits");
  else if (k == LM_COLL_ALL_TO_ALL)
    n += snprintf(buf + n, len - n, "split_dim %lld, cat_dim %lld", (long long)fp[FP_A1] + 1,
                  (long long)fp[FP_A2] + 1);
  if (k == LM_COLL_BROADCAST) n += snprintf(buf + n, len - n, "root %lld", (long long)fp[FP_A1]);
  if (fp[FP_FULL] >= 0) n += snprintf(buf + n, len - n, ", full %lld", (long long)fp[FP_FULL]);
  n += snprintf(buf + n, len - n, ")");
  if (k == LM_COLL_BARRIER || n >= (int)len) return;
  n += snprintf(buf + n, len - n, " of %s [", lm_dtype_name((int)fp[FP_DTYPE]));
  for (int d = 0; d < fp[FP_NDIM] && n < (int)len; d++) {
    const char *sep = d ? ", " : "";
    if (fp[FP_SHAPE + d] < 0) n += snprintf(buf + n, len - n, "%s*", sep);
    else n += snprintf(buf + n, len - n, "%s%lld", sep, (long long)fp[FP_SHAPE + d]);
  }
  if (n < (int)len) snprintf(buf + n, len - n, "]");
}

/* wild_dim >= 0: that dim's size may differ between ranks (uneven shards);
 * the fingerprint carries -1 there and the full size in FP_FULL. */
int lm_check_fingerprint(lm_comm *c, int kind, int op, const lm_tensor *t, int64_t a1,
                         int64_t a2, int64_t wild_dim, int64_t wild_size) {
  c->calls++;
  if (lm_watch_check(c, kinds[kind]) < 0) return -1;
  if (!lm_debug_collectives()) return 0;
  int64_t fp[FP_LEN] = {0};
  fp[FP_RANK] = c->world_ranks[c->rank];
  fp[FP_CALL] = c->calls;
  fp[FP_KIND] = kind;
  fp[FP_OP] = op;
  fp[FP_A1] = a1;
  fp[FP_A2] = a2;
  fp[FP_FULL] = wild_dim >= 0 ? wild_size : -1;
  fp[FP_STOP] = lm_interrupt_vote();
  if (t) {
    fp[FP_DTYPE] = t->dtype_;
    fp[FP_NDIM] = t->ndim;
    for (int d = 0; d < t->ndim; d++) fp[FP_SHAPE + d] = d == wild_dim ? -1 : t->shape_[d];
  }
  int64_t *all = malloc(sizeof *all * FP_LEN * c->size);
  if (!all) return lm_error("%s: out of memory (debug fingerprint)", kinds[kind]);
  if (lm_comm_allgather_i64(c, fp, FP_LEN, all, kinds[kind]) < 0) { free(all); return -1; }
  int rc = 0;
  for (int q = 0; q < c->size && rc == 0; q++) { /* Ctrl-C in a SPMD REPL: every member stops here */
    if (all[(size_t)q * FP_LEN + FP_STOP]) {
      lm_interrupt_voted();
      rc = lm_error("interrupted (Ctrl-C)");
    }
  }
  for (int q = 0; q < c->size && rc == 0; q++) {
    const int64_t *o = all + (size_t)q * FP_LEN;
    if (!memcmp(o + 1, fp + 1, sizeof *fp * (FP_STOP - 1))) continue;
    char mine[256], theirs[256];
    describe(fp, mine, sizeof mine);
    describe(o, theirs, sizeof theirs);
    rc = lm_error("collective mismatch in a group of %d ranks: "
                  "rank %lld issued %s, but rank %lld issued %s", c->size,
                  (long long)fp[FP_RANK], mine, (long long)o[FP_RANK], theirs);
  }
  free(all);
  return rc;
}
