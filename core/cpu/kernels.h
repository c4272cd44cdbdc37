/* kernels.h: the CPU kernels that fill the backend table (backend.c). The
 * CPU backend sees only backend.h of the core. */
#ifndef LOOM_CPU_KERNELS_H
#define LOOM_CPU_KERNELS_H
#include "../backend.h"

int lm_threads_for(int64_t work); /* threads worth using for `work` elements (threads.c) */

int lm_cpu_copy(lm_tensor *dst, const lm_tensor *src);                 /* copy.c */
int lm_cpu_fill(lm_tensor *t, double v);                               /* copy.c */
int lm_cpu_unary(int kind, lm_tensor *out, const lm_tensor *x, const double *p); /* pointwise.c */
int lm_cpu_binary(int kind, lm_tensor *out, const lm_tensor *a, const lm_tensor *b);
int lm_cpu_where(lm_tensor *out, const lm_tensor *c, const lm_tensor *a, const lm_tensor *b);
int lm_cpu_reduce(int kind, lm_tensor *out, const lm_tensor *x, int64_t outer, int64_t n,
                  int64_t inner);                                      /* reduce.c */
int lm_cpu_gemm(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha,
                double beta);                                          /* gemm.c */
int lm_cpu_gemm_half(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha,
                     double beta);                                     /* gemm_half.c */
int lm_cpu_random(lm_tensor *t, int kind, double a, double b, uint64_t seed, uint64_t offset,
                  const int64_t *gshape, const int64_t *start);        /* random.c */
int lm_cpu_softmax(lm_tensor *out, const lm_tensor *x, int log);       /* nn.c */
int lm_cpu_norm(lm_tensor *out, lm_tensor *mean, lm_tensor *rstd, const lm_tensor *x,
                const lm_tensor *w, const lm_tensor *b, double eps, int rms);
int lm_cpu_embedding(lm_tensor *out, const lm_tensor *w, const lm_tensor *idx);
int lm_cpu_index_add(lm_tensor *out, const lm_tensor *idx, const lm_tensor *src);
int lm_cpu_adamw(lm_tensor *p, const lm_tensor *g, lm_tensor *m, lm_tensor *v,
                 const double *h);                                     /* optim.c */

/* fused kernels (the lm_backend slots of the same names) */
int lm_cpu_unary_grad(int kind, lm_tensor *gx, const lm_tensor *g, const lm_tensor *x,
                      const lm_tensor *y, const double *p);            /* fused_pointwise.c */
int lm_cpu_swiglu(lm_tensor *out, const lm_tensor *a, const lm_tensor *b);
int lm_cpu_swiglu_bwd(lm_tensor *da, lm_tensor *db, const lm_tensor *g, const lm_tensor *a,
                      const lm_tensor *b);
int lm_cpu_softmax_bwd(lm_tensor *gx, const lm_tensor *g, const lm_tensor *y, int log); /* fused_rows.c */
int lm_cpu_norm_bwd(lm_tensor *dx, lm_tensor *dw, lm_tensor *db, const lm_tensor *g,
                    const lm_tensor *x, const lm_tensor *w, const lm_tensor *mean,
                    const lm_tensor *rstd, int rms);
int lm_cpu_rope(lm_tensor *out, const lm_tensor *x, const lm_tensor *cos, const lm_tensor *sin,
                int sign);
int lm_cpu_cross_entropy(lm_tensor *loss, lm_tensor *lse, const lm_tensor *x, const lm_tensor *target,
                         const lm_tensor *w, int64_t ignore, double eps); /* fused_loss.c */
int lm_cpu_cross_entropy_bwd(lm_tensor *dx, const lm_tensor *gloss, const lm_tensor *x,
                             const lm_tensor *target, const lm_tensor *w, const lm_tensor *lse,
                             int64_t ignore, double eps);
int lm_cpu_attention(lm_tensor *o, lm_tensor *lse, const lm_tensor *q, const lm_tensor *k,
                     const lm_tensor *v, double scale, int causal);   /* fused_attn.c */
int lm_cpu_attention_bwd(lm_tensor *dq, lm_tensor *dk, lm_tensor *dv, const lm_tensor *g,
                         const lm_tensor *q, const lm_tensor *k, const lm_tensor *v,
                         const lm_tensor *o, const lm_tensor *lse, double scale, int causal);
#endif
