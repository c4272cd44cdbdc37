/* registry.c: lm_op_run (shape inference, then the forward, timed per op
 * when profiling) over the op table (op_table.c), and what users and tools
 * ask of the table. */
#include "op.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- LOOM_PROFILE=1: time per op, exclusive of the ops it calls ---- */
static struct { double self; int64_t calls; } prof[LM_NOPS];
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
  int idx[LM_NOPS];
  double total = 0;
  for (int i = 0; i < LM_NOPS; i++) idx[i] = i, total += prof[i].self;
  qsort(idx, LM_NOPS, sizeof *idx, by_time);
  fprintf(stderr, "loom profile (exclusive time per op, %.3f s in ops):\n", total);
  for (int k = 0; k < LM_NOPS && prof[idx[k]].calls; k++)
    fprintf(stderr, "  %-32s %9.3f ms %5.1f%% %9lld calls\n", lm_op_table[idx[k]].name,
            prof[idx[k]].self * 1e3, 100 * prof[idx[k]].self / total, (long long)prof[idx[k]].calls);
}

void lm_profile_enable(int on) { profiling = on != 0; }
void lm_profile_reset(void) { memset(prof, 0, sizeof prof); }
double lm_profile_seconds(int op) { return op >= 0 && op < LM_NOPS ? prof[op].self : 0; }
int64_t lm_profile_calls(int op) { return op >= 0 && op < LM_NOPS ? prof[op].calls : 0; }

static bool profile_on(void) {
  if (profiling < 0) {
    const char *e = getenv("LOOM_PROFILE");
    profiling = e && *e && *e != '0' && strncmp(e, "trace:", 6) != 0; /* trace: loom.profiler's */
    if (profiling) atexit(report);
  }
  return profiling;
}

/* ---- the table, for users and tools ---- */
int lm_op_count(void) { return LM_NOPS; }

int lm_op_find(const char *name) {
  for (int i = 0; name && i < LM_NOPS; i++)
    if (!strcmp(lm_op_table[i].name, name)) return i;
  return lm_error("no op named \"%s\"", name ? name : "(null)");
}

const char *lm_op_name(int op) { return op >= 0 && op < LM_NOPS ? lm_op_table[op].name : NULL; }

static bool has_slot(const lm_backend *b, size_t slot) {
  return slot == 0 || *(void *const *)((const char *)b + slot) != NULL;
}

int lm_op_has_kernel(int op, int device) {
  if (op < 0 || op >= LM_NOPS) return 0;
  const lm_backend *b = lm_backend_registered(device);
  return b && has_slot(b, lm_op_table[op].slot);
}

const lm_backend *lm_kernel_of(int op, const lm_tensor *t, size_t slot, const char *name) {
  const lm_backend *b = lm_backend_of(t->device_);
  if (b && !has_slot(b, slot)) {
    lm_error("%s: no %s kernel on device %s", lm_op_table[op].name, name, b->name);
    return NULL;
  }
  return b;
}

const lm_backend *lm_fused_of(const lm_tensor *t, size_t slot) {
  const lm_backend *b = lm_backend_of(t->device_); /* made current, as LM_KERNEL does */
  return b && has_slot(b, slot) ? b : NULL;
}

/* ---- running an op ---- */
lm_meta lm_meta_of(const lm_tensor *t) {
  lm_meta m = {.ndim = t->ndim, .dtype = t->dtype_};
  memcpy(m.shape, t->shape_, t->ndim * sizeof *t->shape_);
  return m;
}

lm_tensor *lm_empty_meta(const lm_meta *m, const lm_tensor *like) {
  return lm_empty(m->ndim, m->shape, m->dtype, like->device_);
}


/* An op on meta tensors makes meta outputs of the shapes inference gives. */
static int run_meta(const lm_op_def *d, const lm_call *c, lm_tensor **out) {
  if (!d->shape) return lm_error("%s: cannot run on meta tensors", d->name);
  for (int k = 0; k < d->nout; k++)
    if (!(out[k] = lm_empty(c->out[k].ndim, c->out[k].shape, c->out[k].dtype, LM_META))) {
      while (k--) lm_release(out[k]), out[k] = NULL;
      return -1;
    }
  return d->nout;
}

int lm_op_run(int op, int nin, lm_tensor *const *in, const lm_attrs *a, lm_tensor **out) {
  const lm_op_def *d = &lm_op_table[op];
  lm_call c = {.op = op, .nin = nin, .in = in, .a = a};
  bool meta = false;
  for (int i = 0; i < nin; i++) {
    meta |= in[i]->device_ == LM_META;
    if (in[i]->device_ != LM_META && in[i]->storage && !in[i]->storage->data)
      return lm_error("%s: argument #%d has no data: it was released (FSDP reshards gathered "
                      "parameters after forward) and not restored", d->name, i + 1);
  }
  if (d->shape) {
    lm_meta m[LM_MAX_INPUTS];
    if (nin > LM_MAX_INPUTS) return lm_error("%s: at most %d tensor arguments, got %d", d->name, LM_MAX_INPUTS, nin);
    for (int i = 0; i < nin; i++) m[i] = lm_meta_of(in[i]);
    LM_TRY(d->shape(op, nin, m, a, c.out));
  }
  for (int k = 0; k < d->nout; k++) out[k] = NULL;
  if (meta && !(d->flags & LM_OPF_META_FW)) return run_meta(d, &c, out);
  double t0 = 0, outer_child = 0;
  if (profile_on()) t0 = now(), outer_child = child_time, child_time = 0;
  int rc = d->forward(&c, out);
  if (profiling) {
    double dt = now() - t0;
    prof[op].self += dt - child_time, prof[op].calls++;
    child_time = outer_child + dt;
  }
  if (rc < 0)
    for (int k = 0; k < d->nout; k++) lm_release(out[k]), out[k] = NULL;
  return rc < 0 ? -1 : d->nout;
}

lm_tensor *lm_run(int op, int nin, lm_tensor *const *in, const lm_attrs *a) {
  static const lm_attrs none;
  lm_tensor *out[LM_MAX_OUT];
  if (lm_op_run(op, nin, in, a ? a : &none, out) < 0) return NULL;
  for (int k = 1; k < lm_op_table[op].nout; k++) lm_release(out[k]);
  return lm_op_table[op].nout ? out[0] : NULL;
}
