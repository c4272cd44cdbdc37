/* kernels.cuh: the CUDA kernels that fill the backend table (backend.cu),
 * with the CPU ones' semantics (kernels/cpu/kernels.h), and the device and
 * memory helpers the kernel files share. The CUDA backend sees only
 * core/backend.h of the core. */
#ifndef LOOM_CUDA_KERNELS_CUH
#define LOOM_CUDA_KERNELS_CUH
#include "../../core/backend.h"

/* Device memory on the current device, stream-ordered like tensors, from
 * the caching allocator (alloc.cu). */
size_t lm_cuda_round_size(size_t nbytes);       /* the size class of a request */
int lm_cuda_current_device(void);               /* its index, or -1 with an error */

/* What a kernel returns for arguments it does not take (a head dim, a
 * dtype, an alignment): -2 with an error starting "unsupported:", so the op
 * layer can run the composed form instead. Any other failure is -1. */
#define LM_CUDA_UNSUPPORTED LM_UNSUPPORTED
#define lm_cuda_unsupported(fmt, ...) (lm_error("unsupported: " fmt, ##__VA_ARGS__), LM_CUDA_UNSUPPORTED)

/* lm_cuda_<slot> for every slot of core/backend.h's LM_SLOTS and
 * LM_FUSED_SLOTS, defined in: alloc.cu (alloc, free, empty_cache,
 * memory_stats), copy.cu (copy, fill), pointwise.cu (unary, binary,
 * where), reduce.cu, gemm.cu, grouped_gemm.cu, random.cu, nn.cu (softmax, norm, embedding,
 * index_add), optim.cu (adamw); fused: fused.cu, loss.cu, attention.cu. */
#define LM_CUDA_KERNEL(slot) lm_##slot##_fn lm_cuda_##slot;
LM_SLOTS(LM_CUDA_KERNEL)
LM_FUSED_SLOTS(LM_CUDA_KERNEL)
lm_attention_bias_fn lm_cuda_attention_bias;  /* attention.cu: the slots only CUDA has */
lm_attention_bias_bwd_fn lm_cuda_attention_bias_bwd;
lm_check_ids_fn lm_cuda_check_ids;       /* check.cu */
int lm_cuda_ids_report(int index);       /* after a wait on device index: -1 raising a bad id */
#endif
