/* kernels.cuh: the CUDA kernels that fill the backend table (backend.cu),
 * with the CPU ones' semantics (core/cpu/kernels.h), and the device and
 * memory helpers the kernel files share. The CUDA backend sees only
 * core/backend.h of the core. */
#ifndef LOOM_CUDA_KERNELS_CUH
#define LOOM_CUDA_KERNELS_CUH
#include "../core/backend.h"

/* Device memory on the current device, stream-ordered like tensors. */
void *lm_cuda_alloc(size_t nbytes);
void lm_cuda_free(void *p);

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
#endif
