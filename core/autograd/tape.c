/* tape.c: grad mode, leaves, and the nodes ops record (one per call). */
#include "autograd.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local int grad_enabled = 1;
static int64_t next_seq;

int lm_is_grad_enabled(void) { return grad_enabled; }
int lm_set_grad_enabled(int flag) { int old = grad_enabled; grad_enabled = flag != 0; return old; }

int lm_set_requires_grad(lm_tensor *t, int flag) {
  if (!t) return lm_error("requires_grad: tensor is nil");
  if (t->freed) return lm_error("requires_grad: the tensor was freed (t:free())");
  if (t->grad_fn_)
    return lm_error("requires_grad: only leaves can change it; this tensor was made by %s "
                    "(use detach() first)", lm_op_name(t->grad_fn_->call.op));
  if (flag && !lm_is_float(t->dtype_))
    return lm_error("requires_grad: only floating point tensors can require grad, got %s",
                    lm_dtype_name(t->dtype_));
  t->needs_grad = flag != 0;
  return 0;
}

lm_tensor *lm_grad(lm_tensor *t) { if (t && t->grad_) lm_retain(t->grad_); return t ? t->grad_ : NULL; }

int lm_set_grad(lm_tensor *t, lm_tensor *g) {
  if (!t) return lm_error("grad: tensor is nil");
  if (g && (g->ndim != t->ndim || memcmp(g->shape_, t->shape_, t->ndim * sizeof *t->shape_)))
    return lm_error("grad: expected the shape of the tensor");
  lm_retain(g);
  lm_release(t->grad_);
  t->grad_ = g;
  return 0;
}

int lm_retain_grad(lm_tensor *t) {
  if (!t->needs_grad) return lm_error("retain_grad: tensor does not require grad");
  if (t->grad_fn_) {
    t->grad_fn_->retained[t->output_nr] = t;
    t->retains_grad = 1;
  }
  return 0;
}

/* An alias without history; a DTensor stays a DTensor. */
lm_tensor *lm_detach(lm_tensor *t) {
  if (t->freed) { lm_error("detach: the tensor was freed (t:free())"); return NULL; }
  lm_tensor *d = lm_view_of(t, t->ndim, t->shape_, t->stride_, t->offset);
  if (d && lm_copy_parts(d, t) < 0) { lm_release(d); return NULL; }
  return d;
}

/* A tensor leaving memory stops being its node's retained output, and
 * drops its reference to the node. */
static void release_node(lm_part *p, lm_tensor *owner) {
  lm_node *n = (lm_node *)p;
  if (owner->retains_grad && n->retained[owner->output_nr] == owner) n->retained[owner->output_nr] = NULL;
  if (__atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  for (int i = 0; i < n->call.nin; i++) lm_release(n->call.in[i]);
  for (int k = 0; k < n->call.nout; k++) lm_release(n->call.out[k]);
  free(n);
}
static const lm_part_ops node_ops = {.release = release_node};

/* t is autocast's kind of cast, a bf16/f16 copy of an f32 tensor, or a
 * transpose of one (F.linear's w:to("bf16"):t(); transpose's backward keeps
 * the gradient's dtype): its consumers may give its gradient in f32
 * (lm_saved.wide_grad) */
static int is_wide_cast(const lm_tensor *t) {
  const lm_node *n = t->grad_fn_;
  if (!n || (t->dtype_ != LM_BF16 && t->dtype_ != LM_F16)) return 0;
  if (n->call.op == LM_OP_TRANSPOSE) return n->call.wide_grad & 1;
  return n->call.op == LM_OP_TO && n->call.in[0]->dtype_ == LM_F32;
}

int lm_record(int op, int nin, lm_tensor *const *in, const lm_attrs *a, int nout, lm_tensor **out) {
  const lm_op_def *def = lm_op_def_of(op);
  if (!grad_enabled || !def->backward) return 0;
  int needed = 0;
  for (int i = 0; i < nin; i++) needed |= in[i]->needs_grad;
  if (!needed) return 0;
  /* one block: the node, its versions, then its four pointer arrays */
  lm_node *n = calloc(1, sizeof *n + sizeof(int64_t) * (nin + nout) + sizeof(lm_tensor *) * (nin + 3 * nout));
  if (!n) return lm_error("%s: out of memory recording autograd", def->name);
  n->part.ops = &node_ops;
  n->call = (lm_saved){.op = op, .nin = nin, .nout = nout, .attrs = *a};
  n->version = (int64_t *)(n + 1);
  n->call.in = (lm_tensor **)(n->version + nin + nout);
  n->call.out = n->call.in + nin;
  n->retained = n->call.out + nout;
  n->gsum = n->retained + nout;
  n->seq = __atomic_fetch_add(&next_seq, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < nin; i++) {
    lm_retain(n->call.in[i] = in[i]), n->version[i] = lm_tensor_version(in[i]);
    if (i < 32 && is_wide_cast(in[i])) n->call.wide_grad |= 1u << i;
  }
  int rc = 0;
  for (int k = 0; k < nout; k++) {
    if (!(n->call.out[k] = lm_detach(out[k]))) rc = -1;
    n->version[nin + k] = lm_tensor_version(out[k]);
    if (!lm_is_float(out[k]->dtype_)) continue;
    out[k]->grad_fn_ = n;
    out[k]->output_nr = (uint8_t)k;
    out[k]->needs_grad = 1;
    n->refcount++;
  }
  if (n->refcount == 0) { /* no float output: nothing points at it */
    n->refcount = 1;
    lm_tensor dummy = {0};
    release_node(&n->part, &dummy);
  }
  return rc;
}

static void describe_shape(const lm_tensor *t, char *buf, size_t len) {
  int n = snprintf(buf, len, "(");
  for (int d = 0; d < t->ndim && n < (int)len; d++)
    n += snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)t->shape_[d]);
  if (n < (int)len) snprintf(buf + n, len - n, ")");
}

int lm_check_saved(const lm_node *n) {
  const lm_op_def *def = lm_op_def_of(n->call.op);
  if (def->flags & LM_OPF_NOSAVE) return 0;
  int nin = n->call.nin;
  for (int k = 0; k < nin + n->call.nout; k++) {
    const lm_tensor *t = k < nin ? n->call.in[k] : n->call.out[k - nin];
    int64_t now = lm_tensor_version(t);
    if (now == n->version[k]) continue;
    char shape[160], which[48];
    describe_shape(t, shape, sizeof shape);
    if (k < nin) snprintf(which, sizeof which, "its argument #%d", k + 1);
    else snprintf(which, sizeof which, "its output #%d", k - nin + 1);
    return lm_error("backward: a tensor needed for the gradient was modified in place: %s of %s, "
                    "a %s tensor of shape %s, is at version %lld but %s saved it at version %lld "
                    "(change a clone, or make the change before the forward)", which, def->name,
                    lm_dtype_name(t->dtype_), shape, (long long)now, def->name, (long long)n->version[k]);
  }
  return 0;
}

/* An op that is not in place and answers one of its inputs itself
 * (contiguous of a contiguous tensor, a cast to its own dtype) gets an
 * alias of it instead: recording would otherwise give the input the node
 * as its history, and backward would never reach it. */
static int unalias(int nin, lm_tensor *const *in, int nout, lm_tensor **out) {
  int rc = 0;
  for (int k = 0; k < nout; k++)
    for (int i = 0; i < nin && out[k]; i++) {
      if (out[k] != in[i]) continue;
      lm_tensor *d = lm_detach(in[i]);
      lm_release(out[k]);
      if (!(out[k] = d)) rc = -1;
    }
  if (rc < 0)
    for (int k = 0; k < nout; k++) lm_release(out[k]), out[k] = NULL;
  return rc;
}

/* the op on (local) tensors, bumping the versions of what it updates in
 * place, recorded on the tape */
int lm_run_recorded(int op, int nin, lm_tensor *const *in, const lm_attrs *a, lm_tensor **out) {
  /* an in-place op's inputs change as it runs: their versions move first
   * (an op that fails half-way has still changed them), so the op can note
   * the version it leaves (a weight's kept copy, tensor.h) */
  bool inplace = lm_op_def_of(op)->flags & LM_OPF_INPLACE;
  for (int i = 0; inplace && i < nin; i++) lm_bump_version(in[i]);
  int nout = lm_op_run(op, nin, in, a, out);
  if (nout >= 0 && !inplace && unalias(nin, in, nout, out) < 0) return -1;
  if (nout >= 0 && lm_record(op, nin, in, a, nout, out) < 0) {
    for (int k = 0; k < nout; k++) lm_release(out[k]), out[k] = NULL;
    return -1;
  }
  return nout;
}
