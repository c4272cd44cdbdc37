/* backend.c: the CPU backend, one table of kernels (see lm_backend). */
#include "kernels.h"
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels refuse it: no harm */
#endif

/* The pages a block took from the kernel (the heap grew for it) are
 * faulted in before the first kernel writes there: one MADV_POPULATE_WRITE
 * per thread on its share, instead of one fault per 4 KiB page, each a
 * trap (and in a VM, often a trip to the hypervisor): measured here, 64 MiB
 * of fresh heap took 44 ms to touch, 26 ms populated on one thread and
 * 21 ms on two. Blocks reused from the heap are resident already. */
static void populate(char *lo, char *hi) {
  uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = ((uintptr_t)lo + pg - 1) & ~(pg - 1), e = (uintptr_t)hi & ~(pg - 1);
  if (e <= a || e - a < (4u << 20)) return;
  size_t pages = (e - a) / pg;
  int nt = lm_num_threads();
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int j = 0; j < nt; j++) {
    uintptr_t s = a + pages * j / nt * pg, f = a + pages * (j + 1) / nt * pg;
    if (f > s) madvise((void *)s, f - s, MADV_POPULATE_WRITE);
  }
}
#include <string.h>

/* Training frees and reallocates the same large buffers every step: keep
 * them in the heap (no mmap: glibc would munmap them on free and every
 * fresh buffer would page-fault in again, which cost a 64 MiB add half its
 * time) and never trim it below 1 GiB. Buffers are 64-byte aligned by
 * hand: posix_memalign asks the heap for more than it returns, so a freed
 * buffer is too small for the next request of the same size and the heap
 * grows instead; malloc of the same size reuses the freed block. The word
 * below the buffer holds what malloc returned. (Checked: a repeated 64 MiB
 * op, and training steps after the third, fault in no pages: what remains
 * is the first touch of fresh heap, see populate.) */
static void *cpu_alloc(size_t n) {
  static int tuned;
  if (!tuned) {
    tuned = 1;
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  char *top = sbrk(0);
  char *raw = malloc(n + 64);
  if (!raw) return NULL;
  if (top != (char *)-1 && raw + n + 64 > top) /* some of it is fresh */
    populate(raw > top ? raw : top, raw + n + 64);
  void **p = (void **)(((uintptr_t)raw + 64) & ~(uintptr_t)63);
  p[-1] = raw;
  return p;
}

static void cpu_free(void *p) {
  if (p) free(((void **)p)[-1]);
}

static lm_backend cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
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
