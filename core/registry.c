/* registry.c: the op table (one entry per op, gathered from the ops_*.c
 * files) and the one dispatch path every op call takes. */
#include "internal.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const lm_op_def *table[512];
static int count;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build(void) {
  const lm_op_def *groups[] = {lm_ops_view, lm_ops_pointwise, lm_ops_reduce,
                               lm_ops_linalg, lm_ops_nn, lm_ops_optim, lm_ops_dist};
  for (size_t g = 0; g < sizeof groups / sizeof *groups; g++)
    for (const lm_op_def *d = groups[g]; d->name; d++) table[count++] = d;
}

static void init(void) { pthread_once(&once, build); }

/* LOOM_PROFILE=1: time per op, exclusive of the ops it calls, printed at
 * exit, for finding where a step goes. */
static struct { double self; int64_t calls; } prof[512];
static int profiling = -1;
static _Thread_local double child_time;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int by_time(const void *a, const void *b) {
  double x = prof[*(const int *)a].self, y = prof[*(const int *)b].self;
  return x < y ? 1 : x > y ? -1 : 0;
}

static void report(void) {
  int idx[512];
  double total = 0;
  for (int i = 0; i < count; i++) idx[i] = i, total += prof[i].self;
  qsort(idx, count, sizeof *idx, by_time);
  fprintf(stderr, "loom profile (exclusive time per op, %.3f s in ops):\n", total);
  for (int k = 0; k < count && prof[idx[k]].calls; k++)
    fprintf(stderr, "  %-32s %9.3f ms %5.1f%% %9lld calls\n", table[idx[k]]->name,
            prof[idx[k]].self * 1e3, 100 * prof[idx[k]].self / total, (long long)prof[idx[k]].calls);
}

void lm_profile_enable(int on) { profiling = on != 0; }
void lm_profile_reset(void) { memset(prof, 0, sizeof prof); }
double lm_profile_seconds(int op) { return op >= 0 && op < 512 ? prof[op].self : 0; }
int64_t lm_profile_calls(int op) { return op >= 0 && op < 512 ? prof[op].calls : 0; }

static bool profile_on(void) {
  if (profiling < 0) {
    const char *e = getenv("LOOM_PROFILE");
    profiling = e && *e && *e != '0';
    if (profiling) atexit(report);
  }
  return profiling;
}

int lm_op_count(void) { init(); return count; }

int lm_op_find(const char *name) {
  init();
  if (name)
    for (int i = 0; i < count; i++)
      if (!strcmp(table[i]->name, name)) return i;
  return lm_error("no op named \"%s\"", name ? name : "(null)");
}

const char *lm_op_name(int op) {
  init();
  return op >= 0 && op < count ? table[op]->name : NULL;
}

int lm_op_call(int op, int nin, lm_tensor *const *in, const lm_attrs *attrs,
               int maxout, lm_tensor **out) {
  init();
  if (op < 0 || op >= count) return lm_error("op id %d: no such op", op);
  const lm_op_def *d = table[op];
  if (d->nin >= 0 && nin != d->nin)
    return lm_error("%s: expected %d tensor arguments, got %d", d->name, d->nin, nin);
  if (maxout < d->nout)
    return lm_error("%s: room for %d outputs, it makes %d", d->name, maxout, d->nout);
  for (int i = 0; i < nin; i++) {
    if (!in[i]) return lm_error("%s: argument #%d expected a tensor, got nil", d->name, i + 1);
    if (in[i]->device_ != in[0]->device_)
      return lm_error("%s: argument #%d is on another device than argument #1", d->name, i + 1);
  }
  static const lm_attrs none;
  if (!attrs) attrs = &none;
  if (!d->native && !lm_dist_local_mode())
    for (int i = 0; i < nin; i++)
      if (in[i]->dist) return lm_dtensor_call(op, d, nin, in, attrs, out) < 0 ? -1 : d->nout;
  for (int k = 0; k < d->nout; k++) out[k] = NULL;
  double t0 = 0, outer_child = 0;
  if (profile_on()) t0 = now(), outer_child = child_time, child_time = 0;
  int rc = d->forward(in, nin, attrs, out);
  if (profiling) {
    double dt = now() - t0;
    prof[op].self += dt - child_time, prof[op].calls++;
    child_time = outer_child + dt;
  }
  if (rc < 0) {
    for (int k = 0; k < d->nout; k++) lm_release(out[k]), out[k] = NULL;
    return -1;
  }
  if (lm_record(op, d, nin, in, attrs, d->nout, out) < 0) {
    for (int k = 0; k < d->nout; k++) lm_release(out[k]), out[k] = NULL;
    return -1;
  }
  return d->nout;
}

lm_tensor *lm_call(const char *name, int nin, lm_tensor *const *in, const lm_attrs *a) {
  static _Thread_local struct { const char *name; int id; } cache[64];
  unsigned h = 0;
  for (const char *p = name; *p; p++) h = h * 31 + (unsigned char)*p;
  h %= 64;
  if (cache[h].name != name) {
    int id = lm_op_find(name);
    if (id < 0) return NULL;
    cache[h].name = name, cache[h].id = id;
  }
  lm_tensor *out[4];
  if (lm_op_call(cache[h].id, nin, in, a, 4, out) < 0) return NULL;
  for (int k = 1; k < table[cache[h].id]->nout; k++) lm_release(out[k]);
  return out[0];
}

const lm_op_def *lm_op_def_of(int op) { init(); return table[op]; }
