/* shape.c: helpers the shape inference functions share. */
#include "op.h"
#include <stdio.h>

int lm_broadcast_metas(const char *op, int n, const lm_meta *in, lm_meta *out) {
  int nd = 0;
  for (int k = 0; k < n; k++) nd = in[k].ndim > nd ? in[k].ndim : nd;
  out->ndim = nd;
  for (int d = 0; d < nd; d++) out->shape[d] = 1;
  for (int k = 0; k < n; k++)
    for (int d = 0; d < in[k].ndim; d++) {
      int64_t *s = &out->shape[nd - in[k].ndim + d], v = in[k].shape[d];
      if (v == *s || v == 1) continue;
      if (*s != 1)
        return lm_error("%s: shapes cannot broadcast: argument #%d has size %lld in dim %d, "
                        "another argument has %lld", op, k + 1, (long long)v, d + 1, (long long)*s);
      *s = v;
    }
  return 0;
}

int lm_need_ints(const char *op, const lm_attrs *a, int n, const char *what) {
  if (a->ni >= n) return 0;
  return lm_error("%s: expected %d integer attrs (%s), got %d", op, n, what, a->ni);
}

int lm_need_float(const char *op, int k, const char *arg, const lm_meta *m) {
  if (lm_is_float(m->dtype)) return 0;
  return lm_error("%s: argument #%d (%s) expected a floating point tensor, got %s", op, k, arg,
                  lm_dtype_name(m->dtype));
}

/* GEMM operands of one dtype when any is bf16/f16: mixing one with f32 would
 * run the GEMM in f32 (PyTorch raises too); autocast casts them first. */
int lm_need_same_low(const char *op, int n, const lm_meta *in, const char *const *names) {
  for (int i = 0; i < n; i++) {
    if (in[i].dtype != LM_BF16 && in[i].dtype != LM_F16) continue;
    for (int j = 0; j < n; j++)
      if (in[j].dtype != in[i].dtype)
        return lm_error("%s: argument #%d (%s) is %s but argument #%d (%s) is %s: a GEMM takes one "
                        "dtype, it would not silently run in %s; cast one (x:to(\"%s\")) or run "
                        "under loom.autocast(\"%s\", ...), which casts f32 operands to %s",
                        op, i + 1, names[i], lm_dtype_name(in[i].dtype), j + 1, names[j],
                        lm_dtype_name(in[j].dtype), lm_dtype_name(lm_promote(in[i].dtype, in[j].dtype)),
                        lm_dtype_name(in[i].dtype), lm_dtype_name(in[i].dtype), lm_dtype_name(in[i].dtype));
  }
  return 0;
}

/* The ids of idx (any integer dtype) must lie in [0, n) or equal `skip`
 * when skip_ok. On the CPU they are read here. On a device whose backend
 * checks ids (check_ids) they are checked there, without waiting for the
 * device: a bad id raises at the next call that waits for it (a copy to
 * the host, as PyTorch's device-side asserts do); the kernels meanwhile
 * treat it as a skipped row. Other devices copy the ids to the host. */
int lm_check_ids(const char *op, int k, const char *arg, lm_tensor *idx, int64_t n,
                     int skip_ok, int64_t skip, const char *what) {
  lm_scope s = {0};
  lm_tensor *c = idx;
  const lm_backend *b = idx->device_ != LM_CPU ? lm_backend_registered(idx->device_) : NULL;
  if (b && b->check_ids) {
    char head[160], tail[160];
    snprintf(head, sizeof head, "%s: argument #%d (%s) holds %s ", op, k, arg, what);
    int w = snprintf(tail, sizeof tail, ", outside [1, %lld]", (long long)n);
    if (skip_ok) w += snprintf(tail + w, sizeof tail - w, " and not ignore_index (%lld)", (long long)skip + 1);
    snprintf(tail + w, sizeof tail - w, " (checked on the device, raised at the next wait for it)");
    c = lm_s_contig(&s, lm_s_cast(&s, idx, LM_I64));
    int rc = c ? b->check_ids(c, n, skip_ok, skip, head, tail) : -1;
    if (rc != LM_UNSUPPORTED) { lm_scope_end(&s); return rc; }
    c = idx; /* the backend cannot: on the host */
  }
  if (idx->device_ != LM_CPU) {
    c = lm_s(&s, lm_empty(idx->ndim, idx->shape_, LM_I64, LM_CPU));
    if (!c || lm_copy_(c, idx) < 0) { lm_scope_end(&s); return -1; }
  }
  c = lm_s_contig(&s, lm_s_cast(&s, c, LM_I64));
  if (!c) { lm_scope_end(&s); return -1; }
  const int64_t *p = (const int64_t *)lm_ptr(c);
  int rc = 0;
  for (int64_t j = 0; j < c->numel_; j++) {
    if ((p[j] >= 0 && p[j] < n) || (skip_ok && p[j] == skip)) continue;
    rc = lm_error("%s: argument #%d (%s) holds %s %lld, outside [1, %lld]%s", op, k, arg, what,
                  (long long)p[j] + 1, (long long)n, skip_ok ? " and not ignore_index" : "");
    break;
  }
  lm_scope_end(&s);
  return rc;
}

/* loom.h's entry: ids (1-based, as Lua holds them) in [1, n] or equal to
 * skip (when skip_ok), for checks outside an op (loss_parallel) */
int lm_check_ids_in(const char *op, const char *arg, lm_tensor *ids, int64_t n, int skip_ok,
                    int64_t skip) {
  if (!op || !arg || !ids) return lm_error("check_ids: expected an op name, an argument name and a tensor");
  if (ids->freed) return lm_error("%s: %s was freed (t:free())", op, arg);
  if (ids->dtype_ != LM_I64 && ids->dtype_ != LM_I32)
    return lm_error("%s: %s expected i64 or i32 ids, got %s", op, arg, lm_dtype_name(ids->dtype_));
  lm_scope s = {0};
  lm_tensor *one = lm_scalar(&s, 1, ids);
  lm_tensor *z = one ? lm_sop(&s, LM_OP_SUB, 2, (lm_tensor *[]){ids, one}, NULL) : NULL;
  int rc = z ? lm_check_ids(op, 2, arg, z, n, skip_ok, skip - 1, "class") : -1;
  lm_scope_end(&s);
  return rc;
}
