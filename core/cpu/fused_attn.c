/* fused_attn.c: scaled dot-product attention that never holds the (L, S)
 * score matrix (flash attention, on the CPU). The forward walks tiles of
 * BQ queries against tiles of BK keys with an online softmax (a running
 * max and sum per query, the output rescaled as the max grows) and saves
 * each row's log-sum-exp; the backward rebuilds a tile's probabilities
 * from it, exp(s - lse), and sums dV, dK per key tile and dQ per batch
 * entry. Operands are contiguous (B, L, E), (B, S, E), (B, S, Ev) of one
 * dtype: f32, bf16 and f16 compute in f32 (tiles are widened as they are
 * loaded, results rounded once), f64 in f64. Loops keep the contiguous
 * dim innermost so they vectorize; threads take batch entries (and query
 * tiles in the forward). */
/* lm_expf's rintf becomes a vector round only when the compiler may assume
 * no floating point traps (loom enables none): 10x on exp-bound loops. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "fastmath.h"
#include "kernels.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { BQ = 32, BK = 64 };
typedef float f32;
typedef double f64;

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

typedef struct {
  int64_t B, L, S, E, Ev;
  int dt, es, causal; /* operand dtype and its size */
  double scale;
} attn_dims;

/* n rows of K (from row j0 of batch b) as Kt (E, BK): a column per key */
#define LOAD_T(A)                                                              \
  static void load_t_##A(A *kt, A *tmp, const char *k, int dt, int es, int64_t j0, int64_t n, int64_t E) { \
    for (int64_t j = 0; j < n; j++) {                                          \
      ld_##A(tmp, k + (j0 + j) * E * es, dt, E);                               \
      for (int64_t e = 0; e < E; e++) kt[e * BK + j] = tmp[e];                 \
    }                                                                          \
  }

/* srow[j] = scale * q . k_j for the nj keys of kt, -inf where causal masks */
#define SCORES(A)                                                              \
  static void scores_##A(A *srow, const A *q, const A *kt, int64_t E, int64_t nj, A scale, \
                         int64_t masked_from) {                                \
    for (int64_t j = 0; j < nj; j++) srow[j] = 0;                              \
    for (int64_t e = 0; e < E; e++) {                                          \
      const A qe = q[e], *kr = kt + e * BK;                                    \
      _Pragma("omp simd")                                                      \
      for (int64_t j = 0; j < nj; j++) srow[j] += qe * kr[j];                  \
    }                                                                          \
    for (int64_t j = 0; j < nj; j++) srow[j] = j >= masked_from ? (A)-INFINITY : srow[j] * scale; \
  }

#define ATTN_FWD(A)                                                            \
  static int attn_fwd_##A(char *o, A *lse, const char *q, const char *k, const char *v, \
                           const attn_dims *d) {                               \
    const int64_t E = d->E, Ev = d->Ev, L = d->L, S = d->S, nqt = (L + BQ - 1) / BQ; \
    const int es = d->es, dt = d->dt;                                          \
    const A scale = (A)d->scale;                                               \
    int nt = lm_threads_for(d->B * L * S * (E + Ev)), failed = 0;              \
    _Pragma("omp parallel num_threads(nt) reduction(|:failed)")                \
    {                                                                          \
      A *buf = malloc(sizeof(A) * (BQ * E + E * BK + BK * Ev + BQ * Ev + BK + 2 * BQ + E + Ev)); \
      failed |= !buf;                                                          \
      A *Q = buf, *Kt = Q + BQ * E, *V = Kt + E * BK, *O = V + BK * Ev, *P = O + BQ * Ev; \
      A *m = P + BK, *l = m + BQ, *tmp = l + BQ;                               \
      _Pragma("omp for schedule(dynamic)")                                     \
      for (int64_t it = 0; it < d->B * nqt; it++) {                            \
        if (!buf) continue;                                                    \
        const int64_t b = it / nqt, i0 = it % nqt * BQ, ni = L - i0 < BQ ? L - i0 : BQ; \
        const char *kb = k + b * S * E * es, *vb = v + b * S * Ev * es;        \
        for (int64_t i = 0; i < ni; i++) {                                     \
          ld_##A(Q + i * E, q + (b * L + i0 + i) * E * es, dt, E);             \
          m[i] = -INFINITY, l[i] = 0;                                          \
          for (int64_t e = 0; e < Ev; e++) O[i * Ev + e] = 0;                  \
        }                                                                      \
        const int64_t jend = d->causal && i0 + ni < S ? i0 + ni : S;           \
        for (int64_t j0 = 0; j0 < jend; j0 += BK) {                            \
          const int64_t nj = jend - j0 < BK ? jend - j0 : BK;                  \
          load_t_##A(Kt, tmp, kb, dt, es, j0, nj, E);                          \
          for (int64_t j = 0; j < nj; j++) ld_##A(V + j * Ev, vb + (j0 + j) * Ev * es, dt, Ev); \
          for (int64_t i = 0; i < ni; i++) {                                   \
            scores_##A(P, Q + i * E, Kt, E, nj, scale, d->causal ? i0 + i - j0 + 1 : nj); \
            A mx = m[i];                                                       \
            for (int64_t j = 0; j < nj; j++) mx = P[j] > mx ? P[j] : mx;       \
            if (mx == -INFINITY) continue; /* no key for this row yet */       \
            const A alpha = ex_##A(m[i] - mx);                                 \
            A sum = 0, *Oi = O + i * Ev;                                       \
            _Pragma("omp simd reduction(+:sum)")                               \
            for (int64_t j = 0; j < nj; j++) { P[j] = ex_##A(P[j] - mx); sum += P[j]; } \
            l[i] = l[i] * alpha + sum, m[i] = mx;                              \
            _Pragma("omp simd")                                                \
            for (int64_t e = 0; e < Ev; e++) Oi[e] *= alpha;                   \
            for (int64_t j = 0; j < nj; j++) {                                 \
              const A pj = P[j], *Vj = V + j * Ev;                             \
              _Pragma("omp simd")                                              \
              for (int64_t e = 0; e < Ev; e++) Oi[e] += pj * Vj[e];            \
            }                                                                  \
          }                                                                    \
        }                                                                      \
        for (int64_t i = 0; i < ni; i++) {                                     \
          const A r = 1 / l[i];                                                \
          for (int64_t e = 0; e < Ev; e++) O[i * Ev + e] *= r;                 \
          st_##A(o + (b * L + i0 + i) * Ev * es, dt, O + i * Ev, Ev);          \
          lse[b * L + i0 + i] = m[i] + log(l[i]);                              \
        }                                                                      \
      }                                                                        \
      free(buf);                                                               \
    }                                                                          \
    return failed ? lm_error("attention kernel: out of memory for a thread's tiles") : 0; \
  }

/* Backward for one batch entry b at a time: D_i = dO_i . O_i; per key tile
 * P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = P (dP - D),
 * dK += scale dS^T Q, dQ += scale dS K (dQ summed in Qacc over tiles). */
#define ATTN_BWD(A)                                                            \
  static int attn_bwd_##A(char *dq, char *dk, char *dv, const char *g, const char *q, \
                          const char *k, const char *v, const char *o, const A *lse, \
                          const attn_dims *d) {                                \
    const int64_t E = d->E, Ev = d->Ev, L = d->L, S = d->S;                    \
    const int es = d->es, dt = d->dt;                                          \
    const A scale = (A)d->scale;                                               \
    int nt = lm_threads_for(d->B * L * S * (E + Ev));                          \
    if (nt > d->B) nt = d->B > 0 ? (int)d->B : 1;                              \
    int failed = 0;                                                            \
    _Pragma("omp parallel num_threads(nt) reduction(|:failed)")                \
    {                                                                          \
      size_t n = L * E + L + 2 * BQ * (E > Ev ? E : Ev) + 3 * E * BK + BK * E + BK * Ev * 2 + 3 * BK + E + Ev; \
      A *buf = malloc(sizeof(A) * n);                                          \
      A *Qacc = buf, *D = Qacc + L * E, *Q = D + L, *dO = Q + BQ * (E > Ev ? E : Ev); \
      A *K = dO + BQ * (E > Ev ? E : Ev), *Kt = K + BK * E, *Vt = Kt + E * BK; \
      A *dK = Vt + Ev * BK, *dV = dK + BK * E, *P = dV + BK * Ev, *dP = P + BK, *tmp = dP + 2 * BK; \
      failed |= !buf;                                                          \
      _Pragma("omp for schedule(dynamic)")                                     \
      for (int64_t b = 0; b < d->B; b++) {                                     \
        if (!buf) continue;                                                    \
        const char *qb = q + b * L * E * es, *kb = k + b * S * E * es, *vb = v + b * S * Ev * es; \
        const char *gb = g + b * L * Ev * es, *ob = o + b * L * Ev * es;       \
        const A *lb = lse + b * L;                                             \
        for (int64_t i = 0; i < L; i++) {                                      \
          ld_##A(dO, gb + i * Ev * es, dt, Ev);                                \
          ld_##A(tmp, ob + i * Ev * es, dt, Ev);                               \
          A s = 0;                                                             \
          for (int64_t e = 0; e < Ev; e++) s += dO[e] * tmp[e];                \
          D[i] = s;                                                            \
        }                                                                      \
        memset(Qacc, 0, sizeof(A) * L * E);                                    \
        for (int64_t j0 = 0; j0 < S; j0 += BK) {                               \
          const int64_t nj = S - j0 < BK ? S - j0 : BK;                        \
          for (int64_t j = 0; j < nj; j++) ld_##A(K + j * E, kb + (j0 + j) * E * es, dt, E); \
          for (int64_t j = 0; j < nj; j++)                                     \
            for (int64_t e = 0; e < E; e++) Kt[e * BK + j] = K[j * E + e];     \
          load_t_##A(Vt, tmp, vb, dt, es, j0, nj, Ev);                         \
          memset(dK, 0, sizeof(A) * nj * E), memset(dV, 0, sizeof(A) * nj * Ev); \
          for (int64_t i0 = d->causal ? j0 : 0; i0 < L; i0 += BQ) {            \
            const int64_t ni = L - i0 < BQ ? L - i0 : BQ;                      \
            for (int64_t i = 0; i < ni; i++) {                                 \
              ld_##A(Q + i * E, qb + (i0 + i) * E * es, dt, E);                \
              ld_##A(dO + i * Ev, gb + (i0 + i) * Ev * es, dt, Ev);            \
            }                                                                  \
            for (int64_t i = 0; i < ni; i++) {                                 \
              const A *Qi = Q + i * E, *dOi = dO + i * Ev, li = lb[i0 + i], Di = D[i0 + i]; \
              scores_##A(P, Qi, Kt, E, nj, scale, d->causal ? i0 + i - j0 + 1 : nj); \
              _Pragma("omp simd")                                              \
              for (int64_t j = 0; j < nj; j++) P[j] = ex_##A(P[j] - li);       \
              for (int64_t j = 0; j < nj; j++) dP[j] = 0;                      \
              for (int64_t e = 0; e < Ev; e++) {                               \
                const A ge = dOi[e], *vr = Vt + e * BK;                        \
                _Pragma("omp simd")                                            \
                for (int64_t j = 0; j < nj; j++) dP[j] += ge * vr[j];          \
              }                                                                \
              A *Qa = Qacc + (i0 + i) * E;                                     \
              for (int64_t j = 0; j < nj; j++) {                               \
                const A pj = P[j], ds = pj * (dP[j] - Di) * scale;             \
                if (pj == 0) continue;                                         \
                A *dVj = dV + j * Ev, *dKj = dK + j * E;                       \
                const A *Kj = K + j * E;                                       \
                _Pragma("omp simd")                                            \
                for (int64_t e = 0; e < Ev; e++) dVj[e] += pj * dOi[e];        \
                _Pragma("omp simd")                                            \
                for (int64_t e = 0; e < E; e++) dKj[e] += ds * Qi[e], Qa[e] += ds * Kj[e]; \
              }                                                                \
            }                                                                  \
          }                                                                    \
          for (int64_t j = 0; j < nj; j++) {                                   \
            st_##A(dk + (b * S + j0 + j) * E * es, dt, dK + j * E, E);         \
            st_##A(dv + (b * S + j0 + j) * Ev * es, dt, dV + j * Ev, Ev);      \
          }                                                                    \
        }                                                                      \
        for (int64_t i = 0; i < L; i++) st_##A(dq + (b * L + i) * E * es, dt, Qacc + i * E, E); \
      }                                                                        \
      free(buf);                                                               \
    }                                                                          \
    return failed ? lm_error("attention_bwd kernel: out of memory for a thread's tiles") : 0; \
  }

LOAD_T(f32) LOAD_T(f64)
SCORES(f32) SCORES(f64)
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
  *d = (attn_dims){.B = q->shape[0], .L = q->shape[1], .S = k->shape[1], .E = q->shape[2],
                   .Ev = v->shape[2], .dt = dt, .es = lm_dtype_size(dt), .causal = causal, .scale = scale};
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
