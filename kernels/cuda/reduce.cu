/* reduce.cu: reductions of a contiguous (outer, n, inner) tensor over its
 * middle dim into a contiguous (outer, inner), as kernels/cpu/reduce.c: sums
 * accumulate in double; max/min/argmax/argmin keep the first NaN, else the
 * first extreme (ties go to the lower index); arg* write i64 indices. */
#include "common.cuh"
#include "kernels.cuh"

template <typename T> struct Acc {
  double s; /* the sum */
  T v;      /* the best value so far, at index i (-1: none yet) */
  int64_t i;
};

template <typename T> __device__ inline bool isnan_(T v) { return v != v; }

/* Takes (v, i) into a when it beats a's best. */
template <typename T> __device__ inline void take(int kind, Acc<T> &a, T v, int64_t i) {
  if (i < 0) return;
  bool better;
  if (a.i < 0) better = true;
  else if (isnan_(a.v)) better = isnan_(v) && i < a.i;
  else if (isnan_(v)) better = true;
  else if (v == a.v) better = i < a.i;
  else better = (kind == LM_MAX || kind == LM_ARGMAX) ? v > a.v : v < a.v;
  if (better) a.v = v, a.i = i;
}

template <typename T> __device__ inline void add(int kind, Acc<T> &a, T v, int64_t j) {
  if (kind == LM_SUM) a.s += (double)v;
  else take(kind, a, v, j);
}

template <typename T> __device__ inline void merge(int kind, Acc<T> &a, const Acc<T> &b) {
  if (kind == LM_SUM) a.s += b.s;
  else take(kind, a, b.v, b.i);
}

template <typename T> __device__ inline void put(int kind, char *out, int64_t k, const Acc<T> &a) {
  if (kind == LM_ARGMAX || kind == LM_ARGMIN) ((int64_t *)out)[k] = a.i < 0 ? 0 : a.i;
  else if (kind == LM_SUM) ((T *)out)[k] = (T)a.s;
  else ((T *)out)[k] = a.i < 0 ? (T)0 : a.v;
}

/* inner == 1: a block per row, threads stride along it. */
template <typename T>
__global__ void __launch_bounds__(LM_ROW_THREADS) reduce_rows(int kind, char *out, const T *x, int64_t rows, int64_t n) {
  __shared__ Acc<T> sm[256];
  int tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    Acc<T> a = {0, 0, -1};
    const T *p = x + r * n;
    for (int64_t j = tid; j < n; j += blockDim.x) add(kind, a, p[j], j);
    sm[tid] = a;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (tid < s) merge(kind, sm[tid], sm[tid + s]);
      __syncthreads();
    }
    if (tid == 0) put(kind, out, r, sm[0]);
    __syncthreads();
  }
}

/* inner > 1: a block per 32 columns of one outer slice; threadIdx.x picks
 * the column (coalesced), threadIdx.y splits n eight ways. */
template <typename T>
__global__ void __launch_bounds__(LM_THREADS) reduce_cols(int kind, char *out, const T *x, int64_t outer, int64_t n,
                            int64_t inner) {
  __shared__ Acc<T> sm[8][32];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t tiles = (inner + 31) / 32;
  for (int64_t tile = blockIdx.x; tile < outer * tiles; tile += gridDim.x) {
    int64_t o = tile / tiles, i = (tile % tiles) * 32 + tx;
    Acc<T> a = {0, 0, -1};
    if (i < inner)
      for (int64_t j = ty; j < n; j += 8) add(kind, a, x[(o * n + j) * inner + i], j);
    sm[ty][tx] = a;
    __syncthreads();
    for (int s = 4; s > 0; s >>= 1) {
      if (ty < s) merge(kind, sm[ty][tx], sm[ty + s][tx]);
      __syncthreads();
    }
    if (ty == 0 && i < inner) put(kind, out, o * inner + i, sm[0][tx]);
    __syncthreads();
  }
}

template <typename T>
static void launch(int kind, char *out, const T *x, int64_t outer, int64_t n, int64_t inner) {
  if (inner == 1) {
    int threads = lm_row_threads(n);
    if (threads > 256) threads = 256;
    reduce_rows<T><<<lm_blocks(outer, 1), threads, 0, LM_STREAM>>>(kind, out, x, outer, n);
  } else {
    int64_t blocks = outer * ((inner + 31) / 32);
    reduce_cols<T><<<lm_blocks(blocks, 1), dim3(32, 8), 0, LM_STREAM>>>(kind, out, x, outer, n,
                                                                        inner);
  }
}

int lm_cuda_reduce(int kind, lm_tensor *out, const lm_tensor *x, int64_t outer, int64_t n,
                   int64_t inner) {
  if (kind < 0 || kind >= LM_NREDUCE) return lm_error("reduce kernel: unknown kind %d", kind);
  if (outer * inner == 0) return 0;
  if (lm_cuda_use(out) < 0) return -1;
  char *o = lm_ptr(out);
  switch (x->dtype_) {
  case LM_F32: launch(kind, o, (const float *)lm_ptr(x), outer, n, inner); break;
  case LM_F64: launch(kind, o, (const double *)lm_ptr(x), outer, n, inner); break;
  case LM_I64: launch(kind, o, (const int64_t *)lm_ptr(x), outer, n, inner); break;
  default: return lm_error("reduce kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_));
  }
  return lm_cuda_launched("reduce");
}
