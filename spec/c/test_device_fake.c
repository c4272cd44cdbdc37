/* test_device_fake.c: the core's side of a device backend, checked on the
 * CPU with a fake CUDA backend that counts what it is asked: asking how
 * many GPUs there are makes none current (the review's item 1: no
 * cudaSetDevice per GPU per rank), and freeing a tensor after the backend
 * started failing to select its device does not crash (item 6: the free
 * path called lm_backend_of(...)->free without a NULL check).
 * Prints "N passed, N failed"; exits non-zero on any failure. */
#include "check.h"
#include "backend.h"
#include "ops/op.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int selects, counts, allocs, frees, select_fails;
static int fake_select(int k) {
  selects++;
  return select_fails ? lm_error("fake cuda:%d: an earlier error is sticky", k) : 0;
}
static int fake_count(void) { counts++; return 2; }
static void *fake_alloc(size_t n) { allocs++; return malloc(n ? n : 1); }
static void fake_free(void *p) { frees++; free(p); }
static int copies, checks, check_unsupported;
static char check_head[160], check_tail[160];
/* the byte offset of element i (row-major order) of a strided t */
static int64_t at(const lm_tensor *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) off += i % t->shape_[d] * t->stride_[d], i /= t->shape_[d];
  return (t->offset + off) * lm_dtype_size(t->dtype_);
}
static int fake_copy(lm_tensor *d, const lm_tensor *s) { /* any strides, any dtypes */
  copies++;
  for (int64_t i = 0; i < s->numel_; i++)
    lm_store((char *)d->storage->data + at(d, i), d->dtype_, lm_load((char *)s->storage->data + at(s, i), s->dtype_));
  return 0;
}
static int ce_dtype = -1, rope_dtype = -1;
static int fake_rope(lm_tensor *out, const lm_tensor *x, const lm_tensor *cos, const lm_tensor *sin, int sign) {
  (void)out, (void)cos, (void)sin, (void)sign;
  rope_dtype = x->dtype_;
  return 0;
}
static int fake_cross_entropy(lm_tensor *loss, lm_tensor *lse, const lm_tensor *x, const lm_tensor *target,
                              const lm_tensor *w, int64_t ignore, double eps) {
  (void)target, (void)w, (void)ignore, (void)eps;
  ce_dtype = x->dtype_;
  for (int64_t i = 0; i < loss->numel_; i++) ((float *)lm_ptr(loss))[i] = 1, ((float *)lm_ptr(lse))[i] = 2;
  return 0;
}
static int fake_check_ids(const lm_tensor *idx, int64_t n, int skip_ok, int64_t skip, const char *head,
                          const char *tail) {
  (void)idx, (void)n, (void)skip_ok, (void)skip;
  checks++;
  snprintf(check_head, sizeof check_head, "%s", head);
  snprintf(check_tail, sizeof check_tail, "%s", tail);
  return check_unsupported ? lm_error("unsupported: no slots"), LM_UNSUPPORTED : 0;
}
static int fake_fill(lm_tensor *t, double v) { /* contiguous: all the test needs */
  for (int64_t i = 0; i < t->numel_; i++) lm_store(lm_ptr(t) + i * lm_dtype_size(t->dtype_), t->dtype_, v);
  return 0;
}

static void test_count_selects_nothing(void) {
  CHECK(lm_cuda_device_count() == 2);
  CHECK(lm_device_available(LM_CUDA0) == 1);
  CHECK(lm_device_available(LM_CUDA0 + 1) == 1);
  CHECK(lm_device_available(LM_CUDA0 + 2) == 0);
  CHECK(strstr(lm_last_error(), "cuda:0..cuda:1") != NULL);
  CHECK(counts == 4);
  CHECK(selects == 0); /* no device made current by asking */
}

static void test_free_after_failed_select(void) {
  int64_t shape[1] = {1000};
  allocs = frees = selects = 0;
  lm_tensor *t = lm_empty(1, shape, LM_F32, LM_CUDA0 + 1);
  CHECK(t != NULL && allocs == 1 && selects == 1);
  lm_tensor *u = lm_empty(1, shape, LM_F32, LM_CUDA0 + 1);
  select_fails = 1; /* from here the device cannot be selected */
  CHECK(lm_empty(1, shape, LM_F32, LM_CUDA0 + 1) == NULL);
  CHECK(strstr(lm_last_error(), "sticky") != NULL);
  lm_release(t); /* was a NULL call */
  CHECK(frees == 1);
  CHECK(lm_release_data(u) == 0);
  CHECK(frees == 2);
  lm_release(u);
  CHECK(frees == 2); /* released once only */
}

/* item 4: ids on a device are checked there, not copied to the host (a
 * wait for the device per forward); a backend that cannot falls back */
static void test_ids_checked_on_device(void) {
  int64_t shape[1] = {3};
  lm_tensor *ids = lm_empty(1, shape, LM_I64, LM_CUDA0);
  int64_t *p = lm_data(ids);
  p[0] = 0, p[1] = 3, p[2] = 7;
  copies = 0;
  CHECK(lm_check_ids("embedding", 2, "indices", ids, 5, 0, 0, "id") == 0); /* raised later */
  CHECK(checks == 1 && copies == 0);
  CHECK(strcmp(check_head, "embedding: argument #2 (indices) holds id ") == 0);
  CHECK(strstr(check_tail, ", outside [1, 5]") == check_tail);
  check_unsupported = 1;
  CHECK(lm_check_ids("embedding", 2, "indices", ids, 5, 0, 0, "id") < 0);
  CHECK(strstr(lm_last_error(), "holds id 8, outside [1, 5]") != NULL);
  CHECK(checks == 2 && copies == 1);
  check_unsupported = 0;
  lm_release(ids);
}

/* bf16 logits reach a fused cross entropy kernel as bf16 (no N x C f32
 * copy; loss and lse come back in f32), and bf16 q a fused rope as bf16 */
static void test_bf16_logits_stay_bf16(void) {
  int64_t xs[2] = {3, 5}, ts[1] = {3};
  lm_tensor *x = lm_empty(2, xs, LM_BF16, LM_CUDA0), *t = lm_empty(1, ts, LM_I64, LM_CUDA0);
  int64_t *tp = lm_data(t);
  tp[0] = 0, tp[1] = 4, tp[2] = 2;
  lm_attrs a = {.i = {-100, 0}, .ni = 2, .nf = 1};
  lm_tensor *in[2] = {x, t}, *out[2] = {NULL, NULL};
  CHECK(lm_op_call(LM_OP_CROSS_ENTROPY, 2, in, &a, 2, out) == 2);
  CHECK(ce_dtype == LM_BF16);
  CHECK(out[0] && out[0]->dtype_ == LM_BF16 && out[1] && out[1]->dtype_ == LM_F32);
  lm_release(out[0]), lm_release(out[1]), lm_release(x), lm_release(t);
  int64_t qs[4] = {1, 3, 2, 4}, cs[2] = {3, 2};
  lm_tensor *q = lm_empty(4, qs, LM_BF16, LM_CUDA0), *c = lm_empty(2, cs, LM_F32, LM_CUDA0);
  lm_tensor *rin[3] = {q, c, c}, *r = NULL;
  lm_attrs none = {.ni = 0};
  CHECK(lm_op_call(LM_OP_ROPE, 3, rin, &none, 1, &r) == 1);
  CHECK(rope_dtype == LM_BF16 && r && r->dtype_ == LM_BF16);
  lm_release(r), lm_release(q), lm_release(c);
}

/* ---- a fake fused attention that, like the CUDA kernels, takes head dims
 * 64 and 128 only (f32, dense (B, L, D)); the math naively, on the host ---- */
static int attn_calls, attn_dims_seen;
static int attn_ok(const lm_tensor *q, const lm_tensor *v) {
  int64_t D = q->shape_[2];
  if ((D != 64 && D != 128) || v->shape_[2] != D || q->dtype_ != LM_F32)
    return lm_error("unsupported: fake attention: head dim %lld", (long long)D), LM_UNSUPPORTED;
  attn_calls++, attn_dims_seen = (int)D;
  return 0;
}
/* p[j] = softmax_j(scale q_i . k_j), causal keeps j <= i; returns lse */
static double probs(const float *q, const float *k, int64_t S, int64_t D, int64_t i, double scale, int causal,
                    double *p) {
  double m = -INFINITY, sum = 0;
  for (int64_t j = 0; j < S; j++) {
    double d = 0;
    for (int64_t e = 0; e < D; e++) d += (double)q[i * D + e] * k[j * D + e];
    p[j] = causal && j > i ? -INFINITY : d * scale;
    m = p[j] > m ? p[j] : m;
  }
  for (int64_t j = 0; j < S; j++) sum += p[j] = exp(p[j] - m);
  for (int64_t j = 0; j < S; j++) p[j] /= sum;
  return m + log(sum);
}
static int fake_attention(lm_tensor *o, lm_tensor *lse, const lm_tensor *q, const lm_tensor *k,
                          const lm_tensor *v, double scale, int causal) {
  int rc = attn_ok(q, v);
  if (rc) return rc; /* LM_UNSUPPORTED */
  int64_t B = q->shape_[0], L = q->shape_[1], S = k->shape_[1], D = q->shape_[2];
  double p[64];
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < L; i++) {
      const float *qb = (float *)lm_ptr(q) + b * L * D, *kb = (float *)lm_ptr(k) + b * S * D;
      ((float *)lm_ptr(lse))[b * L + i] = (float)probs(qb, kb, S, D, i, scale, causal, p);
      for (int64_t e = 0; e < D; e++) {
        double acc = 0;
        for (int64_t j = 0; j < S; j++) acc += p[j] * ((float *)lm_ptr(v))[(b * S + j) * D + e];
        ((float *)lm_ptr(o))[(b * L + i) * D + e] = (float)acc;
      }
    }
  return 0;
}
static int fake_attention_bwd(lm_tensor *dq, lm_tensor *dk, lm_tensor *dv, const lm_tensor *g, const lm_tensor *q,
                              const lm_tensor *k, const lm_tensor *v, const lm_tensor *o, const lm_tensor *lse,
                              double scale, int causal) {
  (void)o, (void)lse;
  int rc = attn_ok(q, v);
  if (rc) return rc; /* LM_UNSUPPORTED */
  int64_t B = q->shape_[0], L = q->shape_[1], S = k->shape_[1], D = q->shape_[2];
  const float *Q = (float *)lm_ptr(q), *K = (float *)lm_ptr(k), *V = (float *)lm_ptr(v), *G = (float *)lm_ptr(g);
  float *dQ = (float *)lm_ptr(dq), *dK = (float *)lm_ptr(dk), *dV = (float *)lm_ptr(dv);
  memset(dQ, 0, q->numel_ * 4), memset(dK, 0, k->numel_ * 4), memset(dV, 0, v->numel_ * 4);
  double p[64], dp[64];
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < L; i++) {
      probs(Q + b * L * D, K + b * S * D, S, D, i, scale, causal, p);
      double rs = 0;
      for (int64_t j = 0; j < S; j++) {
        dp[j] = 0;
        for (int64_t e = 0; e < D; e++) dp[j] += (double)G[(b * L + i) * D + e] * V[(b * S + j) * D + e];
        rs += dp[j] * p[j];
      }
      for (int64_t j = 0; j < S; j++) {
        double ds = p[j] * (dp[j] - rs) * scale;
        for (int64_t e = 0; e < D; e++) {
          dV[(b * S + j) * D + e] += (float)(p[j] * G[(b * L + i) * D + e]);
          dQ[(b * L + i) * D + e] += (float)(ds * K[(b * S + j) * D + e]);
          dK[(b * S + j) * D + e] += (float)(ds * Q[(b * L + i) * D + e]);
        }
      }
    }
  return 0;
}

/* the SDPA of 3 leaves made from vals on device dev, its output and grads
 * (o, dq, dk, dv) on the CPU; g the output's gradient */
static void sdpa_run(int dev, int64_t E, int causal, lm_tensor **res) {
  int64_t qs[3] = {2, 5, E}, ks[3] = {2, 7, E};
  lm_tensor *in[3], *out[2] = {NULL, NULL};
  for (int i = 0; i < 3; i++) {
    int64_t *sh = i == 0 ? qs : ks, n = sh[0] * sh[1] * sh[2];
    lm_tensor *h = lm_empty(3, sh, LM_F32, LM_CPU);
    for (int64_t j = 0; j < n; j++) ((float *)lm_data(h))[j] = (float)sin(0.37 * j + i) * 0.5f;
    in[i] = lm_empty(3, sh, LM_F32, dev);
    lm_copy_(in[i], h), lm_release(h), lm_set_requires_grad(in[i], 1);
  }
  lm_attrs a = {.i = {causal}, .ni = 1};
  CHECK(lm_op_call(LM_OP_SDPA, 3, in, &a, 2, out) == 2);
  if (!out[0]) fprintf(stderr, "sdpa: %s\n", lm_last_error());
  lm_tensor *g = lm_empty(3, qs, LM_F32, dev), *gh = lm_empty(3, qs, LM_F32, LM_CPU);
  for (int64_t j = 0; j < 10 * E; j++) ((float *)lm_data(gh))[j] = (float)cos(0.11 * j);
  lm_copy_(g, gh);
  CHECK(out[0] && lm_backward(out[0], g) == 0);
  for (int i = 0; i < 4; i++) {
    lm_tensor *t = i == 0 ? (lm_retain(out[0]), out[0]) : lm_grad(in[i - 1]);
    res[i] = t ? lm_empty(t->ndim, t->shape_, LM_F32, LM_CPU) : NULL;
    if (t) lm_copy_(res[i], t), lm_release(t);
  }
  for (int i = 0; i < 3; i++) lm_release(in[i]);
  lm_release(out[0]), lm_release(out[1]), lm_release(g), lm_release(gh);
}

/* "what to build" item 3: a head dim the fused kernel lacks (32, 80) runs
 * on it padded with zeros to 64 / 128 (not on the composed form that casts
 * bf16 to f32): forward and gradients equal the CPU's (rel 1e-5) */
static void test_attention_padded_head_dims(void) {
  const int64_t dims[2] = {32, 80};
  for (int c = 0; c < 2; c++)
    for (int d = 0; d < 2; d++) {
      lm_tensor *want[4], *got[4];
      attn_calls = 0;
      sdpa_run(LM_CPU, dims[d], c, want);
      sdpa_run(LM_CUDA0, dims[d], c, got);
      CHECK(attn_calls == 2 && attn_dims_seen == (dims[d] < 64 ? 64 : 128)); /* forward, backward */
      for (int i = 0; i < 4; i++) {
        double num = 0, den = 0;
        for (int64_t j = 0; want[i] && got[i] && j < want[i]->numel_; j++) {
          double w = ((float *)lm_data(want[i]))[j], x = ((float *)lm_data(got[i]))[j];
          num += (w - x) * (w - x), den += w * w;
        }
        CHECK(want[i] && got[i] && want[i]->numel_ == got[i]->numel_ && sqrt(num / den) < 1e-5);
        lm_release(want[i]), lm_release(got[i]);
      }
    }
}

int main(void) {
  static lm_backend fake = {.name = "fake cuda", .select = fake_select, .count = fake_count,
                            .alloc = fake_alloc, .free = fake_free, .copy = fake_copy,
                            .fill = fake_fill, .check_ids = fake_check_ids,
                            .cross_entropy = fake_cross_entropy, .rope = fake_rope,
                            .attention = fake_attention, .attention_bwd = fake_attention_bwd};
  CHECK(lm_register_backend(LM_KIND_CUDA, &fake) == 0);
  test_count_selects_nothing();
  test_ids_checked_on_device();
  test_bf16_logits_stay_bf16();
  test_attention_padded_head_dims();
  test_free_after_failed_select();
  return check_report();
}
