/* common.cuh: what the CUDA kernels share: error helpers, dtype stores
 * (loads are core/backend.h's lm_load, on host and device alike), and a
 * strided walk over up to four operands (the device twin of
 * kernels/cpu/iter.c). */
#ifndef LOOM_CUDA_COMMON_CUH
#define LOOM_CUDA_COMMON_CUH
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>
#include "kernels.cuh"

/* Every kernel runs on the legacy default stream of the current device. */
#define LM_STREAM ((cudaStream_t)0)
#define LM_THREADS 256
/* Row kernels (one block per row) take up to this many threads. Every
 * kernel states its block size in __launch_bounds__ (LM_THREADS or this),
 * so ptxas fits its registers to it (scripts/check_cuda_resources.sh). */
#define LM_ROW_THREADS 1024

/* A launch, written LM_LAUNCH(grid, block, smem, kernel)(args) (the kernel
 * last: its template arguments may hold commas), and a kernel's dynamic
 * shared memory. kernels/emu/ defines both to run kernels on the CPU. */
#ifndef LOOM_CUDA_EMULATE
#define LM_LAUNCH(grid, block, smem, ...) __VA_ARGS__<<<(grid), (block), (smem), LM_STREAM>>>
#define LM_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

/* ---- errors ---- */
/* Leaves "cuda: what: reason", clears CUDA's last error, returns -1. */
int lm_cuda_fail(const char *what, cudaError_t e);
/* Checks that the last launch went out; -1 with an error naming kernel. */
int lm_cuda_launched(const char *kernel);
/* Makes t's device current (kernels run where their output lives). */
int lm_cuda_use(const lm_tensor *t);
#define LM_CUDA_TRY(call)                                                      \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) return lm_cuda_fail(#call, e_);                     \
  } while (0)

/* Blocks for a grid-stride loop over n items. */
static inline unsigned lm_blocks(int64_t n, int threads = LM_THREADS) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : b > (1 << 19) ? (1 << 19) : b);
}

/* ---- dtypes (loads and the bf16/f16 conversions: core/backend.h's, on
 * host and device alike) ---- */
__host__ __device__ inline int lm_dtype_size_dev(int d) {
  return d == LM_F64 || d == LM_I64 ? 8 : d == LM_F32 || d == LM_I32 ? 4 : d == LM_BOOL ? 1 : 2;
}

/* One element from double (what lm_store does, but ints as the GPU
 * converts them). */
__host__ __device__ inline void lm_dev_store(char *p, int d, double v) {
  switch (d) {
  case LM_F32: *(float *)p = (float)v; break;
  case LM_F64: *(double *)p = v; break;
  case LM_BF16: *(uint16_t *)p = lm_f32_to_bf16((float)v); break;
  case LM_F16: *(uint16_t *)p = lm_f32_to_f16((float)v); break;
  case LM_I32: *(int32_t *)p = (int32_t)v; break;
  case LM_I64: *(int64_t *)p = (int64_t)v; break;
  default: *(uint8_t *)p = v != 0; break;
  }
}
/* The float-only family (f32, bf16, f16, bool): going through float gives
 * the same bits as going through double, at a fraction of the cost. */
__host__ __device__ inline float lm_dev_loadf(const char *p, int d) {
  switch (d) {
  case LM_F32: return *(const float *)p;
  case LM_BF16: return lm_bf16_to_f32(*(const uint16_t *)p);
  case LM_F16: return lm_f16_to_f32(*(const uint16_t *)p);
  default: return *(const uint8_t *)p;
  }
}
__host__ __device__ inline void lm_dev_storef(char *p, int d, float v) {
  switch (d) {
  case LM_F32: *(float *)p = v; break;
  case LM_BF16: *(uint16_t *)p = lm_f32_to_bf16(v); break;
  case LM_F16: *(uint16_t *)p = lm_f32_to_f16(v); break;
  default: *(uint8_t *)p = v != 0; break;
  }
}
/* Stores a T into an element of dtype d: directly when d is T's own dtype,
 * else through double as lm_store does. */
template <typename T> struct lm_dtype_of;
template <> struct lm_dtype_of<float> { static const int value = LM_F32; };
template <> struct lm_dtype_of<double> { static const int value = LM_F64; };
template <> struct lm_dtype_of<int64_t> { static const int value = LM_I64; };
template <typename T> __host__ __device__ inline void lm_dev_store_as(char *p, int d, T v) {
  if (d == lm_dtype_of<T>::value) *(T *)p = v;
  else lm_dev_store(p, d, (double)v);
}
template <typename T> __host__ __device__ inline T lm_dev_load_as(const char *p, int d) {
  if (d == lm_dtype_of<T>::value) return *(const T *)p;
  return (T)lm_load(p, d);
}

/* ---- float storage types and their compute types ----
 * The fused kernels are templates over the storage type T (float, double,
 * __nv_bfloat16, __half); they compute in lm_acc<T>::type: double for f64,
 * float for the rest (bf16/f16 are storage formats, as everywhere). */
template <typename T> struct lm_acc { typedef float type; };
template <> struct lm_acc<double> { typedef double type; };
__device__ __forceinline__ float lm_to_acc(float v) { return v; }
__device__ __forceinline__ double lm_to_acc(double v) { return v; }
__device__ __forceinline__ float lm_to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float lm_to_acc(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T lm_from_acc(typename lm_acc<T>::type v) { return (T)v; }
template <> __device__ __forceinline__ __nv_bfloat16 lm_from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half lm_from_acc<__half>(float v) { return __float2half_rn(v); }

/* An element of run-time dtype d in compute type C (float or double). */
template <typename C> __device__ __forceinline__ C lm_ld(const char *p, int d) {
  return d == LM_F64 ? (C) * (const double *)p : (C)lm_dev_loadf(p, d);
}
template <> __device__ __forceinline__ double lm_ld<double>(const char *p, int d) { return lm_load(p, d); }
template <typename C> __device__ __forceinline__ void lm_st(char *p, int d, C v) {
  if (d == LM_F64) *(double *)p = (double)v;
  else lm_dev_storef(p, d, (float)v);
}

/* f(T()) for the storage type of a float dtype; an error naming `what`
 * for any other dtype. */
template <typename F> int lm_by_float_dtype(int dtype, const char *what, F f) {
  switch (dtype) {
  case LM_F32: return f(float());
  case LM_F64: return f(double());
  case LM_BF16: return f(__nv_bfloat16());
  case LM_F16: return f(__half());
  default: return lm_error("%s: no CUDA kernel for dtype %s", what, lm_dtype_name(dtype));
  }
}

/* ---- strided walk ---- */
/* lm_walk and lm_walk_init: core/backend.h */
#ifdef __CUDA_ARCH__
#define LM_UNROLL _Pragma("unroll")
#else
#define LM_UNROLL
#endif
/* Addresses of element i of every operand. Loops are unrolled so the
 * walk stays in the kernel's parameter space. */
template <int N, typename I>
__host__ __device__ inline void lm_walk_at(const lm_walk &w, I i, char **p) {
LM_UNROLL
  for (int k = 0; k < N; k++) p[k] = w.base[k];
LM_UNROLL
  for (int d = LM_MAX_DIMS - 1; d > 0; d--) {
    if (d < w.nd) {
      I n = (I)w.shape[d], q = i / n, r = i - q * n;
      i = q;
LM_UNROLL
      for (int k = 0; k < N; k++) p[k] += (int64_t)r * w.stride_[k][d];
    }
  }
LM_UNROLL
  for (int k = 0; k < N; k++) p[k] += (int64_t)i * w.stride_[k][0];
}

template <int N, typename I, typename F>
__global__ void __launch_bounds__(LM_THREADS) lm_pointwise_kernel(lm_walk w, I n, F f) {
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    char *p[N];
    lm_walk_at<N, I>(w, i, p);
    f(p);
  }
}

/* Runs f(p) for every element of t[0]'s shape; p[k] points into t[k]. */
template <int N, typename F>
int lm_launch(const lm_tensor *const *t, F f, const char *name) {
  int64_t n = t[0]->numel_;
  if (n == 0) return 0;
  lm_walk w;
  lm_walk_init(&w, N, t);
#ifdef LOOM_CUDA_HOST_TEST /* kernels' host test: the same walk and functor on CPU memory */
  for (int64_t i = 0; i < n; i++) {
    char *p[N];
    lm_walk_at<N, int64_t>(w, i, p);
    f(p);
  }
  (void)name;
  return 0;
#endif
  if (lm_cuda_use(t[0]) < 0) return -1;
  if (n < INT32_MAX)
    LM_LAUNCH(lm_blocks(n), LM_THREADS, 0, lm_pointwise_kernel<N, uint32_t, F>)(w, (uint32_t)n, f);
  else
    LM_LAUNCH(lm_blocks(n), LM_THREADS, 0, lm_pointwise_kernel<N, int64_t, F>)(w, n, f);
  return lm_cuda_launched(name);
}

/* ---- reductions inside a block ---- */
template <typename T> __device__ inline T lm_warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T> __device__ inline T lm_warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    T u = __shfl_xor_sync(0xffffffffu, v, o);
    v = (u != u || u > v) ? u : v;
  }
  return v;
}
/* Sum (max when is_max) over a 1-D block whose size is a multiple of 32;
 * every thread gets the result. smem holds 32 T's. */
template <typename T> __device__ inline T lm_block_reduce(T v, bool is_max, T *smem) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = is_max ? lm_warp_max(v) : lm_warp_sum(v);
  __syncthreads(); /* smem may still be read from a previous call */
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T u = lane < nw ? smem[lane] : smem[0];
    if (!is_max && lane >= nw) u = 0;
    u = is_max ? lm_warp_max(u) : lm_warp_sum(u);
    if (lane == 0) smem[0] = u;
  }
  __syncthreads();
  return smem[0];
}

/* Threads for a row kernel over n elements: 32..LM_ROW_THREADS, a power of 2. */
static inline int lm_row_threads(int64_t n) {
  int t = 32;
  while (t < LM_ROW_THREADS && t < n) t *= 2;
  return t;
}

#endif
