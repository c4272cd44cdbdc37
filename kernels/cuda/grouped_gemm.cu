/* grouped_gemm.cu: the grouped GEMM (mixture of experts) on CUDA as ONE
 * cuBLAS call for all groups, cublasGemmGroupedBatchedEx (cuBLAS 12.5+):
 * each group with rows is one problem in cuBLAS's column-major terms
 * (gemm.cu's mapping of the group's views, grouped_gemm.h), f32 (in TF32
 * when the matmul precision is high, as a plain GEMM), bf16 and f16 with
 * f32 accumulation into c of the operands' dtype. The problems' sizes,
 * leading dims and transposes are host arrays; the matrices' pointers
 * cuBLAS reads on the device, so they go there in one copy on LM_STREAM,
 * into a block of the caching allocator freed right after the call
 * (stream-ordered: its next user queues after the call). In wgrad mode a
 * group without rows gets zeros (cudaMemsetAsync) and is left out.
 *
 * The entry is looked up at run time in the cuBLAS loom is linked with, so
 * an older cuBLAS still loads; without it, and for what one call cannot
 * take (f64, c of another dtype than the operands, a layout with no unit
 * stride, K = 0, a size beyond int, or cuBLAS answering not supported), the
 * groups run as before: one gemm.cu GEMM per group, queued one after the
 * other. Checked only on the emulated device (kernels/emu/gemm.cpp, which
 * plays the older cuBLAS with LOOM_EMU_NO_GROUPED_GEMM=1): never timed on
 * a GPU. */
#include "common.cuh"
#include "kernels.cuh"
#include "blas.cuh"
#include "../grouped_gemm.h"
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

typedef cublasStatus_t grouped_fn(cublasHandle_t, const cublasOperation_t[], const cublasOperation_t[],
                                  const int[], const int[], const int[], const void *, const void *const[],
                                  cudaDataType_t, const int[], const void *const[], cudaDataType_t, const int[],
                                  const void *, void *const[], cudaDataType_t, const int[], int, const int[],
                                  cublasComputeType_t);
static grouped_fn *grouped_entry;
static pthread_once_t resolved = PTHREAD_ONCE_INIT;

/* cublasGemmGroupedBatchedEx of the cuBLAS already loaded (the library
 * holding cublasCreate_v2: loom is dlopen'ed RTLD_LOCAL, so RTLD_DEFAULT
 * would not see it), or NULL */
static void resolve(void) {
#ifdef LOOM_CUDA_EMU_RUNTIME
  const char *older = getenv("LOOM_EMU_NO_GROUPED_GEMM");
  if (older && strcmp(older, "1") == 0) return; /* the emulated cuBLAS plays one before 12.5 */
#endif
  Dl_info info;
  if (!dladdr((void *)&cublasCreate_v2, &info) || !info.dli_fname) return;
  void *lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (!lib) return;
  grouped_entry = (grouped_fn *)dlsym(lib, "cublasGemmGroupedBatchedEx");
  dlclose(lib); /* the reference RTLD_NOLOAD took; loom's own link keeps the library */
}

/* The problems of one call, in host arrays (cuBLAS's `group`: a run of
 * problems of one shape; consecutive equal problems share one) */
typedef struct call {
  cublasOperation_t *ta, *tb;
  int *m, *n, *k, *lda, *ldb, *ldc, *size;
  float *alpha, *beta;
  const void **ptr;     /* A of every problem, then B, then C */
  int groups, problems;
} call;

static bool fits_int(const lm_blas_operands *o) {
  return o->m <= INT_MAX && o->n <= INT_MAX && o->k <= INT_MAX && o->lda <= INT_MAX && o->ldb <= INT_MAX &&
         o->ldc <= INT_MAX;
}

/* appends o, to the last group when it has o's shape */
static void add(call *q, const lm_blas_operands *o, int64_t cap) {
  int g = q->groups - 1;
  bool same = g >= 0 && q->ta[g] == o->opa && q->tb[g] == o->opb && q->m[g] == o->m && q->n[g] == o->n &&
              q->k[g] == o->k && q->lda[g] == o->lda && q->ldb[g] == o->ldb && q->ldc[g] == o->ldc;
  if (same) q->size[g]++;
  else {
    g = q->groups++;
    q->ta[g] = o->opa, q->tb[g] = o->opb, q->m[g] = (int)o->m, q->n[g] = (int)o->n, q->k[g] = (int)o->k;
    q->lda[g] = (int)o->lda, q->ldb[g] = (int)o->ldb, q->ldc[g] = (int)o->ldc, q->size[g] = 1;
    q->alpha[g] = 1, q->beta[g] = 0;
  }
  int p = q->problems++;
  q->ptr[p] = o->A, q->ptr[cap + p] = o->B, q->ptr[2 * cap + p] = o->C;
}

/* c[e] (wgrad, no rows) dense: one memset zeros it */
static bool dense(const lm_tensor *ce) { return ce->stride_[1] == ce->shape_[2] || ce->shape_[1] <= 1; }

/* 1: the call ran; 0: one call cannot take it (nothing queued that the
 * loop would not redo); -1: an error */
static int one_call(call *q, lm_tensor *c, const lm_tensor *a, const lm_tensor *b, const int64_t *offs,
                    int64_t groups, int wgrad) {
  int dt = a->dtype_;
  if ((dt != LM_F32 && dt != LM_BF16 && dt != LM_F16) || b->dtype_ != dt || c->dtype_ != dt) return 0;
  if (!wgrad && a->shape_[1] == 0) return 0; /* K = 0: gemm.cu's zeros */
  for (int64_t e = 0; e < groups; e++) { /* check every group before queueing anything */
    lm_tensor ce, ae, be;
    lm_blas_operands o;
    if (!lm_grouped_gemm_views(&ce, &ae, &be, c, a, b, offs, e, wgrad)) continue;
    if (offs[e + 1] == offs[e]) { /* wgrad: zeros, below */
      if (!dense(&ce)) return 0;
      continue;
    }
    if (lm_blas_operands_of(&o, &ce, &ae, &be) < 0 || !fits_int(&o)) return 0;
    if (o.m > 0 && o.n > 0) add(q, &o, groups);
  }
  if (lm_cuda_use(c) < 0) return -1;
  for (int64_t e = 0; wgrad && e < groups; e++) {
    lm_tensor ce, ae, be;
    if (offs[e + 1] == offs[e] && lm_grouped_gemm_views(&ce, &ae, &be, c, a, b, offs, e, 1))
      LM_CUDA_TRY(cudaMemsetAsync(lm_ptr(&ce), 0, (size_t)ce.numel_ * lm_dtype_size(dt), LM_STREAM));
  }
  if (q->problems == 0) return 1;
  cublasHandle_t h = lm_cuda_blas_handle(c->device_ - LM_CUDA0);
  size_t bytes = sizeof(void *) * (size_t)groups * 3;
  void **dev = h ? (void **)lm_cuda_alloc(bytes) : NULL;
  if (!dev) return -1;
  cudaError_t ce = cudaMemcpyAsync(dev, q->ptr, bytes, cudaMemcpyHostToDevice, LM_STREAM);
  cudaDataType_t t = lm_cuda_blas_type(dt);
  cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
  if (ce == cudaSuccess)
    s = grouped_entry(h, q->ta, q->tb, q->m, q->n, q->k, q->alpha, (const void *const *)dev, t, q->lda,
                      (const void *const *)dev + groups, t, q->ldb, q->beta, dev + 2 * groups, t, q->ldc,
                      q->groups, q->size, lm_cuda_blas_compute(dt));
  lm_cuda_free(dev); /* stream-ordered: reused only by work queued after the call */
  if (ce != cudaSuccess) return lm_cuda_fail("grouped gemm: the pointer arrays' copy", ce);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH) return 0;
  if (s != CUBLAS_STATUS_SUCCESS) return lm_error("cuda: cublasGemmGroupedBatchedEx: %s", lm_cuda_blas_status(s));
  return lm_cuda_launched("grouped gemm") < 0 ? -1 : 1;
}

int lm_cuda_grouped_gemm(lm_tensor *c, const lm_tensor *a, const lm_tensor *b,
                         const int64_t *offs, int64_t groups, int wgrad) {
  pthread_once(&resolved, resolve);
  int r = 0;
  if (grouped_entry && groups > 0 && groups <= INT_MAX / 3) {
    size_t n = (size_t)groups;
    void *mem = malloc(n * (2 * sizeof(cublasOperation_t) + 7 * sizeof(int) + 2 * sizeof(float) +
                            3 * sizeof(void *)));
    if (!mem) return lm_error("grouped gemm: out of memory for %lld groups", (long long)groups);
    call q;
    memset(&q, 0, sizeof q);
    q.ptr = (const void **)mem; /* the widest first: every array stays aligned */
    q.ta = (cublasOperation_t *)(q.ptr + 3 * n), q.tb = q.ta + n;
    q.m = (int *)(q.tb + n), q.n = q.m + n, q.k = q.n + n, q.lda = q.k + n, q.ldb = q.lda + n;
    q.ldc = q.ldb + n, q.size = q.ldc + n;
    q.alpha = (float *)(q.size + n), q.beta = q.alpha + n;
    r = one_call(&q, c, a, b, offs, groups, wgrad);
    free(mem);
  }
  return r < 0 ? -1 : r ? 0 : lm_grouped_gemm_loop(lm_cuda_gemm, c, a, b, offs, groups, wgrad);
}
