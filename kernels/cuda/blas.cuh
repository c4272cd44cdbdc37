/* blas.cuh: what gemm.cu shares with grouped_gemm.cu: a row-major GEMM's
 * operands in cuBLAS's column-major terms, and device k's cuBLAS handle
 * (on LM_STREAM, with its workspace), the types and the compute type a
 * plain GEMM uses. */
#ifndef LOOM_CUDA_BLAS_CUH
#define LOOM_CUDA_BLAS_CUH
#include <cublas_v2.h>
#include "kernels.cuh"

/* c (B, M, N) = a (B, M, K) @ b (B, K, N) as column-major C (m x n, ldc)
 * = op(A) (m x k) op(B) (k x n): A = our b, B = our a, m = N, n = M, k = K */
typedef struct lm_blas_operands {
  cublasOperation_t opa, opb;
  int64_t m, n, k, lda, ldb, ldc;
  const void *A, *B;
  void *C;
} lm_blas_operands;
/* 0, or -1 (no error left) when cuBLAS cannot read a layout: no unit
 * stride in one of an operand's last two dims, or c's last dim not unit */
int lm_blas_operands_of(lm_blas_operands *o, lm_tensor *c, const lm_tensor *a, const lm_tensor *b);
cublasHandle_t lm_cuda_blas_handle(int k);         /* device k's, made on first use; NULL with an error */
cudaDataType_t lm_cuda_blas_type(int dtype);
cublasComputeType_t lm_cuda_blas_compute(int dtype); /* TF32 for f32 when the matmul precision is high */
const char *lm_cuda_blas_status(cublasStatus_t s);
#endif
