/* entry.c: lm_op_call, the one path every op call from outside the core
 * takes: argument checks, autocast, then calls with DTensor arguments to
 * the DTensor layer (dtensor/dispatch.c), others to the op itself, which
 * autograd records. */
#include "../dtensor/dtensor.h"
#include "../tensor/trace.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* every tensor argument on argument #1's device: an op never copies
 * across devices (on a GPU a kernel given another device's memory, or the
 * CPU's, faults; the CPU cannot read a GPU's) */
static int check_devices(const lm_op_def *d, int nin, lm_tensor *const *in) {
  for (int i = 1; i < nin; i++) {
    if (in[i]->device_ == in[0]->device_) continue;
    char here[32], there[32];
    lm_device_name(in[i]->device_, here, sizeof here), lm_device_name(in[0]->device_, there, sizeof there);
    return lm_error("%s: argument #%d is on %s, argument #1 on %s: an op never copies across devices "
                    "(move one with :to())", d->name, i + 1, here, there);
  }
  return 0;
}

static int check_call(const lm_op_def *d, int nin, lm_tensor *const *in, const lm_attrs *a, int maxout) {
  if (d->nin >= 0 && nin != d->nin)
    return lm_error("%s: expected %d tensor arguments, got %d", d->name, d->nin, nin);
  if (nin < 0 || nin > LM_MAX_INPUTS)
    return lm_error("%s: expected 0 to %d tensor arguments, got %d", d->name, LM_MAX_INPUTS, nin);
  if (maxout < d->nout) return lm_error("%s: room for %d outputs, it makes %d", d->name, maxout, d->nout);
  if (a->ni < 0 || a->ni > LM_MAX_ATTR_INTS || a->nf < 0 || a->nf > LM_MAX_ATTR_REALS || a->nh < 0 ||
      a->nh > LM_MAX_ATTR_HANDLES)
    return lm_error("%s: attrs hold %d integers, %d reals and %d handles; at most %d, %d and %d",
                    d->name, a->ni, a->nf, a->nh, LM_MAX_ATTR_INTS, LM_MAX_ATTR_REALS, LM_MAX_ATTR_HANDLES);
  for (int i = 0; i < nin; i++) {
    if (!in[i]) return lm_error("%s: argument #%d expected a tensor, got nil", d->name, i + 1);
    if (in[i]->freed) return lm_error("%s: argument #%d was freed (t:free())", d->name, i + 1);
  }
  return check_devices(d, nin, in);
}

/* ---- autocast: mixed precision per op, as PyTorch's ---- */
static _Thread_local int autocast = -1; /* the low-precision dtype, -1: off */

int lm_autocast_dtype(void) { return autocast; }

int lm_set_autocast(int dtype) {
  if (dtype != -1 && dtype != LM_BF16 && dtype != LM_F16)
    return lm_error("autocast: expected bf16 or f16 (or -1 for off), got %s", lm_dtype_name(dtype));
  int old = autocast;
  autocast = dtype;
  return old;
}

/* The dtype autocast gives an input of op d: GEMMs take their float
 * operands but f64 in the low-precision dtype (a bf16 x f32 matmul runs in
 * bf16, as PyTorch's autocast runs it), softmax, norms and losses take
 * low-precision inputs in f32; -1: as it is. */
static int autocast_dtype(const lm_op_def *d, const lm_tensor *t) {
  if ((d->flags & LM_OPF_AMP_LOW) && lm_is_float(t->dtype_) && t->dtype_ != LM_F64 && t->dtype_ != autocast)
    return autocast;
  if ((d->flags & LM_OPF_AMP_F32) && (t->dtype_ == LM_BF16 || t->dtype_ == LM_F16)) return LM_F32;
  return -1;
}

static int call(int op, int nin, lm_tensor *const *in, const lm_attrs *attrs, lm_tensor **out) {
  const lm_op_def *d = lm_op_def_of(op);
  if (!(d->flags & LM_OPF_NATIVE))
    for (int i = 0; i < nin; i++)
      if (in[i]->dist) return lm_dtensor_call(op, nin, in, attrs, out) < 0 ? -1 : d->nout;
  return lm_run_recorded(op, nin, in, attrs, out);
}

/* the op on its inputs cast as autocast says (casts are recorded ops) */
static int call_autocast(int op, int nin, lm_tensor *const *in, const lm_attrs *attrs, lm_tensor **out) {
  lm_tensor *cast[LM_RULE_MAX_IN] = {0};
  int rc = 0;
  for (int i = 0; i < nin; i++) {
    int dt = autocast_dtype(lm_op_def_of(op), in[i]);
    lm_attrs to = {.i = {dt, 1}, .ni = 2}; /* autocast's cast (ops/view.c) */
    lm_tensor *x = in[i], *y[LM_MAX_OUT];
    cast[i] = dt < 0 ? (lm_retain(x), x) : call(LM_OP_TO, 1, &x, &to, y) < 0 ? NULL : y[0];
    if (!cast[i]) rc = -1;
  }
  if (rc == 0) rc = call(op, nin, cast, attrs, out);
  for (int i = 0; i < nin; i++) lm_release(cast[i]);
  return rc;
}

static int op_call(int op, int nin, lm_tensor *const *in, const lm_attrs *attrs, int maxout, lm_tensor **out) {
  static const lm_attrs none;
  if (op < 0 || op >= LM_NOPS) return lm_error("op id %d: no such op", op);
  if (lm_interrupt_check()) return lm_error("interrupted (Ctrl-C)");
  const lm_op_def *d = lm_op_def_of(op);
  if (!attrs) attrs = &none;
  LM_TRY(check_call(d, nin, in, attrs, maxout));
  if (autocast >= 0 && (d->flags & (LM_OPF_AMP_LOW | LM_OPF_AMP_F32)) && nin <= LM_RULE_MAX_IN)
    return call_autocast(op, nin, in, attrs, out);
  return call(op, nin, in, attrs, out);
}

/* the call recorded for the trace (loom.profiler): its inputs, its time */
static int traced_call(int op, int nin, lm_tensor *const *in, const lm_attrs *attrs, int maxout, lm_tensor **out) {
  if (op < 0 || op >= LM_NOPS) return op_call(op, nin, in, attrs, maxout, out);
  lm_trace_op r;
  lm_trace_op_begin(&r, LM_TRACE_OP, op, nin, in);
  int rc = op_call(op, nin, in, attrs, maxout, out);
  lm_trace_op_end(&r, rc);
  return rc;
}

int lm_op_call(int op, int nin, lm_tensor *const *in, const lm_attrs *attrs, int maxout, lm_tensor **out) {
  if (lm_trace_on) return traced_call(op, nin, in, attrs, maxout, out);
  return op_call(op, nin, in, attrs, maxout, out);
}

int lm_op_info_of(int op, lm_op_info *info) {
  if (op < 0 || op >= LM_NOPS || !info) return lm_error("op_info: no op with id %d", op);
  const lm_op_def *d = &lm_op_table[op];
  *info = (lm_op_info){.name = d->name, .nin = d->nin, .nout = d->nout,
                       .differentiable = d->backward != NULL, .sharded = lm_rule_table[op] != NULL,
                       .inplace = (d->flags & LM_OPF_INPLACE) != 0};
  return 0;
}
