/* grouped_gemm.h: backend.h's grouped GEMM as one gemm call per group, on
 * views of the operands made in place (a copy of the tensor header with the
 * group's shape, strides and offset; no storage reference is taken: the
 * views live only during the call). Every backend runs it with its own
 * gemm, so a group runs as that backend's plain GEMM does (the CPU's BLAS,
 * threaded inside each call; on CUDA the fallback of the one grouped
 * cuBLAS call, which takes the same views: kernels/cuda/grouped_gemm.cu).
 * Compiled as C (the CPU backend) and as CUDA host code. */
#ifndef LOOM_GROUPED_GEMM_H
#define LOOM_GROUPED_GEMM_H
#include "../core/backend.h"

/* the (1, rows, cols) matrix at element offset `at` of t, strides (rs, cs) */
static inline lm_tensor lm_group_view(const lm_tensor *t, int64_t at, int64_t rows, int64_t rs,
                                      int64_t cols, int64_t cs) {
  lm_tensor v = *t;
  v.ndim = 3;
  v.shape_[0] = 1, v.shape_[1] = rows, v.shape_[2] = cols;
  v.stride_[0] = rows * cols, v.stride_[1] = rs, v.stride_[2] = cs;
  v.offset = t->offset + at;
  v.numel_ = rows * cols;
  return v;
}

/* group e's operands as views: its rows of c, its rows of a and b[e]
 * (wgrad 0), or c[e], (its rows of a)^T and its rows of b (wgrad 1);
 * 0 when the group has nothing to write (no rows, wgrad 0) */
static inline int lm_grouped_gemm_views(lm_tensor *ce, lm_tensor *ae, lm_tensor *be, const lm_tensor *c,
                                        const lm_tensor *a, const lm_tensor *b, const int64_t *offs,
                                        int64_t e, int wgrad) {
  int64_t K = a->shape_[1], M = wgrad ? b->shape_[1] : b->shape_[2];
  int64_t r0 = offs[e], n = offs[e + 1] - offs[e];
  if (!wgrad && n == 0) return 0;
  if (!wgrad) {
    *ce = lm_group_view(c, r0 * c->stride_[0], n, c->stride_[0], M, c->stride_[1]);
    *ae = lm_group_view(a, r0 * a->stride_[0], n, a->stride_[0], K, a->stride_[1]);
    *be = lm_group_view(b, e * b->stride_[0], K, b->stride_[1], M, b->stride_[2]);
  } else { /* n = 0 is a GEMM over nothing: zeros */
    *ce = lm_group_view(c, e * c->stride_[0], K, c->stride_[1], M, c->stride_[2]);
    *ae = lm_group_view(a, r0 * a->stride_[0], K, a->stride_[1], n, a->stride_[0]);
    *be = lm_group_view(b, r0 * b->stride_[0], n, b->stride_[0], M, b->stride_[1]);
  }
  return 1;
}

/* group e's GEMM: its rows of c = its rows of a @ b[e] (wgrad 0), or
 * c[e] = (its rows of a)^T @ (its rows of b) (wgrad 1) */
static inline int lm_grouped_gemm_one(lm_gemm_fn *gemm, lm_tensor *c, const lm_tensor *a,
                                      const lm_tensor *b, const int64_t *offs, int64_t e, int wgrad) {
  lm_tensor ce, ae, be;
  if (!lm_grouped_gemm_views(&ce, &ae, &be, c, a, b, offs, e, wgrad)) return 0;
  return gemm(&ce, &ae, &be, 1, 0);
}

/* every group, one after the other */
static inline int lm_grouped_gemm_loop(lm_gemm_fn *gemm, lm_tensor *c, const lm_tensor *a,
                                       const lm_tensor *b, const int64_t *offs, int64_t groups,
                                       int wgrad) {
  for (int64_t e = 0; e < groups; e++) LM_TRY(lm_grouped_gemm_one(gemm, c, a, b, offs, e, wgrad));
  return 0;
}
#endif
