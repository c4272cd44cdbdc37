/* iter.c: coalesces the dims of up to four strided operands and walks
 * them row by row, in parallel when the tensor is big enough. */
#include "iter.h"
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAXARG 4

typedef struct {
  int nd, narg;
  int64_t shape[LM_MAX_DIMS];
  int64_t stride_[MAXARG][LM_MAX_DIMS]; /* bytes */
  char *base[MAXARG];
} walk;

/* Drops size-1 dims and merges dims that are contiguous in every operand. */
static void coalesce(walk *w, int narg, const lm_tensor *const *t) {
  const lm_tensor *r = t[0];
  w->narg = narg, w->nd = 0;
  for (int k = 0; k < narg; k++) w->base[k] = lm_ptr(t[k]);
  for (int d = 0; d < r->ndim; d++) {
    if (r->shape_[d] == 1) continue;
    int m = w->nd;
    bool merge = m > 0;
    for (int k = 0; k < narg && merge; k++)
      merge = w->stride_[k][m - 1] == t[k]->stride_[d] * r->shape_[d] * lm_dtype_size(t[k]->dtype_);
    if (merge) {
      w->shape[m - 1] *= r->shape_[d];
      for (int k = 0; k < narg; k++) w->stride_[k][m - 1] = t[k]->stride_[d] * lm_dtype_size(t[k]->dtype_);
    } else {
      w->shape[m] = r->shape_[d];
      for (int k = 0; k < narg; k++) w->stride_[k][m] = t[k]->stride_[d] * lm_dtype_size(t[k]->dtype_);
      w->nd++;
    }
  }
  if (w->nd == 0) { /* a scalar */
    w->nd = 1, w->shape[0] = 1;
    for (int k = 0; k < narg; k++) w->stride_[k][0] = 0;
  }
}

/* Rows [r0, r1) of the walk, each of `len` elements starting at column c0. */
static void walk_rows(const walk *w, int64_t r0, int64_t r1, int64_t c0, int64_t len,
                      lm_row_fn fn, void *ctx) {
  int last = w->nd - 1;
  int64_t s[MAXARG];
  for (int k = 0; k < w->narg; k++) s[k] = w->stride_[k][last];
  for (int64_t r = r0; r < r1; r++) {
    char *p[MAXARG];
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
  walk w;
  coalesce(&w, narg, t);
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
