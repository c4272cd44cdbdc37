/* fused_attn.c: scaled dot-product attention that never holds the (L, S)
 * score matrix (flash attention, on the CPU). The forward walks tiles of
 * BQ queries against tiles of BK keys with an online softmax (a running
 * max and sum per query, the output rescaled as the max grows) and saves
 * each row's log-sum-exp; the backward rebuilds a tile's probabilities
 * from it, exp(s - lse), and sums dV, dK per key tile and dQ per batch
 * entry. Operands are contiguous (B, L, E), (B, S, E), (B, S, Ev) of one
 * dtype: f32, bf16 and f16 compute in f32 (tiles are widened as they are
 * loaded, results rounded once), f64 in f64. The tile products run in a
 * register-blocked micro-kernel; threads take (batch entry, query tile)
 * pairs in the forward and batch entries in the backward. With bf16
 * operands on a CPU with bf16 dot products (a build for AVX512_BF16, the
 * bf16 GEMM switch on: lm_cpu_set_bf16_gemm, LOOM_BF16_GEMM=plain) the
 * tile products take bf16 operands with f32 sums (vdpbf16ps), as tensor
 * cores and PyTorch's CPU flash attention do: q, k, v and dO are bf16
 * already; the probabilities and their gradients are rounded to bf16 for
 * the products that take them. Even head dims go to fused_attn_bf16.c,
 * which packs those operands from the bf16 tensors once per batch entry;
 * here the tiles are widened and packed for each product. */
#include "simd.h" /* first: its pragma lets exp-bound loops vectorise */
#include "fastmath.h"
#include "fused_attn.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int64_t dp_runs; /* attention calls whose products ran on them */
int64_t lm_cpu_bf16_attention_runs(void) { return __atomic_load_n(&dp_runs, __ATOMIC_RELAXED); }

/* the path bf16 attention's tile products take, for lm_blas_info */
const char *lm_cpu_bf16_attention_info(void) {
#ifdef ATTN_DP
  return lm_cpu_set_bf16_gemm(-1) == 1 ? "bf16 dot products (vdpbf16ps)"
                                       : "widened to f32 (set off: LOOM_BF16_GEMM=plain or lm_cpu_set_bf16_gemm)";
#else
  return "widened to f32 (built without AVX512_BF16)";
#endif
}

#define JB_f32 16 /* columns of the micro-kernel: two vector registers a row */
#define JB_f64 8

/* ---- rows in and out of the compute type ---- */
static void ld_f32(float *d, const char *p, int dt, int64_t n) {
  const uint16_t *h = (const uint16_t *)p;
  switch (dt) {
  case LM_BF16:
    for (int64_t i = 0; i < n; i++) {
      uint32_t u = (uint32_t)h[i] << 16;
      memcpy(&d[i], &u, 4);
    }
    break;
  case LM_F16: for (int64_t i = 0; i < n; i++) d[i] = lm_f16_to_f32(h[i]); break;
  default: memcpy(d, p, n * sizeof *d);
  }
}
static void st_f32(char *p, int dt, const float *s, int64_t n) {
  uint16_t *h = (uint16_t *)p;
  switch (dt) {
  case LM_BF16: for (int64_t i = 0; i < n; i++) h[i] = lm_f32_to_bf16(s[i]); break;
  case LM_F16: for (int64_t i = 0; i < n; i++) h[i] = lm_f32_to_f16(s[i]); break;
  default: memcpy(p, s, n * sizeof *s);
  }
}
static void ld_f64(double *d, const char *p, int dt, int64_t n) { (void)dt, memcpy(d, p, n * sizeof *d); }
static void st_f64(char *p, int dt, const double *s, int64_t n) { (void)dt, memcpy(p, s, n * sizeof *s); }
static inline double ex_f64(double x) { return exp(x); }

/* C (m x n, row stride ldc) = (zero ? 0 : C) + A (m x K) B (K x n, ldb),
 * A's element (i, k) at a[i * ras + k * kas] (so A or its transpose); m a
 * multiple of RB, n of JB. RB x JB sums stay in registers over k. */
#define MICRO(A)                                                               \
  static void mk_##A(A *restrict c, int64_t ldc, const A *restrict a, int64_t ras, int64_t kas, \
                     const A *restrict b, int64_t ldb, int64_t m, int64_t n, int64_t K, int zero) { \
    enum { JB = JB_##A };                                                      \
    for (int64_t i = 0; i < m; i += RB)                                        \
      for (int64_t j = 0; j < n; j += JB) {                                    \
        A acc[RB][JB];                                                         \
        for (int r = 0; r < RB; r++)                                           \
          for (int q = 0; q < JB; q++) acc[r][q] = zero ? 0 : c[(i + r) * ldc + j + q]; \
        const A *ai = a + i * ras;                                             \
        for (int64_t k = 0; k < K; k++) {                                      \
          const A *bk = b + k * ldb + j;                                       \
          const A x0 = ai[k * kas], x1 = ai[ras + k * kas], x2 = ai[2 * ras + k * kas], \
                  x3 = ai[3 * ras + k * kas];                                  \
          for (int q = 0; q < JB; q++) {                                       \
            acc[0][q] += x0 * bk[q], acc[1][q] += x1 * bk[q];                  \
            acc[2][q] += x2 * bk[q], acc[3][q] += x3 * bk[q];                  \
          }                                                                    \
        }                                                                      \
        for (int r = 0; r < RB; r++)                                           \
          for (int q = 0; q < JB; q++) c[(i + r) * ldc + j + q] = acc[r][q];   \
      }                                                                        \
  }

#ifdef ATTN_DP
/* mk_f32's product on bf16 dot products, A row-major (kas 1) or
 * transposed (ras 1). pk: room for m * K2 + K2 * n words */
static void mk_dp(uint32_t *pk, f32 *c, int64_t ldc, const f32 *a, int64_t ras, int64_t kas, const f32 *b,
                  int64_t ldb, int64_t m, int64_t n, int64_t K, int zero) {
  const int64_t K2 = (K + 1) / 2;
  uint32_t *ap = pk, *bp = pk + m * K2;
  if (kas == 1) pack_rows(ap, a, ras, m, K);
  else pack_across(ap, a, kas, m, K);
  pack_across(bp, b, ldb, n, K);
  if (kas == 1) dp_tile(c, ldc, ap, K2, 1, bp, n, m, n, K2, zero);
  else dp_tile(c, ldc, ap, 1, m, bp, n, m, n, K2, zero);
}
#endif

/* n rows (from row j0) of a (rows, E) operand as the columns of t (E, BK),
 * columns n..up(n, JB) zero */
#define LOAD_T(A)                                                              \
  static void load_t_##A(A *t, A *tmp, const char *x, int dt, int64_t rs, int64_t j0, int64_t n, int64_t E) { \
    for (int64_t j = 0; j < n; j++) {                                          \
      ld_##A(tmp, x + (j0 + j) * rs, dt, E);                                   \
      for (int64_t e = 0; e < E; e++) t[e * BK + j] = tmp[e];                  \
    }                                                                          \
    for (int64_t e = 0; e < E; e++)                                            \
      for (int64_t j = n; j < up(n, JB_##A); j++) t[e * BK + j] = 0;           \
  }

/* n rows (from row j0) of a (rows, E) operand into x (rows of stride ld),
 * rows n..up(n, RB) zero; the columns past E stay as they are (zero) */
#define LOAD_ROWS(A)                                                           \
  static void load_rows_##A(A *x, int64_t ld, const char *src, int dt, int64_t rs, int64_t j0, int64_t n, int64_t E) { \
    for (int64_t j = 0; j < n; j++) ld_##A(x + j * ld, src + (j0 + j) * rs, dt, E); \
    for (int64_t j = n; j < up(n, RB); j++) memset(x + j * ld, 0, sizeof *x * ld); \
  }

#define ATTN_FWD(A)                                                            \
  static int attn_fwd_##A(char *o, A *lse, const char *q, const char *k, const char *v, \
                          const attn_dims *d) {                                \
    const int64_t E = d->E, Ev = d->Ev, L = d->L, S = d->S, nqt = (L + BQ - 1) / BQ; \
    const int64_t Evp = up(Ev, JB_##A);                                        \
    const int dt = d->dt;                                                      \
    const A scale = (A)d->scale;                                               \
    int nt = lm_threads_for(d->B * L * S * (E + Ev)), failed = 0;              \
    _Pragma("omp parallel num_threads(nt) reduction(|:failed)")                \
    {                                                                          \
      const size_t nb = BQ * E + E * BK + BK * Evp + BQ * Evp + BQ * BK + 2 * BQ + E + Ev; \
      A *buf = calloc(nb + pack_words(E > BK ? E : BK, Evp > BK ? Evp : BK), sizeof(A)); \
      A *Q = buf, *Kt = Q + BQ * E, *V = Kt + E * BK, *O = V + BK * Evp, *P = O + BQ * Evp; \
      A *m = P + BQ * BK, *l = m + BQ, *tmp = l + BQ;                          \
      uint32_t *pk = (uint32_t *)(buf + nb);                                   \
      failed |= !buf;                                                          \
      _Pragma("omp for schedule(dynamic)")                                     \
      for (int64_t it = 0; it < d->B * nqt; it++) {                            \
        if (!buf) continue;                                                    \
        const int64_t b = it / nqt, i0 = it % nqt * BQ, ni = L - i0 < BQ ? L - i0 : BQ, ni4 = up(ni, RB); \
        const char *kb = k + entry_at(&d->k, b), *vb = v + entry_at(&d->v, b); \
        load_rows_##A(Q, E, q + entry_at(&d->q, b), dt, d->q.sr, i0, ni, E);   \
        for (int64_t i = 0; i < ni4; i++) m[i] = -INFINITY, l[i] = 0;          \
        memset(O, 0, sizeof(A) * BQ * Evp);                                    \
        const int64_t jend = d->causal && i0 + ni < S ? i0 + ni : S;           \
        for (int64_t j0 = 0; j0 < jend; j0 += BK) {                            \
          const int64_t nj = jend - j0 < BK ? jend - j0 : BK, njp = up(nj, JB_##A); \
          load_t_##A(Kt, tmp, kb, dt, d->k.sr, j0, nj, E);                     \
          load_rows_##A(V, Evp, vb, dt, d->v.sr, j0, nj, Ev);                  \
          mkx_##A(d, pk, P, BK, Q, E, 1, Kt, BK, ni4, njp, E, 1); /* scores */ \
          softmax_tile_##A(P, O, Evp, m, l, ni, ni4, i0, j0, nj, njp, scale, d->causal); \
          mkx_##A(d, pk, O, Evp, P, BK, 1, V, Evp, ni4, Evp, nj, 0); /* O += P V */ \
        }                                                                      \
        for (int64_t i = 0; i < ni; i++) {                                     \
          const A r = 1 / l[i];                                                \
          for (int64_t e = 0; e < Ev; e++) O[i * Evp + e] *= r;                \
          st_##A(o + entry_at(&d->o, b) + (i0 + i) * d->o.sr, dt, O + i * Evp, Ev); \
          lse[b * L + i0 + i] = m[i] + log(l[i]);                              \
        }                                                                      \
      }                                                                        \
      free(buf);                                                               \
    }                                                                          \
    return failed ? lm_error("attention kernel: out of memory for a thread's tiles") : 0; \
  }

/* Backward for one batch entry b at a time: D_i = dO_i . O_i; per key tile
 * P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = scale P (dP - D),
 * dK += dS^T Q, dQ += dS K (dQ summed in Qacc over the key tiles). */
#define ATTN_BWD(A)                                                            \
  static int attn_bwd_##A(char *dq, char *dk, char *dv, const char *g, const char *q, \
                          const char *k, const char *v, const char *o, const A *lse, \
                          const attn_dims *d) {                                \
    const int64_t E = d->E, Ev = d->Ev, L = d->L, S = d->S;                    \
    const int64_t Ep = up(E, JB_##A), Evp = up(Ev, JB_##A), X = E > Ev ? E : Ev; \
    const int dt = d->dt;                                                      \
    const A scale = (A)d->scale;                                               \
    int nt = lm_threads_for(d->B * L * S * (E + Ev)), failed = 0;              \
    if (nt > d->B) nt = d->B > 0 ? (int)d->B : 1;                              \
    _Pragma("omp parallel num_threads(nt) reduction(|:failed)")                \
    {                                                                          \
      size_t n = (L + BQ) * Ep + L + BQ * Ep + BQ * Evp + 2 * BK * Ep + E * BK + Ev * BK + BK * Evp + \
                 2 * BQ * BK + 2 * X;                                          \
      const int64_t kmax = X > BK ? X : BK, wide = Ep > Evp ? Ep : Evp, nmax = wide > BK ? wide : BK; \
      A *buf = calloc(n + pack_words(kmax, nmax), sizeof(A));                  \
      uint32_t *pk = buf ? (uint32_t *)(buf + n) : NULL;                       \
      A *Qacc = buf, *D = Qacc + (L + BQ) * Ep, *Q = D + L, *dO = Q + BQ * Ep, *K = dO + BQ * Evp; \
      A *dK = K + BK * Ep, *Kt = dK + BK * Ep, *Vt = Kt + E * BK, *dV = Vt + Ev * BK; \
      A *P = dV + BK * Evp, *dP = P + BQ * BK, *tmp = dP + BQ * BK;            \
      failed |= !buf;                                                          \
      _Pragma("omp for schedule(dynamic)")                                     \
      for (int64_t b = 0; b < d->B; b++) {                                     \
        if (!buf) continue;                                                    \
        const char *qb = q + entry_at(&d->q, b), *kb = k + entry_at(&d->k, b), *vb = v + entry_at(&d->v, b); \
        const char *gb = g + entry_at(&d->g, b), *ob = o + entry_at(&d->o, b); \
        const A *lb = lse + b * L;                                             \
        for (int64_t i = 0; i < L; i++) {                                      \
          ld_##A(tmp, gb + i * d->g.sr, dt, Ev);                               \
          ld_##A(tmp + X, ob + i * d->o.sr, dt, Ev);                           \
          A s = 0;                                                             \
          for (int64_t e = 0; e < Ev; e++) s += tmp[e] * tmp[X + e];           \
          D[i] = s;                                                            \
        }                                                                      \
        memset(Qacc, 0, sizeof(A) * (L + BQ) * Ep);                            \
        for (int64_t j0 = 0; j0 < S; j0 += BK) {                               \
          const int64_t nj = S - j0 < BK ? S - j0 : BK, njp = up(nj, JB_##A), nj4 = up(nj, RB); \
          load_rows_##A(K, Ep, kb, dt, d->k.sr, j0, nj, E);                    \
          load_t_##A(Kt, tmp, kb, dt, d->k.sr, j0, nj, E);                     \
          load_t_##A(Vt, tmp, vb, dt, d->v.sr, j0, nj, Ev);                    \
          memset(dK, 0, sizeof(A) * BK * Ep), memset(dV, 0, sizeof(A) * BK * Evp); \
          for (int64_t i0 = d->causal ? j0 : 0; i0 < L; i0 += BQ) {            \
            const int64_t ni = L - i0 < BQ ? L - i0 : BQ, ni4 = up(ni, RB);    \
            load_rows_##A(Q, Ep, qb, dt, d->q.sr, i0, ni, E);                  \
            load_rows_##A(dO, Evp, gb, dt, d->g.sr, i0, ni, Ev);               \
            mkx_##A(d, pk, P, BK, Q, Ep, 1, Kt, BK, ni4, njp, E, 1);   /* scores */ \
            mkx_##A(d, pk, dP, BK, dO, Evp, 1, Vt, BK, ni4, njp, Ev, 1); /* dO V^T */ \
            grad_tile_##A(P, dP, lb, D, ni, ni4, i0, j0, nj, njp, scale, d->causal); \
            mkx_##A(d, pk, dV, Evp, P, 1, BK, dO, Evp, nj4, Evp, ni, 0);  /* P^T dO */ \
            mkx_##A(d, pk, dK, Ep, dP, 1, BK, Q, Ep, nj4, Ep, ni, 0);     /* dS^T Q */ \
            mkx_##A(d, pk, Qacc + i0 * Ep, Ep, dP, BK, 1, K, Ep, ni4, Ep, nj, 0); /* dS K */ \
          }                                                                    \
          for (int64_t j = 0; j < nj; j++) {                                   \
            st_##A(dk + entry_at(&d->dk, b) + (j0 + j) * d->dk.sr, dt, dK + j * Ep, E); \
            st_##A(dv + entry_at(&d->dv, b) + (j0 + j) * d->dv.sr, dt, dV + j * Evp, Ev); \
          }                                                                    \
        }                                                                      \
        for (int64_t i = 0; i < L; i++) st_##A(dq + entry_at(&d->dq, b) + i * d->dq.sr, dt, Qacc + i * Ep, E); \
      }                                                                        \
      free(buf);                                                               \
    }                                                                          \
    return failed ? lm_error("attention_bwd kernel: out of memory for a thread's tiles") : 0; \
  }

MICRO(f32) MICRO(f64)

/* a tile product, on bf16 dot products where the call asks for them */
static void mkx_f32(const attn_dims *d, uint32_t *pk, f32 *c, int64_t ldc, const f32 *a, int64_t ras, int64_t kas,
                    const f32 *b, int64_t ldb, int64_t m, int64_t n, int64_t K, int zero) {
#ifdef ATTN_DP
  if (d->dp && (kas == 1 || ras == 1)) {
    mk_dp(pk, c, ldc, a, ras, kas, b, ldb, m, n, K, zero);
    return;
  }
#endif
  (void)d, (void)pk;
  mk_f32(c, ldc, a, ras, kas, b, ldb, m, n, K, zero);
}
static void mkx_f64(const attn_dims *d, uint32_t *pk, f64 *c, int64_t ldc, const f64 *a, int64_t ras, int64_t kas,
                    const f64 *b, int64_t ldb, int64_t m, int64_t n, int64_t K, int zero) {
  (void)d, (void)pk;
  mk_f64(c, ldc, a, ras, kas, b, ldb, m, n, K, zero);
}
/* the 32-bit words mk_dp packs into, at most: A of up to BK rows and B of
 * up to nmax columns, over up to kmax k */
static int64_t pack_words(int64_t kmax, int64_t nmax) { return (kmax + 1) / 2 * (BK + nmax); }
LOAD_T(f32) LOAD_T(f64)
LOAD_ROWS(f32) LOAD_ROWS(f64)
MASK_ROW(f64) SOFTMAX_TILE(f64) GRAD_TILE(f64)
ATTN_FWD(f32) ATTN_FWD(f64)
ATTN_BWD(f32) ATTN_BWD(f64)

/* where t's rows are: t (B, R, E) or (B, H, R, E) with any strides but a
 * last of 1 */
static int rows_of(attn_rows *a, const lm_tensor *t, const char *name, const char *what) {
  const int n = t->ndim;
  const int64_t es = lm_dtype_size(t->dtype_);
  if ((n != 3 && n != 4) || t->stride_[n - 1] != 1)
    return lm_error("%s kernel: expected %s of 3 or 4 dims, the last of stride 1 (%d dims, stride %lld)", name,
                    what, n, (long long)t->stride_[n - 1]);
  *a = (attn_rows){.H = n == 4 && t->shape_[1] > 0 ? t->shape_[1] : 1, .sb = t->stride_[0] * es,
                   .sh = n == 4 ? t->stride_[1] * es : 0, .sr = t->stride_[n - 2] * es};
  return 0;
}

/* the dims of the call and where q, k, v and o are, or -1 when the
 * dtypes or the layouts do not fit */
static int dims_of(attn_dims *d, const lm_tensor *q, const lm_tensor *k, const lm_tensor *v, const lm_tensor *o,
                   const lm_tensor *lse, double scale, int causal, const char *name) {
  int dt = q->dtype_, cd = dt == LM_F64 ? LM_F64 : LM_F32;
  if (dt != LM_F32 && dt != LM_F64 && dt != LM_BF16 && dt != LM_F16)
    return lm_error("%s kernel: no kernel for dtype %s", name, lm_dtype_name(dt));
  if (k->dtype_ != dt || v->dtype_ != dt || lse->dtype_ != cd || !lm_is_contiguous(lse))
    return lm_error("%s kernel: expected q, k, v of one dtype and a dense lse in %s", name, lm_dtype_name(cd));
  const int n = q->ndim;
  *d = (attn_dims){.B = n == 4 ? q->shape_[0] * q->shape_[1] : q->shape_[0], .L = q->shape_[n - 2],
                   .S = k->shape_[n - 2], .E = q->shape_[n - 1], .Ev = v->shape_[n - 1], .dt = dt,
                   .es = lm_dtype_size(dt), .causal = causal, .scale = scale};
  LM_TRY(rows_of(&d->q, q, name, "q"));
  LM_TRY(rows_of(&d->k, k, name, "k"));
  LM_TRY(rows_of(&d->v, v, name, "v"));
  LM_TRY(rows_of(&d->o, o, name, "o"));
#ifdef ATTN_DP
  d->dp = dt == LM_BF16 && lm_cpu_set_bf16_gemm(-1) == 1;
  if (d->dp) __atomic_add_fetch(&dp_runs, 1, __ATOMIC_RELAXED);
#endif
  return 0;
}

#ifdef ATTN_DP
/* fused_attn_bf16.c reads q, k, v and dO rows as 32-bit pairs: even head
 * dims, every row and entry on a 4-byte boundary */
static bool pairs_fit(const attn_dims *d, const lm_tensor *const *t, const attn_rows *const *r, int n) {
  if (!d->dp || d->E % 2 || d->Ev % 2) return false;
  for (int i = 0; i < n; i++)
    if ((r[i]->sb | r[i]->sh | r[i]->sr | (int64_t)(uintptr_t)lm_ptr(t[i])) % 4) return false;
  return true;
}
#endif

int lm_cpu_attention(lm_tensor *o, lm_tensor *lse, const lm_tensor *q, const lm_tensor *k,
                     const lm_tensor *v, double scale, int causal) {
  attn_dims d;
  LM_TRY(dims_of(&d, q, k, v, o, lse, scale, causal, "attention"));
  if (d.dt == LM_F64) return attn_fwd_f64(lm_ptr(o), (f64 *)lm_ptr(lse), lm_ptr(q), lm_ptr(k), lm_ptr(v), &d);
#ifdef ATTN_DP
  if (pairs_fit(&d, (const lm_tensor *[]){q, k, v}, (const attn_rows *[]){&d.q, &d.k, &d.v}, 3))
    return lm_cpu_attn_fwd_bf16(lm_ptr(o), (f32 *)lm_ptr(lse), lm_ptr(q), lm_ptr(k), lm_ptr(v), &d);
#endif
  return attn_fwd_f32(lm_ptr(o), (f32 *)lm_ptr(lse), lm_ptr(q), lm_ptr(k), lm_ptr(v), &d);
}

int lm_cpu_attention_bwd(lm_tensor *dq, lm_tensor *dk, lm_tensor *dv, const lm_tensor *g,
                         const lm_tensor *q, const lm_tensor *k, const lm_tensor *v,
                         const lm_tensor *o, const lm_tensor *lse, double scale, int causal) {
  attn_dims d;
  LM_TRY(dims_of(&d, q, k, v, o, lse, scale, causal, "attention_bwd"));
  if (dq->dtype_ != d.dt || dk->dtype_ != d.dt || dv->dtype_ != d.dt || g->dtype_ != d.dt || o->dtype_ != d.dt)
    return lm_error("attention_bwd kernel: expected g, o, dq, dk, dv in %s (q's dtype)", lm_dtype_name(d.dt));
  LM_TRY(rows_of(&d.g, g, "attention_bwd", "g"));
  LM_TRY(rows_of(&d.dq, dq, "attention_bwd", "dq"));
  LM_TRY(rows_of(&d.dk, dk, "attention_bwd", "dk"));
  LM_TRY(rows_of(&d.dv, dv, "attention_bwd", "dv"));
#define ARGS lm_ptr(dq), lm_ptr(dk), lm_ptr(dv), lm_ptr(g), lm_ptr(q), lm_ptr(k), lm_ptr(v), lm_ptr(o)
  if (d.dt == LM_F64) return attn_bwd_f64(ARGS, (const f64 *)lm_ptr(lse), &d);
#ifdef ATTN_DP
  if (pairs_fit(&d, (const lm_tensor *[]){q, k, v, g}, (const attn_rows *[]){&d.q, &d.k, &d.v, &d.g}, 4))
    return lm_cpu_attn_bwd_bf16(ARGS, (const f32 *)lm_ptr(lse), &d);
#endif
  return attn_bwd_f32(ARGS, (const f32 *)lm_ptr(lse), &d);
#undef ARGS
}
