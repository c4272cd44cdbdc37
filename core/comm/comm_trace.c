/* comm_trace.c: a collective's record for the trace (loom.profiler): begun
 * at launch with its bytes, input shape and group, finished when its wait
 * returns, with the time the caller spent blocked in waits for it. Async
 * collectives in flight each get a lane of their own, so the trace shows
 * them beside the compute they overlap. */
#include "comm.h"
#include "../tensor/trace.h"
#include <stdlib.h>

static unsigned lanes; /* async lanes in use: bit k is LM_TRACE_TID_ASYNC + k */

static int take_lane(void) {
  for (int k = 0; k < 32; k++)
    if (!(lanes & (1u << k))) { lanes |= 1u << k; return k; }
  return 32; /* more in flight: they share the last lane */
}

void lm_comm_trace_begin(lm_work *w, const lm_tensor *t) {
  lm_trace_event *e = calloc(1, sizeof *e);
  if (!e) return; /* untraced rather than failed */
  const lm_comm *c = w->comm;
  e->kind = LM_TRACE_COLL, e->id = w->kind, e->device = t ? t->device_ : -1;
  e->a = (int64_t)c->key, e->b = c->calls, e->n = c->size, e->rank = c->rank;
  if (t) {
    e->bytes = t->numel_ * lm_dtype_size(t->dtype_);
    e->ndim[0] = t->ndim, e->dtype[0] = t->dtype_;
    for (int d = 0; d < t->ndim; d++) e->shape[0][d] = t->shape_[d];
  }
  for (int q = 0; q < c->size && q < (LM_TRACE_INPUTS - 1) * LM_MAX_DIMS; q++)
    e->shape[1 + q / LM_MAX_DIMS][q % LM_MAX_DIMS] = c->world_ranks[q];
  e->tid = w->blocking ? lm_trace_tid() : LM_TRACE_TID_ASYNC + take_lane();
  e->t0 = lm_trace_now();
  w->trace = e;
}

static void let_go(lm_work *w) {
  int k = w->trace->tid - LM_TRACE_TID_ASYNC;
  if (k >= 0 && k < 32) lanes &= ~(1u << k);
  free(w->trace);
  w->trace = NULL;
}

void lm_comm_trace_end(lm_work *w) {
  w->trace->t1 = lm_trace_now();
  lm_trace_push(w->trace);
  let_go(w);
}

void lm_comm_trace_drop(lm_work *w) {
  if (w->trace) let_go(w);
}
