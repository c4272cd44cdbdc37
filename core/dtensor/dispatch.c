/* dispatch.c: an op on DTensor arguments: the op's sharding rule (cached
 * by op, input specs and attrs), the moves the rule asks for, the op on
 * the shards (recorded by autograd), specs on the outputs. */
#include "dtensor.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static bool is_replicated_on(const lm_dspec *s, int k) { return s->pl[k].kind == LM_REPLICATE; }

/* Sharding decisions are cached by (op, input specs, attrs): a key of
 * plain integers (no struct padding), direct-mapped by its hash. */
#define KEY_MAX (3 + LM_RULE_MAX_IN * (2 + LM_MAX_DIMS + 3 * LM_MAX_MESH) + 2 + LM_MAX_ATTR_INTS + LM_MAX_ATTR_REALS)
typedef struct {
  int n;
  uint64_t key[KEY_MAX];
  lm_placement want[LM_RULE_MAX_IN][LM_MAX_MESH];
  lm_dspec out[LM_MAX_OUT];
  lm_attrs local;
} rule_entry;
static _Thread_local rule_entry rule_cache[128];
static _Thread_local int64_t rule_hits, rule_misses;

static int rule_key(int op, const lm_rule *r, uint64_t *k) {
  int n = 0;
  k[n++] = (uint64_t)op, k[n++] = (uint64_t)r->nin, k[n++] = (uint64_t)(uintptr_t)r->in[0]->mesh;
  for (int i = 0; i < r->nin; i++) {
    const lm_dspec *s = r->in[i];
    k[n++] = (uint64_t)(uintptr_t)s->mesh, k[n++] = (uint64_t)s->nd;
    for (int d = 0; d < s->nd; d++) k[n++] = (uint64_t)s->shape[d];
    for (int m = 0; m < s->mesh->ndim; m++)
      k[n++] = (uint64_t)s->pl[m].kind, k[n++] = (uint64_t)s->pl[m].dim, k[n++] = (uint64_t)s->pl[m].op;
  }
  k[n++] = (uint64_t)r->a->ni;
  for (int j = 0; j < r->a->ni; j++) k[n++] = (uint64_t)r->a->i[j];
  k[n++] = (uint64_t)r->a->nf;
  for (int j = 0; j < r->a->nf; j++) memcpy(&k[n++], &r->a->f[j], 8);
  return n;
}

/* global metas of the inputs, shape inference, then the rule */
static int decide(int op, lm_rule *r, lm_tensor *const *in) {
  const lm_op_def *d = lm_op_def_of(op);
  lm_meta m[LM_RULE_MAX_IN], om[LM_MAX_OUT] = {{0}};
  for (int i = 0; i < r->nin; i++) {
    m[i] = (lm_meta){.ndim = r->in[i]->nd, .dtype = in[i]->dtype_};
    memcpy(m[i].shape, r->in[i]->shape, r->in[i]->nd * sizeof *m[i].shape);
  }
  if (d->shape) LM_TRY(d->shape(op, r->nin, m, r->a, om));
  for (int o = 0; o < r->nout; o++) {
    r->out[o] = (lm_dspec){.mesh = r->in[0]->mesh, .nd = om[o].ndim};
    memcpy(r->out[o].shape, om[o].shape, om[o].ndim * sizeof *om[o].shape);
  }
  return lm_rule_table[op](r);
}

static int cached_rule(int op, lm_rule *r, lm_tensor *const *in) {
  uint64_t key[KEY_MAX];
  int n = rule_key(op, r, key);
  rule_entry *e = &rule_cache[lm_fnv1a(key, n * sizeof *key, 0) % 128];
  if (e->n == n && !memcmp(e->key, key, n * sizeof *key)) {
    memcpy(r->want, e->want, sizeof r->want);
    memcpy(r->out, e->out, sizeof r->out);
    r->local = e->local;
    rule_hits++;
    return 0;
  }
  LM_TRY(decide(op, r, in));
  rule_misses++;
  e->n = n;
  memcpy(e->key, key, n * sizeof *key);
  memcpy(e->want, r->want, sizeof e->want);
  memcpy(e->out, r->out, sizeof e->out);
  e->local = r->local;
  return 0;
}

void lm_dtensor_rule_stats(int64_t *hits, int64_t *misses) { *hits = rule_hits, *misses = rule_misses; }
void lm_dtensor_rule_cache_clear(void) { memset(rule_cache, 0, sizeof rule_cache); }

/* The input guarded last and its guarded form: q, k and v (w1 and w3)
 * read one activation in turn, and sharing one guard sums their gradients
 * before its one all-reduce (Megatron's count: one per block input, not one
 * per Linear). Only an activation (not a leaf: a parameter is read again by
 * the next microbatch's graph) at the same version, mesh and guarded dims;
 * let go at the next guard and when a backward starts. */
static _Thread_local struct {
  lm_tensor *in, *guarded;
  int64_t version;
  const lm_mesh *mesh;
  uint32_t dims;
} last_guard;

static void forget_guard(void) {
  lm_release(last_guard.in), lm_release(last_guard.guarded);
  memset(&last_guard, 0, sizeof last_guard);
}

static bool guard_kept(const lm_tensor *in, const lm_mesh *m, uint32_t dims) {
  return last_guard.in == in && last_guard.mesh == m && last_guard.dims == dims &&
         last_guard.version == in->storage->version;
}

static void keep_guard(lm_tensor *in, lm_tensor *guarded, const lm_mesh *m, uint32_t dims) {
  forget_guard();
  lm_retain(in), lm_retain(guarded);
  last_guard.in = in, last_guard.guarded = guarded, last_guard.mesh = m, last_guard.dims = dims;
  last_guard.version = in->storage->version;
  lm_autograd_on_backward(forget_guard);
}

static lm_tensor *call1(int op, lm_tensor *x, const lm_attrs *a) {  /* (for the rule's moves) */
  lm_tensor *out[LM_MAX_OUT];
  return lm_run_recorded(op, 1, &x, a, out) < 0 ? NULL : out[0];
}

int lm_dtensor_call(int op, int nin, lm_tensor *const *in, const lm_attrs *a, lm_tensor **out) {
  const lm_op_def *d = lm_op_def_of(op);
  if (!lm_rule_table[op]) return lm_error("%s: no sharding rule for DTensor arguments yet", d->name);
  if (nin > LM_RULE_MAX_IN) return lm_error("%s: at most %d DTensor arguments", d->name, LM_RULE_MAX_IN);
  const lm_dspec *first = NULL;
  for (int i = 0; i < nin && !first; i++) first = lm_spec(in[i]);
  lm_scope s = {0};
  lm_rule r = {.op = op, .nin = nin, .nout = d->nout, .a = a, .local = *a};
  lm_dspec wrapped[LM_RULE_MAX_IN];
  lm_tensor *args[LM_RULE_MAX_IN];
  int rc = 0;
  for (int i = 0; i < nin && rc == 0; i++) { /* plain tensors join as Replicate */
    const lm_dspec *si = lm_spec(in[i]);
    args[i] = in[i];
    if (si && si->mesh != first->mesh &&
        (si->mesh->ndim != first->mesh->ndim || memcmp(si->mesh->comm, first->mesh->comm, sizeof si->mesh->comm)))
      rc = lm_error("%s: argument #%d is on another mesh than the other DTensor arguments", d->name, i + 1);
    if (!si) {
      if (in[i]->ndim > 0 && !lm_implicit_replication())
        rc = lm_error("%s: argument #%d is a plain tensor mixed with DTensors; make it a DTensor "
                      "(distribute_tensor / from_local) or run inside implicit_replication", d->name, i + 1);
      wrapped[i] = (lm_dspec){.mesh = first->mesh, .nd = in[i]->ndim};
      memcpy(wrapped[i].shape, in[i]->shape_, sizeof wrapped[i].shape);
      si = &wrapped[i];
    }
    r.in[i] = si;
    memcpy(r.want[i], si->pl, sizeof r.want[i]);
  }
  if (rc == 0) rc = cached_rule(op, &r, in);
  /* inputs as the rule wants them, and guards for replicated inputs of
   * outputs that differ across ranks (their gradient is a sum of terms) */
  const lm_mesh *m = first->mesh;
  for (int i = 0; i < nin && rc == 0; i++) {
    lm_tensor *x = args[i];
    bool moves = memcmp(r.want[i], r.in[i]->pl, m->ndim * sizeof(lm_placement)) != 0;
    uint32_t guards = 0; /* mesh dims along which x's gradient is a sum over ranks */
    for (int k = 0; k < m->ndim; k++) {
      bool varies = false;
      for (int o = 0; o < r.nout; o++) varies |= !is_replicated_on(&r.out[o], k);
      if (varies && r.want[i][k].kind == LM_REPLICATE && x->needs_grad && lm_is_grad_enabled()) guards |= 1u << k;
    }
    bool share = guards && !moves && x->grad_fn_ && x->storage;
    if (share && guard_kept(x, m, guards)) {
      lm_retain(last_guard.guarded);
      args[i] = lm_s(&s, last_guard.guarded);
      continue;
    }
    if (!lm_spec(x)) { /* a plain (replicated) input: a DTensor when it must move or guard */
      if (!moves && !guards) continue;
      if (!(x = lm_s(&s, lm_dtensor_from_local(x, (lm_mesh *)m, r.in[i]->pl, x->shape_, 0)))) { rc = -1; break; }
    }
    if (moves) x = lm_s(&s, lm_dtensor_redistribute(x, r.want[i]));
    for (int k = 0; x && k < m->ndim; k++) {
      if (!(guards >> k & 1)) continue;
      lm_attrs ga = lm_comm_attrs(m->comm[k]);
      x = lm_s(&s, call1(LM_OP_DIST_GRAD_REDUCE, x, &ga));
    }
    if (!(args[i] = x)) rc = -1;
    else if (share) keep_guard(in[i], x, m, guards);
  }
  if (rc == 0) rc = lm_run_recorded(op, nin, args, &r.local, out) < 0 ? -1 : 0; /* on the shards */
  for (int o = 0; rc == 0 && o < r.nout; o++)
    if (lm_attach_spec(out[o], &r.out[o]) < 0) rc = -1;
  lm_scope_end(&s);
  return rc;
}
