/* embedding.c: embedding and its backward. Ids in attrs and tensors are
 * 0-based; messages print them 1-based, as the Lua user wrote them. Floats
 * compute in f32 (f64 stays f64). */
#include "op.h"
#include <string.h>

/* ---- embedding(w (V, D), idx (any shape, integer, 0-based)): idx.shape + (D) ----
 * On a vocabulary shard, attrs i[0] = the shard's first row, i[1] = 1 and
 * i[2] = the whole vocabulary's size. */
int lm_shape_embedding(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin, (void)a;
  const lm_meta *w = &in[0], *idx = &in[1];
  if (w->ndim != 2)
    return lm_error("embedding: argument #1 (weight) expected 2 dims (vocabulary, dim), got %d", w->ndim);
  if (idx->dtype != LM_I64 && idx->dtype != LM_I32)
    return lm_error("embedding: argument #2 (indices) expected an integer tensor (i64 or i32), got %s",
                    lm_dtype_name(idx->dtype));
  if (idx->ndim + 1 > LM_MAX_DIMS)
    return lm_error("embedding: argument #2 (indices) expected at most %d dims, got %d",
                    LM_MAX_DIMS - 1, idx->ndim);
  *out = *idx;
  out->dtype = w->dtype;
  out->shape[out->ndim++] = w->shape[1];
  return 0;
}

static bool vocab_shard(const lm_attrs *a) { return a->ni >= 2 && a->i[1]; }

/* On a vocabulary shard, ids become rows of the shard; ids outside it read
 * row 0 and *inside says which to keep. Else the ids are used as they are. */
static lm_tensor *shard_ids(lm_scope *s, lm_tensor *idx, const lm_attrs *a, int64_t rows,
                            lm_tensor **inside) {
  lm_tensor *ids = lm_s_cast(s, idx, LM_I64);
  *inside = NULL;
  if (!vocab_shard(a) || !ids) return ids;
  lm_tensor *shifted = lm_s2(s, LM_OP_SUB, ids, lm_scalar(s, (double)a->i[0], ids));
  *inside = lm_s2(s, LM_OP_LOGICAL_AND, lm_s2(s, LM_OP_GE, shifted, lm_scalar(s, 0, ids)),
                  lm_s2(s, LM_OP_LT, shifted, lm_scalar(s, (double)rows, ids)));
  return lm_s_where(s, *inside, shifted, lm_scalar(s, 0, ids));
}

/* rows of out (ids.shape + (D)) whose id was outside the shard, zeroed */
static lm_tensor *keep_rows(lm_scope *s, lm_tensor *out, lm_tensor *inside) {
  if (!inside) return out;
  lm_attrs last = {.i = {-1}, .ni = 1};
  return lm_s_where(s, lm_sop(s, LM_OP_UNSQUEEZE, 1, &inside, &last), out, lm_scalar(s, 0, out));
}

int lm_fw_embedding(const lm_call *c, lm_tensor **out) {
  lm_tensor *w = c->in[0], *idx = c->in[1];
  int64_t vocab = vocab_shard(c->a) && c->a->ni >= 3 ? c->a->i[2] : w->shape_[0];
  LM_TRY(lm_check_ids("embedding", 2, "indices", idx, vocab, 0, 0, "id"));
  const lm_backend *be = LM_KERNEL(c->op, w, embedding);
  lm_scope s = {0};
  lm_tensor *inside, *ids = be ? shard_ids(&s, idx, c->a, w->shape_[0], &inside) : NULL;
  lm_tensor *wc = lm_s_contig(&s, w), *ic = lm_s_contig(&s, ids);
  lm_tensor *o = ic && wc ? lm_s(&s, lm_empty_meta(&c->out[0], w)) : NULL;
  lm_tensor *r = o && be->embedding(o, wc, ic) == 0 ? keep_rows(&s, o, inside) : NULL;
  if (r) lm_retain(r);
  lm_scope_end(&s);
  return (*out = r) ? 0 : -1;
}

/* dw (V, D) in cd: the rows of g added at the ids */
static lm_tensor *index_add_rows(lm_scope *s, int op, lm_tensor *g, lm_tensor *idx, int64_t V, int cd) {
  const lm_backend *be = LM_KERNEL(op, g, index_add);
  if (!be) return NULL;
  int64_t D = g->ndim ? g->shape_[g->ndim - 1] : 1, shape[2] = {V, D}, gshape[2] = {idx->numel_, D};
  lm_tensor *dw = lm_s(s, lm_empty(2, shape, cd, g->device_));
  lm_tensor *g2 = lm_s_reshape(s, lm_s_contig(s, lm_s_cast(s, g, cd)), 2, gshape);
  lm_tensor *ic = lm_s_contig(s, lm_s_cast(s, idx, LM_I64));
  if (!dw || !g2 || !ic || lm_fill_(dw, 0) < 0 || be->index_add(dw, ic, g2) < 0) return NULL;
  return dw;
}

int lm_bw_embedding(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *w = n->in[0];
  if (!w->needs_grad) return 0;
  lm_scope s = {0};
  lm_tensor *inside, *ids = shard_ids(&s, n->in[1], &n->attrs, w->shape_[0], &inside);
  lm_tensor *g = keep_rows(&s, gout[0], inside);
  lm_tensor *dw = g && ids ? index_add_rows(&s, n->op, g, ids, w->shape_[0], lm_compute_dtype(w->dtype_)) : NULL;
  int rc = dw ? lm_give(n, gin, 0, dw) : -1;
  lm_scope_end(&s);
  return rc;
}
