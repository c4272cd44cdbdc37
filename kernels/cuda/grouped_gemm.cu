/* grouped_gemm.cu: the grouped GEMM (mixture of experts) on CUDA: one
 * cuBLAS(Lt) GEMM per group through gemm.cu, queued on the stream one after
 * the other (bf16/f16 operands with f32 accumulation, as a plain GEMM);
 * the group offsets are on the host, as cuBLAS needs each group's shape. */
#include "common.cuh"
#include "kernels.cuh"
#include "../grouped_gemm.h"

int lm_cuda_grouped_gemm(lm_tensor *c, const lm_tensor *a, const lm_tensor *b,
                         const int64_t *offs, int64_t groups, int wgrad) {
  return lm_grouped_gemm_loop(lm_cuda_gemm, c, a, b, offs, groups, wgrad);
}
