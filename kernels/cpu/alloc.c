/* alloc.c: the CPU allocator. Blocks of 1 MiB and more come from mmap in
 * size classes (four per power of two, as the CUDA allocator's) and go,
 * when freed, on a cache that the next request of the same class takes back:
 * a training step or an op in a loop that makes the same large outputs
 * again reuses pages already resident, with no page faults and no system
 * call. The cache holds at most LOOM_CPU_CACHE_MB (default a quarter of the
 * machine's memory); past it the oldest blocks go back to the OS, as all
 * of them do on lm_cpu_empty_cache (loom.empty_cache()) and before an mmap
 * that failed is tried again. Smaller blocks come from malloc. Every block
 * is 64-byte aligned; the two words below it say where it came from. */
#include "kernels.h"
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h> /* a cached block is poisoned: a use after free is caught */
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels refuse it: no harm */
#endif

/* MAX_CACHED: a 350M model's training step frees several hundred large
 * blocks; with room for 256 the rest went back to the OS each step and came
 * back as 2.2 GB of fresh pages (15.5 s a step, 13.6 s with 4096) */
enum { HEAD = 64, MAX_CACHED = 4096 };
#define LARGE ((size_t)1 << 20)
#define MAPPED ((size_t)1) /* the low bit of a block's size word: it came from mmap */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t stat[LM_NMEM_STATS];
static struct { char *base; size_t size; } cache[MAX_CACHED]; /* oldest first */
static int ncached;
static size_t cached_bytes, cache_limit = SIZE_MAX;
static int tuned;

/* Fresh pages are faulted in before the first kernel writes there: one
 * MADV_POPULATE_WRITE per thread on its share, instead of one fault per
 * 4 KiB page, each a trap (and in a VM, often a trip to the hypervisor):
 * measured here, 64 MiB of fresh memory took 44 ms to touch, 26 ms
 * populated on one thread and 21 ms on two. */
static void populate(char *lo, size_t n) {
  if (n < (4u << 20)) return;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), pages = n / pg;
  int nt = lm_num_threads();
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int j = 0; j < nt; j++) {
    size_t s = pages * j / nt * pg, f = pages * (j + 1) / nt * pg;
    if (f > s) madvise(lo + s, f - s, MADV_POPULATE_WRITE);
  }
}

/* the size class of a large request (header included) */
static size_t round_class(size_t n) {
  size_t p = LARGE;
  while (p <= n / 2) p *= 2; /* p <= n < 2p */
  size_t step = p / 4;
  return (n + step - 1) / step * step;
}

/* Medium blocks stay in malloc's heap (no mmap: glibc would munmap them on
 * free and every fresh one would fault in again), which is never trimmed
 * below 1 GiB; the cache's limit comes from the environment. */
static void tune(void) {
  tuned = 1;
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const char *e = getenv("LOOM_CPU_CACHE_MB");
  long long mb = e && *e ? atoll(e) : -1;
  size_t ram = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
  cache_limit = mb >= 0 ? (size_t)mb << 20 : ram / 4;
}

/* drops cached blocks, oldest first, until at most `keep` bytes stay */
static void trim_to(size_t keep) {
  int k = 0;
  while (k < ncached && cached_bytes > keep) {
    UNPOISON(cache[k].base, cache[k].size);
    munmap(cache[k].base, cache[k].size);
    cached_bytes -= cache[k].size;
    stat[LM_MEM_RESERVED] -= (int64_t)cache[k].size;
    k++;
  }
  memmove(cache, cache + k, (size_t)(ncached - k) * sizeof cache[0]);
  ncached -= k;
}

/* a cached block of exactly `size`, newest first (its pages are warmest) */
static char *take_cached(size_t size) {
  for (int k = ncached - 1; k >= 0; k--) {
    if (cache[k].size != size) continue;
    char *b = cache[k].base;
    memmove(cache + k, cache + k + 1, (size_t)(ncached - k - 1) * sizeof cache[0]);
    ncached--, cached_bytes -= size;
    UNPOISON(b, size);
    return b;
  }
  return NULL;
}

static void count_alloc(size_t size) {
  stat[LM_MEM_ALLOCATED] += (int64_t)size;
  if (stat[LM_MEM_ALLOCATED] > stat[LM_MEM_PEAK]) stat[LM_MEM_PEAK] = stat[LM_MEM_ALLOCATED];
}

static char *map_large(size_t size) {
  pthread_mutex_lock(&mu);
  char *b = take_cached(size);
  bool fresh = !b;
  if (fresh) {
    b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) { /* out of memory: hand the cache back, try once more */
      trim_to(0);
      b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (b == MAP_FAILED) b = NULL;
    else stat[LM_MEM_RESERVED] += (int64_t)size, stat[LM_MEM_DRIVER_ALLOCS]++, stat[LM_MEM_DRIVER_BYTES] += (int64_t)size;
  }
  if (b) count_alloc(size);
  pthread_mutex_unlock(&mu);
  if (b && fresh) populate(b, size);
  return b;
}

void *lm_cpu_alloc(size_t n) {
  if (!tuned) tune();
  if (n > SIZE_MAX / 2) return NULL;
  char *base, *p;
  size_t size;
  if (n + HEAD >= LARGE) {
    size = round_class(n + HEAD);
    if (!(base = map_large(size))) return NULL;
    p = base + HEAD;
    ((size_t *)p)[-2] = size | MAPPED;
  } else {
    size = n + HEAD;
    if (!(base = malloc(size))) return NULL;
    p = (char *)(((uintptr_t)base + HEAD) & ~(uintptr_t)(HEAD - 1)); /* 16 to 64 bytes up */
    ((size_t *)p)[-2] = size;
    pthread_mutex_lock(&mu);
    count_alloc(size), stat[LM_MEM_RESERVED] += (int64_t)size;
    pthread_mutex_unlock(&mu);
  }
  ((char **)p)[-1] = base;
  return p;
}

void lm_cpu_free(void *p) {
  if (!p) return;
  char *base = ((char **)p)[-1];
  size_t w = ((size_t *)p)[-2], size = w & ~MAPPED;
  pthread_mutex_lock(&mu);
  stat[LM_MEM_ALLOCATED] -= (int64_t)size;
  if (!(w & MAPPED)) {
    stat[LM_MEM_RESERVED] -= (int64_t)size;
    pthread_mutex_unlock(&mu);
    free(base);
    return;
  }
  if (size <= cache_limit) {
    size_t keep = cache_limit - size; /* room for it, and a free slot */
    if (ncached == MAX_CACHED && cached_bytes - cache[0].size < keep) keep = cached_bytes - cache[0].size;
    if (cached_bytes > keep) trim_to(keep);
    POISON(base, size);
    cache[ncached].base = base, cache[ncached].size = size;
    ncached++, cached_bytes += size;
  } else {
    munmap(base, size);
    stat[LM_MEM_RESERVED] -= (int64_t)size;
  }
  pthread_mutex_unlock(&mu);
}

void lm_cpu_empty_cache(int index) {
  (void)index;
  pthread_mutex_lock(&mu);
  trim_to(0);
  pthread_mutex_unlock(&mu);
  malloc_trim(0); /* and what malloc's heap holds free */
}

int lm_cpu_memory_stats(int index, int64_t *stats) {
  (void)index;
  pthread_mutex_lock(&mu);
  memcpy(stats, stat, sizeof stat);
  pthread_mutex_unlock(&mu);
  return 0;
}
