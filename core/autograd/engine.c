/* engine.c: backward. Walks the nodes reachable from a root in reverse
 * creation order, calls each op's backward, sums gradients into leaves and
 * tells the grad-ready callback when a leaf's gradient is complete. */
#include "autograd.h"
#include "../tensor/trace.h"
#include <stdlib.h>
#include <string.h>

static lm_grad_ready_fn grad_ready;
static lm_pre_backward_fn pre_backward;
void lm_set_grad_ready_callback(lm_grad_ready_fn fn) { grad_ready = fn; }
void lm_set_pre_backward_callback(lm_pre_backward_fn fn) { pre_backward = fn; }

int lm_set_pre_backward(lm_tensor *t, int on) {
  if (!t || !t->grad_fn_) return lm_error("pre-backward hook: expected a tensor made by an op (with a grad_fn)");
  if (t->output_nr >= 32) return lm_error("pre-backward hook: output #%d is beyond 32", t->output_nr + 1);
  uint32_t bit = 1u << t->output_nr;
  t->grad_fn_->hooked = on ? t->grad_fn_->hooked | bit : t->grad_fn_->hooked & ~bit;
  return 0;
}

/* g += x, or g = x when g is empty; x is consumed. */
static int accumulate(lm_tensor **g, lm_tensor *x) {
  if (!*g) { *g = x; return 0; }
  lm_tensor *in[2] = {*g, x};
  lm_tensor *s = lm_run(LM_OP_ADD, 2, in, NULL);
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
    lm_tensor *s = lm_run(LM_OP_ADD, 2, in, NULL);
    lm_release(g);
    if (!(g = s)) return -1;
  }
  if (leaf->dist) { /* a DTensor leaf's gradient is a DTensor alike */
    lm_tensor *d = lm_view_of(g, g->ndim, g->shape_, g->stride_, g->offset);
    lm_release(g);
    if (!(g = d) || lm_copy_parts(g, leaf) < 0) { lm_release(g); return -1; }
  }
  lm_release(leaf->grad_);
  leaf->grad_ = g;
  return 0;
}

/* output k's retained .grad, in the output's dtype (a gradient given
 * wide, lm_saved.wide_grad, is f32 for a bf16 output) */
static int retain(lm_node *n, int k) {
  lm_tensor *g = lm_cast(n->gsum[k], n->call.out[k]->dtype_);
  int rc = g ? lm_set_grad(n->retained[k], g) : -1;
  lm_release(g);
  return rc;
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
static int leaf_slot(leaves *l, lm_tensor *t) { /* -1 when out of memory */
  for (int i = 0; i < l->n; i++) if (l->t[i] == t) return i;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    lm_tensor **tv = realloc(l->t, cap * sizeof *tv);
    if (tv) l->t = tv;
    int *left = tv ? realloc(l->left, cap * sizeof *left) : NULL;
    if (!left) return lm_error("backward: out of memory");
    l->left = left, l->cap = cap;
  }
  l->t[l->n] = t, l->left[l->n] = 0;
  return l->n++;
}

/* a node's backward, recorded for the trace (loom.profiler) when it is on */
static int backward_node(const lm_op_def *def, lm_node *n, lm_tensor **gin) {
  if (!lm_trace_on) return def->backward(&n->call, n->gsum, gin);
  lm_trace_op r;
  lm_trace_op_begin(&r, LM_TRACE_BACKWARD, n->call.op, n->call.nin, n->call.in);
  int rc = def->backward(&n->call, n->gsum, gin);
  lm_trace_op_end(&r, rc);
  return rc;
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
    for (int i = 0; i < n->call.nin; i++) {
      lm_tensor *t = n->call.in[i];
      if (!t->needs_grad) continue;
      if (!t->grad_fn_) { /* leaf_slot may move lv->left: index after */
        int k = leaf_slot(lv, t);
        if ((rc = k < 0 ? -1 : 0) < 0) break;
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
    const lm_op_def *def = lm_op_def_of(n->call.op);
    int any = 0;
    for (int k = 0; k < n->call.nout; k++) any |= n->gsum[k] != NULL;
    lm_tensor **gin = calloc(n->call.nin, sizeof *gin);
    if (!gin) rc = lm_error("backward: out of memory");
    if (any) {
      for (int k = 0; k < n->call.nout && rc == 0; k++) {
        if (!n->gsum[k]) {
          n->gsum[k] = lm_empty_like(n->call.out[k]);
          if (!n->gsum[k] || lm_fill_(n->gsum[k], 0) < 0) rc = -1;
        }
        if (n->retained[k] && rc == 0) rc = retain(n, k);
      }
      for (int k = 0; rc == 0 && pre_backward && k < n->call.nout; k++)
        if (n->hooked & (1u << k)) pre_backward(n, k);
      if (rc == 0) rc = lm_check_saved(n);
      if (rc == 0 && backward_node(def, n, gin) < 0) rc = -1;
    }
    for (int k = 0; k < n->call.nout; k++) lm_release(n->gsum[k]), n->gsum[k] = NULL;
    for (int i = 0; gin && i < n->call.nin; i++) {
      lm_tensor *t = n->call.in[i], *g = gin[i];
      if (!t->needs_grad || rc < 0) { lm_release(g); continue; }
      if (t->grad_fn_) {
        if (g && accumulate(&t->grad_fn_->gsum[t->output_nr], g) < 0) rc = -1;
        continue;
      }
      int s = leaf_slot(lv, t); /* found: counted above */
      if (g && accumulate_leaf(t, g) < 0) rc = -1;
      if (s >= 0 && --lv->left[s] == 0 && grad_ready && rc == 0) grad_ready(t);
    }
    free(gin);
  }
  for (int j = 0; j < order->n; j++)
    for (int k = 0; k < order->v[j]->call.nout; k++)
      lm_release(order->v[j]->gsum[k]), order->v[j]->gsum[k] = NULL;
  return rc;
}

static void (*on_backward)(void);
void lm_autograd_on_backward(void (*fn)(void)) { on_backward = fn; }

int lm_backward(lm_tensor *root, lm_tensor *grad) {
  if (on_backward) on_backward();
  if (!root) return lm_error("backward: tensor is nil");
  if (root->freed) return lm_error("backward: the tensor was freed (t:free())");
  if (!root->needs_grad)
    return lm_error("backward: the tensor does not require grad and has no grad_fn");
  if (grad) {
    if (grad->ndim != root->ndim || memcmp(grad->shape_, root->shape_, root->ndim * sizeof *root->shape_))
      return lm_error("backward: argument #1 (gradient) expected the shape of the tensor");
    lm_retain(grad);
  } else {
    if (root->numel_ != 1)
      return lm_error("backward: grad can be implicitly created only for scalar outputs, "
                      "got %lld elements", (long long)root->numel_);
    grad = lm_empty_like(root);
    if (!grad || lm_fill_(grad, 1) < 0) return -1;
  }
  int old = lm_set_grad_enabled(0);
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
  return rc;
}
