/* dtensor.c: DTensor specs, shard layout, differentiable redistribution and
 * the dispatch of ops on DTensors: sharding rule -> redistribute inputs ->
 * the op on the shards. Autograd records the shard-local computation; the
 * collectives are ops whose backward is the conjugate collective. */
#include "comm/comm.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_name[] = {"Replicate", "Shard", "Partial"};
static lm_tensor *alias(const lm_tensor *x);

/* ---- meshes and specs ---- */

lm_mesh *lm_mesh_new(int ndim, const int64_t *shape, const int64_t *coord, lm_comm *const *comms,
                     int device) {
  if (ndim < 1 || ndim > LM_MAX_MESH) {
    lm_error("mesh: expected 1 to %d dims, got %d", LM_MAX_MESH, ndim);
    return NULL;
  }
  lm_mesh *m = calloc(1, sizeof *m);
  if (!m) { lm_error("mesh: out of memory"); return NULL; }
  m->refcount = 1, m->ndim = ndim, m->device = device;
  for (int d = 0; d < ndim; d++) m->shape[d] = shape[d], m->coord[d] = coord[d], m->comm[d] = comms[d];
  return m;
}

void lm_mesh_release(lm_mesh *m) {
  if (m && __atomic_sub_fetch(&m->refcount, 1, __ATOMIC_ACQ_REL) == 0) free(m);
}

int lm_attach_spec(lm_tensor *t, const lm_dspec *s) {
  lm_dspec *c = malloc(sizeof *c);
  if (!c) return lm_error("dtensor: out of memory");
  *c = *s;
  __atomic_add_fetch(&c->mesh->refcount, 1, __ATOMIC_RELAXED);
  lm_free_spec(t);
  t->dist = c;
  return 0;
}

void lm_free_spec(lm_tensor *t) {
  lm_dspec *s = t->dist;
  if (!s) return;
  lm_mesh_release(s->mesh);
  free(s);
  t->dist = NULL;
}

static _Thread_local int local_mode, implicit_replication;
bool lm_dist_local_mode(void) { return local_mode; }
int lm_set_dist_local_mode(int on) { int old = local_mode; local_mode = on; return old; }
int lm_set_implicit_replication(int on) { int old = implicit_replication; implicit_replication = on; return old; }

static int check_placements(const char *who, const lm_mesh *m, int nd, const lm_placement *pl) {
  for (int d = 0; d < m->ndim; d++) {
    if (pl[d].kind < LM_REPLICATE || pl[d].kind > LM_PARTIAL)
      return lm_error("%s: placement %d has an unknown kind %d", who, d + 1, pl[d].kind);
    if (pl[d].kind == LM_SHARD && (pl[d].dim < 0 || pl[d].dim >= nd))
      return lm_error("%s: placement %d is Shard(%d), the tensor has %d dims", who, d + 1,
                      pl[d].dim + 1, nd);
    if (pl[d].kind == LM_PARTIAL && (pl[d].op < LM_RED_SUM || pl[d].op > LM_RED_MIN))
      return lm_error("%s: placement %d is Partial with an unknown op %d", who, d + 1, pl[d].op);
  }
  return 0;
}

int lm_shard_layout(const lm_mesh *m, int nd, const int64_t *gshape, const lm_placement *pl,
                    const int64_t *coord, int64_t *lshape, int64_t *offset) {
  if (!coord) coord = m->coord;
  for (int d = 0; d < nd; d++) lshape[d] = gshape[d], offset[d] = 0;
  for (int k = 0; k < m->ndim; k++) { /* mesh dims in order: nested shards split the shard */
    if (pl[k].kind != LM_SHARD) continue;
    int d = pl[k].dim, n = (int)m->shape[k], i = (int)coord[k];
    offset[d] += lm_chunk_offset(lshape[d], n, i);
    lshape[d] = lm_chunk_size(lshape[d], n, i);
  }
  return 0;
}

int lm_dtensor_spec(const lm_tensor *d, lm_placement *pl, int64_t *gshape, lm_mesh **mesh) {
  const lm_dspec *s = d ? lm_spec(d) : NULL;
  if (!s) return 0;
  if (pl) memcpy(pl, s->pl, s->mesh->ndim * sizeof *pl);
  if (gshape) memcpy(gshape, s->shape, s->nd * sizeof *gshape);
  if (mesh) *mesh = s->mesh;
  return s->mesh->ndim;
}

/* ---- collectives as differentiable ops (attrs: i[0] the comm) ----
 * Their inputs and outputs are shards; backward runs the conjugate. */

static lm_comm *comm_of(const lm_attrs *a) { return (lm_comm *)(uintptr_t)a->i[0]; }

/* _dist_all_gather(x; comm, dim, full) and its conjugate _dist_slice(x; comm, dim) */
static int fw_all_gather(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  return (*out = lm_all_gather(comm_of(a), in[0], (int)a->i[1], a->i[2])) ? 0 : -1;
}
static int fw_slice(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  lm_comm *c = comm_of(a);
  int d = (int)a->i[1], k = lm_comm_size(c), r = lm_comm_rank(c);
  int64_t n = in[0]->shape[d];
  lm_tensor *x = in[0];
  lm_attrs na = {.i = {d, lm_chunk_offset(n, k, r), lm_chunk_size(n, k, r)}, .ni = 3};
  lm_tensor *v = lm_call("narrow", 1, &x, &na);
  *out = v ? lm_contiguous(v) : NULL;
  lm_release(v);
  return *out ? 0 : -1;
}
static int bw_all_gather(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  lm_tensor *x = g[0];
  return (gin[0] = lm_call("_dist_slice", 1, &x, &n->attrs)) ? 0 : -1;
}
static int bw_slice(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  lm_attrs a = n->attrs;
  a.i[2] = n->in[0]->shape[a.i[1]], a.ni = 3;
  lm_tensor *x = g[0];
  return (gin[0] = lm_call("_dist_all_gather", 1, &x, &a)) ? 0 : -1;
}

/* _dist_all_reduce(x; comm, op): the gradient of a sum is the incoming one
 * on every rank (it is replicated), of an average that over the size. */
static int fw_all_reduce(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  return (*out = lm_all_reduce(comm_of(a), in[0], (int)a->i[1])) ? 0 : -1;
}
static int bw_all_reduce(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  int op = (int)n->attrs.i[1];
  if (op == LM_RED_SUM) return (gin[0] = lm_grad_like(g[0], n->in[0])) ? 0 : -1;
  if (op != LM_RED_AVG) return lm_error("redistribute: Partial(max/min) is not differentiable");
  lm_scope s = {0};
  lm_tensor *r = lm_s2(&s, "div", g[0], lm_scalar(&s, (double)lm_comm_size(comm_of(&n->attrs)), g[0]));
  gin[0] = lm_grad_like(r, n->in[0]);
  lm_scope_end(&s);
  return gin[0] ? 0 : -1;
}

/* _dist_reduce_scatter(x; comm, op, dim) */
static int fw_reduce_scatter(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  return (*out = lm_reduce_scatter(comm_of(a), in[0], (int)a->i[1], (int)a->i[2])) ? 0 : -1;
}
static int bw_reduce_scatter(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  int op = (int)n->attrs.i[1];
  if (op != LM_RED_SUM && op != LM_RED_AVG)
    return lm_error("redistribute: Partial(max/min) to Shard is not differentiable");
  lm_attrs a = {.i = {n->attrs.i[0], n->attrs.i[2], n->in[0]->shape[n->attrs.i[2]]}, .ni = 3};
  lm_tensor *x = g[0];
  if (!(gin[0] = lm_call("_dist_all_gather", 1, &x, &a))) return -1;
  if (op == LM_RED_SUM) return 0;
  lm_scope s = {0}; /* an average's terms each count 1/size */
  lm_tensor *full = lm_s(&s, gin[0]);
  gin[0] = lm_s2(&s, "div", full, lm_scalar(&s, (double)lm_comm_size(comm_of(&n->attrs)), full));
  if (gin[0]) lm_retain(gin[0]);
  lm_scope_end(&s);
  return gin[0] ? 0 : -1;
}

/* _dist_all_to_all(x; comm, split_dim, cat_dim, full size of cat_dim) */
static int fw_all_to_all(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  return (*out = lm_all_to_all(comm_of(a), in[0], (int)a->i[1], (int)a->i[2], a->i[3])) ? 0 : -1;
}
static int bw_all_to_all(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  /* split the old cat dim, gather the old split dim to the input's size */
  lm_attrs a = {.i = {n->attrs.i[0], n->attrs.i[2], n->attrs.i[1], n->in[0]->shape[n->attrs.i[1]]}, .ni = 4};
  lm_tensor *x = g[0];
  return (gin[0] = lm_call("_dist_all_to_all", 1, &x, &a)) ? 0 : -1;
}

/* _dist_to_partial(x; comm): Replicate -> Partial(sum): the value stays on
 * the first rank of the comm, the others hold zeros. Its gradient is the
 * incoming one (a Partial's gradient is replicated). */
static int fw_to_partial(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  if (lm_comm_rank(comm_of(a)) == 0) return (*out = alias(in[0])) ? 0 : -1;
  *out = lm_empty_like(in[0]);
  return *out && lm_fill_(*out, 0) == 0 ? 0 : -1;
}

/* an alias of x's storage without a spec (outputs get theirs afterwards) */
static lm_tensor *alias(const lm_tensor *x) {
  return lm_view_of(x, x->ndim, x->shape, x->stride_, x->offset);
}

/* _dist_grad_reduce(x; comm): identity forward; backward sums the local
 * gradients over the comm. It guards a replicated input of an op whose
 * output differs across ranks: each rank's gradient is then one term. */
static int fw_identity(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin, (void)a;
  return (*out = alias(in[0])) ? 0 : -1;
}
static int bw_grad_reduce(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  return (gin[0] = lm_all_reduce(comm_of(&n->attrs), g[0], LM_RED_SUM)) ? 0 : -1;
}
static int bw_identity(const lm_node *n, lm_tensor *const *g, lm_tensor **gin) {
  return (gin[0] = lm_grad_like(g[0], n->in[0])) ? 0 : -1;
}

#define DIST_OP(NAME, FW, BW) {NAME, 1, 1, FW, BW, NULL, 1}
const lm_op_def lm_ops_dist[] = {
    DIST_OP("_dist_all_gather", fw_all_gather, bw_all_gather),
    DIST_OP("_dist_slice", fw_slice, bw_slice),
    DIST_OP("_dist_all_reduce", fw_all_reduce, bw_all_reduce),
    DIST_OP("_dist_reduce_scatter", fw_reduce_scatter, bw_reduce_scatter),
    DIST_OP("_dist_all_to_all", fw_all_to_all, bw_all_to_all),
    DIST_OP("_dist_to_partial", fw_to_partial, bw_identity),
    DIST_OP("_dist_grad_reduce", fw_identity, bw_grad_reduce),
    DIST_OP("_dist_alias", fw_identity, bw_identity),
    {0}};

/* ---- from_local, to_local, redistribute ---- */

static lm_tensor *call1(const char *op, lm_tensor *x, const lm_attrs *a) {
  return lm_call(op, 1, &x, a);
}

lm_tensor *lm_dtensor_from_local(lm_tensor *local, lm_mesh *m, const lm_placement *pl,
                                 const int64_t *gshape, int run_check) {
  if (!local || !m || !pl) { lm_error("from_local: tensor, mesh and placements are required"); return NULL; }
  if (lm_spec(local)) { lm_error("from_local: the tensor is already a DTensor"); return NULL; }
  if (check_placements("from_local", m, local->ndim, pl) < 0) return NULL;
  lm_dspec s = {.mesh = m, .nd = local->ndim};
  memcpy(s.pl, pl, m->ndim * sizeof *pl);
  for (int d = 0; d < local->ndim; d++) {
    s.shape[d] = local->shape[d];
    if (!gshape) /* even shards: every rank holds as much */
      for (int k = 0; k < m->ndim; k++)
        if (pl[k].kind == LM_SHARD && pl[k].dim == d) s.shape[d] *= m->shape[k];
  }
  if (gshape) memcpy(s.shape, gshape, local->ndim * sizeof *gshape);
  int64_t lshape[LM_MAX_DIMS], off[LM_MAX_DIMS];
  lm_shard_layout(m, s.nd, s.shape, pl, NULL, lshape, off);
  if (gshape || run_check)
    for (int d = 0; d < s.nd; d++)
      if (lshape[d] != local->shape[d]) {
        lm_error("from_local: this rank holds size %lld in dim %d, but the placements give it %lld of "
                 "the global size %lld (pass shape= for uneven shards)", (long long)local->shape[d],
                 d + 1, (long long)lshape[d], (long long)s.shape[d]);
        return NULL;
      }
  if (run_check) { /* every rank must agree on the global shape */
    for (int k = 0; k < m->ndim; k++) {
      int64_t mine[LM_MAX_DIMS + 1] = {s.nd}, *all = malloc(sizeof(int64_t) * (LM_MAX_DIMS + 1) * m->shape[k]);
      memcpy(mine + 1, s.shape, s.nd * sizeof *mine);
      int rc = all ? lm_comm_allgather_i64(m->comm[k], mine, LM_MAX_DIMS + 1, all) : lm_error("oom");
      for (int r = 0; rc == 0 && r < m->shape[k]; r++)
        if (memcmp(all + r * (LM_MAX_DIMS + 1), mine, sizeof mine))
          rc = lm_error("from_local: run_check: rank %d of mesh dim %d has another global shape", r, k + 1);
      free(all);
      if (rc < 0) return NULL;
    }
  }
  lm_tensor *d = call1("_dist_alias", local, NULL);
  if (d && lm_attach_spec(d, &s) < 0) { lm_release(d); return NULL; }
  return d;
}

lm_tensor *lm_dtensor_to_local(lm_tensor *d) {
  if (!d || !lm_spec(d)) { lm_error("to_local: expected a DTensor"); return NULL; }
  return call1("_dist_alias", d, NULL);
}

/* One mesh dim's move from placement a to b; x is the current shard. */
static lm_tensor *move(lm_tensor *x, const lm_dspec *s, int k, lm_placement a, lm_placement b) {
  lm_attrs at = {.i = {(int64_t)(uintptr_t)s->mesh->comm[k]}, .ni = 1};
  if (a.kind == b.kind && (a.kind == LM_REPLICATE || (a.kind == LM_SHARD && a.dim == b.dim) ||
                           (a.kind == LM_PARTIAL && a.op == b.op))) {
    lm_retain(x);
    return x;
  }
  /* the full size of a dim at this mesh dim's level: the global size split
   * by the shards of the earlier mesh dims */
  int64_t lshape[LM_MAX_DIMS], off[LM_MAX_DIMS];
  lm_placement outer[LM_MAX_MESH] = {{0}};
  for (int j = 0; j < s->mesh->ndim; j++)
    outer[j] = j < k ? s->pl[j] : (lm_placement){LM_REPLICATE, 0, 0};
  lm_shard_layout(s->mesh, s->nd, s->shape, outer, NULL, lshape, off);
  if (a.kind == LM_SHARD && b.kind == LM_REPLICATE)
    at.i[1] = a.dim, at.i[2] = lshape[a.dim], at.ni = 3;
  if (a.kind == LM_SHARD && b.kind == LM_REPLICATE) return call1("_dist_all_gather", x, &at);
  if (a.kind == LM_REPLICATE && b.kind == LM_SHARD) { at.i[1] = b.dim, at.ni = 2; return call1("_dist_slice", x, &at); }
  if (a.kind == LM_PARTIAL && b.kind == LM_REPLICATE) { at.i[1] = a.op, at.ni = 2; return call1("_dist_all_reduce", x, &at); }
  if (a.kind == LM_PARTIAL && b.kind == LM_SHARD) {
    at.i[1] = a.op, at.i[2] = b.dim, at.ni = 3;
    return call1("_dist_reduce_scatter", x, &at);
  }
  if (a.kind == LM_SHARD && b.kind == LM_SHARD) {
    at.i[1] = b.dim, at.i[2] = a.dim, at.i[3] = lshape[a.dim], at.ni = 4;
    return call1("_dist_all_to_all", x, &at);
  }
  if (a.kind == LM_REPLICATE && b.kind == LM_PARTIAL && b.op == LM_RED_SUM) return call1("_dist_to_partial", x, &at);
  if (a.kind == LM_REPLICATE && b.kind == LM_PARTIAL) return call1("_dist_alias", x, NULL); /* avg/max/min of equals */
  if (a.kind == LM_SHARD && b.kind == LM_PARTIAL) { /* via Replicate */
    at.i[1] = a.dim, at.i[2] = lshape[a.dim], at.ni = 3;
    lm_tensor *r = call1("_dist_all_gather", x, &at), *p = r ? move(r, s, k, (lm_placement){LM_REPLICATE, 0, 0}, b) : NULL;
    lm_release(r);
    return p;
  }
  lm_error("redistribute: cannot move mesh dim %d from %s to %s", k + 1, kind_name[a.kind], kind_name[b.kind]);
  return NULL;
}

lm_tensor *lm_dtensor_redistribute(lm_tensor *d, const lm_placement *pl) {
  const lm_dspec *s = d ? lm_spec(d) : NULL;
  if (!s) { lm_error("redistribute: expected a DTensor"); return NULL; }
  if (check_placements("redistribute", s->mesh, s->nd, pl) < 0) return NULL;
  int nm = s->mesh->ndim;
  lm_dspec cur = *s;
  lm_tensor *x = call1("_dist_alias", d, NULL);
  /* As PyTorch: from the last mesh dim to the first, move each dim to its
   * target, except that a target Shard whose tensor dim is sharded
   * differently by the earlier mesh dims (now vs in the target) goes to
   * Replicate first, so nested shards are never split in another order;
   * then from the first mesh dim to the last, Replicate -> target (local). */
  for (int pass = 0; pass < 2; pass++)
    for (int j = 0; j < nm && x; j++) {
      int k = pass == 0 ? nm - 1 - j : j;
      lm_placement want = pl[k];
      if (pass == 0 && want.kind == LM_SHARD)
        for (int e = 0; e < k; e++) {
          bool now = cur.pl[e].kind == LM_SHARD && cur.pl[e].dim == want.dim;
          bool then = pl[e].kind == LM_SHARD && pl[e].dim == want.dim;
          if (now != then) want = (lm_placement){LM_REPLICATE, 0, 0};
        }
      if (!memcmp(&cur.pl[k], &want, sizeof want)) continue;
      lm_tensor *y = move(x, &cur, k, cur.pl[k], want);
      lm_release(x);
      x = y;
      cur.pl[k] = want;
    }
  if (x && lm_attach_spec(x, &cur) < 0) { lm_release(x); return NULL; }
  return x;
}

/* ---- dispatch ---- */

static bool is_replicated_on(const lm_dspec *s, int k) { return s->pl[k].kind == LM_REPLICATE; }

/* Sharding decisions are cached by (op, input specs, attrs): a key of
 * plain integers (no struct padding), direct-mapped by its hash. */
#define KEY_MAX (3 + LM_RULE_MAX_IN * (2 + LM_MAX_DIMS + 3 * LM_MAX_MESH) + 2 + 24 + 8)
typedef struct {
  int n;
  uint64_t key[KEY_MAX];
  lm_placement want[LM_RULE_MAX_IN][LM_MAX_MESH];
  lm_dspec out[4];
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

static int cached_rule(int op, const lm_op_def *d, lm_rule *r) {
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
  LM_TRY(d->shard_rule(r));
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

int lm_dtensor_call(int op, const lm_op_def *d, int nin, lm_tensor *const *in, const lm_attrs *a,
                    lm_tensor **out) {
  if (!d->shard_rule) return lm_error("%s: no sharding rule for DTensor arguments yet", d->name);
  if (nin > LM_RULE_MAX_IN) return lm_error("%s: at most %d DTensor arguments", d->name, LM_RULE_MAX_IN);
  const lm_dspec *first = NULL;
  for (int i = 0; i < nin && !first; i++) first = lm_spec(in[i]);
  lm_scope s = {0};
  lm_rule r = {.op = d->name, .nin = nin, .nout = d->nout, .a = a, .local = *a};
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
      if (in[i]->ndim > 0 && !implicit_replication)
        rc = lm_error("%s: argument #%d is a plain tensor mixed with DTensors; make it a DTensor "
                      "(distribute_tensor / from_local) or run inside implicit_replication", d->name, i + 1);
      wrapped[i] = (lm_dspec){.mesh = first->mesh, .nd = in[i]->ndim};
      memcpy(wrapped[i].shape, in[i]->shape, sizeof wrapped[i].shape);
      si = &wrapped[i];
    }
    r.in[i] = si;
    memcpy(r.want[i], si->pl, sizeof r.want[i]);
  }
  if (rc == 0) rc = cached_rule(op, d, &r);
  /* inputs as the rule wants them, and guards for replicated inputs of
   * outputs that differ across ranks (their gradient is a sum of terms) */
  const lm_mesh *m = first->mesh;
  for (int i = 0; i < nin && rc == 0; i++) {
    lm_tensor *x = args[i];
    if (!lm_spec(x)) { /* a plain (replicated) input: a DTensor when it must move or guard */
      bool moves = memcmp(r.want[i], r.in[i]->pl, m->ndim * sizeof(lm_placement)) != 0, varies = false;
      for (int o = 0; o < r.nout; o++)
        for (int k = 0; k < m->ndim; k++) varies |= !is_replicated_on(&r.out[o], k);
      if (!moves && !(varies && x->needs_grad && lm_is_grad_enabled())) continue;
      if (!(x = lm_s(&s, lm_dtensor_from_local(x, (lm_mesh *)m, r.in[i]->pl, x->shape, 0)))) { rc = -1; break; }
    }
    if (memcmp(r.want[i], r.in[i]->pl, m->ndim * sizeof(lm_placement)))
      x = lm_s(&s, lm_dtensor_redistribute(x, r.want[i]));
    for (int k = 0; x && k < m->ndim; k++) {
      bool varies = false;
      for (int o = 0; o < r.nout; o++) varies |= !is_replicated_on(&r.out[o], k);
      if (varies && r.want[i][k].kind == LM_REPLICATE && x->needs_grad && lm_is_grad_enabled()) {
        lm_attrs ga = {.i = {(int64_t)(uintptr_t)m->comm[k]}, .ni = 1};
        x = lm_s(&s, call1("_dist_grad_reduce", x, &ga));
      }
    }
    if (!(args[i] = x)) rc = -1;
  }
  if (rc == 0) { /* the op on the shards: nested calls and kernels see plain tensors */
    int old = lm_set_dist_local_mode(1);
    rc = lm_op_call(op, nin, args, &r.local, d->nout, out) < 0 ? -1 : 0;
    lm_set_dist_local_mode(old);
  }
  for (int o = 0; rc == 0 && o < r.nout; o++)
    if (lm_attach_spec(out[o], &r.out[o]) < 0) rc = -1;
  lm_scope_end(&s);
  return rc;
}
