/* backend.c: the CPU backend, one table of kernels (see lm_backend). */
#include "kernels.h"
#include <malloc.h>
#include <stdlib.h>

/* Training frees and reallocates the same large buffers every step: keep
 * them in the heap instead of mmap/munmap, which would page-fault on every
 * fresh buffer. */
static void *cpu_alloc(size_t n) {
  static int tuned;
  if (!tuned) {
    tuned = 1;
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's maximum */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  void *p = NULL;
  return posix_memalign(&p, 64, n) == 0 ? p : NULL;
}

const lm_backend lm_cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = free,
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
};
