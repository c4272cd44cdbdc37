/* iter.c: walks up to four strided operands (lm_walk, backend.h) row by
 * row, in parallel when the tensor is big enough. */
#include "iter.h"
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Rows [r0, r1) of the walk, each of `len` elements starting at column c0. */
static void walk_rows(const lm_walk *w, int64_t r0, int64_t r1, int64_t c0, int64_t len,
                      lm_row_fn fn, void *ctx) {
  int last = w->nd - 1;
  int64_t s[LM_WALK_ARGS];
  for (int k = 0; k < w->narg; k++) s[k] = w->stride_[k][last];
  for (int64_t r = r0; r < r1; r++) {
    char *p[LM_WALK_ARGS];
    for (int k = 0; k < w->narg; k++) p[k] = w->base[k] + c0 * s[k];
    int64_t rem = r;
    for (int d = last - 1; d >= 0; d--) {
      int64_t i = rem % w->shape[d];
      rem /= w->shape[d];
      for (int k = 0; k < w->narg; k++) p[k] += i * w->stride_[k][d];
    }
    fn(len, p, s, ctx);
  }
}

void lm_foreach(int narg, const lm_tensor *const *t, lm_row_fn fn, void *ctx) {
  if (t[0]->numel_ == 0) return;
  lm_walk w;
  lm_walk_init(&w, narg, t);
  int64_t inner = w.shape[w.nd - 1], rows = t[0]->numel_ / inner;
  int nt = lm_threads_for(t[0]->numel_);
  if (nt <= 1) { walk_rows(&w, 0, rows, 0, inner, fn, ctx); return; }
  if (rows >= nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int j = 0; j < nt; j++)
      walk_rows(&w, rows * j / nt, rows * (j + 1) / nt, 0, inner, fn, ctx);
  } else { /* few long rows: split each row across threads */
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int j = 0; j < nt; j++) {
      int64_t c0 = inner * j / nt, c1 = inner * (j + 1) / nt;
      walk_rows(&w, 0, rows, c0, c1 - c0, fn, ctx);
    }
  }
}

/* Tiles of TK rows along the dim where the second operand steps by one
 * element, TL elements along the innermost: TL lines of the strided side
 * are live at a time, under the 8 ways of a cache set even when the stride
 * is a multiple of 4 KiB; measured best of 4..512 x 4..32 here. */
enum { TK = 128, TL = 8 };

int lm_foreach_tiled(const lm_tensor *const *t, lm_tile_fn fn, void *ctx) {
  int64_t numel = t[0]->numel_;
  if (numel < 4 * TK * TL) return 0;
  lm_walk w;
  lm_walk_init(&w, 2, t);
  int last = w.nd - 1, es[2] = {lm_dtype_size(t[0]->dtype_), lm_dtype_size(t[1]->dtype_)};
  bool u0 = w.stride_[0][last] == es[0], u1 = w.stride_[1][last] == es[1];
  if (w.nd < 2 || u0 == u1) return 0;
  int b = u0 ? 1 : 0, k = -1; /* operand b is unit-stride along dim k */
  for (int d = last - 1; d >= 0 && k < 0; d--)
    if (w.stride_[b][d] == es[b]) k = d;
  if (k < 0) return 0;
  int64_t K = w.shape[k], L = w.shape[last];
  int64_t tk = (K + TK - 1) / TK, tl = (L + TL - 1) / TL;
  int64_t tasks = numel / (K * L) * tk * tl;
  int nt = lm_threads_for(numel);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t task = 0; task < tasks; task++) {
    int64_t jl = task % tl, rem = task / tl, jk = rem % tk, o = rem / tk;
    char *p[2] = {w.base[0], w.base[1]};
    for (int d = last - 1; d >= 0; d--) { /* the other dims, from o */
      if (d == k) continue;
      int64_t i = o % w.shape[d];
      o /= w.shape[d];
      p[0] += i * w.stride_[0][d], p[1] += i * w.stride_[1][d];
    }
    int64_t k0 = jk * TK, rows = (k0 + TK < K ? k0 + TK : K) - k0;
    int64_t l0 = jl * TL, len = (l0 + TL < L ? l0 + TL : L) - l0;
    int64_t s[2] = {w.stride_[0][last], w.stride_[1][last]}, rs[2] = {w.stride_[0][k], w.stride_[1][k]};
    char *q[2] = {p[0] + k0 * rs[0] + l0 * s[0], p[1] + k0 * rs[1] + l0 * s[1]};
    fn(rows, len, q, rs, s, ctx);
  }
  return 1;
}
