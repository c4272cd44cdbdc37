/* fused_attn_bf16.c: flash attention for bf16 q, k, v with even head dims
 * on bf16 dot products (vdpbf16ps, f32 sums): the loop of fused_attn.c
 * (its comment says how the tiles go), with the products' operands taken
 * from the bf16 tensors as they are instead of widened to f32 tiles and
 * packed again for every product. A row of q or dO is already a row of
 * pairs along the head dim; each batch entry's other operands are packed
 * once, as the products take them:
 *   KT  (E/2, S)   k's pairs along E, one column per key: scores = Q KT
 *   VP  (S/2, Ev)  v's pairs along the keys: O += P VP
 * and in the backward also
 *   VT  (Ev/2, S)  v's pairs along Ev: dP = dO VT
 *   QI  (L/2, E), GI (L/2, Ev)  q's and dO's pairs along the queries:
 *                  dK += dS^T QI, dV += P^T GI
 *   KJ  (S/2, E)   k's pairs along the keys: dQ += dS KJ.
 * Probabilities and their gradients are rounded to bf16 for the products
 * that take them, as in fused_attn.c's bf16 path, whose sums these are in
 * the same order (the results are the same bits). A key or query past the
 * last (an odd S or L) pairs with a zero; a pair that would reach a key
 * the tile does not attend (an odd causal tile) is split off, so a NaN
 * there cannot leak in as 0 * NaN. */
#include "simd.h" /* first: its pragma lets exp-bound loops vectorise */
#include "fastmath.h"
#include "fused_attn.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef ATTN_DP
/* x (rows, n2 pairs a row, row stride ld pairs) as t (n2, tld): t[kk * tld + r]
 * = x[r * ld + kk]; the columns rows..tld zero */
static void transpose_pairs(uint32_t *t, int64_t tld, const uint32_t *x, int64_t ld, int64_t rows, int64_t n2) {
  for (int64_t kk = 0; kk < n2; kk++) {
    uint32_t *tk = t + kk * tld;
    for (int64_t r = 0; r < rows; r++) tk[r] = x[r * ld + kk];
    memset(tk + rows, 0, (size_t)(tld - rows) * sizeof *tk);
  }
}

/* rows of n bf16 (row r at x + r * ld16) as pairs of consecutive rows:
 * out[rr * ld + e] = x[2 rr][e] | x[2 rr + 1][e] << 16, a zero row past the
 * last, zero columns n..ld */
static void interleave_rows(uint32_t *out, int64_t ld, const uint16_t *x, int64_t ld16, int64_t rows, int64_t n) {
  for (int64_t rr = 0; rr < (rows + 1) / 2; rr++) {
    const uint16_t *r0 = x + 2 * rr * ld16, *r1 = 2 * rr + 1 < rows ? r0 + ld16 : NULL;
    uint32_t *o = out + rr * ld;
    for (int64_t e = 0; e < n; e++) o[e] = r0[e] | (r1 ? (uint32_t)r1[e] << 16 : 0);
    memset(o + n, 0, (size_t)(ld - n) * sizeof *o);
  }
}

/* rows i0..i0+n of a bf16 operand (rows rs bytes apart, 2 * n2 values
 * each) as pairs, rows n..up(n, RB) zero */
static void rows_pairs(uint32_t *out, const char *x, int64_t rs, int64_t n2, int64_t i0, int64_t n) {
  for (int64_t i = 0; i < n; i++) memcpy(out + i * n2, x + (i0 + i) * rs, (size_t)n2 * sizeof *out);
  memset(out + n * n2, 0, (size_t)((up(n, RB) - n) * n2) * sizeof *out);
}

/* C += A B over K2 pairs where B's pairs run over keys j0.. of which nj
 * count: an odd nj's last pair holds the key past the tile, which the
 * product must not read, so that pair goes alone with its high half zero */
static void dp_keys(f32 *c, int64_t ldc, const uint32_t *a, int64_t as_i, int64_t as_kk, const uint32_t *b,
                    int64_t ldb, int64_t m, int64_t n, int64_t nj, int past, uint32_t *row) {
  const int64_t full = nj / 2;
  if (!(nj & 1) || !past) {
    dp_tile(c, ldc, a, as_i, as_kk, b, ldb, m, n, (nj + 1) / 2, 0);
    return;
  }
  if (full) dp_tile(c, ldc, a, as_i, as_kk, b, ldb, m, n, full, 0);
  for (int64_t x = 0; x < n; x++) row[x] = b[full * ldb + x] & 0xFFFFu;
  dp_tile(c, ldc, a + full * as_kk, as_i, as_kk, row, n, m, n, 1, 0);
}

static void store_bf16(char *p, const f32 *s, int64_t n) {
  uint16_t *h = (uint16_t *)p;
  for (int64_t i = 0; i < n; i++) h[i] = lm_f32_to_bf16(s[i]);
}

int lm_cpu_attn_fwd_bf16(char *o, f32 *lse, const char *q, const char *k, const char *v, const attn_dims *d) {
  const int64_t E = d->E, Ev = d->Ev, L = d->L, S = d->S, nqt = (L + BQ - 1) / BQ;
  const int64_t E2 = E / 2, Evp = up(Ev, 16), Sp = up(S, 16), S2 = (S + 1) / 2;
  const f32 scale = (f32)d->scale;
  int nt = lm_threads_for(d->B * L * S * (E + Ev)), failed = 0;
#pragma omp parallel num_threads(nt) reduction(| : failed)
  {
    const size_t words = E2 * Sp + S2 * Evp + BQ * E2 + BQ * BK / 2 + Evp, floats = BQ * BK + BQ * Evp + 2 * BQ;
    uint32_t *KT = malloc(words * sizeof *KT);
    f32 *P = malloc(floats * sizeof *P);
    uint32_t *VP = KT + E2 * Sp, *Qt = VP + S2 * Evp, *Pp = Qt + BQ * E2, *row = Pp + BQ * BK / 2;
    f32 *O = P + BQ * BK, *m = O + BQ * Evp, *l = m + BQ;
    int64_t packed = -1; /* the batch entry KT and VP hold */
    failed |= !KT || !P;
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < d->B * nqt; it++) {
      if (!KT || !P) continue;
      const int64_t b = it / nqt, i0 = it % nqt * BQ, ni = L - i0 < BQ ? L - i0 : BQ, ni4 = up(ni, RB);
      if (b != packed) {
        transpose_pairs(KT, Sp, (const uint32_t *)(k + entry_at(&d->k, b)), d->k.sr / 4, S, E2);
        interleave_rows(VP, Evp, (const uint16_t *)(v + entry_at(&d->v, b)), d->v.sr / 2, S, Ev);
        packed = b;
      }
      rows_pairs(Qt, q + entry_at(&d->q, b), d->q.sr, E2, i0, ni);
      for (int64_t i = 0; i < ni4; i++) m[i] = -INFINITY, l[i] = 0;
      memset(O, 0, sizeof *O * BQ * Evp);
      const int64_t jend = d->causal && i0 + ni < S ? i0 + ni : S;
      for (int64_t j0 = 0; j0 < jend; j0 += BK) {
        const int64_t nj = jend - j0 < BK ? jend - j0 : BK, njp = up(nj, 16);
        dp_tile(P, BK, Qt, E2, 1, KT + j0, Sp, ni4, njp, E2, 1); /* scores */
        softmax_tile_f32(P, O, Evp, m, l, ni, ni4, i0, j0, nj, njp, scale, d->causal);
        pack_rows(Pp, P, BK, ni4, nj);
        dp_keys(O, Evp, Pp, (nj + 1) / 2, 1, VP + j0 / 2 * Evp, Evp, ni4, Evp, nj, j0 + nj < S, row); /* O += P V */
      }
      for (int64_t i = 0; i < ni; i++) {
        const f32 r = 1 / l[i];
        for (int64_t e = 0; e < Ev; e++) O[i * Evp + e] *= r;
        store_bf16(o + entry_at(&d->o, b) + (i0 + i) * d->o.sr, O + i * Evp, Ev);
        lse[b * L + i0 + i] = m[i] + log(l[i]);
      }
    }
    free(KT), free(P);
  }
  return failed ? lm_error("attention kernel: out of memory for a thread's tiles") : 0;
}

/* Backward, one batch entry at a time (fused_attn.c's order of sums):
 * D_i = dO_i . O_i; per key tile, per query tile: P = exp(S - lse),
 * dV += P^T dO, dP = dO V^T, dS = scale P (dP - D), dK += dS^T Q,
 * dQ += dS K (summed in Qacc over the key tiles). */
int lm_cpu_attn_bwd_bf16(char *dq, char *dk, char *dv, const char *g, const char *q, const char *k,
                         const char *v, const char *o, const f32 *lse, const attn_dims *d) {
  const int64_t E = d->E, Ev = d->Ev, L = d->L, S = d->S;
  const int64_t E2 = E / 2, Ev2 = Ev / 2, Ep = up(E, 16), Evp = up(Ev, 16), Sp = up(S, 16);
  const int64_t L2 = (L + 1) / 2, S2 = (S + 1) / 2;
  const f32 scale = (f32)d->scale;
  int nt = lm_threads_for(d->B * L * S * (E + Ev)), failed = 0;
  if (nt > d->B) nt = d->B > 0 ? (int)d->B : 1;
#pragma omp parallel num_threads(nt) reduction(| : failed)
  {
    const size_t words = E2 * Sp + Ev2 * Sp + L2 * Ep + L2 * Evp + S2 * Ep + BQ * E2 + BQ * Ev2 + BK * BQ / 2 + Ep,
                 floats = (L + BQ) * Ep + L + BK * Ep + BK * Evp + 2 * BQ * BK;
    uint32_t *KT = malloc(words * sizeof *KT);
    f32 *Qacc = malloc(floats * sizeof *Qacc);
    uint32_t *VT = KT + E2 * Sp, *QI = VT + Ev2 * Sp, *GI = QI + L2 * Ep, *KJ = GI + L2 * Evp;
    uint32_t *Qt = KJ + S2 * Ep, *Gt = Qt + BQ * E2, *Sk = Gt + BQ * Ev2, *row = Sk + BK * BQ / 2;
    f32 *D = Qacc + (L + BQ) * Ep, *dK = D + L, *dV = dK + BK * Ep, *P = dV + BK * Evp, *dP = P + BQ * BK;
    failed |= !KT || !Qacc;
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < d->B; b++) {
      if (!KT || !Qacc) continue;
      const char *qb = q + entry_at(&d->q, b), *kb = k + entry_at(&d->k, b), *vb = v + entry_at(&d->v, b);
      const char *gb = g + entry_at(&d->g, b), *ob = o + entry_at(&d->o, b);
      const f32 *lb = lse + b * L;
      for (int64_t i = 0; i < L; i++) {
        const uint16_t *gi = (const uint16_t *)(gb + i * d->g.sr), *oi = (const uint16_t *)(ob + i * d->o.sr);
        f32 s = 0;
        for (int64_t e = 0; e < Ev; e++) s += lm_bf16_to_f32(gi[e]) * lm_bf16_to_f32(oi[e]);
        D[i] = s;
      }
      transpose_pairs(KT, Sp, (const uint32_t *)kb, d->k.sr / 4, S, E2);
      transpose_pairs(VT, Sp, (const uint32_t *)vb, d->v.sr / 4, S, Ev2);
      interleave_rows(QI, Ep, (const uint16_t *)qb, d->q.sr / 2, L, E);
      interleave_rows(GI, Evp, (const uint16_t *)gb, d->g.sr / 2, L, Ev);
      interleave_rows(KJ, Ep, (const uint16_t *)kb, d->k.sr / 2, S, E);
      memset(Qacc, 0, sizeof *Qacc * (L + BQ) * Ep);
      for (int64_t j0 = 0; j0 < S; j0 += BK) {
        const int64_t nj = S - j0 < BK ? S - j0 : BK, njp = up(nj, 16), nj4 = up(nj, RB);
        memset(dK, 0, sizeof *dK * BK * Ep), memset(dV, 0, sizeof *dV * BK * Evp);
        for (int64_t i0 = d->causal ? j0 : 0; i0 < L; i0 += BQ) {
          const int64_t ni = L - i0 < BQ ? L - i0 : BQ, ni4 = up(ni, RB);
          rows_pairs(Qt, qb, d->q.sr, E2, i0, ni);
          rows_pairs(Gt, gb, d->g.sr, Ev2, i0, ni);
          dp_tile(P, BK, Qt, E2, 1, KT + j0, Sp, ni4, njp, E2, 1);    /* scores */
          dp_tile(dP, BK, Gt, Ev2, 1, VT + j0, Sp, ni4, njp, Ev2, 1); /* dO V^T */
          grad_tile_f32(P, dP, lb, D, ni, ni4, i0, j0, nj, njp, scale, d->causal);
          pack_across(Sk, P, BK, nj4, ni); /* P^T as pairs along the queries */
          dp_tile(dV, Evp, Sk, 1, nj4, GI + i0 / 2 * Evp, Evp, nj4, Evp, (ni + 1) / 2, 0);
          pack_across(Sk, dP, BK, nj4, ni); /* dS^T */
          dp_tile(dK, Ep, Sk, 1, nj4, QI + i0 / 2 * Ep, Ep, nj4, Ep, (ni + 1) / 2, 0);
          pack_rows(Sk, dP, BK, ni4, nj); /* dS as pairs along the keys */
          dp_keys(Qacc + i0 * Ep, Ep, Sk, (nj + 1) / 2, 1, KJ + j0 / 2 * Ep, Ep, ni4, Ep, nj, 0, row);
        }
        for (int64_t j = 0; j < nj; j++) {
          store_bf16(dk + entry_at(&d->dk, b) + (j0 + j) * d->dk.sr, dK + j * Ep, E);
          store_bf16(dv + entry_at(&d->dv, b) + (j0 + j) * d->dv.sr, dV + j * Evp, Ev);
        }
      }
      for (int64_t i = 0; i < L; i++) store_bf16(dq + entry_at(&d->dq, b) + i * d->dq.sr, Qacc + i * Ep, E);
    }
    free(KT), free(Qacc);
  }
  return failed ? lm_error("attention_bwd kernel: out of memory for a thread's tiles") : 0;
}
#endif
