/* scope.c: owned intermediates for formulas written from ops (see lm_scope). */
#include "internal.h"

lm_tensor *lm_s(lm_scope *s, lm_tensor *t) {
  if (!t) return NULL;
  if (s->n == (int)(sizeof s->t / sizeof *s->t)) {
    lm_release(t);
    lm_error("scope: more than %d intermediates", s->n);
    return NULL;
  }
  return s->t[s->n++] = t;
}

lm_tensor *lm_sop(lm_scope *s, const char *op, int nin, lm_tensor *const *in, const lm_attrs *a) {
  for (int i = 0; i < nin; i++) if (!in[i]) return NULL;
  return lm_s(s, lm_call(op, nin, in, a));
}

lm_tensor *lm_s1(lm_scope *s, const char *op, lm_tensor *x) { return lm_sop(s, op, 1, &x, NULL); }

lm_tensor *lm_s1f(lm_scope *s, const char *op, lm_tensor *x, double f0) {
  lm_attrs a = {.f = {f0}, .nf = 1};
  return lm_sop(s, op, 1, &x, &a);
}

lm_tensor *lm_s2(lm_scope *s, const char *op, lm_tensor *a, lm_tensor *b) {
  lm_tensor *in[2] = {a, b};
  return lm_sop(s, op, 2, in, NULL);
}

lm_tensor *lm_scalar(lm_scope *s, double v, const lm_tensor *like) {
  if (!like) return NULL;
  lm_tensor *t = lm_s(s, lm_empty(0, NULL, like->dtype_, like->device_));
  return t && lm_fill_(t, v) == 0 ? t : NULL;
}

void lm_scope_end(lm_scope *s) {
  while (s->n) lm_release(s->t[--s->n]);
}
