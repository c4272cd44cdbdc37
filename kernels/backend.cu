/* backend.cu: the CUDA backend table (lm_cuda_backend), device discovery
 * and selection, the stream-ordered allocator, and the helpers the kernel
 * files share (errors, the strided walk's setup). */
#include "common.cuh"
#include "kernels.cuh"
#include <stdio.h>

/* ---- errors ---- */
int lm_cuda_fail(const char *what, cudaError_t e) {
  cudaGetLastError(); /* clear it, so the next call starts clean */
  return lm_error("cuda: %s: %s", what, cudaGetErrorString(e));
}

int lm_cuda_launched(const char *kernel) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : lm_cuda_fail(kernel, e);
}

/* ---- devices ---- */
#define MAX_DEVICES 64
static int device_count = -1;              /* -1: not asked yet */
static char no_device_reason[256];
static bool pool_ready[MAX_DEVICES], use_pool[MAX_DEVICES];

int lm_cuda_device_count(void) {
  if (device_count < 0) {
    int n = 0; /* left untouched when there is no driver or GPU */
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      snprintf(no_device_reason, sizeof no_device_reason,
               "cuda: cudaGetDeviceCount found no device (%s)", cudaGetErrorString(e));
      cudaGetLastError();
      n = 0;
    } else if (n == 0) {
      snprintf(no_device_reason, sizeof no_device_reason,
               "cuda: cudaGetDeviceCount found no device");
    }
    device_count = n > MAX_DEVICES ? MAX_DEVICES : n;
  }
  if (device_count == 0) lm_error("%s", no_device_reason);
  return device_count;
}

int lm_cuda_available(int device) {
  int k = device - LM_CUDA0, n = lm_cuda_device_count();
  if (n == 0) return 0;
  if (k < 0 || k >= n) {
    lm_error("cuda:%d: expected a device in cuda:0..cuda:%d", k, n - 1);
    return 0;
  }
  return 1;
}

static int set_device(int k) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
  if (cur != k) LM_CUDA_TRY(cudaSetDevice(k));
  if (!pool_ready[k]) { /* keep freed blocks cached: no sync per free */
    int pools = 0;
    cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, k);
    use_pool[k] = pools != 0;
    if (use_pool[k]) {
      cudaMemPool_t pool;
      uint64_t keep = UINT64_MAX;
      if (cudaDeviceGetDefaultMemPool(&pool, k) == cudaSuccess)
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaGetLastError();
    pool_ready[k] = true;
  }
  return 0;
}

const lm_backend *lm_cuda_backend_for(int device) {
  if (!lm_cuda_available(device)) return NULL;
  return set_device(device - LM_CUDA0) < 0 ? NULL : &lm_cuda_backend;
}

int lm_cuda_use(const lm_tensor *t) {
  int k = t->device_ - LM_CUDA0;
#ifdef LOOM_CUDA_HOST_TEST
  if (k < 0) return 0;
#endif
  if (k < 0) return lm_error("cuda: tensor is on the CPU, expected a CUDA tensor");
  if (k >= MAX_DEVICES || !pool_ready[k]) return lm_cuda_backend_for(t->device_) ? 0 : -1;
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == k) return 0;
  LM_CUDA_TRY(cudaSetDevice(k));
  return 0;
}

/* ---- memory: on the current device (lm_backend_of selected it) ---- */
static int current_device(void) {
  int k = 0;
  if (cudaGetDevice(&k) != cudaSuccess) k = 0;
  return k < 0 || k >= MAX_DEVICES ? 0 : k;
}

static void *cuda_alloc(size_t n) {
  int k = current_device();
  if (!pool_ready[k] && set_device(k) < 0) return NULL;
  void *p = NULL;
  cudaError_t e = use_pool[k] ? cudaMallocAsync(&p, n, LM_STREAM) : cudaMalloc(&p, n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    lm_error("cuda:%d: cannot allocate %zu bytes (%s)", k, n, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

static void cuda_free(void *p) {
  if (!p) return;
  int k = current_device();
  cudaError_t e = use_pool[k] ? cudaFreeAsync(p, LM_STREAM) : cudaFree(p);
  if (e != cudaSuccess) cudaGetLastError(); /* free cannot fail upward */
}

/* ---- the walk: coalesces like core/cpu/iter.c ---- */
void lm_walk_init(lm_walk *w, int narg, const lm_tensor *const *t) {
  const lm_tensor *r = t[0];
  w->nd = 0;
  for (int k = 0; k < LM_MAXARG; k++) {
    w->base[k] = k < narg ? lm_ptr(t[k]) : NULL;
    for (int d = 0; d < LM_MAX_DIMS; d++) w->stride_[k][d] = 0;
  }
  for (int d = 0; d < LM_MAX_DIMS; d++) w->shape[d] = 1;
  for (int d = 0; d < r->ndim; d++) {
    if (r->shape[d] == 1) continue;
    int m = w->nd;
    bool merge = m > 0;
    for (int k = 0; k < narg && merge; k++)
      merge = w->stride_[k][m - 1] == t[k]->stride_[d] * r->shape[d] * lm_dtype_size(t[k]->dtype_);
    if (merge) {
      w->shape[m - 1] *= r->shape[d];
      for (int k = 0; k < narg; k++)
        w->stride_[k][m - 1] = t[k]->stride_[d] * lm_dtype_size(t[k]->dtype_);
    } else {
      w->shape[m] = r->shape[d];
      for (int k = 0; k < narg; k++) w->stride_[k][m] = t[k]->stride_[d] * lm_dtype_size(t[k]->dtype_);
      w->nd++;
    }
  }
  if (w->nd == 0) w->nd = 1; /* a scalar: shape 1, strides 0 */
}

/* ---- the table, in lm_backend's order (C++17 has no designated
 * initialisers): a slot added to lm_backend must be added here too. ---- */
static_assert(sizeof(lm_backend) == 16 * sizeof(void *), "lm_backend changed: update lm_cuda_backend");
extern "C" const lm_backend lm_cuda_backend = {
    "cuda",
    cuda_alloc,
    cuda_free,
    lm_cuda_copy,
    lm_cuda_fill,
    lm_cuda_unary,
    lm_cuda_binary,
    lm_cuda_where,
    lm_cuda_reduce,
    lm_cuda_gemm,
    lm_cuda_random,
    lm_cuda_softmax,
    lm_cuda_norm,
    lm_cuda_embedding,
    lm_cuda_index_add,
    lm_cuda_adamw,
};
