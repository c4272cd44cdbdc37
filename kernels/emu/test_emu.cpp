/* test_emu.cpp: the fused CUDA kernels (fused.cu, loss.cu, attention*.cu)
 * run through their slot functions on the CPU under emu.h, against plain
 * f64 references written from the formulas of core/backend.h. Outputs are
 * poisoned with NaN first, so an element left unwritten fails the check.
 * The caching allocator (alloc.cu) runs over a pretend 64 MiB device.
 * Ends with "test_cuda_emu: N passed, N failed". */
#include "emu.h"
#include "../cuda/fused.cu"
#include "../cuda/loss.cu"
#include "../cuda/attention.cu"
#include "../cuda/attention_bwd.cu"
#include "../cuda/alloc.cu"
#include <stdarg.h>
#include <map>
#include <memory>
#include <string>

/* ---- what the kernel files call outside themselves ---- */
static char last_error[1024];
extern "C" int lm_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}
extern "C" const char *lm_dtype_name(int d) {
  static const char *n[] = {"f32", "f64", "bf16", "f16", "i32", "i64", "bool"};
  return d >= 0 && d < 7 ? n[d] : "?";
}
extern "C" int lm_dtype_size(int d) { return lm_dtype_size_dev(d); }
extern "C" int lm_is_contiguous(const lm_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape_[d] != 1 && t->stride_[d] != s) return 0;
    s *= t->shape_[d];
  }
  return 1;
}
int lm_cuda_use(const lm_tensor *) { return 0; }
int lm_cuda_launched(const char *) { return 0; }
int lm_cuda_current_device(void) { return 0; }

/* a device of 64 MiB for the allocator (alloc.cu) to ask */
static const size_t DEVICE_BYTES = 64 << 20;
static std::map<void *, size_t> device_blocks;
static size_t device_used;
static cudaError_t sticky = cudaSuccess;
extern "C" cudaError_t cudaMalloc(void **p, size_t n) {
  if (device_used + n > DEVICE_BYTES) return sticky = cudaErrorMemoryAllocation;
  *p = malloc(n);
  device_blocks[*p] = n, device_used += n;
  return cudaSuccess;
}
extern "C" cudaError_t cudaFree(void *p) {
  device_used -= device_blocks[p];
  device_blocks.erase(p);
  free(p);
  return cudaSuccess;
}
extern "C" cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
  *fr = DEVICE_BYTES - device_used, *total = DEVICE_BYTES;
  return cudaSuccess;
}
extern "C" cudaError_t cudaGetLastError(void) {
  cudaError_t e = sticky;
  sticky = cudaSuccess;
  return e;
}
extern "C" const char *cudaGetErrorString(cudaError_t e) { return e ? "out of memory" : "no error"; }
int lm_cuda_fill(lm_tensor *t, double v) {
  for (int64_t i = 0; i < t->numel_; i++) lm_dev_store(lm_ptr(t) + i * lm_dtype_size(t->dtype_), t->dtype_, v);
  return 0;
}

/* ---- tensors in host memory ---- */
struct Ten {
  lm_tensor t;
  lm_storage s;
  std::vector<char> buf;
  double at(int64_t i) const { return lm_load(lm_ptr(&t) + i * lm_dtype_size(t.dtype_), t.dtype_); }
  void set(int64_t i, double v) { lm_dev_store(lm_ptr(&t) + i * lm_dtype_size(t.dtype_), t.dtype_, v); }
  int64_t n() const { return t.numel_; }
};
typedef std::unique_ptr<Ten> P;

static P make(std::vector<int64_t> shape, int dtype) {
  P x(new Ten());
  memset(&x->t, 0, sizeof x->t);
  memset(&x->s, 0, sizeof x->s);
  x->t.ndim = (int8_t)shape.size(), x->t.dtype_ = (int8_t)dtype, x->t.device_ = LM_CUDA0, x->t.refcount = 1;
  int64_t n = 1;
  for (int d = (int)shape.size() - 1; d >= 0; d--) x->t.shape_[d] = shape[d], x->t.stride_[d] = n, n *= shape[d];
  x->t.numel_ = n;
  x->buf.assign((size_t)(n * lm_dtype_size(dtype) + 16), 0);
  x->s.refcount = 1, x->s.data = x->buf.data(), x->s.nbytes = x->buf.size(), x->t.storage = &x->s;
  for (int64_t i = 0; i < n; i++) x->set(i, NAN); /* poison */
  return x;
}

static uint64_t rng_state = 88172645463325252ULL;
static double uniform() { /* xorshift64, in [-1, 1) */
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / (double)(1ULL << 52) - 1;
}
static P rand_t(std::vector<int64_t> shape, int dtype, double scale = 1) {
  P x = make(shape, dtype);
  for (int64_t i = 0; i < x->n(); i++) x->set(i, uniform() * scale);
  return x;
}

/* ---- checks ---- */
static int passed, failed;
/* |got - ref| / |ref| (norms over all elements) within tol; NaN fails */
static void check(const char *what, const Ten &got, const std::vector<double> &ref, double tol) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < got.n(); i++) {
    double d = got.at(i) - ref[i];
    num += d * d, den += ref[i] * ref[i];
  }
  double err = sqrt(num / (den > 0 ? den : 1));
  bool ok = err <= tol && (int64_t)ref.size() == got.n();
  ok ? passed++ : failed++;
  printf("%s %-58s rel err %.3g (tol %.0e)\n", ok ? "ok  " : "FAIL", what, err, tol);
}
static void expect(const char *what, bool ok, const char *detail = "") {
  ok ? passed++ : failed++;
  printf("%s %-58s %s\n", ok ? "ok  " : "FAIL", what, detail);
}
static void expect_rc(const char *what, int rc, int want) {
  bool ok = rc == want;
  ok ? passed++ : failed++;
  printf("%s %-58s rc %d (want %d)%s%s\n", ok ? "ok  " : "FAIL", what, rc, want, rc ? ": " : "", rc ? last_error : "");
}
static double tol_of(int dtype) { return dtype == LM_F64 ? 1e-12 : dtype == LM_F32 ? 2e-6 : dtype == LM_BF16 ? 2e-2 : 4e-3; }

/* ---- attention ---- */
struct AttnRef { std::vector<double> o, lse, dq, dk, dv; };

static AttnRef attn_ref(const Ten &q, const Ten &k, const Ten &v, const Ten &g, int64_t B, int64_t L,
                        int64_t S, int D, double scale, int causal) {
  AttnRef r;
  r.o.assign(B * L * D, 0), r.lse.assign(B * L, 0), r.dq.assign(B * L * D, 0);
  r.dk.assign(B * S * D, 0), r.dv.assign(B * S * D, 0);
  std::vector<double> p(S), dp(S);
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < L; i++) {
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < S; j++) {
        double s = 0;
        for (int e = 0; e < D; e++) s += q.at((b * L + i) * D + e) * k.at((b * S + j) * D + e);
        p[j] = causal && j > i ? -INFINITY : s * scale;
        m = fmax(m, p[j]);
      }
      for (int64_t j = 0; j < S; j++) sum += p[j] = exp(p[j] - m);
      r.lse[b * L + i] = m + log(sum);
      double dsum = 0;
      for (int64_t j = 0; j < S; j++) {
        p[j] /= sum;
        dp[j] = 0;
        for (int e = 0; e < D; e++) {
          r.o[(b * L + i) * D + e] += p[j] * v.at((b * S + j) * D + e);
          dp[j] += g.at((b * L + i) * D + e) * v.at((b * S + j) * D + e);
          r.dv[(b * S + j) * D + e] += p[j] * g.at((b * L + i) * D + e);
        }
        dsum += p[j] * dp[j];
      }
      for (int64_t j = 0; j < S; j++) {
        double ds = p[j] * (dp[j] - dsum) * scale;
        for (int e = 0; e < D; e++) {
          r.dq[(b * L + i) * D + e] += ds * k.at((b * S + j) * D + e);
          r.dk[(b * S + j) * D + e] += ds * q.at((b * L + i) * D + e);
        }
      }
    }
  return r;
}

static void attention_case(int dtype, int64_t B, int64_t L, int64_t S, int D, int causal) {
  double scale = 1 / sqrt((double)D);
  P q = rand_t({B, L, D}, dtype), k = rand_t({B, S, D}, dtype), v = rand_t({B, S, D}, dtype);
  P g = rand_t({B, L, D}, dtype), o = make({B, L, D}, dtype), lse = make({B, L}, LM_F32);
  P dq = make({B, L, D}, dtype), dk = make({B, S, D}, dtype), dv = make({B, S, D}, dtype);
  AttnRef r = attn_ref(*q, *k, *v, *g, B, L, S, D, scale, causal);
  char what[128];
  snprintf(what, sizeof what, "attention %s B%lld L%lld S%lld D%d%s", lm_dtype_name(dtype), (long long)B,
           (long long)L, (long long)S, D, causal ? " causal" : "");
  int rc = lm_cuda_attention(&o->t, &lse->t, &q->t, &k->t, &v->t, scale, causal);
  expect_rc(what, rc, 0);
  if (rc) return;
  double tol = tol_of(dtype);
  check((std::string(what) + ": o").c_str(), *o, r.o, tol);
  check((std::string(what) + ": lse").c_str(), *lse, r.lse, dtype == LM_F32 ? 2e-6 : 1e-2);
  rc = lm_cuda_attention_bwd(&dq->t, &dk->t, &dv->t, &g->t, &q->t, &k->t, &v->t, &o->t, &lse->t, scale, causal);
  expect_rc((std::string(what) + ": backward").c_str(), rc, 0);
  if (rc) return;
  double btol = dtype == LM_F32 ? 1e-5 : 3 * tol;
  check((std::string(what) + ": dq").c_str(), *dq, r.dq, btol);
  check((std::string(what) + ": dk").c_str(), *dk, r.dk, btol);
  check((std::string(what) + ": dv").c_str(), *dv, r.dv, btol);
}

static void attention_refusals() {
  P q = rand_t({1, 8, 96}, LM_BF16), o = make({1, 8, 96}, LM_BF16), lse = make({1, 8}, LM_F32);
  expect_rc("attention head dim 96: unsupported",
            lm_cuda_attention(&o->t, &lse->t, &q->t, &q->t, &q->t, 0.1, 0), LM_CUDA_UNSUPPORTED);
  P q64 = rand_t({1, 8, 64}, LM_F64), o64 = make({1, 8, 64}, LM_F64);
  expect_rc("attention f64: unsupported",
            lm_cuda_attention(&o64->t, &lse->t, &q64->t, &q64->t, &q64->t, 0.1, 0), LM_CUDA_UNSUPPORTED);
  P a = rand_t({1, 8, 64}, LM_F32), bad = make({1, 8, 64}, LM_F32);
  bad->t.offset = 1; /* 4 bytes off */
  expect_rc("attention misaligned: unsupported",
            lm_cuda_attention(&o->t, &lse->t, &bad->t, &a->t, &a->t, 0.1, 0), LM_CUDA_UNSUPPORTED);
}

/* ---- cross entropy ---- */
static void ce_case(int dtype, int64_t N, int64_t C, bool weighted, double eps) {
  int cd = dtype == LM_F64 ? LM_F64 : LM_F32;
  const int64_t ignore = -100;
  P x = rand_t({N, C}, dtype, 4), t = make({N}, LM_I64), w = weighted ? rand_t({C}, cd) : nullptr;
  if (w) for (int64_t c = 0; c < C; c++) w->set(c, 0.5 + fabs(w->at(c)));
  for (int64_t n = 0; n < N; n++) t->set(n, n % 5 == 3 ? (double)ignore : (double)((n * 7919) % C));
  P loss = make({N}, cd), lse = make({N}, cd), gl = rand_t({N}, cd), dx = make({N, C}, dtype);
  std::vector<double> rl(N), rlse(N), rdx(N * C);
  for (int64_t n = 0; n < N; n++) {
    double m = -INFINITY, s = 0, sw = 0, swl = 0;
    for (int64_t c = 0; c < C; c++) m = fmax(m, x->at(n * C + c));
    for (int64_t c = 0; c < C; c++) s += exp(x->at(n * C + c) - m);
    double l = m + log(s);
    rlse[n] = l;
    int64_t tn = (int64_t)t->at(n);
    for (int64_t c = 0; c < C; c++) {
      double wc = w ? w->at(c) : 1;
      sw += wc, swl += wc * (x->at(n * C + c) - l);
    }
    if (tn == ignore) { rl[n] = 0; continue; }
    double wt = w ? w->at(tn) : 1;
    rl[n] = -(1 - eps) * wt * (x->at(n * C + tn) - l) - eps / C * swl;
    for (int64_t c = 0; c < C; c++) {
      double p = exp(x->at(n * C + c) - l), wc = w ? w->at(c) : 1;
      rdx[n * C + c] = gl->at(n) * (p * ((1 - eps) * wt + eps / C * sw) - (c == tn) * (1 - eps) * wt - eps / C * wc);
    }
  }
  char what[128];
  snprintf(what, sizeof what, "cross_entropy %s N%lld C%lld%s eps %g", lm_dtype_name(dtype), (long long)N,
           (long long)C, weighted ? " weighted" : "", eps);
  int rc = lm_cuda_cross_entropy(&loss->t, &lse->t, &x->t, &t->t, w ? &w->t : NULL, ignore, eps);
  expect_rc(what, rc, 0);
  double tol = cd == LM_F64 ? 1e-12 : 1e-5;
  check((std::string(what) + ": loss").c_str(), *loss, rl, tol);
  check((std::string(what) + ": lse").c_str(), *lse, rlse, tol);
  rc = lm_cuda_cross_entropy_bwd(&dx->t, &gl->t, &x->t, &t->t, w ? &w->t : NULL, &lse->t, ignore, eps);
  expect_rc((std::string(what) + ": backward").c_str(), rc, 0);
  check((std::string(what) + ": dx").c_str(), *dx, rdx, tol_of(dtype) * 2);
}

/* ---- rows: softmax and norm backward ---- */
static void softmax_bwd_case(int dtype, int64_t R, int64_t n, int log) {
  P x = rand_t({R, n}, dtype, 3), y = make({R, n}, dtype), g = rand_t({R, n}, dtype), gx = make({R, n}, dtype);
  for (int64_t r = 0; r < R; r++) { /* y = softmax or log_softmax of x, rounded to dtype */
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; j++) m = fmax(m, x->at(r * n + j));
    for (int64_t j = 0; j < n; j++) s += exp(x->at(r * n + j) - m);
    for (int64_t j = 0; j < n; j++) y->set(r * n + j, log ? x->at(r * n + j) - m - ::log(s) : exp(x->at(r * n + j) - m) / s);
  }
  std::vector<double> ref(R * n);
  for (int64_t r = 0; r < R; r++) {
    double s = 0;
    for (int64_t j = 0; j < n; j++) s += log ? g->at(r * n + j) : g->at(r * n + j) * y->at(r * n + j);
    for (int64_t j = 0; j < n; j++) {
      double gj = g->at(r * n + j), yj = y->at(r * n + j);
      ref[r * n + j] = log ? gj - exp(yj) * s : yj * (gj - s);
    }
  }
  char what[96];
  snprintf(what, sizeof what, "softmax_bwd %s %lldx%lld%s", lm_dtype_name(dtype), (long long)R, (long long)n,
           log ? " log" : "");
  expect_rc(what, lm_cuda_softmax_bwd(&gx->t, &g->t, &y->t, log), 0);
  check(what, *gx, ref, tol_of(dtype));
}

static void norm_bwd_case(int dtype, int64_t R, int64_t n, int rms, bool affine) {
  P x = rand_t({R, n}, dtype, 2), g = rand_t({R, n}, dtype), w = affine ? rand_t({n}, dtype) : nullptr;
  P mean = make({R}, dtype), rstd = make({R}, dtype), dx = make({R, n}, dtype);
  P dw = affine ? make({n}, dtype) : nullptr, db = affine && !rms ? make({n}, dtype) : nullptr;
  std::vector<double> rdx(R * n), rdw(n, 0), rdb(n, 0);
  for (int64_t r = 0; r < R; r++) {
    double mu = 0, var = 0;
    if (!rms) {
      for (int64_t j = 0; j < n; j++) mu += x->at(r * n + j);
      mu /= n;
    }
    for (int64_t j = 0; j < n; j++) var += (x->at(r * n + j) - mu) * (x->at(r * n + j) - mu);
    mean->set(r, mu), rstd->set(r, 1 / sqrt(var / n + 1e-5));
    double m = mean->at(r), rs = rstd->at(r), s1 = 0, s2 = 0; /* as the forward saved them */
    for (int64_t j = 0; j < n; j++) {
      double gh = g->at(r * n + j) * (w ? w->at(j) : 1), xh = (x->at(r * n + j) - (rms ? 0 : m)) * rs;
      s1 += gh, s2 += gh * xh;
      rdw[j] += g->at(r * n + j) * xh, rdb[j] += g->at(r * n + j);
    }
    for (int64_t j = 0; j < n; j++) {
      double gh = g->at(r * n + j) * (w ? w->at(j) : 1), xh = (x->at(r * n + j) - (rms ? 0 : m)) * rs;
      rdx[r * n + j] = rs * (gh - (rms ? 0 : s1 / n) - xh * s2 / n);
    }
  }
  char what[96];
  snprintf(what, sizeof what, "norm_bwd %s %lldx%lld %s%s", lm_dtype_name(dtype), (long long)R, (long long)n,
           rms ? "rms" : "layer", affine ? " affine" : "");
  expect_rc(what, lm_cuda_norm_bwd(&dx->t, dw ? &dw->t : NULL, db ? &db->t : NULL, &g->t, &x->t,
                                   w ? &w->t : NULL, rms ? NULL : &mean->t, &rstd->t, rms), 0);
  check((std::string(what) + ": dx").c_str(), *dx, rdx, tol_of(dtype));
  if (dw) check((std::string(what) + ": dw").c_str(), *dw, rdw, tol_of(dtype));
  if (db) check((std::string(what) + ": db").c_str(), *db, rdb, tol_of(dtype));
}

/* ---- pointwise: rope, swiglu, unary_grad ---- */
static void rope_case(int dtype, int sign) {
  int64_t O = 2, T = 5, H = 3, D = 8;
  P x = rand_t({O, T, H, D}, dtype), c = rand_t({T, D / 2}, LM_F32), s = rand_t({T, D / 2}, LM_F32);
  P out = make({O, T, H, D}, dtype);
  std::vector<double> ref(x->n());
  for (int64_t p = 0; p < x->n() / 2; p++) {
    int64_t i = p % (D / 2), t = p / (D / 2) / H % T;
    double a = x->at(2 * p), b = x->at(2 * p + 1), cs = c->at(t * D / 2 + i), sn = sign * s->at(t * D / 2 + i);
    ref[2 * p] = a * cs - b * sn, ref[2 * p + 1] = a * sn + b * cs;
  }
  char what[64];
  snprintf(what, sizeof what, "rope %s sign %d", lm_dtype_name(dtype), sign);
  expect_rc(what, lm_cuda_rope(&out->t, &x->t, &c->t, &s->t, sign), 0);
  check(what, *out, ref, tol_of(dtype));
}

static void swiglu_case(int dtype) {
  int64_t n = 1000;
  P a = rand_t({n}, dtype, 4), b = rand_t({n}, dtype), g = rand_t({n}, dtype);
  P out = make({n}, dtype), da = make({n}, dtype), db = make({n}, dtype);
  std::vector<double> ro(n), rda(n), rdb(n);
  for (int64_t i = 0; i < n; i++) {
    double x = a->at(i), sg = 1 / (1 + exp(-x));
    ro[i] = x * sg * b->at(i);
    rda[i] = g->at(i) * b->at(i) * sg * (1 + x * (1 - sg));
    rdb[i] = g->at(i) * x * sg;
  }
  std::string what = std::string("swiglu ") + lm_dtype_name(dtype);
  expect_rc(what.c_str(), lm_cuda_swiglu(&out->t, &a->t, &b->t), 0);
  check(what.c_str(), *out, ro, tol_of(dtype));
  expect_rc((what + " backward").c_str(), lm_cuda_swiglu_bwd(&da->t, &db->t, &g->t, &a->t, &b->t), 0);
  check((what + ": da").c_str(), *da, rda, tol_of(dtype));
  check((what + ": db").c_str(), *db, rdb, tol_of(dtype));
}

static void unary_grad_cases(int dtype) {
  /* every differentiable kind of core/unary.h: its f'(x) against central
   * differences of its f(x) */
#define NAME(K, F, D, R) #K,
  const char *names[] = {LM_UNARY_KINDS(NAME)};
#undef NAME
  int64_t n = 300;
  for (int kind = 0; kind < LM_NUNARY; kind++) {
    if (lm_unary_grad_reads(kind) == LM_D_NONE) continue;
    double p[2] = {kind == LM_POW_SCALAR ? 3.0 : -0.5, 0.7};
    bool positive = kind == LM_SQRT || kind == LM_RSQRT || kind == LM_LOG || kind == LM_POW_SCALAR;
    P x = rand_t({n}, dtype, 2), g = rand_t({n}, dtype), y = make({n}, dtype), gx = make({n}, dtype);
    std::vector<double> ref(n);
    for (int64_t j = 0; j < n; j++) {
      double xv = x->at(j);
      if (positive) x->set(j, xv = 0.2 + fabs(xv));
      if (fabs(xv) < 0.02 || fabs(xv - p[0]) < 0.02 || fabs(xv - p[1]) < 0.02) x->set(j, xv += 0.05); /* off the kinks */
      y->set(j, lm_unary_f64(kind, xv, p[0], p[1]));
      double h = 1e-6;
      ref[j] = g->at(j) * (lm_unary_f64(kind, xv + h, p[0], p[1]) - lm_unary_f64(kind, xv - h, p[0], p[1])) / (2 * h);
    }
    std::string what = std::string("unary_grad ") + names[kind] + " " + lm_dtype_name(dtype);
    expect_rc(what.c_str(), lm_cuda_unary_grad(kind, &gx->t, &g->t, &x->t, &y->t, p), 0);
    /* y rounded to the dtype feeds the derivative: the dtype's tolerance, and
     * central differences in f64 are good to ~1e-9 */
    check(what.c_str(), *gx, ref, dtype == LM_F64 ? 1e-7 : tol_of(dtype) * 4);
  }
}

/* ---- the caching allocator ---- */
static void allocator_cases() {
  const size_t K = 1024, M = K * K;
  size_t in[] = {1, 512, 513, M - 1, M, M + 1, 3 * M, 3 * M + 1, 5 * M};
  size_t out[] = {512, 512, 1024, M, M, M + M / 4, 3 * M, 3 * M + M / 2, 5 * M};
  bool ok = true;
  for (int i = 0; i < 9; i++) ok = ok && lm_cuda_round_size(in[i]) == out[i];
  expect("allocator: size classes (512 B steps, 4 per power of two above 1 MiB)", ok);

  int64_t st[LM_NMEM_STATS];
  lm_cuda_memory_stats(0, st);
  int64_t drivers0 = st[LM_MEM_DRIVER_ALLOCS];
  size_t sizes[] = {100, 4000, 70000, 3 * M + 5, 100, 2 * M};
  for (int step = 0; step < 3; step++) { /* a "training step": the same requests each time */
    void *p[6];
    for (int i = 0; i < 6; i++) p[i] = lm_cuda_alloc(sizes[i]);
    for (int i = 0; i < 6; i++) lm_cuda_free(p[i]);
  }
  lm_cuda_memory_stats(0, st);
  char d[128];
  snprintf(d, sizeof d, "%lld driver allocations", (long long)(st[LM_MEM_DRIVER_ALLOCS] - drivers0));
  expect("allocator: later steps reuse the first step's blocks", st[LM_MEM_DRIVER_ALLOCS] - drivers0 == 6, d);
  expect("allocator: nothing allocated after the frees, all reserved",
         st[LM_MEM_ALLOCATED] == 0 && st[LM_MEM_RESERVED] >= (int64_t)(5 * M) && st[LM_MEM_PEAK] >= (int64_t)(5 * M));

  /* out of memory: the cache goes back to the driver and the request is retried */
  lm_cuda_free(lm_cuda_alloc(16 * M)); /* cached: 16 MiB and the step's blocks */
  void *big = lm_cuda_alloc(48 * M);    /* more than is left beside the cache */
  lm_cuda_memory_stats(0, st);
  expect("allocator: a request that fits once the cache is emptied succeeds",
         big != NULL && st[LM_MEM_RESERVED] == (int64_t)(48 * M));
  void *huge = lm_cuda_alloc(100 * M);
  expect("allocator: out of memory returns NULL naming requested and free bytes",
         huge == NULL && strstr(last_error, "out of memory") && strstr(last_error, "104857600 requested") &&
             strstr(last_error, "16777216 bytes free of 67108864"),
         last_error);
  lm_cuda_free(big);
  void *again = lm_cuda_alloc(48 * M);
  expect("allocator: usable after running out (the freed block comes back)", again == big);
  lm_cuda_free(again);
  lm_cuda_empty_cache(0);
  lm_cuda_memory_stats(0, st);
  expect("allocator: empty_cache hands every block back", st[LM_MEM_RESERVED] == 0 && device_used == 0);
}

int main() {
  allocator_cases();
  unary_grad_cases(LM_F32);
  unary_grad_cases(LM_F64);
  for (int dt : {LM_F32, LM_F64, LM_BF16}) swiglu_case(dt);
  for (int dt : {LM_F32, LM_F16}) rope_case(dt, 1), rope_case(dt, -1);
  for (int dt : {LM_F32, LM_F64}) softmax_bwd_case(dt, 3, 300, 0), softmax_bwd_case(dt, 3, 1500, 1);
  for (int rms = 0; rms < 2; rms++)
    norm_bwd_case(LM_F32, 70, 40, rms, true), norm_bwd_case(LM_F64, 5, 1100, rms, false);
  norm_bwd_case(LM_BF16, 130, 64, 0, true);
  ce_case(LM_F32, 9, 1500, false, 0), ce_case(LM_F32, 9, 77, true, 0.1), ce_case(LM_F64, 6, 50, true, 0.2);
  ce_case(LM_BF16, 7, 300, false, 0.05);
  attention_refusals();
  for (int causal = 0; causal < 2; causal++) {
    attention_case(LM_F32, 2, 37, 70, 64, causal);
    attention_case(LM_BF16, 2, 37, 70, 64, causal);
    attention_case(LM_BF16, 1, 130, 100, 64, causal);
  }
  attention_case(LM_F16, 1, 70, 70, 128, 1);
  attention_case(LM_F32, 1, 65, 33, 128, 0);
  attention_case(LM_BF16, 1, 96, 160, 128, 1);
  /* above 128: two blocks per row tile, one per half of the columns */
  attention_case(LM_F32, 1, 70, 100, 256, 1);
  attention_case(LM_BF16, 1, 70, 100, 256, 0);
  attention_case(LM_F16, 1, 65, 33, 192, 1);
  attention_case(LM_BF16, 1, 40, 70, 192, 0);
  printf("(%ld barriers emulated)\ntest_cuda_emu: %d passed, %d failed\n", lm_emu::barriers, passed, failed);
  return failed ? 1 : 0;
}
