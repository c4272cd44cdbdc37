/* kernels.cuh: the CUDA kernels that fill the backend table (backend.cu),
 * with the CPU ones' semantics (kernels/cpu/kernels.h), and the device and
 * memory helpers the kernel files share. The CUDA backend sees only
 * core/backend.h of the core. */
#ifndef LOOM_CUDA_KERNELS_CUH
#define LOOM_CUDA_KERNELS_CUH
#include "../../core/backend.h"

/* Device memory on the current device, stream-ordered like tensors, from
 * the caching allocator (alloc.cu). */
lm_alloc_fn lm_cuda_alloc;
lm_free_fn lm_cuda_free;
size_t lm_cuda_round_size(size_t nbytes);       /* the size class of a request */
void lm_cuda_empty_cache(int index);            /* cached blocks back to the driver */
lm_memory_stats_fn lm_cuda_memory_stats;
int lm_cuda_current_device(void);               /* its index, or -1 with an error */

/* What a kernel returns for arguments it does not take (a head dim, a
 * dtype, an alignment): -2 with an error starting "unsupported:", so the op
 * layer can run the composed form instead. Any other failure is -1. */
#define LM_CUDA_UNSUPPORTED LM_UNSUPPORTED
#define lm_cuda_unsupported(fmt, ...) (lm_error("unsupported: " fmt, ##__VA_ARGS__), LM_CUDA_UNSUPPORTED)

lm_copy_fn lm_cuda_copy;                 /* copy.cu */
lm_fill_fn lm_cuda_fill;                 /* copy.cu */
lm_unary_fn lm_cuda_unary;               /* pointwise.cu */
lm_binary_fn lm_cuda_binary;
lm_where_fn lm_cuda_where;
lm_reduce_fn lm_cuda_reduce;             /* reduce.cu */
lm_gemm_fn lm_cuda_gemm;                 /* gemm.cu */
lm_random_fn lm_cuda_random;             /* random.cu */
lm_softmax_fn lm_cuda_softmax;           /* nn.cu */
lm_norm_fn lm_cuda_norm;
lm_embedding_fn lm_cuda_embedding;
lm_index_add_fn lm_cuda_index_add;
lm_adamw_fn lm_cuda_adamw;
lm_check_ids_fn lm_cuda_check_ids;       /* check.cu */
int lm_cuda_ids_report(int index);       /* after a wait on device index: -1 raising a bad id */

/* fused kernels (fused.cu, loss.cu, attention.cu): core/backend.h's slots */
lm_unary_grad_fn lm_cuda_unary_grad;
lm_swiglu_fn lm_cuda_swiglu;
lm_swiglu_bwd_fn lm_cuda_swiglu_bwd;
lm_softmax_bwd_fn lm_cuda_softmax_bwd;
lm_norm_bwd_fn lm_cuda_norm_bwd;
lm_rope_fn lm_cuda_rope;
lm_attention_fn lm_cuda_attention;
lm_attention_bwd_fn lm_cuda_attention_bwd;
lm_attention_bias_fn lm_cuda_attention_bias;
lm_attention_bias_bwd_fn lm_cuda_attention_bias_bwd;
lm_cross_entropy_fn lm_cuda_cross_entropy;
lm_cross_entropy_bwd_fn lm_cuda_cross_entropy_bwd;
#endif
