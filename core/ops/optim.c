/* optim.c: optimizer updates as ops, so every device runs them through its
 * backend. They update their inputs in place, make no outputs and are not
 * differentiable (callers run them without grad). */
#include "op.h"
#include <stdio.h>
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

/* one parameter's update (p, g, m, v), writing the bf16/f16 copy of p
 * that autocast's next cast of it takes, when one is kept (tensor.h) */
static int step(const lm_backend *be, lm_tensor *const *t, const double *h) {
  lm_tensor *low = lm_low_copy_target(t[0]);
  LM_TRY(be->adamw(t[0], t[1], t[2], t[3], h, low));
  if (low) lm_low_copy_done(t[0]);
  return 0;
}

int lm_fw_adamw(const lm_call *c, lm_tensor **out) {
  (void)out;
  for (int i = 0; i < 4; i++)
    if (!lm_is_contiguous(c->in[i])) return lm_error("_adamw_: argument #%d must be contiguous", i + 1);
  const lm_backend *be = LM_KERNEL(c->op, c->in[0], adamw);
  return be ? step(be, c->in, c->a->f) : -1;
}

/* _adamw_multi_(p1, g1, m1, v1, p2, g2, m2, v2, ...; the 7 hyperparameters
 * of _adamw_, shared): one call updates every parameter of a model (of one
 * step count), each with the adamw kernel. Each group of four is checked
 * as _adamw_ checks its arguments, all before any update runs. */
int lm_shape_adamw_multi(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)out;
  static const char *what[4] = {"param", "grad", "exp_avg", "exp_avg_sq"};
  const char *name = "_adamw_multi_";
  if (nin < 4 || nin % 4)
    return lm_error("%s: expected 4 tensors per parameter (param, grad, exp_avg, exp_avg_sq), got %d", name, nin);
  if (a->nf < 7) return lm_error("%s: expected 7 hyperparameters, got %d", name, a->nf);
  for (int k = 0; k < nin; k += 4) {
    if (in[k].dtype != LM_F32 && in[k].dtype != LM_F64)
      return lm_error("%s: argument #%d (param of parameter %d) expected f32 or f64, got %s", name, k + 1,
                      k / 4 + 1, lm_dtype_name(in[k].dtype));
    for (int i = 1; i < 4; i++) {
      char arg[64];
      snprintf(arg, sizeof arg, "argument #%d (%s of parameter %d)", k + i + 1, what[i], k / 4 + 1);
      LM_TRY(same_layout(name, arg, &in[k + i], &in[k]));
    }
  }
  return 0;
}

int lm_fw_adamw_multi(const lm_call *c, lm_tensor **out) {
  (void)out;
  for (int i = 0; i < c->nin; i++)
    if (!lm_is_contiguous(c->in[i]))
      return lm_error("_adamw_multi_: argument #%d (of parameter %d) must be contiguous", i + 1, i / 4 + 1);
  const lm_backend *be = LM_KERNEL(c->op, c->in[0], adamw);
  if (!be) return -1;
  for (int k = 0; k < c->nin; k += 4)
    LM_TRY(step(be, c->in + k, c->a->f));
  return 0;
}
