/* collective.c: collectives (core/comm/) as differentiable ops on shards.
 * Their attrs hold the communicator as handle 0 and their ints from i[0];
 * backward runs the conjugate collective. DTensor's redistribution is
 * made of these ops. */
#include "../comm/comm.h"
#include "op.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

lm_comm *lm_attr_comm(const lm_attrs *a, int k, const char *op) {
  lm_comm *c = a->nh > k && a->hk[k] == LM_HANDLE_COMM ? a->h[k] : NULL;
  if (!c || c->magic != LM_COMM_MAGIC) {
    lm_error("%s: handle %d expected a communicator, got %s", op, k + 1,
             a->nh <= k ? "none" : a->hk[k] != LM_HANDLE_COMM ? "another kind of handle" : "a dead one");
    return NULL;
  }
  return c;
}

lm_attrs lm_comm_attrs(lm_comm *c) {
  return (lm_attrs){.h = {c}, .hk = {LM_HANDLE_COMM}, .nh = 1};
}

#define COMM(a, op) lm_comm *comm = lm_attr_comm((a), 0, lm_op_name(op)); if (!comm) return -1

/* an alias of x's storage without a spec (outputs get theirs afterwards) */
static lm_tensor *alias(const lm_tensor *x) {
  return lm_view_of(x, x->ndim, x->shape_, x->stride_, x->offset);
}

/* _dist_all_gather(x; dim, full) and its conjugate _dist_slice(x; dim) */
int lm_fw_dist_all_gather(const lm_call *c, lm_tensor **out) {
  COMM(c->a, c->op);
  return (*out = lm_all_gather(comm, c->in[0], (int)c->a->i[0], c->a->i[1])) ? 0 : -1;
}

int lm_fw_dist_slice(const lm_call *c, lm_tensor **out) {
  COMM(c->a, c->op);
  lm_tensor *x = c->in[0];
  int d = (int)c->a->i[0], k = lm_comm_size(comm), r = lm_comm_rank(comm);
  int64_t n = x->shape_[d];
  lm_attrs na = {.i = {d, lm_chunk_offset(n, k, r), lm_chunk_size(n, k, r)}, .ni = 3};
  lm_tensor *v = lm_run(LM_OP_NARROW, 1, &x, &na);
  *out = v ? lm_contiguous(v) : NULL;
  lm_release(v);
  return *out ? 0 : -1;
}

int lm_bw_dist_all_gather(const lm_saved *n, lm_tensor *const *g, lm_tensor **gin) {
  lm_tensor *x = g[0];
  return (gin[0] = lm_run(LM_OP_DIST_SLICE, 1, &x, &n->attrs)) ? 0 : -1;
}

int lm_bw_dist_slice(const lm_saved *n, lm_tensor *const *g, lm_tensor **gin) {
  lm_attrs a = n->attrs;
  a.i[1] = n->in[0]->shape_[a.i[0]], a.ni = 2;
  lm_tensor *x = g[0];
  return (gin[0] = lm_run(LM_OP_DIST_ALL_GATHER, 1, &x, &a)) ? 0 : -1;
}

/* divides g by the comm's size: an average's terms each count 1/size */
static lm_tensor *over_size(lm_tensor *g, lm_comm *comm) {
  lm_scope s = {0};
  lm_tensor *r = lm_s2(&s, LM_OP_DIV, g, lm_scalar(&s, (double)lm_comm_size(comm), g));
  if (r) lm_retain(r);
  lm_scope_end(&s);
  return r;
}

/* _dist_all_reduce(x; op): the gradient of a sum is the incoming one on
 * every rank (it is replicated), of an average that over the size. */
int lm_fw_dist_all_reduce(const lm_call *c, lm_tensor **out) {
  COMM(c->a, c->op);
  return (*out = lm_all_reduce(comm, c->in[0], (int)c->a->i[0])) ? 0 : -1;
}

int lm_bw_dist_all_reduce(const lm_saved *n, lm_tensor *const *g, lm_tensor **gin) {
  COMM(&n->attrs, n->op);
  int op = (int)n->attrs.i[0];
  if (op == LM_RED_SUM) return (gin[0] = lm_grad_like(g[0], n->in[0])) ? 0 : -1;
  if (op != LM_RED_AVG) return lm_error("redistribute: Partial(max/min) is not differentiable");
  lm_tensor *r = over_size(g[0], comm);
  gin[0] = lm_grad_like(r, n->in[0]);
  lm_release(r);
  return gin[0] ? 0 : -1;
}

/* _dist_reduce_scatter(x; op, dim) */
int lm_fw_dist_reduce_scatter(const lm_call *c, lm_tensor **out) {
  COMM(c->a, c->op);
  return (*out = lm_reduce_scatter(comm, c->in[0], (int)c->a->i[0], (int)c->a->i[1])) ? 0 : -1;
}

int lm_bw_dist_reduce_scatter(const lm_saved *n, lm_tensor *const *g, lm_tensor **gin) {
  COMM(&n->attrs, n->op);
  int op = (int)n->attrs.i[0], d = (int)n->attrs.i[1];
  if (op != LM_RED_SUM && op != LM_RED_AVG)
    return lm_error("redistribute: Partial(max/min) to Shard is not differentiable");
  lm_attrs a = lm_comm_attrs(comm);
  a.i[0] = d, a.i[1] = n->in[0]->shape_[d], a.ni = 2;
  lm_tensor *x = g[0], *full = lm_run(LM_OP_DIST_ALL_GATHER, 1, &x, &a);
  if (!full || op == LM_RED_SUM) return (gin[0] = full) ? 0 : -1;
  gin[0] = over_size(full, comm);
  lm_release(full);
  return gin[0] ? 0 : -1;
}

/* _dist_all_to_all(x; split_dim, cat_dim, full size of cat_dim) */
int lm_fw_dist_all_to_all(const lm_call *c, lm_tensor **out) {
  COMM(c->a, c->op);
  const int64_t *i = c->a->i;
  return (*out = lm_all_to_all(comm, c->in[0], (int)i[0], (int)i[1], i[2])) ? 0 : -1;
}

int lm_bw_dist_all_to_all(const lm_saved *n, lm_tensor *const *g, lm_tensor **gin) {
  /* split the old cat dim, gather the old split dim to the input's size */
  lm_attrs a = n->attrs;
  a.i[0] = n->attrs.i[1], a.i[1] = n->attrs.i[0], a.i[2] = n->in[0]->shape_[n->attrs.i[0]], a.ni = 3;
  lm_tensor *x = g[0];
  return (gin[0] = lm_run(LM_OP_DIST_ALL_TO_ALL, 1, &x, &a)) ? 0 : -1;
}

/* _dist_to_partial(x): Replicate -> Partial(sum): the value stays on the
 * first rank of the comm, the others hold zeros. Its gradient is the
 * incoming one (a Partial's gradient is replicated). */
int lm_fw_dist_to_partial(const lm_call *c, lm_tensor **out) {
  COMM(c->a, c->op);
  if (lm_comm_rank(comm) == 0) return (*out = alias(c->in[0])) ? 0 : -1;
  *out = lm_empty_like(c->in[0]);
  return *out && lm_fill_(*out, 0) == 0 ? 0 : -1;
}

/* _dist_alias(x) and _dist_grad_reduce(x): identity forward. Grad reduce's
 * backward sums the local gradients over the comm: it guards a replicated
 * input of an op whose output differs across ranks, where each rank's
 * gradient is one term. */
int lm_fw_dist_alias(const lm_call *c, lm_tensor **out) {
  return (*out = alias(c->in[0])) ? 0 : -1;
}

int lm_bw_dist_grad_reduce(const lm_saved *n, lm_tensor *const *g, lm_tensor **gin) {
  COMM(&n->attrs, n->op);
  return (gin[0] = lm_all_reduce(comm, g[0], LM_RED_SUM)) ? 0 : -1;
}

/* _dist_pad(x; dim) (async TP's shared gather): x in this rank's chunk of
 * a tensor k times longer on dim, zeros elsewhere, without communication;
 * its backward reduce-scatters the gradient (each rank's rows summed over
 * the comm), the gradient of the sequence shard a gather fed. */
int lm_fw_dist_pad(const lm_call *c, lm_tensor **out) {
  COMM(c->a, c->op);
  lm_tensor *x = c->in[0];
  int d = (int)c->a->i[0], k = lm_comm_size(comm), r = lm_comm_rank(comm);
  if (d < 0 || d >= x->ndim) return lm_error("_dist_pad: dim %d is out of range for a %d-d tensor", d, x->ndim);
  lm_tensor **parts = malloc(sizeof *parts * (size_t)k), *z = lm_empty_like(x);
  *out = NULL;
  if (parts && z && lm_fill_(z, 0) == 0) {
    for (int i = 0; i < k; i++) parts[i] = i == r ? x : z;
    *out = lm_run(LM_OP_CAT, k, parts, &(lm_attrs){.i = {d}, .ni = 1});
  } else if (!parts) {
    lm_error("_dist_pad: out of memory");
  }
  free(parts);
  lm_release(z);
  return *out ? 0 : -1;
}

int lm_bw_dist_pad(const lm_saved *n, lm_tensor *const *g, lm_tensor **gin) {
  COMM(&n->attrs, n->op);
  return (gin[0] = lm_reduce_scatter(comm, g[0], LM_RED_SUM, (int)n->attrs.i[0])) ? 0 : -1;
}

/* _dist_all_to_all_single(x, output_splits, input_splits): the rows of x
 * exchanged by splits (all_to_all_v.c), the splits 1-D i64 tensors of the
 * group's size on x's device (copied to the host when they are not there).
 * Backward sends the gradient's rows back with the splits swapped. */
static const int64_t *host_splits(lm_scope *s, lm_tensor *t, int k, const char *arg) {
  if (t->dtype_ != LM_I64 || t->ndim != 1 || t->shape_[0] != k) {
    char shape[32] = "a scalar";
    if (t->ndim == 1) snprintf(shape, sizeof shape, "(%lld)", (long long)t->shape_[0]);
    else if (t->ndim > 1) snprintf(shape, sizeof shape, "%d dims", t->ndim);
    lm_error("all_to_all_single: %s expected an i64 tensor of %d row counts (one per rank of the group), "
             "got %s %s", arg, k, lm_dtype_name(t->dtype_), shape);
    return NULL;
  }
  lm_tensor *h = t;
  if (t->device_ != LM_CPU) {
    h = lm_s(s, lm_empty(1, t->shape_, LM_I64, LM_CPU));
    if (h && lm_copy_(h, t) < 0) return NULL;
  }
  h = lm_s_contig(s, h);
  return h ? (const int64_t *)lm_data(h) : NULL;
}

int lm_fw_dist_all_to_all_single(const lm_call *c, lm_tensor **out) {
  COMM(c->a, c->op);
  int k = lm_comm_size(comm);
  lm_scope s = {0};
  const int64_t *os = host_splits(&s, c->in[1], k, "output_splits");
  const int64_t *is = os ? host_splits(&s, c->in[2], k, "input_splits") : NULL;
  *out = is ? lm_all_to_all_v(comm, c->in[0], os, is) : NULL;
  lm_scope_end(&s);
  return *out ? 0 : -1;
}

int lm_bw_dist_all_to_all_single(const lm_saved *n, lm_tensor *const *g, lm_tensor **gin) {
  lm_tensor *in[3] = {g[0], n->in[2], n->in[1]};
  return (gin[0] = lm_run(n->op, 3, in, &n->attrs)) ? 0 : -1;
}
