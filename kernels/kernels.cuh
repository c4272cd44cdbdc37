/* kernels.cuh: the CUDA kernels that fill the backend table (backend.cu),
 * with the CPU ones' semantics (core/cpu/kernels.h), and the device and
 * memory helpers the kernel files share. The CUDA backend sees only
 * core/backend.h of the core. */
#ifndef LOOM_CUDA_KERNELS_CUH
#define LOOM_CUDA_KERNELS_CUH
#include "../core/backend.h"

/* Device memory on the current device, stream-ordered like tensors, from
 * the caching allocator (alloc.cu). */
void *lm_cuda_alloc(size_t nbytes);
void lm_cuda_free(void *p);
size_t lm_cuda_round_size(size_t nbytes);       /* the size class of a request */
void lm_cuda_empty_cache(int index);            /* cached blocks back to the driver */
int lm_cuda_memory_stats(int index, int64_t *stats);
int lm_cuda_current_device(void);               /* its index, or -1 with an error */

/* What a kernel returns for arguments it does not take (a head dim, a
 * dtype, an alignment): -2 with an error starting "unsupported:", so the op
 * layer can run the composed form instead. Any other failure is -1. */
#define LM_CUDA_UNSUPPORTED LM_UNSUPPORTED
#define lm_cuda_unsupported(fmt, ...) (lm_error("unsupported: " fmt, ##__VA_ARGS__), LM_CUDA_UNSUPPORTED)

int lm_cuda_copy(lm_tensor *dst, const lm_tensor *src);                  /* copy.cu */
int lm_cuda_fill(lm_tensor *t, double v);                                /* copy.cu */
int lm_cuda_unary(int kind, lm_tensor *out, const lm_tensor *x, const double *p); /* pointwise.cu */
int lm_cuda_binary(int kind, lm_tensor *out, const lm_tensor *a, const lm_tensor *b);
int lm_cuda_where(lm_tensor *out, const lm_tensor *c, const lm_tensor *a, const lm_tensor *b);
int lm_cuda_reduce(int kind, lm_tensor *out, const lm_tensor *x, int64_t outer, int64_t n,
                   int64_t inner);                                       /* reduce.cu */
int lm_cuda_gemm(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha,
                 double beta);                                           /* gemm.cu */
int lm_cuda_random(lm_tensor *t, int kind, double a, double b, uint64_t seed, uint64_t offset,
                   const int64_t *gshape, const int64_t *start);         /* random.cu */
int lm_cuda_softmax(lm_tensor *out, const lm_tensor *x, int log);        /* nn.cu */
int lm_cuda_norm(lm_tensor *out, lm_tensor *mean, lm_tensor *rstd, const lm_tensor *x,
                 const lm_tensor *w, const lm_tensor *b, double eps, int rms);
int lm_cuda_embedding(lm_tensor *out, const lm_tensor *w, const lm_tensor *idx);
int lm_cuda_index_add(lm_tensor *out, const lm_tensor *idx, const lm_tensor *src);
int lm_cuda_adamw(lm_tensor *p, const lm_tensor *g, lm_tensor *m, lm_tensor *v, const double *h);

/* fused kernels (fused.cu, loss.cu, attention.cu): core/backend.h's slots */
int lm_cuda_unary_grad(int kind, lm_tensor *gx, const lm_tensor *g, const lm_tensor *x,
                       const lm_tensor *y, const double *p);
int lm_cuda_swiglu(lm_tensor *out, const lm_tensor *a, const lm_tensor *b);
int lm_cuda_swiglu_bwd(lm_tensor *da, lm_tensor *db, const lm_tensor *g, const lm_tensor *a,
                       const lm_tensor *b);
int lm_cuda_softmax_bwd(lm_tensor *gx, const lm_tensor *g, const lm_tensor *y, int log);
int lm_cuda_norm_bwd(lm_tensor *dx, lm_tensor *dw, lm_tensor *db, const lm_tensor *g,
                     const lm_tensor *x, const lm_tensor *w, const lm_tensor *mean,
                     const lm_tensor *rstd, int rms);
int lm_cuda_rope(lm_tensor *out, const lm_tensor *x, const lm_tensor *cos, const lm_tensor *sin,
                 int sign);
int lm_cuda_attention(lm_tensor *o, lm_tensor *lse, const lm_tensor *q, const lm_tensor *k,
                      const lm_tensor *v, double scale, int causal);
int lm_cuda_attention_bwd(lm_tensor *dq, lm_tensor *dk, lm_tensor *dv, const lm_tensor *g,
                          const lm_tensor *q, const lm_tensor *k, const lm_tensor *v,
                          const lm_tensor *o, const lm_tensor *lse, double scale, int causal);
int lm_cuda_cross_entropy(lm_tensor *loss, lm_tensor *lse, const lm_tensor *x,
                          const lm_tensor *target, const lm_tensor *w, int64_t ignore, double eps);
int lm_cuda_cross_entropy_bwd(lm_tensor *dx, const lm_tensor *gloss, const lm_tensor *x,
                              const lm_tensor *target, const lm_tensor *w, const lm_tensor *lse,
                              int64_t ignore, double eps);
#endif
