// optim.cu: the fused AdamW update, as kernels/cpu/optim.c.
#include "common.cuh"
#include "kernels.cuh"

// low (or NULL): the new p rounded to dtype ld (bf16 or f16) as the cast
// kernel rounds it
template <typename T>
__global__ void __launch_bounds__(LM_THREADS) adamw_kernel(T *p, const T *g, T *m, T *v, int64_t n, T b1, T b2, T eps,
                             T decay, T step, T rbc2, uint16_t *low, int ld) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    T gi = g[i];
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    T pi = p[i] * decay - step * m[i] / (sqrt(v[i]) * rbc2 + eps);
    p[i] = pi;
    if (low) low[i] = ld == LM_BF16 ? lm_f32_to_bf16((float)pi) : lm_f32_to_f16((float)pi);
  }
}

int lm_cuda_adamw(lm_tensor *p, const lm_tensor *g, lm_tensor *m, lm_tensor *v, const double *h, lm_tensor *low) {
  if (lm_cuda_use(p) < 0) return -1;
  int64_t n = p->numel_;
  if (n == 0) return 0;
  double decay = 1 - h[0] * h[4], step = h[0] / h[5], rbc2 = 1 / sqrt(h[6]);
  uint16_t *lp = low ? (uint16_t *)lm_ptr(low) : NULL;
  int ld = low ? (int)low->dtype_ : (int)LM_BF16;
  if (p->dtype_ == LM_F64)
    LM_LAUNCH(lm_blocks(n), LM_THREADS, 0, adamw_kernel<double>)(
        (double *)lm_ptr(p), (const double *)lm_ptr(g), (double *)lm_ptr(m), (double *)lm_ptr(v), n,
        h[1], h[2], h[3], decay, step, rbc2, (uint16_t *)nullptr, (int)LM_BF16);
  else
    LM_LAUNCH(lm_blocks(n), LM_THREADS, 0, adamw_kernel<float>)(
        (float *)lm_ptr(p), (const float *)lm_ptr(g), (float *)lm_ptr(m), (float *)lm_ptr(v), n,
        (float)h[1], (float)h[2], (float)h[3], (float)decay, (float)step, (float)rbc2, lp, ld);
  return lm_cuda_launched("adamw");
}
