/* backend.c: the CPU backend, one table of kernels (see lm_backend). */
#include "kernels.h"
#include <stdlib.h>
#include <string.h>

static lm_backend cpu_backend = {
    .name = "cpu",
    .alloc = lm_cpu_alloc,
    .free = lm_cpu_free,
    .empty_cache = lm_cpu_empty_cache,
    .memory_stats = lm_cpu_memory_stats,
    .copy = lm_cpu_copy,
    .fill = lm_cpu_fill,
    .unary = lm_cpu_unary,
    .binary = lm_cpu_binary,
    .where = lm_cpu_where,
    .reduce = lm_cpu_reduce,
    .gemm = lm_cpu_gemm,
    .random = lm_cpu_random,
    .softmax = lm_cpu_softmax,
    .norm = lm_cpu_norm,
    .embedding = lm_cpu_embedding,
    .index_add = lm_cpu_index_add,
    .adamw = lm_cpu_adamw,
    .info = lm_blas_info,
    .unary_grad = lm_cpu_unary_grad,
    .swiglu = lm_cpu_swiglu,
    .swiglu_bwd = lm_cpu_swiglu_bwd,
    .softmax_bwd = lm_cpu_softmax_bwd,
    .norm_bwd = lm_cpu_norm_bwd,
    .rope = lm_cpu_rope,
    .attention = lm_cpu_attention,
    .attention_bwd = lm_cpu_attention_bwd,
    .cross_entropy = lm_cpu_cross_entropy,
    .cross_entropy_bwd = lm_cpu_cross_entropy_bwd,
};

/* LOOM_CPU_FUSED=0 leaves the fused slots empty, so ops run their composed
 * forms: how the specs check those on a machine whose backend has both. */
static void drop_fused(lm_backend *b) {
  b->unary_grad = NULL;
  b->swiglu = NULL, b->swiglu_bwd = NULL;
  b->softmax_bwd = NULL, b->norm_bwd = NULL, b->rope = NULL;
  b->attention = NULL, b->attention_bwd = NULL;
  b->cross_entropy = NULL, b->cross_entropy_bwd = NULL;
}

/* Registered when libloom loads: the CPU is always there. */
__attribute__((constructor)) static void register_cpu(void) {
  const char *e = getenv("LOOM_CPU_FUSED");
  if (e && !strcmp(e, "0")) drop_fused(&cpu_backend);
  lm_register_backend(LM_KIND_CPU, &cpu_backend);
}
