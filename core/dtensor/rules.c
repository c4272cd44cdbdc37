/* rules.c: how each family of ops runs on DTensors. A rule reads the
 * inputs' global shapes and placements and the outputs' global shapes (from
 * the op's shape inference) and, one mesh dim at a time, picks the
 * placements the inputs must have, the outputs' placements, and the attrs
 * of the shard-local op. */
#include "dtensor.h"
#include <string.h>

#define R_ ((lm_placement){LM_REPLICATE, 0, 0})
#define S_(d) ((lm_placement){LM_SHARD, (d), 0})
#define P_(op) ((lm_placement){LM_PARTIAL, 0, (op)})

static int nmesh(const lm_rule *r) { return r->in[0]->mesh->ndim; }

static bool is(lm_placement p, int kind) { return p.kind == kind; }

/* Every input replicated on mesh dim k (the safe fallback). */
static void replicate_all(lm_rule *r, int k) {
  for (int i = 0; i < r->nin; i++) r->want[i][k] = R_;
  for (int o = 0; o < r->nout; o++) r->out[o].pl[k] = R_;
}

/* ---- elementwise ---- */

/* Shards of mesh dim k: the output takes the first input's shard on a dim
 * it does not broadcast; inputs that hold that dim follow it, inputs that
 * broadcast along it stay whole. */
static void pointwise_shards(lm_rule *r, int k) {
  int nd = r->out[0].nd, od = -1;
  for (int i = 0; i < r->nin && od < 0; i++) {
    lm_placement p = r->want[i][k];
    int lead = nd - r->in[i]->nd;
    if (is(p, LM_SHARD) && r->in[i]->shape[p.dim] == r->out[0].shape[p.dim + lead] &&
        r->out[0].shape[p.dim + lead] > 1)
      od = p.dim + lead;
  }
  for (int i = 0; i < r->nin; i++) {
    int lead = nd - r->in[i]->nd, d = od - lead;
    bool holds = od >= 0 && d >= 0 && r->in[i]->shape[d] == r->out[0].shape[od];
    if (is(r->want[i][k], LM_PARTIAL)) continue;
    r->want[i][k] = holds ? S_(d) : R_;
  }
  for (int o = 0; o < r->nout; o++) r->out[o].pl[k] = od >= 0 ? S_(od) : R_;
}

/* Mesh dim k of an op that cannot take a Partial input: such inputs are
 * reduced first (wanted replicated), then sharded as pointwise_shards says. */
static void reduce_then_shard(lm_rule *r, int k) {
  for (int i = 0; i < r->nin; i++)
    if (is(r->want[i][k], LM_PARTIAL)) r->want[i][k] = R_;
  pointwise_shards(r, k);
}

/* Nonlinear elementwise ops: a Partial input is reduced first. */
int lm_rule_pointwise(lm_rule *r) {
  for (int k = 0; k < nmesh(r); k++) reduce_then_shard(r, k);
  return 0;
}

static bool any_partial(const lm_rule *r, int k, int *op) {
  for (int i = 0; i < r->nin; i++)
    if (is(r->want[i][k], LM_PARTIAL)) { *op = r->want[i][k].op; return true; }
  return false;
}

/* Elementwise ops linear in each input (add, sub, neg, copies): Partial
 * survives; a replicated term joins as a Partial so it is added once. */
int lm_rule_linear_pw(lm_rule *r) {
  for (int k = 0; k < nmesh(r); k++) {
    int op;
    bool shard = false;
    for (int i = 0; i < r->nin; i++) shard |= is(r->want[i][k], LM_SHARD);
    if (any_partial(r, k, &op) && !shard && op == LM_RED_SUM) {
      for (int i = 0; i < r->nin; i++) r->want[i][k] = P_(LM_RED_SUM);
      for (int o = 0; o < r->nout; o++) r->out[o].pl[k] = P_(LM_RED_SUM);
      continue;
    }
    if (any_partial(r, k, &op) && !shard && r->nin == 1) { /* a copy keeps any Partial */
      r->out[0].pl[k] = r->want[0][k];
      continue;
    }
    reduce_then_shard(r, k);
  }
  return 0;
}

/* mul and div: Partial(sum) times (or over) a replicated tensor stays
 * Partial; Partial times Partial reduces first. */
int lm_rule_mul(lm_rule *r) {
  bool div = r->op == LM_OP_DIV;
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement a = r->want[0][k], b = r->want[1][k];
    bool pa = is(a, LM_PARTIAL) && a.op == LM_RED_SUM, pb = is(b, LM_PARTIAL) && b.op == LM_RED_SUM;
    if ((pa && is(b, LM_REPLICATE)) || (pb && !div && is(a, LM_REPLICATE))) {
      for (int o = 0; o < r->nout; o++) r->out[o].pl[k] = P_(LM_RED_SUM);
      continue;
    }
    reduce_then_shard(r, k);
  }
  return 0;
}

/* Updates that run on each shard as it is (optimizers). */
int lm_rule_local(lm_rule *r) {
  for (int o = 0; o < r->nout; o++) r->out[o] = *r->in[0];
  return 0;
}

/* ---- matmul: (..., M, K) @ (..., K, N) ---- */

int lm_rule_matmul(lm_rule *r) {
  const lm_dspec *a = r->in[0], *b = r->in[1];
  if (a->nd < 2 || b->nd < 2) { /* vectors: whole */
    for (int k = 0; k < nmesh(r); k++) replicate_all(r, k);
    return 0;
  }
  const int64_t *shape = r->out[0].shape;
  int nb = r->out[0].nd - 2;
  int ka = a->nd - 1, kb = b->nd - 2, ma = a->nd - 2, nb_ = b->nd - 1;
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement pa = r->want[0][k], pb = r->want[1][k];
    lm_placement *out = &r->out[0].pl[k];
    bool sa = is(pa, LM_SHARD), sb = is(pb, LM_SHARD), ra = is(pa, LM_REPLICATE), rb = is(pb, LM_REPLICATE);
    if (sa && pa.dim == ka && sb && pb.dim == kb) *out = P_(LM_RED_SUM);
    else if (sa && pa.dim == ka && rb) r->want[1][k] = S_(kb), *out = P_(LM_RED_SUM);
    else if (ra && sb && pb.dim == kb) r->want[0][k] = S_(ka), *out = P_(LM_RED_SUM);
    else if (sa && pa.dim == ma && rb) *out = S_(nb);
    else if (ra && sb && pb.dim == nb_) *out = S_(nb + 1);
    else if (sa && pa.dim < ma && (rb || (sb && pb.dim < kb))) { /* batch dims */
      int od = pa.dim + (nb - (a->nd - 2));
      int db = od - (nb - (b->nd - 2));
      bool b_holds = db >= 0 && b->shape[db] == shape[od] && shape[od] > 1;
      r->want[1][k] = b_holds ? S_(db) : R_;
      *out = S_(od);
    } else if (is(pa, LM_PARTIAL) && pa.op == LM_RED_SUM && rb) *out = pa;
    else if (is(pb, LM_PARTIAL) && pb.op == LM_RED_SUM && ra) *out = pb;
    else if (ra && rb) *out = R_;
    else replicate_all(r, k);
  }
  return 0;
}

/* ---- reductions: attrs i[0] dim, i[1] keepdim; none = all elements ---- */

int lm_rule_reduce(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  bool all = r->a->ni == 0, keep = !all && r->a->ni > 1 && r->a->i[1];
  int d = all ? -1 : lm_wrap_dim(lm_op_name(r->op), "dim", r->a->i[0], x->nd);
  if (!all && d < 0) return -1;
  bool sum = r->op == LM_OP_SUM, mean = r->op == LM_OP_MEAN;
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    bool over = is(p, LM_SHARD) && (all || p.dim == d);
    bool even = is(p, LM_SHARD) && x->shape[p.dim] % x->mesh->shape[k] == 0;
    lm_placement o = p;
    if (is(p, LM_PARTIAL) && !(sum || mean)) r->want[0][k] = o = R_;
    else if (over && sum) o = P_(LM_RED_SUM);
    else if (over && mean && even) o = P_(LM_RED_AVG);
    else if (over) r->want[0][k] = o = R_;
    else if (is(p, LM_SHARD)) o = S_(keep || p.dim < d ? p.dim : p.dim - 1);
    for (int q = 0; q < r->nout; q++) r->out[q].pl[k] = o;
  }
  return 0;
}

/* ---- ops over trailing dims: softmax (i[0] = dim), norms (i[0] = number
 * of normalized trailing dims); further inputs (weights) are whole ---- */

int lm_rule_rows(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  bool norm = r->op == LM_OP_LAYER_NORM || r->op == LM_OP_RMS_NORM;
  int from;
  if (norm) from = x->nd - (int)(r->a->ni ? r->a->i[0] : 1);
  else if ((from = lm_wrap_dim(lm_op_name(r->op), "dim", r->a->ni ? r->a->i[0] : -1, x->nd)) < 0) return -1;
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    bool hits = is(p, LM_SHARD) && (norm ? p.dim >= from : p.dim == from);
    if (is(p, LM_PARTIAL) || hits) r->want[0][k] = R_;
    for (int i = 1; i < r->nin; i++) r->want[i][k] = R_;
    r->out[0].pl[k] = r->want[0][k];
    if (r->nout > 1) /* the norms' stats (2, x's leading dims) */
      r->out[1].pl[k] = is(r->want[0][k], LM_SHARD) ? S_(r->want[0][k].dim + 1) : R_;
  }
  return 0;
}

/* ---- shape ops ---- */

int lm_rule_transpose(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  int d0 = lm_wrap_dim("transpose", "dim0", r->a->i[0], x->nd), d1 = lm_wrap_dim("transpose", "dim1", r->a->i[1], x->nd);
  if (d0 < 0 || d1 < 0) return -1;
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    if (is(p, LM_SHARD)) p.dim = p.dim == d0 ? d1 : p.dim == d1 ? d0 : p.dim;
    r->out[0].pl[k] = p;
  }
  return 0;
}

int lm_rule_permute(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  int64_t where[LM_MAX_DIMS];
  for (int d = 0; d < x->nd; d++) where[lm_wrap_dim("permute", "dims", r->a->i[d], x->nd)] = d;
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    if (is(p, LM_SHARD)) p.dim = (int32_t)where[p.dim];
    r->out[0].pl[k] = p;
  }
  return 0;
}

/* narrow(dim, start, len): a shard on that dim is gathered first */
int lm_rule_narrow(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  int d = lm_wrap_dim("narrow", "dim", r->a->i[0], x->nd);
  for (int k = 0; k < nmesh(r); k++) {
    if (is(r->want[0][k], LM_SHARD) && r->want[0][k].dim == d) r->want[0][k] = R_;
    r->out[0].pl[k] = r->want[0][k];
  }
  return 0;
}

int lm_rule_unsqueeze(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  int d = lm_wrap_dim("unsqueeze", "dim", r->a->i[0], x->nd + 1);
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    if (is(p, LM_SHARD) && p.dim >= d) p.dim++;
    r->out[0].pl[k] = p;
  }
  return 0;
}

int lm_rule_squeeze(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  int only = r->a->ni > 0 ? lm_wrap_dim("squeeze", "dim", r->a->i[0], x->nd) : -1;
  int64_t where[LM_MAX_DIMS];
  for (int d = 0, nd = 0; d < x->nd; d++)
    where[d] = x->shape[d] == 1 && (only < 0 || only == d) ? -1 : nd++;
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    if (is(p, LM_SHARD) && where[p.dim] < 0) r->want[0][k] = p = R_;
    else if (is(p, LM_SHARD)) p.dim = (int32_t)where[p.dim];
    r->out[0].pl[k] = p;
  }
  return 0;
}

/* expand(sizes): sizes are global; the shard's dim gets its local size */
int lm_rule_expand(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  int nd = r->out[0].nd, lead = nd - x->nd;
  const int64_t *shape = r->out[0].shape;
  int64_t lshape[LM_MAX_DIMS], off[LM_MAX_DIMS];
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    if (is(p, LM_SHARD) && x->shape[p.dim] != shape[p.dim + lead]) r->want[0][k] = p = R_;
    if (is(p, LM_SHARD)) p.dim += lead;
    if (is(p, LM_PARTIAL)) r->want[0][k] = p = R_;
    r->out[0].pl[k] = p;
  }
  lm_shard_layout(r->out[0].mesh, nd, shape, r->out[0].pl, NULL, lshape, off);
  for (int d = 0; d < nd; d++) r->local.i[d] = lshape[d];
  return 0;
}

/* view/reshape(sizes): a shard survives when its dim is kept whole, or is
 * the first factor of a split or the first dim of a merge and the shard
 * divides evenly; otherwise the tensor is gathered first. */
int lm_rule_view(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  int nd = r->out[0].nd;
  const int64_t *shape = r->out[0].shape;
  /* group dims: [i0, i1) of x and [o0, o1) of the view cover equal products */
  int64_t out_of[LM_MAX_DIMS]; /* x dim -> the view dim its shard goes to, or -1 */
  for (int d = 0; d < x->nd; d++) out_of[d] = -1;
  int i = 0, o = 0;
  while (i < x->nd && o < nd) {
    int i0 = i, o0 = o;
    int64_t pi = x->shape[i++], po = shape[o++];
    while (pi != po) {
      if (pi < po && i < x->nd) pi *= x->shape[i++];
      else if (o < nd) po *= shape[o++];
      else break;
    }
    /* the first x dim of a group maps to the first view dim of it */
    out_of[i0] = (i - i0 == 1 || o - o0 == 1) ? o0 : -1;
  }
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    if (is(p, LM_SHARD)) {
      int od = (int)out_of[p.dim];
      int64_t parts = x->mesh->shape[k];
      if (od < 0 || shape[od] % parts != 0 || x->shape[p.dim] % parts != 0) r->want[0][k] = p = R_;
      else p.dim = od;
    }
    r->out[0].pl[k] = p;
  }
  int64_t lshape[LM_MAX_DIMS], off[LM_MAX_DIMS];
  lm_shard_layout(r->out[0].mesh, nd, shape, r->out[0].pl, NULL, lshape, off);
  for (int d = 0; d < nd; d++) r->local.i[d] = lshape[d];
  return 0;
}

/* cat(tensors; dim): inputs agree on their placements, none shards dim */
int lm_rule_cat(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  int d = lm_wrap_dim("cat", "dim", r->a->i[0], x->nd);
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    if ((is(p, LM_SHARD) && p.dim == d) || is(p, LM_PARTIAL)) p = R_;
    for (int i = 0; i < r->nin; i++) r->want[i][k] = p;
    r->out[0].pl[k] = p;
  }
  return 0;
}

/* ---- nn ops ---- */

/* embedding(weight (V, D), ids): the embedding dim sharded gives a shard
 * of the output's last dim; the vocabulary sharded gives a Partial sum,
 * each rank looking up its own rows and zeros for the others' (attrs:
 * i[0] = first row held, i[1] = 1 to mask ids outside the shard, i[2] =
 * the whole vocabulary, against which ids are checked). */
int lm_rule_embedding(lm_rule *r) {
  const lm_dspec *w = r->in[0], *ids = r->in[1];
  int vocab_shards = 0;
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement pw = r->want[0][k], pi = r->want[1][k];
    if (is(pi, LM_PARTIAL)) r->want[1][k] = pi = R_;
    if (is(pw, LM_PARTIAL)) r->want[0][k] = pw = R_;
    if (is(pw, LM_SHARD) && is(pi, LM_SHARD)) r->want[1][k] = pi = R_;
    if (is(pw, LM_SHARD) && pw.dim == 1) r->out[0].pl[k] = S_(ids->nd);
    else if (is(pw, LM_SHARD) && !vocab_shards) r->out[0].pl[k] = P_(LM_RED_SUM), vocab_shards++;
    else if (is(pw, LM_SHARD)) r->want[0][k] = R_, r->out[0].pl[k] = pi; /* one vocab shard at a time */
    else r->out[0].pl[k] = pi;
  }
  if (vocab_shards) {
    int64_t lshape[LM_MAX_DIMS], off[LM_MAX_DIMS];
    lm_shard_layout(w->mesh, 2, w->shape, r->want[0], NULL, lshape, off);
    r->local.i[0] = off[0], r->local.i[1] = 1, r->local.i[2] = w->shape[0], r->local.ni = 3;
  }
  return 0;
}

/* cross_entropy(logits (N, C), target [, weight]): whole classes; the rows
 * may be sharded (each rank's loss is then a term: mean becomes a sum of
 * shares, which the op cannot know, so rows are gathered for mean). */
int lm_rule_cross_entropy(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  int red = r->a->ni > 1 ? (int)r->a->i[1] : 1;
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    bool rows = is(p, LM_SHARD) && p.dim == 0 && x->nd == 2 && red != 1;
    if (rows) {
      r->want[1][k] = S_(0);
      for (int i = 2; i < r->nin; i++) r->want[i][k] = R_;
      r->out[0].pl[k] = red == 0 ? S_(0) : P_(LM_RED_SUM);
      if (r->nout > 1) r->out[1].pl[k] = S_(0); /* lse (N) */
    } else replicate_all(r, k);
  }
  return 0;
}

/* attention on (..., L, E): batch and head dims may be sharded alike */
int lm_rule_sdpa(lm_rule *r) {
  const lm_dspec *q = r->in[0];
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    bool batch = is(p, LM_SHARD) && p.dim < q->nd - 2;
    for (int i = 0; i < r->nin; i++) {
      int lead = r->in[i]->nd - q->nd, d = batch ? p.dim + lead : -1;
      r->want[i][k] = batch && d >= 0 && r->in[i]->shape[d] == q->shape[p.dim] ? S_(d) : R_;
    }
    r->out[0].pl[k] = batch ? p : R_;
    if (r->nout > 1) r->out[1].pl[k] = r->out[0].pl[k]; /* lse (..., L): the same batch dims */
  }
  return 0;
}

/* rope(x (..., T, H, D), cos, sin): x may be sharded on batch or heads */
int lm_rule_rope(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    bool keep = is(p, LM_SHARD) && (p.dim < x->nd - 3 || p.dim == x->nd - 2);
    r->want[0][k] = keep ? p : R_;
    r->want[1][k] = r->want[2][k] = R_;
    r->out[0].pl[k] = r->want[0][k];
  }
  return 0;
}

/* triu/tril: the last two dims whole; a Partial survives (it is linear) */
int lm_rule_last2(lm_rule *r) {
  const lm_dspec *x = r->in[0];
  for (int k = 0; k < nmesh(r); k++) {
    lm_placement p = r->want[0][k];
    if (is(p, LM_SHARD) && p.dim >= x->nd - 2) r->want[0][k] = p = R_;
    r->out[0].pl[k] = p;
  }
  return 0;
}

/* the rule column of op_list.h ("none": the op does not take DTensors) */
#define lm_rule_none NULL
const lm_rule_fn lm_rule_table[LM_NOPS] = {
#define LM_OP(ID, NAME, NIN, NOUT, KIND, FLAGS, SHAPE, FW, BW, RULE, SLOT) [LM_OP_##ID] = lm_rule_##RULE,
#include "../op_list.h"
#undef LM_OP
};
