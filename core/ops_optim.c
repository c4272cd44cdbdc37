/* ops_optim.c: optimizer updates as ops, so every device runs them through
 * its backend. They mutate their inputs, make no outputs and are not
 * differentiable (callers run them without grad). */
#include "internal.h"
#include <string.h>

static int same_layout(const char *op, const char *name, const lm_tensor *t, const lm_tensor *p) {
  if (t->dtype_ != p->dtype_)
    return lm_error("%s: %s expected dtype %s (the parameter's), got %s", op, name,
                    lm_dtype_name(p->dtype_), lm_dtype_name(t->dtype_));
  if (t->ndim != p->ndim || memcmp(t->shape, p->shape, t->ndim * sizeof *t->shape))
    return lm_error("%s: %s expected the parameter's shape", op, name);
  if (!lm_is_contiguous(t)) return lm_error("%s: %s must be contiguous", op, name);
  return 0;
}

/* _adamw_(param, grad, exp_avg, exp_avg_sq; f = lr, beta1, beta2, eps,
 * weight_decay, bias_correction1, bias_correction2) */
static int fw_adamw(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin, (void)out;
  const char *op = "_adamw_";
  lm_tensor *p = in[0];
  if (p->dtype_ != LM_F32 && p->dtype_ != LM_F64)
    return lm_error("%s: argument #1 (param) expected f32 or f64, got %s", op, lm_dtype_name(p->dtype_));
  if (a->nf < 7) return lm_error("%s: expected 7 hyperparameters, got %d", op, a->nf);
  LM_TRY(same_layout(op, "argument #1 (param)", p, p));
  LM_TRY(same_layout(op, "argument #2 (grad)", in[1], p));
  LM_TRY(same_layout(op, "argument #3 (exp_avg)", in[2], p));
  LM_TRY(same_layout(op, "argument #4 (exp_avg_sq)", in[3], p));
  const lm_backend *be = lm_backend_of(p->device_);
  if (!be->adamw) return lm_error("%s: no kernel on device %s", op, be->name);
  return be->adamw(p, in[1], in[2], in[3], a->f);
}

const lm_op_def lm_ops_optim[] = {{"_adamw_", 4, 0, fw_adamw, NULL, lm_rule_local, 0}, {0}};
