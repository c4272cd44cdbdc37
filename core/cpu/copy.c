/* copy.c: strided copy with dtype conversion, and fill. */
#include "iter.h"
#include <string.h>

typedef struct { int sd, dd; } conv;

static void copy_row(int64_t n, char **p, const int64_t *s, void *ctx) {
  const conv *c = ctx;
  int es = lm_dtype_size(c->dd);
  if (c->sd == c->dd && s[0] == es && s[1] == es) { memcpy(p[0], p[1], n * es); return; }
  if (c->sd == LM_F32 && c->dd == LM_F32) {
    for (int64_t i = 0; i < n; i++) *(float *)(p[0] + i * s[0]) = *(float *)(p[1] + i * s[1]);
  } else if (c->sd == c->dd && c->dd == LM_I64) { /* exact beyond 2^53 */
    for (int64_t i = 0; i < n; i++) *(int64_t *)(p[0] + i * s[0]) = *(int64_t *)(p[1] + i * s[1]);
  } else if (c->sd == LM_F32 && c->dd == LM_BF16) {
    for (int64_t i = 0; i < n; i++)
      *(uint16_t *)(p[0] + i * s[0]) = lm_f32_to_bf16(*(float *)(p[1] + i * s[1]));
  } else if (c->sd == LM_BF16 && c->dd == LM_F32) {
    for (int64_t i = 0; i < n; i++)
      *(float *)(p[0] + i * s[0]) = lm_bf16_to_f32(*(uint16_t *)(p[1] + i * s[1]));
  } else {
    for (int64_t i = 0; i < n; i++)
      lm_store(p[0] + i * s[0], c->dd, lm_load(p[1] + i * s[1], c->sd));
  }
}

int lm_cpu_copy(lm_tensor *dst, const lm_tensor *src) {
  conv c = {src->dtype_, dst->dtype_};
  const lm_tensor *t[2] = {dst, src};
  lm_foreach(2, t, copy_row, &c);
  return 0;
}

typedef struct { int dtype; double v; } fillv;

static void fill_row(int64_t n, char **p, const int64_t *s, void *ctx) {
  const fillv *f = ctx;
  int es = lm_dtype_size(f->dtype);
  char v[8];
  lm_store(v, f->dtype, f->v);
  for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], v, es);
}

int lm_cpu_fill(lm_tensor *t, double v) {
  fillv f = {t->dtype_, v};
  const lm_tensor *a[1] = {t};
  lm_foreach(1, a, fill_row, &f);
  return 0;
}
