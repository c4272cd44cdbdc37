/* grouped_gemm.c: the grouped GEMM (mixture of experts) on the CPU: one BLAS
 * GEMM per group through the CPU's gemm (OpenBLAS 0.3.21 has no batched or
 * grouped entry; bf16/f16 operands take gemm's f32-accumulating path).
 * Large groups run one after the other, each GEMM threaded by the BLAS as a
 * plain GEMM is; many small groups (fine-grained experts: a few dozen rows
 * each, where a threaded GEMM spends its time splitting and joining) run
 * side by side instead, one whole group per thread with the BLAS on one. */
#include "kernels.h"
#include "../grouped_gemm.h"

void openblas_set_num_threads(int n);

enum { SMALL_GROUP_ROWS = 256 }; /* mean rows per group below which groups go side by side */

int lm_cpu_grouped_gemm(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, const int64_t *offs,
                        int64_t groups, int wgrad) {
  int nt = lm_num_threads();
  if (nt < 2 || groups < 2 * nt || offs[groups] > SMALL_GROUP_ROWS * groups)
    return lm_grouped_gemm_loop(lm_cpu_gemm, c, a, b, offs, groups, wgrad);
  int failed = 0;
  openblas_set_num_threads(1);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) reduction(|| : failed)
  for (int64_t e = 0; e < groups; e++)
    failed = lm_grouped_gemm_one(lm_cpu_gemm, c, a, b, offs, e, wgrad) < 0 || failed;
  openblas_set_num_threads(nt);
  return failed ? lm_error("grouped_gemm: a group's GEMM failed (its operands' layout)") : 0;
}
