/* iter.h: the strided walk every CPU pointwise kernel shares. */
#ifndef LOOM_CPU_ITER_H
#define LOOM_CPU_ITER_H
#include "kernels.h"

/* fn(n, p, s, ctx) processes one row of n elements: operand k starts at
 * p[k] and steps s[k] bytes. Operands share t[0]'s shape (broadcast views
 * carry stride 0). Rows are spread over threads when the work is large. */
typedef void (*lm_row_fn)(int64_t n, char **p, const int64_t *s, void *ctx);
void lm_foreach(int narg, const lm_tensor *const *t, lm_row_fn fn, void *ctx);

#endif
