/* grouped_gemm.c: the grouped GEMM (mixture of experts) on the CPU: one BLAS
 * GEMM per group (OpenBLAS 0.3.21 has no batched or grouped entry), through
 * the CPU's gemm, so bf16/f16 operands take its f32-accumulating path and
 * each call is threaded by the BLAS as a plain GEMM is. */
#include "kernels.h"
#include "../grouped_gemm.h"

int lm_cpu_grouped_gemm(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, const int64_t *offs,
                        int64_t groups, int wgrad) {
  return lm_grouped_gemm_loop(lm_cpu_gemm, c, a, b, offs, groups, wgrad);
}
