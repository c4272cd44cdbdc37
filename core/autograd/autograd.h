/* autograd.h: the tape. Ops record a node per call while grad mode is on
 * (tape.c); lm_backward walks the nodes reachable from a root in reverse
 * creation order, calling each op's backward (engine.c). */
#ifndef LOOM_AUTOGRAD_H
#define LOOM_AUTOGRAD_H
#include "../ops/op.h"

struct lm_node {
  lm_part part;         /* a tensor's grad_fn_ (see tensor.h) */
  int32_t refcount;     /* one per output pointing at it */
  int64_t seq;          /* creation order: backward visits high to low */
  lm_saved call;        /* the op, its inputs (retained) and detached outputs */
  lm_tensor **retained; /* weak: outputs that asked for retain_grad */
  int64_t *version;     /* of each input's, then output's, storage when recorded */
  int visit;            /* scratch of one backward pass */
  uint32_t hooked;      /* outputs (bits) whose pre-backward hook is set */
  lm_tensor **gsum;     /* scratch: gradient summed per output */
};

/* Records op on the tape when grad mode is on, the op is differentiable
 * and an input requires grad: the outputs get the node as their grad_fn. */
int lm_record(int op, int nin, lm_tensor *const *in, const lm_attrs *a, int nout, lm_tensor **out);
/* Runs op (lm_op_run) and records it: what the op entry and the DTensor
 * layer call for every op; the number of outputs or -1. */
int lm_run_recorded(int op, int nin, lm_tensor *const *in, const lm_attrs *a, lm_tensor **out);
/* 0 when nothing the node saved was changed in place since, else -1 with
 * PyTorch's kind of message (which tensor, which op saved it, versions) */
int lm_check_saved(const lm_node *n);
/* fn runs as each backward starts (the DTensor layer lets go of what it
 * kept for the forward); one at a time, NULL for none */
void lm_autograd_on_backward(void (*fn)(void));

#endif
