/* iter.h: the strided walk every CPU pointwise kernel shares. */
#ifndef LOOM_CPU_ITER_H
#define LOOM_CPU_ITER_H
#include "kernels.h"

/* fn(n, p, s, ctx) processes one row of n elements: operand k starts at
 * p[k] and steps s[k] bytes. Operands share t[0]'s shape (broadcast views
 * carry stride 0). Rows are spread over threads when the work is large. */
typedef void (*lm_row_fn)(int64_t n, char **p, const int64_t *s, void *ctx);
void lm_foreach(int narg, const lm_tensor *const *t, lm_row_fn fn, void *ctx);

/* The two-operand walk of a copy where one operand steps by one element
 * along the innermost dim and the other does not but does along another
 * dim (a transpose). fn(rows, len, p, rs, s, ctx) gets a tile: `rows` rows
 * `rs[k]` bytes apart, each of `len` elements `s[k]` bytes apart, small
 * enough that both sides stay in cache and TLB. Returns 1 when it did the
 * walk, 0 when the layout is not such a transpose (or is small). */
typedef void (*lm_tile_fn)(int64_t rows, int64_t len, char **p, const int64_t *rs,
                           const int64_t *s, void *ctx);
int lm_foreach_tiled(const lm_tensor *const *t, lm_tile_fn fn, void *ctx);
#endif
