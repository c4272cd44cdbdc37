/* fused_attn.h: what the CPU attention kernels share (fused_attn.c, the
 * general kernels; fused_attn_bf16.c, bf16 operands on bf16 dot products):
 * the call's dims, the tile sizes and, where the build targets AVX512_BF16,
 * the bf16 dot-product tile product with its operand packing. */
#ifndef LOOM_CPU_FUSED_ATTN_H
#define LOOM_CPU_FUSED_ATTN_H
#include "fastmath.h"
#include "kernels.h"
#include <math.h>
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define ATTN_DP 1 /* the bf16 dot-product tile products are built */
#endif

enum { BQ = 32, BK = 64, RB = 4 };

/* Where an operand's rows are: batch entry b, the head b % H of the
 * outer entry b / H, starts at (b / H) sb + (b % H) sh bytes, its rows sr
 * bytes apart (the heads of a (B, R, H, E) tensor, transposed, need no
 * copy); each row is dense. */
typedef struct {
  int64_t H, sb, sh, sr;
} attn_rows;
static inline int64_t entry_at(const attn_rows *a, int64_t b) { return b / a->H * a->sb + b % a->H * a->sh; }

typedef struct {
  int64_t B, L, S, E, Ev; /* B batch entries (batch x heads) */
  int dt, es, causal;     /* operand dtype and its size */
  int dp;                 /* tile products on bf16 dot products */
  double scale;
  attn_rows q, k, v, o, g, dq, dk, dv; /* g, dq, dk, dv: the backward's */
} attn_dims;

static inline int64_t up(int64_t n, int64_t k) { return (n + k - 1) / k * k; }

/* row i of a score tile: scaled, -inf past the causal diagonal or nj */
#define MASK_ROW(A)                                                            \
  static inline void mask_row_##A(A *s, int64_t nj, int64_t njp, A scale, int64_t keep) { \
    if (keep > nj) keep = nj;                                                  \
    if (keep < 0) keep = 0;                                                    \
    _Pragma("omp simd")                                                        \
    for (int64_t j = 0; j < keep; j++) s[j] *= scale;                          \
    for (int64_t j = keep; j < njp; j++) s[j] = (A)-INFINITY;                  \
  }

/* A score tile's rows into probabilities, the forward's online softmax:
 * rows i < ni4 (queries from i0, ni of them real) over keys from j0 (nj
 * real of njp): each row's running max m and sum l updated and its output
 * row (O, ldo apart) rescaled; a row with no key yet stays zero */
#define SOFTMAX_TILE(A)                                                        \
  static inline void softmax_tile_##A(A *P, A *O, int64_t ldo, A *m, A *l, int64_t ni, int64_t ni4, int64_t i0, \
                                      int64_t j0, int64_t nj, int64_t njp, A scale, int causal) { \
    for (int64_t i = 0; i < ni4; i++) {                                        \
      A *Pi = P + i * BK, *Oi = O + i * ldo;                                   \
      mask_row_##A(Pi, nj, njp, scale, i < ni ? (causal ? i0 + i - j0 + 1 : nj) : 0); \
      A mx = m[i];                                                             \
      _Pragma("omp simd reduction(max:mx)")                                    \
      for (int64_t j = 0; j < nj; j++) mx = Pi[j] > mx ? Pi[j] : mx;           \
      if (mx == -INFINITY) { /* no key for this row yet */                     \
        for (int64_t j = 0; j < nj; j++) Pi[j] = 0;                            \
        continue;                                                              \
      }                                                                        \
      const A alpha = ex_##A(m[i] - mx);                                       \
      A sum = 0;                                                               \
      _Pragma("omp simd reduction(+:sum)")                                     \
      for (int64_t j = 0; j < nj; j++) { Pi[j] = ex_##A(Pi[j] - mx); sum += Pi[j]; } \
      l[i] = l[i] * alpha + sum, m[i] = mx;                                    \
      _Pragma("omp simd")                                                      \
      for (int64_t e = 0; e < ldo; e++) Oi[e] *= alpha;                        \
    }                                                                          \
  }

/* The backward's tile: P = exp(s - lse) (0 where masked) and, in dP,
 * dS = scale P (dP - D), for the rows as SOFTMAX_TILE's */
#define GRAD_TILE(A)                                                           \
  static inline void grad_tile_##A(A *P, A *dP, const A *lse, const A *D, int64_t ni, int64_t ni4, int64_t i0, \
                                   int64_t j0, int64_t nj, int64_t njp, A scale, int causal) { \
    for (int64_t i = 0; i < ni4; i++) {                                        \
      A *Pi = P + i * BK, *dPi = dP + i * BK;                                  \
      mask_row_##A(Pi, nj, njp, scale, i < ni ? (causal ? i0 + i - j0 + 1 : nj) : 0); \
      const A li = i < ni ? lse[i0 + i] : 0, Di = i < ni ? D[i0 + i] : 0;      \
      _Pragma("omp simd")                                                      \
      for (int64_t j = 0; j < njp; j++) {                                      \
        Pi[j] = ex_##A(Pi[j] - li); /* 0 where masked */                       \
        dPi[j] = Pi[j] * (dPi[j] - Di) * scale;                                \
      }                                                                        \
    }                                                                          \
  }

static inline float ex_f32(float x) { return lm_expf(x); }
MASK_ROW(f32) SOFTMAX_TILE(f32) GRAD_TILE(f32)

#ifdef ATTN_DP
/* Operands of vdpbf16ps: 32-bit words holding a pair of bf16 along the
 * sum's dim k (k low, k + 1 high; an odd K's last pair holds a zero). */
static inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* rows of m x K row-major f32 A (row i at a + i * ras), rounded to bf16, as
 * pairs: out[i * K2 + kk] */
static inline void pack_rows(uint32_t *out, const f32 *a, int64_t ras, int64_t m, int64_t K) {
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

/* pairs across consecutive f32 rows k, k + 1 of K rows of len values (row
 * k at src + k * stride), rounded to bf16: out[kk * len + x] */
static inline void pack_across(uint32_t *out, const f32 *src, int64_t stride, int64_t len, int64_t K) {
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

/* R rows of C (row stride ldc) = (zero ? 0 : C) + A B over K2 pairs, 16 * W
 * columns from column j: A's pair (r, kk) at a[r * as_i + kk * as_kk], B's
 * pair (kk, j) at b[kk * ldb + j]. R x W sums stay in registers. */
#define DP_BLOCK(R, W)                                                         \
  static inline void dp_block_##R##_##W(f32 *c, int64_t ldc, const uint32_t *a, int64_t as_i, \
                                        int64_t as_kk, const uint32_t *b, int64_t ldb, int64_t K2, int zero) { \
    __m512 acc[R][W];                                                          \
    for (int r = 0; r < R; r++)                                                \
      for (int h = 0; h < W; h++) acc[r][h] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16 * h); \
    for (int64_t kk = 0; kk < K2; kk++) {                                      \
      __m512bh bv[W];                                                          \
      for (int h = 0; h < W; h++) bv[h] = (__m512bh)_mm512_loadu_si512(b + kk * ldb + 16 * h); \
      for (int r = 0; r < R; r++) {                                            \
        const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[r * as_i + kk * as_kk]); \
        for (int h = 0; h < W; h++) acc[r][h] = _mm512_dpbf16_ps(acc[r][h], x, bv[h]); \
      }                                                                        \
    }                                                                          \
    for (int r = 0; r < R; r++)                                                \
      for (int h = 0; h < W; h++) _mm512_storeu_ps(c + r * ldc + 16 * h, acc[r][h]); \
  }
DP_BLOCK(8, 2) DP_BLOCK(8, 1) DP_BLOCK(4, 2) DP_BLOCK(4, 1)
#undef DP_BLOCK

/* C (m x n, row stride ldc) = (zero ? 0 : C) + A B on pairs, A's pair (i,
 * kk) at a[i * as_i + kk * as_kk] and B's (kk, j) at b[kk * ldb + j]; m a
 * multiple of RB, n of 16. The sums over kk run in order, so a product
 * split along kk into two calls (the second with zero 0) sums alike. */
static inline void dp_tile(f32 *c, int64_t ldc, const uint32_t *a, int64_t as_i, int64_t as_kk,
                           const uint32_t *b, int64_t ldb, int64_t m, int64_t n, int64_t K2, int zero) {
  for (int64_t i = 0; i < m;) {
    const int eight = i + 8 <= m;
    for (int64_t j = 0; j < n; j += 32) {
      f32 *cij = c + i * ldc + j;
      const uint32_t *ai = a + i * as_i, *bj = b + j;
      if (eight && j + 32 <= n) dp_block_8_2(cij, ldc, ai, as_i, as_kk, bj, ldb, K2, zero);
      else if (eight) dp_block_8_1(cij, ldc, ai, as_i, as_kk, bj, ldb, K2, zero);
      else if (j + 32 <= n) dp_block_4_2(cij, ldc, ai, as_i, as_kk, bj, ldb, K2, zero);
      else dp_block_4_1(cij, ldc, ai, as_i, as_kk, bj, ldb, K2, zero);
    }
    i += eight ? 8 : 4;
  }
}

/* bf16 q, k, v (even head dims) on these products, their operands packed
 * from the bf16 tensors as they are (fused_attn_bf16.c) */
int lm_cpu_attn_fwd_bf16(char *o, f32 *lse, const char *q, const char *k, const char *v, const attn_dims *d);
int lm_cpu_attn_bwd_bf16(char *dq, char *dk, char *dv, const char *g, const char *q, const char *k,
                         const char *v, const char *o, const f32 *lse, const attn_dims *d);
#endif
#endif
