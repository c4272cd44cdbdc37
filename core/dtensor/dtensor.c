/* dtensor.c: meshes, DTensor specs and shard layout, from_local and
 * to_local, and differentiable redistribution (each move a collective op
 * whose backward is the conjugate collective, see ops/collective.c). */
#include "../comm/comm.h"
#include "dtensor.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_name[] = {"Replicate", "Shard", "Partial"};

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

/* A tensor's spec is its own copy; the mesh is shared, refcounted. */
static void release_spec(lm_part *p, lm_tensor *owner) {
  (void)owner;
  lm_mesh_release(((lm_dspec *)p)->mesh);
  free(p);
}
static lm_part *copy_spec(const lm_part *p);
static const lm_part_ops spec_ops = {.release = release_spec, .copy = copy_spec};

static lm_part *copy_spec(const lm_part *p) {
  lm_dspec *c = malloc(sizeof *c);
  if (!c) { lm_error("dtensor: out of memory"); return NULL; }
  *c = *(const lm_dspec *)p;
  c->part.ops = &spec_ops;
  __atomic_add_fetch(&c->mesh->refcount, 1, __ATOMIC_RELAXED);
  return &c->part;
}

int lm_attach_spec(lm_tensor *t, const lm_dspec *s) {
  lm_part *c = copy_spec(&s->part);
  if (!c) return -1;
  if (t->dist) release_spec(t->dist, t);
  t->dist = c;
  return 0;
}

static _Thread_local int implicit_replication;
int lm_set_implicit_replication(int on) { int old = implicit_replication; implicit_replication = on; return old; }
int lm_implicit_replication(void) { return implicit_replication; }

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

/* ---- from_local, to_local, redistribute ---- */

/* x through a (recorded) one-output op */
static lm_tensor *call1(int op, lm_tensor *x, const lm_attrs *a) {
  static const lm_attrs none;
  lm_tensor *out[LM_MAX_OUT];
  return lm_run_recorded(op, 1, &x, a ? a : &none, out) < 0 ? NULL : out[0];
}

lm_tensor *lm_dtensor_from_local(lm_tensor *local, lm_mesh *m, const lm_placement *pl,
                                 const int64_t *gshape, int run_check) {
  if (!local || !m || !pl) { lm_error("from_local: tensor, mesh and placements are required"); return NULL; }
  if (lm_spec(local)) { lm_error("from_local: the tensor is already a DTensor"); return NULL; }
  if (check_placements("from_local", m, local->ndim, pl) < 0) return NULL;
  lm_dspec s = {.mesh = m, .nd = local->ndim};
  memcpy(s.pl, pl, m->ndim * sizeof *pl);
  for (int d = 0; d < local->ndim; d++) {
    s.shape[d] = local->shape_[d];
    if (!gshape) /* even shards: every rank holds as much */
      for (int k = 0; k < m->ndim; k++)
        if (pl[k].kind == LM_SHARD && pl[k].dim == d) s.shape[d] *= m->shape[k];
  }
  if (gshape) memcpy(s.shape, gshape, local->ndim * sizeof *gshape);
  int64_t lshape[LM_MAX_DIMS], off[LM_MAX_DIMS];
  lm_shard_layout(m, s.nd, s.shape, pl, NULL, lshape, off);
  if (gshape || run_check)
    for (int d = 0; d < s.nd; d++)
      if (lshape[d] != local->shape_[d]) {
        lm_error("from_local: this rank holds size %lld in dim %d, but the placements give it %lld of "
                 "the global size %lld (pass shape= for uneven shards)", (long long)local->shape_[d],
                 d + 1, (long long)lshape[d], (long long)s.shape[d]);
        return NULL;
      }
  if (run_check) { /* every rank must agree on the global shape */
    for (int k = 0; k < m->ndim; k++) {
      int64_t mine[LM_MAX_DIMS + 1] = {s.nd}, *all = malloc(sizeof(int64_t) * (LM_MAX_DIMS + 1) * m->shape[k]);
      memcpy(mine + 1, s.shape, s.nd * sizeof *mine);
      int rc = all ? lm_comm_allgather_i64(m->comm[k], mine, LM_MAX_DIMS + 1, all, "from_local's run_check") : lm_error("oom");
      for (int r = 0; rc == 0 && r < m->shape[k]; r++)
        if (memcmp(all + r * (LM_MAX_DIMS + 1), mine, sizeof mine))
          rc = lm_error("from_local: run_check: rank %d of mesh dim %d has another global shape", r, k + 1);
      free(all);
      if (rc < 0) return NULL;
    }
  }
  lm_tensor *d = call1(LM_OP_DIST_ALIAS, local, NULL);
  if (d && lm_attach_spec(d, &s) < 0) { lm_release(d); return NULL; }
  return d;
}

lm_tensor *lm_dtensor_to_local(lm_tensor *d) {
  if (!d || !lm_spec(d)) { lm_error("to_local: expected a DTensor"); return NULL; }
  return call1(LM_OP_DIST_ALIAS, d, NULL);
}

/* One mesh dim's move from placement a to b; x is the current shard. */
static lm_tensor *move(lm_tensor *x, const lm_dspec *s, int k, lm_placement a, lm_placement b) {
  lm_attrs at = lm_comm_attrs(s->mesh->comm[k]);
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
    at.i[0] = a.dim, at.i[1] = lshape[a.dim], at.ni = 2;
  if (a.kind == LM_SHARD && b.kind == LM_REPLICATE) return call1(LM_OP_DIST_ALL_GATHER, x, &at);
  if (a.kind == LM_REPLICATE && b.kind == LM_SHARD) { at.i[0] = b.dim, at.ni = 1; return call1(LM_OP_DIST_SLICE, x, &at); }
  if (a.kind == LM_PARTIAL && b.kind == LM_REPLICATE) { at.i[0] = a.op, at.ni = 1; return call1(LM_OP_DIST_ALL_REDUCE, x, &at); }
  if (a.kind == LM_PARTIAL && b.kind == LM_SHARD) {
    at.i[0] = a.op, at.i[1] = b.dim, at.ni = 2;
    return call1(LM_OP_DIST_REDUCE_SCATTER, x, &at);
  }
  if (a.kind == LM_SHARD && b.kind == LM_SHARD) {
    at.i[0] = b.dim, at.i[1] = a.dim, at.i[2] = lshape[a.dim], at.ni = 3;
    return call1(LM_OP_DIST_ALL_TO_ALL, x, &at);
  }
  if (a.kind == LM_REPLICATE && b.kind == LM_PARTIAL && b.op == LM_RED_SUM) return call1(LM_OP_DIST_TO_PARTIAL, x, &at);
  if (a.kind == LM_REPLICATE && b.kind == LM_PARTIAL) return call1(LM_OP_DIST_ALIAS, x, NULL); /* avg/max/min of equals */
  if (a.kind == LM_SHARD && b.kind == LM_PARTIAL) { /* via Replicate */
    at.i[0] = a.dim, at.i[1] = lshape[a.dim], at.ni = 2;
    lm_tensor *r = call1(LM_OP_DIST_ALL_GATHER, x, &at), *p = r ? move(r, s, k, (lm_placement){LM_REPLICATE, 0, 0}, b) : NULL;
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
  lm_tensor *x = call1(LM_OP_DIST_ALIAS, d, NULL);
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

