/* autograd.c: the tape. Ops record a node per call while grad mode is on;
 * lm_backward walks the nodes reachable from a root in reverse creation
 * order, calling each op's backward and summing gradients into leaves. */
#include "internal.h"
#include <stdlib.h>
#include <string.h>

static _Thread_local int grad_enabled = 1;
static int64_t next_seq;
static lm_grad_ready_fn grad_ready;

int lm_is_grad_enabled(void) { return grad_enabled; }
int lm_set_grad_enabled(int flag) { int old = grad_enabled; grad_enabled = flag != 0; return old; }
void lm_set_grad_ready_callback(lm_grad_ready_fn fn) { grad_ready = fn; }

int lm_set_requires_grad(lm_tensor *t, int flag) {
  if (!t) return lm_error("requires_grad: tensor is nil");
  if (t->grad_fn_)
    return lm_error("requires_grad: only leaves can change it; this tensor was made by %s "
                    "(use detach() first)", lm_op_name(t->grad_fn_->op));
  if (flag && !lm_is_float(t->dtype_))
    return lm_error("requires_grad: only floating point tensors can require grad, got %s",
                    lm_dtype_name(t->dtype_));
  t->needs_grad = flag != 0;
  return 0;
}

lm_tensor *lm_grad(lm_tensor *t) { if (t && t->grad_) lm_retain(t->grad_); return t ? t->grad_ : NULL; }

int lm_set_grad(lm_tensor *t, lm_tensor *g) {
  if (!t) return lm_error("grad: tensor is nil");
  if (g && (g->ndim != t->ndim || memcmp(g->shape, t->shape, t->ndim * 8)))
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
  lm_tensor *d = lm_view_of(t, t->ndim, t->shape, t->stride_, t->offset);
  if (d && t->dist && lm_attach_spec(d, t->dist) < 0) { lm_release(d); return NULL; }
  return d;
}

void lm_node_release(lm_node *n) {
  if (!n || __atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  for (int i = 0; i < n->nin; i++) lm_release(n->in[i]);
  for (int k = 0; k < n->nout; k++) lm_release(n->out[k]);
  free(n);
}

/* A tensor leaving memory stops being a node's retained output. */
void lm_forget_retained(lm_tensor *t) {
  if (t->retains_grad && t->grad_fn_ && t->grad_fn_->retained[t->output_nr] == t)
    t->grad_fn_->retained[t->output_nr] = NULL;
}

int lm_record(int op, const lm_op_def *def, int nin, lm_tensor *const *in,
              const lm_attrs *a, int nout, lm_tensor **out) {
  if (!grad_enabled || !def->backward) return 0;
  int needed = 0;
  for (int i = 0; i < nin; i++) needed |= in[i]->needs_grad;
  if (!needed) return 0;
  /* one block: the node, then its four pointer arrays */
  lm_node *n = calloc(1, sizeof *n + sizeof(lm_tensor *) * (nin + 3 * nout));
  if (!n) return lm_error("%s: out of memory recording autograd", def->name);
  n->in = (lm_tensor **)(n + 1);
  n->out = n->in + nin;
  n->retained = n->out + nout;
  n->gsum = n->retained + nout;
  n->op = op, n->nin = nin, n->nout = nout, n->attrs = *a;
  n->seq = __atomic_fetch_add(&next_seq, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < nin; i++) lm_retain(n->in[i] = in[i]);
  for (int k = 0; k < nout; k++) {
    n->out[k] = lm_detach(out[k]);
    if (!lm_is_float(out[k]->dtype_)) continue;
    out[k]->grad_fn_ = n;
    out[k]->output_nr = (uint8_t)k;
    out[k]->needs_grad = 1;
    n->refcount++;
  }
  if (n->refcount == 0) { n->refcount = 1; lm_node_release(n); }
  return 0;
}

lm_tensor *lm_grad_like(lm_tensor *g, const lm_tensor *t) {
  if (!g) return NULL;
  lm_retain(g);
  int lead = g->ndim - t->ndim;
  for (int d = g->ndim - 1; d >= 0; d--) {
    if (d >= lead && (t->shape[d - lead] != 1 || g->shape[d] == 1)) continue;
    lm_attrs a = {.i = {d, 1}, .ni = 2};
    lm_tensor *s = lm_call("sum", 1, &g, &a);
    lm_release(g);
    if (!(g = s)) return NULL;
  }
  if (g->ndim != t->ndim) {
    lm_attrs a = {.ni = t->ndim};
    memcpy(a.i, t->shape, t->ndim * sizeof *t->shape);
    lm_tensor *v = lm_call("reshape", 1, &g, &a);
    lm_release(g);
    if (!(g = v)) return NULL;
  }
  lm_tensor *c = lm_cast(g, t->dtype_);
  lm_release(g);
  return c;
}

/* g += x, or g = x when g is empty; x is consumed. */
static int accumulate(lm_tensor **g, lm_tensor *x) {
  if (!*g) { *g = x; return 0; }
  lm_tensor *in[2] = {*g, x};
  lm_tensor *s = lm_call("add", 2, in, NULL);
  lm_release(x);
  if (!s) return -1;
  lm_release(*g);
  *g = s;
  return 0;
}

/* leaf.grad += g (g consumed); a DTensor leaf's gradient gets its spec */
static int accumulate_leaf(lm_tensor *leaf, lm_tensor *g) {
  if (g->dtype_ != leaf->dtype_) {
    lm_tensor *c = lm_cast(g, leaf->dtype_);
    lm_release(g);
    if (!(g = c)) return -1;
  }
  if (leaf->grad_) {
    lm_tensor *in[2] = {leaf->grad_, g};
    lm_tensor *s = lm_call("add", 2, in, NULL);
    lm_release(g);
    if (!(g = s)) return -1;
  }
  if (leaf->dist) {
    lm_tensor *d = lm_view_of(g, g->ndim, g->shape, g->stride_, g->offset);
    lm_release(g);
    if (!(g = d) || lm_attach_spec(g, leaf->dist) < 0) { lm_release(g); return -1; }
  }
  lm_release(leaf->grad_);
  leaf->grad_ = g;
  return 0;
}

typedef struct { lm_node **v; int n, cap; } nodes;
static int push(nodes *s, lm_node *x) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 64;
    lm_node **v = realloc(s->v, s->cap * sizeof *v);
    if (!v) return lm_error("backward: out of memory");
    s->v = v;
  }
  s->v[s->n++] = x;
  return 0;
}
static int by_seq_desc(const void *a, const void *b) {
  int64_t x = (*(lm_node *const *)a)->seq, y = (*(lm_node *const *)b)->seq;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Counts, for each leaf, the edges into it, so its hook fires when the
 * last one has been walked. Leaves are kept in a small list. */
typedef struct { lm_tensor **t; int *left; int n, cap; } leaves;
static int leaf_slot(leaves *l, lm_tensor *t) {
  for (int i = 0; i < l->n; i++) if (l->t[i] == t) return i;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    l->t = realloc(l->t, l->cap * sizeof *l->t);
    l->left = realloc(l->left, l->cap * sizeof *l->left);
  }
  l->t[l->n] = t, l->left[l->n] = 0;
  return l->n++;
}

static int run(lm_node *root_node, nodes *order, leaves *lv) {
  static int64_t pass;
  int visit = (int)++pass;
  nodes stack = {0};
  int rc = push(&stack, root_node);
  root_node->visit = visit;
  while (rc == 0 && stack.n) {
    lm_node *n = stack.v[--stack.n];
    if ((rc = push(order, n)) < 0) break;
    for (int i = 0; i < n->nin; i++) {
      lm_tensor *t = n->in[i];
      if (!t->needs_grad) continue;
      if (!t->grad_fn_) { /* leaf_slot may move lv->left: index after */
        int k = leaf_slot(lv, t);
        lv->left[k]++;
        continue;
      }
      if (t->grad_fn_->visit != visit) {
        t->grad_fn_->visit = visit;
        if ((rc = push(&stack, t->grad_fn_)) < 0) break;
      }
    }
  }
  free(stack.v);
  if (rc < 0) return -1;
  qsort(order->v, order->n, sizeof *order->v, by_seq_desc);
  for (int j = 0; j < order->n && rc == 0; j++) {
    lm_node *n = order->v[j];
    const lm_op_def *def = lm_op_def_of(n->op);
    int any = 0;
    for (int k = 0; k < n->nout; k++) any |= n->gsum[k] != NULL;
    lm_tensor **gin = calloc(n->nin, sizeof *gin);
    if (!gin) rc = lm_error("backward: out of memory");
    if (any) {
      for (int k = 0; k < n->nout && rc == 0; k++) {
        if (!n->gsum[k]) {
          n->gsum[k] = lm_empty_like(n->out[k]);
          if (!n->gsum[k] || lm_fill_(n->gsum[k], 0) < 0) rc = -1;
        }
        if (n->retained[k]) rc = rc ? rc : lm_set_grad(n->retained[k], n->gsum[k]);
      }
      if (rc == 0 && def->backward(n, n->gsum, gin) < 0) rc = -1;
    }
    for (int k = 0; k < n->nout; k++) lm_release(n->gsum[k]), n->gsum[k] = NULL;
    for (int i = 0; gin && i < n->nin; i++) {
      lm_tensor *t = n->in[i], *g = gin[i];
      if (!t->needs_grad || rc < 0) { lm_release(g); continue; }
      if (t->grad_fn_) {
        if (g && accumulate(&t->grad_fn_->gsum[t->output_nr], g) < 0) rc = -1;
        continue;
      }
      int s = leaf_slot(lv, t);
      if (g && accumulate_leaf(t, g) < 0) rc = -1;
      if (--lv->left[s] == 0 && grad_ready && rc == 0) grad_ready(t);
    }
    free(gin);
  }
  for (int j = 0; j < order->n; j++)
    for (int k = 0; k < order->v[j]->nout; k++)
      lm_release(order->v[j]->gsum[k]), order->v[j]->gsum[k] = NULL;
  return rc;
}

int lm_backward(lm_tensor *root, lm_tensor *grad) {
  if (!root) return lm_error("backward: tensor is nil");
  if (!root->needs_grad)
    return lm_error("backward: the tensor does not require grad and has no grad_fn");
  if (grad) {
    if (grad->ndim != root->ndim || memcmp(grad->shape, root->shape, root->ndim * 8))
      return lm_error("backward: argument #1 (gradient) expected the shape of the tensor");
    lm_retain(grad);
  } else {
    if (root->numel_ != 1)
      return lm_error("backward: grad can be implicitly created only for scalar outputs, "
                      "got %lld elements", (long long)root->numel_);
    grad = lm_empty_like(root);
    if (!grad || lm_fill_(grad, 1) < 0) return -1;
  }
  int old = lm_set_grad_enabled(0), old_local = lm_set_dist_local_mode(1);
  int rc;
  if (!root->grad_fn_) {
    rc = accumulate_leaf(root, grad);
    if (rc == 0 && grad_ready) grad_ready(root);
  } else {
    nodes order = {0};
    leaves lv = {0};
    root->grad_fn_->gsum[root->output_nr] = grad;
    rc = run(root->grad_fn_, &order, &lv);
    free(order.v), free(lv.t), free(lv.left);
  }
  lm_set_grad_enabled(old);
  lm_set_dist_local_mode(old_local);
  return rc;
}
