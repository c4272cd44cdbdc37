/* alloc.cu: the caching allocator for CUDA memory. Sizes are rounded into
 * classes (512 B steps below 1 MiB, four classes per power of two above), a
 * freed block goes on a free list of its device, size class and stream, and
 * the next request of that class on that stream takes it back: a training
 * step that repeats the previous one's sizes asks the driver for nothing.
 * Reuse needs no synchronisation: work that used a block was queued on its
 * stream before the free, work that reuses it is queued after.
 * The rule that makes that true, checked by spec/cuda_streams_spec.lua:
 * every kernel, copy and cuBLAS call runs on LM_STREAM (the legacy default
 * stream), so every block is keyed by that one stream; NCCL's side stream
 * (core/comm/nccl.c) is a blocking stream, which the legacy default stream
 * waits for, and each collective also makes it wait on its event. A
 * non-blocking stream, or a kernel on another stream, would need a block
 * keyed by its stream and an event before reuse elsewhere (PyTorch's
 * record_stream): add that before adding such a stream.
 * Out of memory, the cache of the device is handed back to the driver and
 * the request tried once more; failing again it returns NULL with an error
 * naming the requested and the free bytes, and the process goes on. */
#include "common.cuh"
#include "kernels.cuh"
#include <pthread.h>
#include <stdlib.h>

#define MAX_DEVICES 64

/* a block from cudaMalloc; on the live table or on a free list */
typedef struct node {
  void *p;
  size_t size;          /* its size class */
  cudaStream_t stream;
  int device;
  struct node *next;    /* chain in its hash bucket */
} node;

/* chained hash table; buckets double when it holds twice as many nodes */
typedef struct table {
  node **bucket;
  size_t nbucket, count;
} table;

typedef struct dev_state {
  table free_;          /* free blocks by (size, stream) */
  int64_t stat[LM_NMEM_STATS];
} dev_state;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static table live;      /* blocks handed out, by address, all devices */
static dev_state devs[MAX_DEVICES];

/* ---- size classes ---- */
size_t lm_cuda_round_size(size_t n) {
  const size_t mib = (size_t)1 << 20;
  if (n == 0) n = 1;
  if (n < mib) return (n + 511) & ~(size_t)511;
  if (n > SIZE_MAX / 4) return n; /* no class: the driver will refuse it */
  size_t p = mib;
  while (p <= n / 2) p *= 2;      /* p <= n < 2p */
  size_t step = p / 4;
  return (n + step - 1) / step * step;
}

/* ---- the hash tables ---- */
static size_t mix(uint64_t k) {
  k ^= k >> 33, k *= 0xff51afd7ed558ccdULL, k ^= k >> 33;
  return (size_t)k;
}
static size_t live_hash(const void *p) { return mix((uint64_t)(uintptr_t)p); }
static size_t free_hash(size_t size, cudaStream_t s) {
  return mix((uint64_t)size * 31 + (uint64_t)(uintptr_t)s);
}

/* doubles t's buckets; false (t unchanged) when malloc fails */
static bool grow(table *t, bool by_address) {
  size_t n = t->nbucket ? t->nbucket * 2 : 256;
  node **b = (node **)calloc(n, sizeof *b);
  if (!b) return false;
  for (size_t i = 0; i < t->nbucket; i++) {
    for (node *e = t->bucket[i], *next; e; e = next) {
      next = e->next;
      size_t h = (by_address ? live_hash(e->p) : free_hash(e->size, e->stream)) & (n - 1);
      e->next = b[h], b[h] = e;
    }
  }
  free(t->bucket);
  t->bucket = b, t->nbucket = n;
  return true;
}

/* inserts e; false when the table could not get its first buckets */
static bool put(table *t, node *e, bool by_address) {
  if ((t->count >= 2 * t->nbucket || !t->bucket) && !grow(t, by_address) && !t->bucket) return false;
  size_t h = (by_address ? live_hash(e->p) : free_hash(e->size, e->stream)) & (t->nbucket - 1);
  e->next = t->bucket[h], t->bucket[h] = e;
  t->count++;
  return true;
}

/* removes and returns the live node of p, or NULL */
static node *take_live(const void *p) {
  if (!live.bucket) return NULL;
  for (node **e = &live.bucket[live_hash(p) & (live.nbucket - 1)]; *e; e = &(*e)->next) {
    if ((*e)->p == p) {
      node *r = *e;
      *e = r->next, live.count--;
      return r;
    }
  }
  return NULL;
}

/* removes and returns a free block of (size, stream) from d, or NULL */
static node *take_free(dev_state *d, size_t size, cudaStream_t s) {
  table *t = &d->free_;
  if (!t->bucket) return NULL;
  for (node **e = &t->bucket[free_hash(size, s) & (t->nbucket - 1)]; *e; e = &(*e)->next) {
    if ((*e)->size == size && (*e)->stream == s) {
      node *r = *e;
      *e = r->next, t->count--;
      return r;
    }
  }
  return NULL;
}

/* hands d's free blocks back to the driver (cudaFree synchronises) */
static void release_cache(int k) {
  dev_state *d = &devs[k];
  for (size_t i = 0; i < d->free_.nbucket; i++) {
    for (node *e = d->free_.bucket[i], *next; e; e = next) {
      next = e->next;
      if (cudaFree(e->p) != cudaSuccess) cudaGetLastError();
      d->stat[LM_MEM_RESERVED] -= (int64_t)e->size;
      free(e);
    }
    d->free_.bucket[i] = NULL;
  }
  d->free_.count = 0;
}

void lm_cuda_empty_cache(int k) {
  if (k < 0 || k >= MAX_DEVICES) return;
  pthread_mutex_lock(&mu);
  release_cache(k);
  pthread_mutex_unlock(&mu);
}

/* ---- allocation on the current device ---- */
static void *oom(int k, size_t n, size_t size, cudaError_t e) {
  size_t fr = 0, total = 0;
  if (cudaMemGetInfo(&fr, &total) != cudaSuccess) cudaGetLastError();
  lm_error("cuda:%d: out of memory: cannot allocate %zu bytes (%zu requested); %zu bytes "
           "free of %zu, %lld held by tensors (cache emptied and retried once; %s)",
           k, size, n, fr, total, (long long)devs[k].stat[LM_MEM_ALLOCATED], cudaGetErrorString(e));
  return NULL;
}

/* a block of size on device k from the driver, emptying the cache and
 * trying again once when the driver is out of memory */
static void *from_driver(int k, size_t n, size_t size) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, size);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    release_cache(k);
    e = cudaMalloc(&p, size);
  }
  if (e != cudaSuccess) {
    cudaGetLastError(); /* leave no sticky error for the next call */
    if (e == cudaErrorMemoryAllocation) return oom(k, n, size, e);
    lm_error("cuda:%d: cannot allocate %zu bytes (%s)", k, size, cudaGetErrorString(e));
    return NULL;
  }
  devs[k].stat[LM_MEM_DRIVER_ALLOCS]++;
  devs[k].stat[LM_MEM_DRIVER_BYTES] += (int64_t)size;
  devs[k].stat[LM_MEM_RESERVED] += (int64_t)size;
  return p;
}

void *lm_cuda_alloc(size_t n) {
  int k = lm_cuda_current_device();
  if (k < 0) return NULL;
  size_t size = lm_cuda_round_size(n);
  dev_state *d = &devs[k];
  pthread_mutex_lock(&mu);
  node *e = take_free(d, size, LM_STREAM);
  if (!e) {
    void *p = from_driver(k, n, size);
    if (p && !(e = (node *)malloc(sizeof *e))) {
      cudaFree(p);
      d->stat[LM_MEM_RESERVED] -= (int64_t)size;
      lm_error("cuda:%d: out of host memory for the allocator's books", k);
    }
    if (!e) { pthread_mutex_unlock(&mu); return NULL; }
    e->p = p, e->size = size, e->stream = LM_STREAM, e->device = k;
  }
  if (!put(&live, e, true)) { /* cannot track it: give it back */
    if (!put(&d->free_, e, false)) {
      cudaFree(e->p);
      d->stat[LM_MEM_RESERVED] -= (int64_t)size;
      free(e);
    }
    pthread_mutex_unlock(&mu);
    lm_error("cuda:%d: out of host memory for the allocator's books", k);
    return NULL;
  }
  d->stat[LM_MEM_ALLOCATED] += (int64_t)size;
  if (d->stat[LM_MEM_ALLOCATED] > d->stat[LM_MEM_PEAK]) d->stat[LM_MEM_PEAK] = d->stat[LM_MEM_ALLOCATED];
  pthread_mutex_unlock(&mu);
#ifdef LOOM_CUDA_EMULATE
  /* the emulated device: every block handed out holds NaN (kernels/emu/
   * poison.h), stream-ordered as its reuse is, so a kernel that reads what
   * no one wrote (on a GPU: the previous tensor's values) shows */
  if (lm_emu::poison_block) lm_emu::poison_block(e->p, size);
#endif
  return e->p;
}

void lm_cuda_free(void *p) {
  if (!p) return;
  pthread_mutex_lock(&mu);
  node *e = take_live(p);
  if (e) {
    dev_state *d = &devs[e->device];
    d->stat[LM_MEM_ALLOCATED] -= (int64_t)e->size;
    if (!put(&d->free_, e, false)) { /* no room in the books: back to the driver */
      cudaFree(e->p);
      d->stat[LM_MEM_RESERVED] -= (int64_t)e->size;
      free(e);
    }
  }
  pthread_mutex_unlock(&mu);
  if (!e && cudaFree(p) != cudaSuccess) cudaGetLastError(); /* not ours */
}

/* the table's memory_stats: device index k's counters */
int lm_cuda_memory_stats(int k, int64_t *stats) {
  if (k < 0 || k >= MAX_DEVICES) return lm_error("cuda:%d: no such device", k);
  pthread_mutex_lock(&mu);
  for (int i = 0; i < LM_NMEM_STATS; i++) stats[i] = devs[k].stat[i];
  pthread_mutex_unlock(&mu);
  return 0;
}
