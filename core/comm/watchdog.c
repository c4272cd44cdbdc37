/* watchdog.c: ends the job, naming the rank, when ranks can no longer meet:
 * a rank that finished (or returned early) while others wait for it in a
 * collective; a rank that stopped answering (heartbeats along a ring: a
 * stopped or unreachable process sends none); a collective that waits
 * past its timeout. It runs in a thread of its own on a duplicate of the
 * world communicator (MPI_THREAD_MULTIPLE). Waiting ranks sleep: the main
 * thread polls its collective with growing naps (lm_watch_wait). */
#include "comm.h"
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TAG_HEARTBEAT = 1, TAG_NOTICE = 2, MAX_COMMS = 256 };

/* What a rank tells the others when it finishes: how many collectives it
 * issued on each communicator (keyed alike on every member). */
typedef struct {
  int32_t rank, ncomms;
  struct { uint64_t key; int64_t calls; } comm[MAX_COMMS];
} notice;

static struct {
  int on, size, rank;
  MPI_Comm ctrl;
  pthread_t thread;
  atomic_int stop;
  double heartbeat_timeout, collective_timeout;
  /* the main thread's wait, read by the watchdog thread */
  pthread_mutex_t lock;
  int waiting;
  const lm_comm *comm;
  const char *what;
  int64_t call;
  double since;
  /* the ranks that finished, with their counts */
  notice *done;    /* [size] */
  char *finished;  /* [size] */
} W = {.lock = PTHREAD_MUTEX_INITIALIZER};

static atomic_int in_flight; /* async collectives the main thread has not waited for */
void lm_progress_hold(int delta) { atomic_fetch_add(&in_flight, delta); }

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void nap(double seconds) {
  struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
}

static double env_seconds(const char *name, double dflt) {
  const char *e = getenv(name);
  return e && *e ? atof(e) : dflt;
}

/* ---- communicators are keyed alike on every member: their members'
 * world ranks and how many comms with those members were made before ---- */
static struct { uint64_t hash; int count; } serials[256];
/* the comms this rank made, with their calls (frozen when freed); the
 * oldest freed ones make room for new ones */
static struct { uint64_t key; const lm_comm *c; int64_t calls; int used; } comms[MAX_COMMS];

uint64_t lm_watch_key(const int *world_ranks, int size) {
  uint64_t h = lm_fnv1a(world_ranks, sizeof(int) * (size_t)size, 0);
  for (int i = 0; i < 256; i++) {
    if (serials[i].count && serials[i].hash != h) continue;
    serials[i].hash = h;
    return h ^ ((uint64_t)serials[i].count++ * 0x9E3779B97F4A7C15ULL);
  }
  return h; /* past 256 member sets: keys may repeat, which only weakens a check */
}

void lm_watch_comm(const lm_comm *c, int alive) {
  pthread_mutex_lock(&W.lock);
  int slot = -1;
  for (int i = 0; i < MAX_COMMS && slot < 0; i++)
    if (alive ? !comms[i].used : comms[i].c == c) slot = i;
  for (int i = 0; alive && slot < 0 && i < MAX_COMMS; i++)
    if (!comms[i].c) slot = i; /* a freed one */
  if (slot >= 0 && alive) comms[slot].key = c->key, comms[slot].c = c, comms[slot].used = 1;
  else if (slot >= 0) comms[slot].calls = c->calls, comms[slot].c = NULL;
  pthread_mutex_unlock(&W.lock);
}

/* ---- ending the job ---- */
static void end_job(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void end_job(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fflush(stdout);
  fprintf(stderr, "loom watchdog (rank %d): %s; ending the job\n", W.rank, msg);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* the main thread's wait, as words ("all_reduce (call #57) of a group of 2") */
static void describe_wait(char *buf, size_t len) {
  if (!W.waiting) { snprintf(buf, len, "not waiting in a collective"); return; }
  snprintf(buf, len, "waiting %.0f s in %s (call #%lld) of a group of %d", now() - W.since, W.what,
           (long long)W.call, W.comm->size);
}

/* calls the finished rank r made on c (-1: c is not in its notice, so
 * nothing can be said) */
static int64_t calls_of(int r, const lm_comm *c) {
  const notice *n = &W.done[r];
  for (int i = 0; i < n->ncomms && i < MAX_COMMS; i++)
    if (n->comm[i].key == c->key) return n->comm[i].calls;
  return -1;
}

/* a finished member of c that will never make call #call on it, or -1 */
static int gone_member(const lm_comm *c, int64_t call) {
  for (int q = 0; q < c->size; q++) {
    int r = c->world_ranks[q];
    int64_t made = W.finished[r] ? calls_of(r, c) : -1;
    if (made >= 0 && made < call) return r;
  }
  return -1;
}

/* 1 when world rank r has finished its script (a p2p peer that never will send) */
int lm_watch_finished(int r) {
  if (!W.on || r < 0 || r >= W.size) return 0;
  pthread_mutex_lock(&W.lock);
  int f = W.finished[r] != 0;
  pthread_mutex_unlock(&W.lock);
  return f;
}

int lm_watch_check(const lm_comm *c, const char *what) {
  if (!W.on) return 0;
  pthread_mutex_lock(&W.lock);
  int r = gone_member(c, c->calls);
  pthread_mutex_unlock(&W.lock);
  if (r >= 0)
    return lm_error("%s: rank %d has finished its script, so this collective (call #%lld of a group of %d) "
                    "can never complete", what, r, (long long)c->calls, c->size);
  return 0;
}

/* ---- the thread ---- */
static void check_finished(int r) {
  pthread_mutex_lock(&W.lock);
  W.finished[r] = 1;
  int stuck = W.waiting && gone_member(W.comm, W.call) == r;
  char wait[256];
  describe_wait(wait, sizeof wait);
  pthread_mutex_unlock(&W.lock);
  if (stuck) end_job("rank %d finished its script while this rank is %s with it", r, wait);
}

static void *watch(void *arg) {
  (void)arg;
  int next = (W.rank + 1) % W.size, prev = (W.rank + W.size - 1) % W.size;
  int64_t beat = 0, heard = 0;
  notice in;
  MPI_Request send = MPI_REQUEST_NULL, hb = MPI_REQUEST_NULL, nt = MPI_REQUEST_NULL;
  MPI_Irecv(&heard, 1, MPI_INT64_T, prev, TAG_HEARTBEAT, W.ctrl, &hb);
  MPI_Irecv(&in, sizeof in, MPI_BYTE, MPI_ANY_SOURCE, TAG_NOTICE, W.ctrl, &nt);
  double last = now(), sent = 0;
  while (!atomic_load(&W.stop)) {
    int flag = 0;
    if (now() - sent >= 1) { /* one heartbeat a second to the next rank */
      if (send != MPI_REQUEST_NULL) MPI_Test(&send, &flag, MPI_STATUS_IGNORE);
      if (send == MPI_REQUEST_NULL) beat++, MPI_Isend(&beat, 1, MPI_INT64_T, next, TAG_HEARTBEAT, W.ctrl, &send);
      sent = now();
    }
    for (flag = 1; flag;) { /* heartbeats of the previous rank */
      MPI_Test(&hb, &flag, MPI_STATUS_IGNORE);
      if (flag) last = now(), MPI_Irecv(&heard, 1, MPI_INT64_T, prev, TAG_HEARTBEAT, W.ctrl, &hb);
    }
    for (flag = 1; flag;) { /* notices of ranks that finished */
      MPI_Test(&nt, &flag, MPI_STATUS_IGNORE);
      if (!flag) break;
      if (in.rank >= 0 && in.rank < W.size) {
        pthread_mutex_lock(&W.lock);
        W.done[in.rank] = in;
        pthread_mutex_unlock(&W.lock);
        check_finished(in.rank);
      }
      MPI_Irecv(&in, sizeof in, MPI_BYTE, MPI_ANY_SOURCE, TAG_NOTICE, W.ctrl, &nt);
    }
    char wait[256];
    pthread_mutex_lock(&W.lock);
    describe_wait(wait, sizeof wait);
    double waited = W.waiting ? now() - W.since : 0;
    pthread_mutex_unlock(&W.lock);
    if (W.heartbeat_timeout > 0 && now() - last > W.heartbeat_timeout && !W.finished[prev])
      end_job("rank %d stopped answering for %.0f s (stopped, killed, or its machine unreachable); "
              "this rank is %s", prev, now() - last, wait);
    if (W.collective_timeout > 0 && waited > W.collective_timeout)
      end_job("a collective waited past LOOM_COLLECTIVE_TIMEOUT (%.0f s): this rank is %s "
              "(another rank is stuck, or ranks called collectives in different orders)",
              W.collective_timeout, wait);
    /* with async collectives in flight, a probe every 50 us drives MPI's
     * progress engine for them (MPI progresses only inside MPI calls) */
    for (int i = 0; i < 1000 && atomic_load(&in_flight) > 0 && !atomic_load(&W.stop); i++) {
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, W.ctrl, &flag, MPI_STATUS_IGNORE);
      nap(50e-6);
    }
    if (atomic_load(&in_flight) == 0) nap(0.05);
  }
  MPI_Cancel(&hb), MPI_Wait(&hb, MPI_STATUS_IGNORE);
  MPI_Cancel(&nt), MPI_Wait(&nt, MPI_STATUS_IGNORE);
  if (send != MPI_REQUEST_NULL) MPI_Wait(&send, MPI_STATUS_IGNORE);
  return NULL;
}

int lm_watch_start(int rank, int size, int thread_level) {
  if (size < 2 || getenv("LOOM_NO_WATCHDOG")) return 0;
  if (thread_level < MPI_THREAD_MULTIPLE) {
    fprintf(stderr, "loom: this MPI has no MPI_THREAD_MULTIPLE: no watchdog (a rank that stops "
                    "may leave the others waiting)\n");
    return 0;
  }
  W.rank = rank, W.size = size;
  W.heartbeat_timeout = env_seconds("LOOM_HEARTBEAT_TIMEOUT", 15);
  W.collective_timeout = env_seconds("LOOM_COLLECTIVE_TIMEOUT", 300);
  W.done = calloc((size_t)size, sizeof *W.done);
  W.finished = calloc((size_t)size, 1);
  if (!W.done || !W.finished || MPI_Comm_dup(MPI_COMM_WORLD, &W.ctrl) != MPI_SUCCESS)
    return lm_error("dist.init: cannot start the watchdog");
  if (pthread_create(&W.thread, NULL, watch, NULL) != 0) return lm_error("dist.init: cannot start the watchdog thread");
  W.on = 1;
  return 0;
}

/* ---- the main thread's waits ---- */
int lm_watch_wait(const lm_comm *c, const char *what, int (*test)(void *), void *arg) {
  if (W.on) {
    pthread_mutex_lock(&W.lock);
    W.waiting = 1, W.comm = c, W.what = what, W.call = c->calls, W.since = now();
    int r = gone_member(c, c->calls);
    pthread_mutex_unlock(&W.lock);
    if (r >= 0) end_job("rank %d finished its script while this rank waits in %s (call #%lld) with it",
                        r, what, (long long)c->calls);
  }
  /* spin briefly (most collectives of a step are done in microseconds), then nap longer and longer */
  double t0 = now(), naps = 20e-6;
  int done;
  while ((done = test(arg)) == 0) {
    if (now() - t0 < 200e-6) continue;
    nap(naps);
    if (naps < 1e-3) naps *= 1.5;
  }
  if (W.on) {
    pthread_mutex_lock(&W.lock);
    W.waiting = 0;
    pthread_mutex_unlock(&W.lock);
  }
  return done < 0 ? -1 : 0;
}

/* receives (and drops) every control message that has arrived */
static void drain(void) {
  for (int flag = 1; flag;) {
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, W.ctrl, &flag, &st);
    if (!flag) break;
    int bytes;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    char *buf = malloc((size_t)bytes + 1);
    MPI_Recv(buf, bytes, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, W.ctrl, MPI_STATUS_IGNORE);
    free(buf);
  }
}

/* Tells the others this rank finished (with its counts), waits for every
 * rank to finish (sleeping, the watchdog on), then stops the thread. */
void lm_watch_finish(void) {
  if (!W.on) return;
  notice n = {.rank = W.rank};
  pthread_mutex_lock(&W.lock);
  for (int i = 0; i < MAX_COMMS; i++)
    if (comms[i].used)
      n.comm[n.ncomms].key = comms[i].key, n.comm[n.ncomms++].calls = comms[i].c ? comms[i].c->calls : comms[i].calls;
  pthread_mutex_unlock(&W.lock);
  int bytes = (int)(offsetof(notice, comm) + sizeof n.comm[0] * (size_t)n.ncomms);
  MPI_Request *sends = calloc((size_t)W.size, sizeof *sends), all;
  for (int q = 0; q < W.size; q++) {
    sends[q] = MPI_REQUEST_NULL;
    if (q != W.rank) MPI_Isend(&n, bytes, MPI_BYTE, q, TAG_NOTICE, W.ctrl, &sends[q]);
  }
  MPI_Ibarrier(W.ctrl, &all);
  for (int flag = 0; !flag;) {
    MPI_Test(&all, &flag, MPI_STATUS_IGNORE);
    if (!flag) nap(1e-3);
  }
  atomic_store(&W.stop, 1);
  pthread_join(W.thread, NULL);
  W.on = 0;
  /* every rank finished: take in what others still send (notices, the
   * last heartbeats) until our sends are done, then until everyone's are */
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) MPI_Ibarrier(W.ctrl, &all);
    for (int done = 0; !done;) {
      drain();
      if (pass == 0) MPI_Testall(W.size, sends, &done, MPI_STATUSES_IGNORE);
      else MPI_Test(&all, &done, MPI_STATUS_IGNORE);
      if (!done) nap(1e-4);
    }
  }
  drain();
  free(sends);
  MPI_Comm_free(&W.ctrl);
}
