/* optim.c: optimizer updates as ops, so every device runs them through its
 * backend. They update their inputs in place, make no outputs and are not
 * differentiable (callers run them without grad). */
#include "op.h"
#include <string.h>

static int same_layout(const char *op, const char *name, const lm_meta *t, const lm_meta *p) {
  if (t->dtype != p->dtype)
    return lm_error("%s: %s expected dtype %s (the parameter's), got %s", op, name,
                    lm_dtype_name(p->dtype), lm_dtype_name(t->dtype));
  if (t->ndim != p->ndim || memcmp(t->shape, p->shape, t->ndim * sizeof *t->shape))
    return lm_error("%s: %s expected the parameter's shape", op, name);
  return 0;
}

/* _adamw_(param, grad, exp_avg, exp_avg_sq; f = lr, beta1, beta2, eps,
 * weight_decay, bias_correction1, bias_correction2) */
int lm_shape_adamw(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin, (void)out;
  static const char *args[4] = {"argument #1 (param)", "argument #2 (grad)", "argument #3 (exp_avg)",
                                "argument #4 (exp_avg_sq)"};
  if (in[0].dtype != LM_F32 && in[0].dtype != LM_F64)
    return lm_error("_adamw_: argument #1 (param) expected f32 or f64, got %s", lm_dtype_name(in[0].dtype));
  if (a->nf < 7) return lm_error("_adamw_: expected 7 hyperparameters, got %d", a->nf);
  for (int i = 1; i < 4; i++) LM_TRY(same_layout("_adamw_", args[i], &in[i], &in[0]));
  return 0;
}

int lm_fw_adamw(const lm_call *c, lm_tensor **out) {
  (void)out;
  for (int i = 0; i < 4; i++)
    if (!lm_is_contiguous(c->in[i])) return lm_error("_adamw_: argument #%d must be contiguous", i + 1);
  const lm_backend *be = LM_KERNEL(c->op, c->in[0], adamw);
  return be ? be->adamw(c->in[0], c->in[1], c->in[2], c->in[3], c->a->f) : -1;
}
