/* gemm.cu: batched matrix multiply on row-major 3-D strided tensors, as in
 * kernels/cpu/gemm.c: an operand whose strides are a transpose goes in
 * transposed, without a copy, and batches go in as strided batches. cuBLAS
 * is column-major, so row-major c = a @ b runs as column-major
 * c^T = b^T @ a^T.
 *
 * f32, bf16 and f16 operands go through cuBLASLt (cublasLtMatmul): bf16/f16
 * with f32 accumulation into c of their dtype or f32, f32 with TF32 tensor
 * cores when lm_float32_matmul_precision() is LM_PRECISION_HIGH and in full
 * f32 otherwise. The algorithm cuBLASLt's heuristic picks for a shape is
 * kept (a direct-mapped cache), and its workspace is allocated once per
 * device. f64, batches that broadcast one operand (batch stride 0), K = 0
 * and anything cuBLASLt declines go through cublasGemmStridedBatchedEx. */
#include "common.cuh"
#include "kernels.cuh"
#include "blas.cuh"
#include <cublasLt.h>
#include <limits.h>

#define MAX_DEVICES 64

typedef struct gemm_dev {
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  void *ws;          /* the workspace both share (one stream: never at once) */
  size_t ws_size;
} gemm_dev;
static gemm_dev devs[MAX_DEVICES];

const char *lm_cuda_blas_status(cublasStatus_t s) {
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

/* device k's handles and workspace, made on first use */
static gemm_dev *dev_of(int k) {
  if (k < 0 || k >= MAX_DEVICES) { lm_error("gemm: no cuBLAS handle for cuda:%d", k); return NULL; }
  gemm_dev *d = &devs[k];
  if (d->blas) return d;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, k);
  size_t size = (size_t)(major >= 9 ? 32 : 4) << 20; /* cuBLAS's advice for Hopper and earlier */
  cublasStatus_t s;
  cudaError_t e = cudaMalloc(&d->ws, size);
  if (e != cudaSuccess) {
    cudaGetLastError();
    lm_error("cuda:%d: cannot allocate the %zu-byte GEMM workspace (%s)", k, size, cudaGetErrorString(e));
    d->ws = NULL;
    return NULL;
  }
  d->ws_size = size;
  if ((s = cublasLtCreate(&d->lt)) != CUBLAS_STATUS_SUCCESS) {
    lm_error("cuda: cublasLtCreate on cuda:%d: %s", k, lm_cuda_blas_status(s));
    d->lt = NULL;
  } else if ((s = cublasCreate(&d->blas)) != CUBLAS_STATUS_SUCCESS) {
    lm_error("cuda: cublasCreate on cuda:%d: %s", k, lm_cuda_blas_status(s));
    d->blas = NULL;
  }
  if (!d->lt || !d->blas) {
    if (d->lt) cublasLtDestroy(d->lt);
    cudaFree(d->ws);
    d->lt = NULL, d->ws = NULL;
    return NULL;
  }
  cublasSetStream(d->blas, LM_STREAM);
  cublasSetWorkspace(d->blas, d->ws, d->ws_size);
  return d;
}

cublasHandle_t lm_cuda_blas_handle(int k) {
  gemm_dev *d = dev_of(k);
  return d ? d->blas : NULL;
}

/* How cuBLAS can read a row-major (rows, cols) matrix with strides (rs, cs):
 * memory that is row-major NoTrans is the column-major transpose, so the
 * CBLAS NoTrans case is cuBLAS OP_N on the swapped product, and vice versa.
 * Stored column-major, the matrix is (cols x rows) for OP_N and (rows x
 * cols) for OP_T, ld apart. */
static int blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                       cublasOperation_t *op, int64_t *ld) {
  if (cs == 1 && (rs >= cols || rows == 1)) { *op = CUBLAS_OP_N; *ld = rows == 1 ? cols : rs; }
  else if (rs == 1 && (cs >= rows || cols == 1)) { *op = CUBLAS_OP_T; *ld = cols == 1 ? rows : cs; }
  else return -1;
  if (*ld < 1) *ld = 1;
  return 0;
}

/* One GEMM in column-major terms: C (m x n, ldc) = op(A) (m x k) op(B) (k x n),
 * with A = our b, B = our a, m = N, n = M. */
typedef struct problem {
  int device;
  cudaDataType_t ab, c;       /* operand and result types */
  cublasComputeType_t compute;
  cublasOperation_t opa, opb;
  int64_t m, n, k, lda, ldb, ldc, batch, sa, sb, sc;
  uint32_t align[3];          /* of A, B, C in bytes (up to 256) */
} problem;

static uint32_t alignment(const void *p) {
  uint32_t a = 256;
  while (a > 1 && ((uintptr_t)p & (a - 1))) a >>= 1;
  return a;
}

/* ---- cuBLASLt, with the heuristic's answer kept per problem ---- */
#define PLAN_SLOTS 512
typedef struct plan { problem key; cublasLtMatmulAlgo_t algo; bool used; } plan;
static plan plans[PLAN_SLOTS];

static size_t plan_slot(const problem *p) {
  const unsigned char *b = (const unsigned char *)p;
  uint64_t h = 1469598103934665603ULL; /* FNV-1a over the (zeroed, then filled) key */
  for (size_t i = 0; i < sizeof *p; i++) h = (h ^ b[i]) * 1099511628211ULL;
  return (size_t)(h % PLAN_SLOTS);
}

/* a column-major rows x cols layout, ld apart, batch of them stride apart */
static cublasStatus_t layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols,
                             int64_t ld, int64_t batch, int64_t stride) {
  cublasStatus_t s = cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
  if (s != CUBLAS_STATUS_SUCCESS || batch == 1) return s;
  int32_t nb = (int32_t)batch;
  s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &nb, sizeof nb);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  return s;
}

/* the heuristic's first algorithm for p, from the cache when asked before */
static cublasStatus_t pick(gemm_dev *d, const problem *p, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                           cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatmulAlgo_t *algo) {
  plan *pl = &plans[plan_slot(p)];
  if (pl->used && memcmp(&pl->key, p, sizeof *p) == 0) { *algo = pl->algo; return CUBLAS_STATUS_SUCCESS; }
  cublasLtMatmulPreference_t pref;
  cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  uint64_t ws = d->ws_size;
  s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
    s = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &p->align[i < 3 ? i : 2], sizeof(uint32_t));
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(d->lt, op, la, lb, lc, lc, pref, 1, &r, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s == CUBLAS_STATUS_SUCCESS && found < 1) s = CUBLAS_STATUS_NOT_SUPPORTED;
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  pl->key = *p, pl->algo = r.algo, pl->used = true;
  *algo = r.algo;
  return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t run_lt(gemm_dev *d, const problem *p, const void *A, const void *B, void *C,
                             float alpha, float beta) {
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
  cublasStatus_t s = cublasLtMatmulDescCreate(&op, p->compute, CUDA_R_32F);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &p->opa, sizeof p->opa);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &p->opb, sizeof p->opb);
  bool ta = p->opa != CUBLAS_OP_N, tb = p->opb != CUBLAS_OP_N;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = layout(&la, p->ab, ta ? p->k : p->m, ta ? p->m : p->k, p->lda, p->batch, p->sa);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = layout(&lb, p->ab, tb ? p->n : p->k, tb ? p->k : p->n, p->ldb, p->batch, p->sb);
  if (s == CUBLAS_STATUS_SUCCESS) s = layout(&lc, p->c, p->m, p->n, p->ldc, p->batch, p->sc);
  cublasLtMatmulAlgo_t algo;
  if (s == CUBLAS_STATUS_SUCCESS) s = pick(d, p, op, la, lb, lc, &algo);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmul(d->lt, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &algo, d->ws, d->ws_size, LM_STREAM);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  return s;
}

/* ---- cuBLAS: every dtype and stride cuBLASLt does not take ---- */
static cublasStatus_t run_blas(gemm_dev *d, const problem *p, const void *A, const void *B, void *C,
                               double alpha, double beta) {
  float af = (float)alpha, bf = (float)beta;
  bool f64 = p->compute == CUBLAS_COMPUTE_64F;
  return cublasGemmStridedBatchedEx(d->blas, p->opa, p->opb, (int)p->m, (int)p->n, (int)p->k,
                                    f64 ? (const void *)&alpha : (const void *)&af, A, p->ab, (int)p->lda,
                                    p->sa, B, p->ab, (int)p->ldb, p->sb,
                                    f64 ? (const void *)&beta : (const void *)&bf, C, p->c, (int)p->ldc,
                                    p->sc, (int)p->batch, p->compute, CUBLAS_GEMM_DEFAULT);
}

/* K = 0: no products, c = beta * c (beta 0 writes zeros, never 0 * NaN of
 * a fresh buffer); cuBLASLt takes no k = 0 and cuBLAS wants lda >= 1 */
__global__ void __launch_bounds__(LM_THREADS)
gemm_empty_k_kernel(char *c, int dt, int64_t M, int64_t N, int64_t s0, int64_t s1, int64_t total, double beta) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t b = i / (M * N), m = i / N % M, n = i % N;
    char *p = c + (b * s0 + m * s1 + n) * lm_dtype_size_dev(dt);
    lm_dev_store(p, dt, beta == 0 ? 0.0 : beta * lm_load(p, dt));
  }
}

static int gemm_empty_k(lm_tensor *c, double beta) {
  int64_t B = c->shape_[0], M = c->shape_[1], N = c->shape_[2], total = B * M * N;
  if (total == 0) return 0;
  if (lm_cuda_use(c) < 0) return -1;
  LM_LAUNCH(lm_blocks(total), LM_THREADS, 0, gemm_empty_k_kernel)(
      lm_ptr(c), c->dtype_, M, N, c->stride_[0], c->stride_[1], total, beta);
  return lm_cuda_launched("gemm (K = 0)");
}

cudaDataType_t lm_cuda_blas_type(int dtype) {
  return dtype == LM_F64 ? CUDA_R_64F : dtype == LM_F32 ? CUDA_R_32F : dtype == LM_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

cublasComputeType_t lm_cuda_blas_compute(int dtype) {
  return dtype == LM_F64 ? CUBLAS_COMPUTE_64F
         : dtype == LM_F32 && lm_float32_matmul_precision() == LM_PRECISION_HIGH ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                : CUBLAS_COMPUTE_32F;
}

int lm_blas_operands_of(lm_blas_operands *o, lm_tensor *c, const lm_tensor *a, const lm_tensor *b) {
  int64_t M = c->shape_[1], N = c->shape_[2], K = a->shape_[2];
  if (blas_layout(M, K, a->stride_[1], a->stride_[2], &o->opb, &o->ldb) < 0 ||
      blas_layout(K, N, b->stride_[1], b->stride_[2], &o->opa, &o->lda) < 0 || c->stride_[2] != 1)
    return -1;
  o->ldc = c->stride_[1] > N ? c->stride_[1] : (N ? N : 1);
  o->m = N, o->n = M, o->k = K;
  o->A = lm_ptr(b), o->B = lm_ptr(a), o->C = lm_ptr(c);
  return 0;
}

int lm_cuda_gemm(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha, double beta) {
  int64_t B = c->shape_[0], M = c->shape_[1], N = c->shape_[2], K = a->shape_[2];
  lm_blas_operands o;
  if (lm_blas_operands_of(&o, c, a, b) < 0)
    return lm_error("gemm: operands need unit stride in one of their last two dims");
  int ab = a->dtype_, cd = c->dtype_;
  bool half = ab == LM_BF16 || ab == LM_F16;
  if (b->dtype_ != ab || !lm_is_float(ab) || (cd != ab && !(half && cd == LM_F32)))
    return lm_error("gemm: expected operands of one float dtype and c of theirs (or f32 for bf16/f16), "
                    "got %s, %s and %s", lm_dtype_name(ab), lm_dtype_name(b->dtype_), lm_dtype_name(cd));
  if (M == 0 || N == 0 || B == 0) return 0;
  if (K == 0) return gemm_empty_k(c, beta);
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || o.lda > INT_MAX || o.ldb > INT_MAX ||
      o.ldc > INT_MAX || B > INT_MAX)
    return lm_error("gemm: sizes beyond 2^31 are not supported on CUDA");
  if (lm_cuda_use(c) < 0) return -1;
  gemm_dev *d = dev_of(c->device_ - LM_CUDA0);
  if (!d) return -1;
  problem p;
  memset(&p, 0, sizeof p); /* the cache compares keys byte for byte */
  p.device = c->device_, p.ab = lm_cuda_blas_type(ab), p.c = lm_cuda_blas_type(cd);
  p.compute = lm_cuda_blas_compute(ab);
  p.opa = o.opa, p.opb = o.opb;
  p.m = o.m, p.n = o.n, p.k = o.k, p.lda = o.lda, p.ldb = o.ldb, p.ldc = o.ldc, p.batch = B;
  p.sa = b->stride_[0], p.sb = a->stride_[0], p.sc = c->stride_[0];
  p.align[0] = alignment(o.A), p.align[1] = alignment(o.B), p.align[2] = alignment(o.C);
  bool broadcast = B > 1 && (p.sa == 0 || p.sb == 0);
  cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
  if (ab != LM_F64 && !broadcast && K > 0) s = run_lt(d, &p, o.A, o.B, o.C, (float)alpha, (float)beta);
  if (s != CUBLAS_STATUS_SUCCESS) s = run_blas(d, &p, o.A, o.B, o.C, alpha, beta);
  if (s != CUBLAS_STATUS_SUCCESS) return lm_error("cuda: cuBLAS gemm: %s", lm_cuda_blas_status(s));
  return lm_cuda_launched("gemm");
}
