/* trace.c: the trace buffer (loom.h's lm_trace_*): events recorded while
 * tracing is on, in chunks that grow as needed up to a cap, moved out in
 * order by lm_trace_drain (loom.profiler writes them as Chrome trace JSON).
 * Also the records of an op or backward node: its inputs, its times, and
 * what the device's allocator mapped fresh while it ran. */
#include "trace.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int lm_trace_on;

enum { CHUNK = 4096, DEFAULT_CAP = 1 << 19 };
typedef struct chunk { struct chunk *next; int n, head; lm_trace_event ev[CHUNK]; } chunk;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static chunk *first, *last;
static int64_t pending, dropped, cap = -1;
static int next_tid;
static _Thread_local int my_tid;

int64_t lm_trace_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int lm_trace_tid(void) {
  if (!my_tid) my_tid = __atomic_add_fetch(&next_tid, 1, __ATOMIC_RELAXED);
  return my_tid;
}

int lm_trace_enable(int on) {
  int old = lm_trace_on;
  __atomic_store_n(&lm_trace_on, on != 0, __ATOMIC_RELAXED);
  return old;
}
int lm_trace_enabled(void) { return lm_trace_on; }

/* appends e (copied); past the cap it is counted as dropped */
static void push(const lm_trace_event *e) {
  pthread_mutex_lock(&mu);
  if (cap < 0) { /* the buffer's cap, read once */
    const char *v = getenv("LOOM_TRACE_MAX_EVENTS");
    long long k = v && *v ? atoll(v) : 0;
    cap = k > 0 ? k : DEFAULT_CAP;
  }
  if (pending >= cap) {
    dropped++;
  } else {
    if (!last || last->n == CHUNK) {
      chunk *c = malloc(sizeof *c);
      if (!c) { dropped++; pthread_mutex_unlock(&mu); return; }
      c->next = NULL, c->n = c->head = 0;
      if (last) last->next = c; else first = c;
      last = c;
    }
    last->ev[last->n++] = *e;
    pending++;
  }
  pthread_mutex_unlock(&mu);
}

int lm_trace_record(const lm_trace_event *e) {
  if (!e) return lm_error("trace_record: expected an event, got NULL");
  if (!lm_trace_on) return 0; /* not tracing: nothing kept */
  if (e->t1 < e->t0) return lm_error("trace_record: the event ends (%lld) before it starts (%lld)",
                                     (long long)e->t1, (long long)e->t0);
  lm_trace_event c = *e;
  c.tid = lm_trace_tid();
  push(&c);
  return 0;
}

int64_t lm_trace_pending(void) {
  pthread_mutex_lock(&mu);
  int64_t n = pending;
  pthread_mutex_unlock(&mu);
  return n;
}

int64_t lm_trace_dropped(void) { return dropped; }

int64_t lm_trace_drain(lm_trace_event *out, int64_t want) {
  int64_t got = 0;
  pthread_mutex_lock(&mu);
  while (out && first && got < want) {
    int k = (int)(first->n - first->head < want - got ? first->n - first->head : want - got);
    memcpy(out + got, first->ev + first->head, (size_t)k * sizeof *out);
    got += k, first->head += k;
    if (first->head < first->n) break;
    if (first == last && first->n < CHUNK) { first->n = first->head = 0; break; } /* kept for reuse */
    chunk *c = first;
    first = c->next;
    if (!first) last = NULL;
    free(c);
  }
  pending -= got;
  pthread_mutex_unlock(&mu);
  return got;
}

void lm_trace_clear(void) {
  pthread_mutex_lock(&mu);
  while (first) {
    chunk *c = first;
    first = c->next;
    free(c);
  }
  last = NULL;
  pending = dropped = 0;
  pthread_mutex_unlock(&mu);
}

/* ---- an op's record ---- */

/* the allocator's counters of a device (CPU for none or meta); 0 when it keeps none */
static int mem_stats(int device, int64_t *st) {
  if (device < 0 || lm_device_kind(device) == LM_KIND_META) device = LM_CPU;
  const lm_backend *b = lm_backend_registered(device);
  if (!b || !b->memory_stats) return -1;
  return b->memory_stats(device - (lm_device_kind(device) == LM_KIND_CUDA ? LM_CUDA0 : 0), st);
}

void lm_trace_op_begin(lm_trace_op *r, int kind, int op, int nin, lm_tensor *const *in) {
  lm_trace_event *e = &r->e;
  memset(e, 0, sizeof *e);
  e->kind = kind, e->id = op, e->n = nin, e->device = -1;
  e->tid = lm_trace_tid();
  for (int i = 0; in && i < nin && i < LM_TRACE_INPUTS; i++) {
    const lm_tensor *t = in[i];
    if (!t) continue;
    if (e->device < 0) e->device = t->device_;
    e->ndim[i] = t->ndim, e->dtype[i] = t->dtype_;
    memcpy(e->shape[i], t->shape_, (size_t)t->ndim * sizeof *t->shape_);
    if (t->dist) e->flags |= LM_TRACE_DTENSOR;
  }
  int64_t st[LM_NMEM_STATS] = {0};
  mem_stats(e->device, st);
  r->fresh0 = st[LM_MEM_DRIVER_BYTES], r->maps0 = st[LM_MEM_DRIVER_ALLOCS];
  e->t0 = lm_trace_now(); /* last: the sampling above is not the op's time */
}

void lm_trace_op_end(lm_trace_op *r, int rc) {
  lm_trace_event *e = &r->e;
  e->t1 = lm_trace_now();
  if (rc < 0) e->flags |= LM_TRACE_FAILED;
  int64_t st[LM_NMEM_STATS] = {0};
  if (mem_stats(e->device, st) == 0) {
    e->bytes = st[LM_MEM_DRIVER_BYTES] - r->fresh0;
    e->c = st[LM_MEM_DRIVER_ALLOCS] - r->maps0;
    e->a = st[LM_MEM_ALLOCATED], e->b = st[LM_MEM_RESERVED];
  }
  push(e);
}

void lm_trace_push(const lm_trace_event *e) { push(e); }
