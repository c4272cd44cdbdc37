/* gemm.cu: batched matrix multiply through cuBLAS on row-major 3-D strided
 * tensors. As in core/cpu/gemm.c, an operand whose strides are a transpose
 * goes in transposed, without a copy. cuBLAS is column-major, so row-major
 * c = a @ b is computed as column-major c^T = b^T @ a^T. */
#include "common.cuh"
#include "kernels.cuh"
#include <cublas_v2.h>
#include <limits.h>

#define MAX_DEVICES 64
static cublasHandle_t handles[MAX_DEVICES];

static const char *status_name(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
  case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
  case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
  default: return "error";
  }
}

static cublasHandle_t handle_of(int k) {
  if (k < 0 || k >= MAX_DEVICES) { lm_error("gemm: no cuBLAS handle for cuda:%d", k); return NULL; }
  if (!handles[k]) {
    cublasHandle_t h;
    cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS) {
      lm_error("cuda: cublasCreate on cuda:%d: %s", k, status_name(s));
      return NULL;
    }
    cublasSetStream(h, LM_STREAM);
    handles[k] = h;
  }
  return handles[k];
}

/* How cuBLAS can read a row-major (rows, cols) matrix with strides (rs, cs):
 * memory that is row-major NoTrans is the column-major transpose, so the
 * CBLAS NoTrans case is cuBLAS OP_N on the swapped product, and vice versa. */
static int blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                       cublasOperation_t *op, int64_t *ld) {
  if (cs == 1 && (rs >= cols || rows == 1)) { *op = CUBLAS_OP_N; *ld = rows == 1 ? cols : rs; }
  else if (rs == 1 && (cs >= rows || cols == 1)) { *op = CUBLAS_OP_T; *ld = cols == 1 ? rows : cs; }
  else return -1;
  if (*ld < 1) *ld = 1;
  return 0;
}

int lm_cuda_gemm(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha, double beta) {
  int64_t B = c->shape_[0], M = c->shape_[1], N = c->shape_[2], K = a->shape_[2];
  cublasOperation_t ta, tb;
  int64_t lda, ldb;
  if (blas_layout(M, K, a->stride_[1], a->stride_[2], &ta, &lda) < 0 ||
      blas_layout(K, N, b->stride_[1], b->stride_[2], &tb, &ldb) < 0 || c->stride_[2] != 1)
    return lm_error("gemm: operands need unit stride in one of their last two dims");
  int64_t ldc = c->stride_[1] > N ? c->stride_[1] : (N ? N : 1);
  if (M == 0 || N == 0 || B == 0) return 0;
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
      ldc > INT_MAX || B > INT_MAX)
    return lm_error("gemm: sizes beyond 2^31 are not supported on CUDA");
  if (a->dtype_ != c->dtype_ || b->dtype_ != c->dtype_)
    return lm_error("gemm: operands differ in dtype (%s, %s, %s)", lm_dtype_name(a->dtype_),
                    lm_dtype_name(b->dtype_), lm_dtype_name(c->dtype_));
  if (lm_cuda_use(c) < 0) return -1;
  cublasHandle_t h = handle_of(c->device_ - LM_CUDA0);
  if (!h) return -1;
  /* column-major: C^T (N x M) = op(B^T) (N x K) @ op(A^T) (K x M) */
  const void *A = lm_ptr(b), *Bm = lm_ptr(a);
  void *C = lm_ptr(c);
  long long sA = b->stride_[0], sB = a->stride_[0], sC = c->stride_[0];
  cublasStatus_t s;
  if (c->dtype_ == LM_F64) {
    s = cublasDgemmStridedBatched(h, tb, ta, (int)N, (int)M, (int)K, &alpha, (const double *)A,
                                  (int)ldb, sA, (const double *)Bm, (int)lda, sB, &beta,
                                  (double *)C, (int)ldc, sC, (int)B);
  } else if (c->dtype_ == LM_F32) {
    float al = (float)alpha, be = (float)beta;
    s = cublasSgemmStridedBatched(h, tb, ta, (int)N, (int)M, (int)K, &al, (const float *)A,
                                  (int)ldb, sA, (const float *)Bm, (int)lda, sB, &be,
                                  (float *)C, (int)ldc, sC, (int)B);
  } else if (c->dtype_ == LM_BF16 || c->dtype_ == LM_F16) { /* f32 accumulate */
    float al = (float)alpha, be = (float)beta;
    cudaDataType_t t = c->dtype_ == LM_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    s = cublasGemmStridedBatchedEx(h, tb, ta, (int)N, (int)M, (int)K, &al, A, t, (int)ldb, sA,
                                   Bm, t, (int)lda, sB, &be, C, t, (int)ldc, sC, (int)B,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  } else {
    return lm_error("gemm: no CUDA kernel for dtype %s", lm_dtype_name(c->dtype_));
  }
  if (s != CUBLAS_STATUS_SUCCESS) return lm_error("cuda: cuBLAS gemm: %s", status_name(s));
  return lm_cuda_launched("gemm");
}
