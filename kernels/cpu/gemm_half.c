/* gemm_half.c: GEMM on bf16/f16 operands with f32 accumulation, for BLAS
 * builds without a bf16 kernel (Debian's OpenBLAS has none). Widening bf16
 * or f16 to f32 is exact and so is the f32 product of two of them, so sgemm
 * on widened operands computes what a bf16 dot-product unit does: exact
 * products, f32 sums. Panels of K are widened into scratch in the operand's
 * own layout (a transposed operand stays transposed and goes to sgemm with
 * its trans flag) by copy.c's vectorised converters, and the f32
 * accumulator is rounded into c once. */
#include "kernels.h"
#include <cblas.h>
#include <stdlib.h>

enum { PANEL = 256 };

static float widen1(const char *p, int dtype) {
  uint16_t h = *(const uint16_t *)p;
  return dtype == LM_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
}

/* The rows x cols matrix at p (element strides rs, cs) widened into dense
 * dst: row-major, or its transpose when only rs is 1 (returns CblasTrans). */
static enum CBLAS_TRANSPOSE widen(float *dst, const char *p, int dt, int64_t rows, int64_t cols,
                                  int64_t rs, int64_t cs) {
  bool tr = cs != 1 && rs == 1;
  int64_t outer = tr ? cols : rows, inner = tr ? rows : cols, os = tr ? cs : rs, is = tr ? rs : cs;
#pragma omp parallel for num_threads(lm_threads_for(rows * cols)) schedule(static)
  for (int64_t o = 0; o < outer; o++) {
    const char *src = p + 2 * o * os;
    float *d = dst + o * inner;
    if (is == 1) lm_cpu_convert(inner, d, LM_F32, src, dt);
    else for (int64_t i = 0; i < inner; i++) d[i] = widen1(src + 2 * i * is, dt);
  }
  return tr ? CblasTrans : CblasNoTrans;
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
    if (!f32_out && beta != 0) widen(acc, pc, c->dtype_, M, N, c->stride_[1], 1);
    for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += PANEL) {
      int64_t n = K - k0 < PANEL ? K - k0 : PANEL;
      enum CBLAS_TRANSPOSE ta = widen(ap, pa + 2 * k0 * a->stride_[2], dt, M, n, a->stride_[1], a->stride_[2]);
      enum CBLAS_TRANSPOSE tb = widen(bp, pb + 2 * k0 * b->stride_[1], dt, n, N, b->stride_[1], b->stride_[2]);
      int64_t lda = ta == CblasTrans ? M : n, ldb = tb == CblasTrans ? n : N;
      cblas_sgemm(CblasRowMajor, ta, tb, M, N, n, (float)alpha, ap, lda > 0 ? lda : 1, bp, ldb > 0 ? ldb : 1, b0,
                  cacc, ldc > 0 ? ldc : 1);
      b0 = 1;
      if (K == 0) break;
    }
    if (!f32_out) {
#pragma omp parallel for num_threads(lm_threads_for(M * N)) schedule(static)
      for (int64_t m = 0; m < M; m++) lm_cpu_convert(N, pc + 2 * m * c->stride_[1], c->dtype_, acc + m * N, LM_F32);
    }
  }
  free(ap);
  return 0;
}
