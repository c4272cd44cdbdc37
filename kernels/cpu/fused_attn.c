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
 * the products that take them. */
#include "simd.h" /* first: its pragma lets exp-bound loops vectorise */
#include "fastmath.h"
#include "kernels.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define ATTN_DP 1 /* the bf16 dot-product tile products are built */
#endif
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

enum { BQ = 32, BK = 64, RB = 4 };
#define JB_f32 16 /* columns of the micro-kernel: two vector registers a row */
#define JB_f64 8

static inline int64_t up(int64_t n, int64_t k) { return (n + k - 1) / k * k; }

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
static inline float ex_f32(float x) { return lm_expf(x); }
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

typedef struct {
  int64_t B, L, S, E, Ev;
  int dt, es, causal; /* operand dtype and its size */
  int dp;             /* tile products on bf16 dot products */
  double scale;
} attn_dims;

#ifdef ATTN_DP
/* Operands of vdpbf16ps: 32-bit words holding a pair of bf16 along the
 * sum's dim k (k low, k + 1 high; an odd K's last pair holds a zero),
 * rounded from the f32 tiles (exact for what was bf16 already). */
static inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* rows of m x K row-major A (row i at a + i * ras) as pairs: out[i * K2 + kk] */
static void pack_rows(uint32_t *out, const f32 *a, int64_t ras, int64_t m, int64_t K) {
  const int64_t K2 = (K + 1) / 2;
  for (int64_t i = 0; i < m; i++)
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      const f32 *r = a + i * ras + k0;
      __m512 x0 = _mm512_maskz_loadu_ps(first_lanes(K - k0), r);
      __m512 x1 = _mm512_maskz_loadu_ps(K - k0 > 16 ? first_lanes(K - k0 - 16) : 0, r + 16);
      _mm512_mask_storeu_epi32(out + i * K2 + k0 / 2, first_lanes(K2 - k0 / 2),
                               (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
    }
}

/* pairs across consecutive rows k, k + 1 of K rows of len values (row k
 * at src + k * stride): out[kk * len + x] */
static void pack_across(uint32_t *out, const f32 *src, int64_t stride, int64_t len, int64_t K) {
  for (int64_t kk = 0; kk < (K + 1) / 2; kk++) {
    const f32 *r0 = src + 2 * kk * stride, *r1 = r0 + stride;
    const int odd = 2 * kk + 1 == K;
    for (int64_t x = 0; x < len; x += 16) {
      __mmask16 mk = first_lanes(len - x);
      __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r0 + x)));
      __m512i hi = odd ? _mm512_setzero_si512()
                       : _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r1 + x)));
      _mm512_mask_storeu_epi32(out + kk * len + x, mk, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

/* mk_f32's product on bf16 dot products, A row-major (kas 1) or
 * transposed (ras 1). pk: room for m * K2 + K2 * n words */
static void mk_dp(uint32_t *pk, f32 *c, int64_t ldc, const f32 *a, int64_t ras, int64_t kas, const f32 *b,
                  int64_t ldb, int64_t m, int64_t n, int64_t K, int zero) {
  const int64_t K2 = (K + 1) / 2;
  uint32_t *ap = pk, *bp = pk + m * K2;
  int64_t as_i = K2, as_kk = 1; /* A's pair (i, kk) at ap[i * as_i + kk * as_kk] */
  if (kas == 1) pack_rows(ap, a, ras, m, K);
  else pack_across(ap, a, kas, m, K), as_i = 1, as_kk = m;
  pack_across(bp, b, ldb, n, K);
  for (int64_t i = 0; i < m; i += RB)
    for (int64_t j = 0; j < n; j += 32) {
      const int two = j + 32 <= n; /* RB x 32 sums in registers, or RB x 16 at the end */
      __m512 acc[RB][2];
      for (int r = 0; r < RB; r++)
        for (int h = 0; h <= two; h++)
          acc[r][h] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + (i + r) * ldc + j + 16 * h);
      const uint32_t *ai = ap + i * as_i;
      for (int64_t kk = 0; kk < K2; kk++) {
        const uint32_t *bk = bp + kk * n + j;
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bk);
        const __m512bh b1 = two ? (__m512bh)_mm512_loadu_si512(bk + 16) : b0;
        for (int r = 0; r < RB; r++) {
          const __m512bh x = (__m512bh)_mm512_set1_epi32((int)ai[r * as_i + kk * as_kk]);
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
          if (two) acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
        }
      }
      for (int r = 0; r < RB; r++)
        for (int h = 0; h <= two; h++) _mm512_storeu_ps(c + (i + r) * ldc + j + 16 * h, acc[r][h]);
    }
}
#endif

/* n rows (from row j0) of a (rows, E) operand as the columns of t (E, BK),
 * columns n..up(n, JB) zero */
#define LOAD_T(A)                                                              \
  static void load_t_##A(A *t, A *tmp, const char *x, int dt, int es, int64_t j0, int64_t n, int64_t E) { \
    for (int64_t j = 0; j < n; j++) {                                          \
      ld_##A(tmp, x + (j0 + j) * E * es, dt, E);                               \
      for (int64_t e = 0; e < E; e++) t[e * BK + j] = tmp[e];                  \
    }                                                                          \
    for (int64_t e = 0; e < E; e++)                                            \
      for (int64_t j = n; j < up(n, JB_##A); j++) t[e * BK + j] = 0;           \
  }

/* n rows (from row j0) of a (rows, E) operand into x (rows of stride ld),
 * rows n..up(n, RB) zero; the columns past E stay as they are (zero) */
#define LOAD_ROWS(A)                                                           \
  static void load_rows_##A(A *x, int64_t ld, const char *src, int dt, int es, int64_t j0, int64_t n, int64_t E) { \
    for (int64_t j = 0; j < n; j++) ld_##A(x + j * ld, src + (j0 + j) * E * es, dt, E); \
    for (int64_t j = n; j < up(n, RB); j++) memset(x + j * ld, 0, sizeof *x * ld); \
  }

/* row i of a score tile: scaled, -inf past the causal diagonal or nj */
#define MASK_ROW(A)                                                            \
  static void mask_row_##A(A *s, int64_t nj, int64_t njp, A scale, int64_t keep) { \
    if (keep > nj) keep = nj;                                                  \
    if (keep < 0) keep = 0;                                                    \
    _Pragma("omp simd")                                                        \
    for (int64_t j = 0; j < keep; j++) s[j] *= scale;                          \
    for (int64_t j = keep; j < njp; j++) s[j] = (A)-INFINITY;                  \
  }

#define ATTN_FWD(A)                                                            \
  static int attn_fwd_##A(char *o, A *lse, const char *q, const char *k, const char *v, \
                          const attn_dims *d) {                                \
    const int64_t E = d->E, Ev = d->Ev, L = d->L, S = d->S, nqt = (L + BQ - 1) / BQ; \
    const int64_t Evp = up(Ev, JB_##A);                                        \
    const int es = d->es, dt = d->dt;                                          \
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
        const char *kb = k + b * S * E * es, *vb = v + b * S * Ev * es;        \
        load_rows_##A(Q, E, q + b * L * E * es, dt, es, i0, ni, E);            \
        for (int64_t i = 0; i < ni4; i++) m[i] = -INFINITY, l[i] = 0;          \
        memset(O, 0, sizeof(A) * BQ * Evp);                                    \
        const int64_t jend = d->causal && i0 + ni < S ? i0 + ni : S;           \
        for (int64_t j0 = 0; j0 < jend; j0 += BK) {                            \
          const int64_t nj = jend - j0 < BK ? jend - j0 : BK, njp = up(nj, JB_##A); \
          load_t_##A(Kt, tmp, kb, dt, es, j0, nj, E);                          \
          load_rows_##A(V, Evp, vb, dt, es, j0, nj, Ev);                       \
          mkx_##A(d, pk, P, BK, Q, E, 1, Kt, BK, ni4, njp, E, 1); /* scores */ \
          for (int64_t i = 0; i < ni4; i++) {                                  \
            A *Pi = P + i * BK, *Oi = O + i * Evp;                             \
            mask_row_##A(Pi, nj, njp, scale, i < ni ? (d->causal ? i0 + i - j0 + 1 : nj) : 0); \
            A mx = m[i];                                                       \
            _Pragma("omp simd reduction(max:mx)")                              \
            for (int64_t j = 0; j < nj; j++) mx = Pi[j] > mx ? Pi[j] : mx;     \
            if (mx == -INFINITY) { /* no key for this row yet */               \
              for (int64_t j = 0; j < nj; j++) Pi[j] = 0;                      \
              continue;                                                        \
            }                                                                  \
            const A alpha = ex_##A(m[i] - mx);                                 \
            A sum = 0;                                                         \
            _Pragma("omp simd reduction(+:sum)")                               \
            for (int64_t j = 0; j < nj; j++) { Pi[j] = ex_##A(Pi[j] - mx); sum += Pi[j]; } \
            l[i] = l[i] * alpha + sum, m[i] = mx;                              \
            _Pragma("omp simd")                                                \
            for (int64_t e = 0; e < Evp; e++) Oi[e] *= alpha;                  \
          }                                                                    \
          mkx_##A(d, pk, O, Evp, P, BK, 1, V, Evp, ni4, Evp, nj, 0); /* O += P V */ \
        }                                                                      \
        for (int64_t i = 0; i < ni; i++) {                                     \
          const A r = 1 / l[i];                                                \
          for (int64_t e = 0; e < Ev; e++) O[i * Evp + e] *= r;                \
          st_##A(o + (b * L + i0 + i) * Ev * es, dt, O + i * Evp, Ev);         \
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
    const int es = d->es, dt = d->dt;                                          \
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
        const char *qb = q + b * L * E * es, *kb = k + b * S * E * es, *vb = v + b * S * Ev * es; \
        const char *gb = g + b * L * Ev * es, *ob = o + b * L * Ev * es;       \
        const A *lb = lse + b * L;                                             \
        for (int64_t i = 0; i < L; i++) {                                      \
          ld_##A(tmp, gb + i * Ev * es, dt, Ev);                               \
          ld_##A(tmp + X, ob + i * Ev * es, dt, Ev);                           \
          A s = 0;                                                             \
          for (int64_t e = 0; e < Ev; e++) s += tmp[e] * tmp[X + e];           \
          D[i] = s;                                                            \
        }                                                                      \
        memset(Qacc, 0, sizeof(A) * (L + BQ) * Ep);                            \
        for (int64_t j0 = 0; j0 < S; j0 += BK) {                               \
          const int64_t nj = S - j0 < BK ? S - j0 : BK, njp = up(nj, JB_##A), nj4 = up(nj, RB); \
          load_rows_##A(K, Ep, kb, dt, es, j0, nj, E);                         \
          load_t_##A(Kt, tmp, kb, dt, es, j0, nj, E);                          \
          load_t_##A(Vt, tmp, vb, dt, es, j0, nj, Ev);                         \
          memset(dK, 0, sizeof(A) * BK * Ep), memset(dV, 0, sizeof(A) * BK * Evp); \
          for (int64_t i0 = d->causal ? j0 : 0; i0 < L; i0 += BQ) {            \
            const int64_t ni = L - i0 < BQ ? L - i0 : BQ, ni4 = up(ni, RB);    \
            load_rows_##A(Q, Ep, qb, dt, es, i0, ni, E);                       \
            load_rows_##A(dO, Evp, gb, dt, es, i0, ni, Ev);                    \
            mkx_##A(d, pk, P, BK, Q, Ep, 1, Kt, BK, ni4, njp, E, 1);   /* scores */ \
            mkx_##A(d, pk, dP, BK, dO, Evp, 1, Vt, BK, ni4, njp, Ev, 1); /* dO V^T */ \
            for (int64_t i = 0; i < ni4; i++) {                                \
              A *Pi = P + i * BK, *dPi = dP + i * BK;                          \
              mask_row_##A(Pi, nj, njp, scale, i < ni ? (d->causal ? i0 + i - j0 + 1 : nj) : 0); \
              const A li = i < ni ? lb[i0 + i] : 0, Di = i < ni ? D[i0 + i] : 0; \
              _Pragma("omp simd")                                              \
              for (int64_t j = 0; j < njp; j++) {                              \
                Pi[j] = ex_##A(Pi[j] - li); /* 0 where masked */               \
                dPi[j] = Pi[j] * (dPi[j] - Di) * scale;                        \
              }                                                                \
            }                                                                  \
            mkx_##A(d, pk, dV, Evp, P, 1, BK, dO, Evp, nj4, Evp, ni, 0);  /* P^T dO */ \
            mkx_##A(d, pk, dK, Ep, dP, 1, BK, Q, Ep, nj4, Ep, ni, 0);     /* dS^T Q */ \
            mkx_##A(d, pk, Qacc + i0 * Ep, Ep, dP, BK, 1, K, Ep, ni4, Ep, nj, 0); /* dS K */ \
          }                                                                    \
          for (int64_t j = 0; j < nj; j++) {                                   \
            st_##A(dk + (b * S + j0 + j) * E * es, dt, dK + j * Ep, E);        \
            st_##A(dv + (b * S + j0 + j) * Ev * es, dt, dV + j * Evp, Ev);     \
          }                                                                    \
        }                                                                      \
        for (int64_t i = 0; i < L; i++) st_##A(dq + (b * L + i) * E * es, dt, Qacc + i * Ep, E); \
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
MASK_ROW(f32) MASK_ROW(f64)
ATTN_FWD(f32) ATTN_FWD(f64)
ATTN_BWD(f32) ATTN_BWD(f64)

/* the dims of the call, or -1 when the dtypes do not fit */
static int dims_of(attn_dims *d, const lm_tensor *q, const lm_tensor *k, const lm_tensor *v,
                   const lm_tensor *lse, double scale, int causal, const char *name) {
  int dt = q->dtype_, cd = dt == LM_F64 ? LM_F64 : LM_F32;
  if (dt != LM_F32 && dt != LM_F64 && dt != LM_BF16 && dt != LM_F16)
    return lm_error("%s kernel: no kernel for dtype %s", name, lm_dtype_name(dt));
  if (k->dtype_ != dt || v->dtype_ != dt || lse->dtype_ != cd)
    return lm_error("%s kernel: expected q, k, v of one dtype and lse in %s", name, lm_dtype_name(cd));
  *d = (attn_dims){.B = q->shape_[0], .L = q->shape_[1], .S = k->shape_[1], .E = q->shape_[2],
                   .Ev = v->shape_[2], .dt = dt, .es = lm_dtype_size(dt), .causal = causal, .scale = scale};
#ifdef ATTN_DP
  d->dp = dt == LM_BF16 && lm_cpu_set_bf16_gemm(-1) == 1;
  if (d->dp) __atomic_add_fetch(&dp_runs, 1, __ATOMIC_RELAXED);
#endif
  return 0;
}

int lm_cpu_attention(lm_tensor *o, lm_tensor *lse, const lm_tensor *q, const lm_tensor *k,
                     const lm_tensor *v, double scale, int causal) {
  attn_dims d;
  LM_TRY(dims_of(&d, q, k, v, lse, scale, causal, "attention"));
  if (d.dt == LM_F64) return attn_fwd_f64(lm_ptr(o), (f64 *)lm_ptr(lse), lm_ptr(q), lm_ptr(k), lm_ptr(v), &d);
  return attn_fwd_f32(lm_ptr(o), (f32 *)lm_ptr(lse), lm_ptr(q), lm_ptr(k), lm_ptr(v), &d);
}

int lm_cpu_attention_bwd(lm_tensor *dq, lm_tensor *dk, lm_tensor *dv, const lm_tensor *g,
                         const lm_tensor *q, const lm_tensor *k, const lm_tensor *v,
                         const lm_tensor *o, const lm_tensor *lse, double scale, int causal) {
  attn_dims d;
  LM_TRY(dims_of(&d, q, k, v, lse, scale, causal, "attention_bwd"));
  if (dq->dtype_ != d.dt || dk->dtype_ != d.dt || dv->dtype_ != d.dt || g->dtype_ != d.dt || o->dtype_ != d.dt)
    return lm_error("attention_bwd kernel: expected g, o, dq, dk, dv in %s (q's dtype)", lm_dtype_name(d.dt));
#define ARGS lm_ptr(dq), lm_ptr(dk), lm_ptr(dv), lm_ptr(g), lm_ptr(q), lm_ptr(k), lm_ptr(v), lm_ptr(o)
  if (d.dt == LM_F64) return attn_bwd_f64(ARGS, (const f64 *)lm_ptr(lse), &d);
  return attn_bwd_f32(ARGS, (const f32 *)lm_ptr(lse), &d);
#undef ARGS
}
