/* gemm.c: batched matrix multiply, the CPU's one GEMM dispatch: f32 and
 * f64 through OpenBLAS (operands whose strides are a transpose go to BLAS
 * as transposed, without a copy); bf16 through oneDNN where the CPU has
 * bf16 dot products (gemm_dnnl.c), else, and for f16, widened to f32 for
 * sgemm (gemm_half.c). */
#include "kernels.h"
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

const char *lm_blas_info(void) {
  static _Thread_local char buf[640];
  const char *forced = getenv("OPENBLAS_CORETYPE");
  snprintf(buf, sizeof buf, "%s; core %s%s%s%s, %d threads; bf16 GEMM: %s; bf16 attention: %s",
           openblas_get_config(), openblas_get_corename(), forced ? " (OPENBLAS_CORETYPE=" : "",
           forced ? forced : "", forced ? ")" : "", openblas_get_num_threads(), lm_cpu_bf16_gemm_info(),
           lm_cpu_bf16_attention_info());
  return buf;
}

/* How BLAS can read a (rows, cols) matrix with strides (rs, cs). */
static int blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                       enum CBLAS_TRANSPOSE *tr, int64_t *ld) {
  if (cs == 1 && (rs >= cols || rows == 1)) { *tr = CblasNoTrans; *ld = rows == 1 ? cols : rs; }
  else if (rs == 1 && (cs >= rows || cols == 1)) { *tr = CblasTrans; *ld = cols == 1 ? rows : cs; }
  else return -1;
  if (*ld < 1) *ld = 1;
  return 0;
}

/* K = 0: no products, c = beta * c; beta 0 writes zeros (never 0 * NaN of
 * a fresh buffer), as BLAS defines it */
static int gemm_empty_k(lm_tensor *c, double beta) {
  int es = lm_dtype_size(c->dtype_);
  for (int64_t i = 0; i < c->shape_[0]; i++)
    for (int64_t m = 0; m < c->shape_[1]; m++)
      for (int64_t n = 0; n < c->shape_[2]; n++) {
        char *p = lm_ptr(c) + (i * c->stride_[0] + m * c->stride_[1] + n * c->stride_[2]) * es;
        lm_store(p, c->dtype_, beta == 0 ? 0 : beta * lm_load(p, c->dtype_));
      }
  return 0;
}

int lm_cpu_gemm(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha, double beta) {
  if (a->shape_[2] == 0) return gemm_empty_k(c, beta);
  int64_t B = c->shape_[0], M = c->shape_[1], N = c->shape_[2], K = a->shape_[2];
  if (a->dtype_ == LM_BF16 || a->dtype_ == LM_F16) {
    if (M == 0 || N == 0) return 0;
    int rc = lm_cpu_gemm_dnnl(c, a, b, alpha, beta);   /* 1: no fast path for this call */
    return rc == 1 ? lm_cpu_gemm_half(c, a, b, alpha, beta) : rc;
  }
  enum CBLAS_TRANSPOSE ta, tb;
  int64_t lda, ldb;
  if (blas_layout(M, K, a->stride_[1], a->stride_[2], &ta, &lda) < 0 ||
      blas_layout(K, N, b->stride_[1], b->stride_[2], &tb, &ldb) < 0 || c->stride_[2] != 1)
    return lm_error("gemm: operands need unit stride in one of their last two dims");
  int64_t ldc = c->stride_[1] > N ? c->stride_[1] : (N ? N : 1);
  int es = lm_dtype_size(c->dtype_);
  char *pa = lm_ptr(a), *pb = lm_ptr(b), *pc = lm_ptr(c);
  if (M == 0 || N == 0) return 0;
  for (int64_t i = 0; i < B; i++) {
    void *A = pa + i * a->stride_[0] * es, *Bm = pb + i * b->stride_[0] * es,
         *C = pc + i * c->stride_[0] * es;
    if (c->dtype_ == LM_F64)
      cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, C, ldc);
    else
      cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, (float)alpha, A, lda, Bm, ldb, (float)beta,
                  C, ldc);
  }
  return 0;
}
