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
 * pairs in the forward and batch entries in the backward. */
#include "simd.h" /* first: its pragma lets exp-bound loops vectorise */
#include "fastmath.h"
#include "kernels.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
  double scale;
} attn_dims;

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
      A *buf = calloc(BQ * E + E * BK + BK * Evp + BQ * Evp + BQ * BK + 2 * BQ + E + Ev, sizeof(A)); \
      A *Q = buf, *Kt = Q + BQ * E, *V = Kt + E * BK, *O = V + BK * Evp, *P = O + BQ * Evp; \
      A *m = P + BQ * BK, *l = m + BQ, *tmp = l + BQ;                          \
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
          mk_##A(P, BK, Q, E, 1, Kt, BK, ni4, njp, E, 1); /* scores */         \
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
          mk_##A(O, Evp, P, BK, 1, V, Evp, ni4, Evp, nj, 0); /* O += P V */   \
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
      A *buf = calloc(n, sizeof(A));                                           \
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
            mk_##A(P, BK, Q, Ep, 1, Kt, BK, ni4, njp, E, 1);   /* scores */    \
            mk_##A(dP, BK, dO, Evp, 1, Vt, BK, ni4, njp, Ev, 1); /* dO V^T */  \
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
            mk_##A(dV, Evp, P, 1, BK, dO, Evp, nj4, Evp, ni, 0);  /* P^T dO */ \
            mk_##A(dK, Ep, dP, 1, BK, Q, Ep, nj4, Ep, ni, 0);     /* dS^T Q */ \
            mk_##A(Qacc + i0 * Ep, Ep, dP, BK, 1, K, Ep, ni4, Ep, nj, 0); /* dS K */ \
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
