/* random.cu: fills a tensor from Philox4x32-10 counters by global linear
 * index, the same function and formulas as core/tensor/rng.c and kernels/cpu/random.c,
 * so a CUDA tensor draws the numbers its CPU twin draws. Products and sums
 * use round-to-nearest intrinsics (no FMA contraction) to match the CPU. */
#include "common.cuh"
#include "kernels.cuh"
#include "../../core/philox.h"

struct Rnd {
  int nd, dtype, kind;
  int64_t shape[LM_MAX_DIMS], stride_[LM_MAX_DIMS], gshape[LM_MAX_DIMS], start[LM_MAX_DIMS];
  char *base;
  double a, b;
  uint64_t seed, offset;
};

__global__ void __launch_bounds__(LM_THREADS) random_kernel(Rnd r, int64_t n) {
  int es = lm_dtype_size_dev(r.dtype);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t rem = i, g = 0, gstride = 1, off = 0;
#pragma unroll
    for (int d = LM_MAX_DIMS - 1; d >= 0; d--) {
      if (d < r.nd) {
        int64_t idx = rem % r.shape[d];
        rem /= r.shape[d];
        off += idx * r.stride_[d];
        g += (idx + r.start[d]) * gstride;
        gstride *= r.gshape[d];
      }
    }
    double v = lm_philox_draw(r.kind, r.a, r.b, r.seed, r.offset + (uint64_t)g, r.dtype);
    lm_dev_store(r.base + off * es, r.dtype, v);
  }
}

int lm_cuda_random(lm_tensor *t, int kind, double a, double b, uint64_t seed, uint64_t offset,
                   const int64_t *gshape, const int64_t *start) {
  if (t->numel_ == 0) return 0;
  if (lm_cuda_use(t) < 0) return -1;
  Rnd r;
  memset(&r, 0, sizeof r);
  r.nd = t->ndim, r.dtype = t->dtype_, r.kind = kind;
  for (int d = 0; d < t->ndim; d++) {
    r.shape[d] = t->shape_[d], r.stride_[d] = t->stride_[d];
    r.gshape[d] = gshape ? gshape[d] : t->shape_[d];
    r.start[d] = start ? start[d] : 0;
  }
  r.base = lm_ptr(t), r.a = a, r.b = b, r.seed = seed, r.offset = offset;
  random_kernel<<<lm_blocks(t->numel_), LM_THREADS, 0, LM_STREAM>>>(r, t->numel_);
  return lm_cuda_launched("random");
}
