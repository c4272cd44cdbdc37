/* gemm_half.c: GEMM on bf16/f16 operands with f32 accumulation, for BLAS
 * builds without a bf16 kernel (Debian's OpenBLAS has none): panels of K
 * are widened to f32 in scratch, as a BLAS packs them, and multiplied by
 * sgemm into an f32 accumulator that is rounded into c once. */
#include "kernels.h"
#include <cblas.h>
#include <stdlib.h>

enum { PANEL = 256 };

static float widen(const char *p, int dtype) {
  uint16_t h = *(const uint16_t *)p;
  return dtype == LM_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
}

/* rows x cols of the matrix at p (element strides rs, cs) into dense f32 */
static void to_f32(float *dst, const char *p, int dtype, int64_t rows, int64_t cols, int64_t rs,
                   int64_t cs) {
#pragma omp parallel for num_threads(lm_threads_for(rows * cols)) schedule(static)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < cols; k++) dst[r * cols + k] = widen(p + 2 * (r * rs + k * cs), dtype);
}

static void store_acc(lm_tensor *c, const char *cp, const float *acc, int64_t M, int64_t N) {
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      uint16_t *o = (uint16_t *)(cp + 2 * (m * c->stride_[1] + n));
      float v = acc[m * N + n];
      *o = c->dtype_ == LM_BF16 ? lm_f32_to_bf16(v) : lm_f32_to_f16(v);
    }
}

int lm_cpu_gemm_half(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha, double beta) {
  int64_t B = c->shape_[0], M = c->shape_[1], N = c->shape_[2], K = a->shape_[2];
  int dt = a->dtype_, es = 2;
  bool f32_out = c->dtype_ == LM_F32;
  int64_t kp = K < PANEL ? K : PANEL;
  float *ap = malloc(sizeof(float) * (M * kp + kp * N + (f32_out ? 0 : M * N)) + 1);
  if (!ap) return lm_error("gemm: out of memory for %s panels", lm_dtype_name(dt));
  float *bp = ap + M * kp, *acc = bp + kp * N;
  for (int64_t i = 0; i < B; i++) {
    const char *pa = lm_ptr(a) + i * a->stride_[0] * es, *pb = lm_ptr(b) + i * b->stride_[0] * es;
    char *pc = lm_ptr(c) + i * c->stride_[0] * lm_dtype_size(c->dtype_);
    float *cacc = f32_out ? (float *)pc : acc;
    int64_t ldc = f32_out ? c->stride_[1] : N;
    float b0 = (float)beta;
    if (!f32_out && beta != 0) to_f32(acc, pc, c->dtype_, M, N, c->stride_[1], 1);
    for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += PANEL) {
      int64_t n = K - k0 < PANEL ? K - k0 : PANEL;
      to_f32(ap, pa + 2 * k0 * a->stride_[2], dt, M, n, a->stride_[1], a->stride_[2]);
      to_f32(bp, pb + 2 * k0 * b->stride_[1], dt, n, N, b->stride_[1], b->stride_[2]);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, n, (float)alpha, ap, n > 0 ? n : 1,
                  bp, N > 0 ? N : 1, b0, cacc, ldc > 0 ? ldc : 1);
      b0 = 1;
      if (K == 0) break;
    }
    if (!f32_out) store_acc(c, pc, acc, M, N);
  }
  free(ap);
  return 0;
}
