/* kernels.h: the CPU kernels that fill the backend table (backend.c). The
 * CPU backend sees only backend.h of the core. */
#ifndef LOOM_CPU_KERNELS_H
#define LOOM_CPU_KERNELS_H
#include "../../core/backend.h"

int lm_threads_for(int64_t work); /* threads worth using for `work` elements (threads.c) */

/* lm_cpu_<slot> for every slot of core/backend.h's LM_SLOTS and
 * LM_FUSED_SLOTS, defined in: alloc.c (the caching allocator: alloc,
 * free, empty_cache, memory_stats), copy.c (copy, fill), pointwise.c
 * (unary, binary, where), reduce.c, gemm.c, grouped_gemm.c, random.c, nn.c (softmax, norm,
 * embedding, index_add), optim.c (adamw); fused: fused_pointwise.c
 * (unary_grad, swiglu, swiglu_bwd), fused_rows.c (softmax_bwd, norm_bwd,
 * rope), fused_loss.c (cross_entropy, _bwd), fused_attn.c (attention, _bwd). */
#define LM_CPU_KERNEL(slot) lm_##slot##_fn lm_cpu_##slot;
LM_SLOTS(LM_CPU_KERNEL)
LM_FUSED_SLOTS(LM_CPU_KERNEL)

/* n dense elements of dtype sd to dd by copy.c's vectorised converters:
 * f32 <-> bf16, f16 or f64 only */
void lm_cpu_convert(int64_t n, void *dst, int dd, const void *src, int sd);
lm_gemm_fn lm_cpu_gemm_half;             /* gemm_half.c: bf16/f16 operands widened for sgemm */
/* gemm_dnnl.c: bf16 operands through oneDNN's matmul where the CPU has bf16
 * dot products; returns 1 (nothing done) where it has no fast kernel */
lm_gemm_fn lm_cpu_gemm_dnnl;
const char *lm_cpu_bf16_gemm_info(void); /* the bf16 path that runs, for lm_blas_info */
const char *lm_cpu_bf16_attention_info(void); /* bf16 attention's tile products, likewise */
#endif
