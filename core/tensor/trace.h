/* trace.h: the trace buffer's side for the core (trace.c): the flag the op
 * door, autograd and the collectives test before recording anything, and
 * the records they make. The public half (enable, drain) is in loom.h. */
#ifndef LOOM_TRACE_H
#define LOOM_TRACE_H
#include "tensor.h"

/* 1 while tracing: read directly (one load and a branch when off) */
extern int lm_trace_on;

/* an op's record, begun before it runs and pushed once it returns */
typedef struct lm_trace_op {
  lm_trace_event e;
  int64_t fresh0, maps0;   /* the allocator's fresh bytes and mappings before */
} lm_trace_op;
/* kind LM_TRACE_OP (the door) or LM_TRACE_BACKWARD (an autograd node) */
void lm_trace_op_begin(lm_trace_op *r, int kind, int op, int nin, lm_tensor *const *in);
void lm_trace_op_end(lm_trace_op *r, int rc);   /* rc < 0: it failed */
/* appends a finished event as it is (core/comm's collectives) */
void lm_trace_push(const lm_trace_event *e);

/* the thread lane an event goes on (1: the first thread that recorded) */
int lm_trace_tid(void);
#endif
