/* kernels.h: the CPU kernels that fill the backend table (backend.c). The
 * CPU backend sees only backend.h of the core. */
#ifndef LOOM_CPU_KERNELS_H
#define LOOM_CPU_KERNELS_H
#include "../../core/backend.h"

int lm_threads_for(int64_t work); /* threads worth using for `work` elements (threads.c) */

lm_alloc_fn lm_cpu_alloc;                /* alloc.c: the caching allocator */
lm_free_fn lm_cpu_free;
lm_empty_cache_fn lm_cpu_empty_cache;
lm_memory_stats_fn lm_cpu_memory_stats;
lm_copy_fn lm_cpu_copy;                  /* copy.c */
/* n dense elements of dtype sd to dd by copy.c's vectorised converters:
 * f32 <-> bf16, f16 or f64 only */
void lm_cpu_convert(int64_t n, void *dst, int dd, const void *src, int sd);
lm_fill_fn lm_cpu_fill;                  /* copy.c */
lm_unary_fn lm_cpu_unary;                /* pointwise.c */
lm_binary_fn lm_cpu_binary;
lm_where_fn lm_cpu_where;
lm_reduce_fn lm_cpu_reduce;              /* reduce.c */
lm_gemm_fn lm_cpu_gemm;                  /* gemm.c */
lm_gemm_fn lm_cpu_gemm_half;             /* gemm_half.c */
lm_random_fn lm_cpu_random;              /* random.c */
lm_softmax_fn lm_cpu_softmax;            /* nn.c */
lm_norm_fn lm_cpu_norm;
lm_embedding_fn lm_cpu_embedding;
lm_index_add_fn lm_cpu_index_add;
lm_adamw_fn lm_cpu_adamw;                /* optim.c */

/* fused kernels (the lm_backend slots of the same names) */
lm_unary_grad_fn lm_cpu_unary_grad;      /* fused_pointwise.c */
lm_swiglu_fn lm_cpu_swiglu;
lm_swiglu_bwd_fn lm_cpu_swiglu_bwd;
lm_softmax_bwd_fn lm_cpu_softmax_bwd;    /* fused_rows.c */
lm_norm_bwd_fn lm_cpu_norm_bwd;
lm_rope_fn lm_cpu_rope;
lm_cross_entropy_fn lm_cpu_cross_entropy; /* fused_loss.c */
lm_cross_entropy_bwd_fn lm_cpu_cross_entropy_bwd;
lm_attention_fn lm_cpu_attention;        /* fused_attn.c */
lm_attention_bwd_fn lm_cpu_attention_bwd;
#endif
