/* check.cu: the id range check of embedding and cross entropy, on the
 * device and without waiting for it. A check kernel marks its slot (in
 * mapped host memory) with a bad id; the next call that waits for the
 * device anyway (a copy to the host: loss:item(), a print) reads the slots
 * of checks that device has finished and raises the first bad one, as
 * PyTorch's device-side asserts surface at the next sync. Until then the
 * kernels treat a bad id as a skipped row (zeros), never out of bounds. */
#include "common.cuh"
#include <pthread.h>
#include <stdio.h>

#define SLOTS 64 /* checks in flight between two waits; a 65th waits first */

typedef struct ids_slot {
  unsigned long long bad; /* 0, or 1 once a thread claimed the report */
  long long id;           /* the bad id the claiming thread saw */
} ids_slot;

typedef struct pending {
  int device;             /* -1: the slot is free */
  unsigned long long seq; /* issue order: the first bad check is raised */
  char head[160], tail[160];
} pending;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static ids_slot *slots, *dslots; /* host view, device view */
static pending pend[SLOTS];
static unsigned long long issued;

__global__ void __launch_bounds__(LM_THREADS)
check_ids_kernel(const int64_t *ids, int64_t n, int64_t vocab, int skip_ok, int64_t skip, ids_slot *s) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t v = ids[i];
    if ((v >= 0 && v < vocab) || (skip_ok && v == skip)) continue;
    if (atomicCAS(&s->bad, 0ULL, 1ULL) == 0ULL) s->id = v;
  }
}

/* the slots, made once (mapped pinned memory, visible to every device);
 * without them the core checks on the host (LM_UNSUPPORTED) */
static int ready_slots(void) {
  if (slots) return 0;
  cudaError_t e = cudaHostAlloc((void **)&slots, SLOTS * sizeof *slots,
                                cudaHostAllocMapped | cudaHostAllocPortable);
  if (e == cudaSuccess) e = cudaHostGetDevicePointer((void **)&dslots, slots, 0);
  if (e != cudaSuccess) {
    if (slots) cudaFreeHost(slots);
    slots = NULL;
    cudaGetLastError();
    return lm_cuda_unsupported("id check: no mapped host memory (%s)", cudaGetErrorString(e));
  }
  memset(slots, 0, SLOTS * sizeof *slots);
  for (int i = 0; i < SLOTS; i++) pend[i].device = -1;
  return 0;
}

/* Reads the slots of device k's checks (its queue has drained: the caller
 * waited for it) and frees them; -1 raising the first bad id. Call with mu. */
static int report_locked(int k) {
  int first = -1;
  for (int i = 0; slots && i < SLOTS; i++) {
    if (pend[i].device != k) continue;
    if (slots[i].bad && (first < 0 || pend[i].seq < pend[first].seq)) first = i;
    pend[i].device = -1;
  }
  int rc = 0;
  if (first >= 0)
    rc = lm_error("%s%lld%s", pend[first].head, slots[first].id + 1, pend[first].tail);
  for (int i = 0; slots && i < SLOTS; i++)
    if (pend[i].device < 0) slots[i].bad = 0, slots[i].id = 0;
  return rc;
}

int lm_cuda_ids_report(int k) {
  pthread_mutex_lock(&mu);
  int rc = report_locked(k);
  pthread_mutex_unlock(&mu);
  return rc;
}

/* a free slot; with all in flight, waits for the devices that hold them
 * (one wait per 64 checks without a copy to the host between them).
 * Call with mu. */
static int take_slot(int *slot) {
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < SLOTS; i++)
      if (pend[i].device < 0) return *slot = i, 0;
    int cur = -1;
    LM_CUDA_TRY(cudaGetDevice(&cur));
    for (int i = 0; i < SLOTS; i++) {
      int k = pend[i].device;
      if (k < 0) continue;
      LM_CUDA_TRY(cudaSetDevice(k));
      LM_CUDA_TRY(cudaDeviceSynchronize());
      int rc = report_locked(k);
      if (rc < 0) { cudaSetDevice(cur); return rc; }
    }
    LM_CUDA_TRY(cudaSetDevice(cur));
  }
  return lm_error("id check: no free slot");
}

int lm_cuda_check_ids(const lm_tensor *idx, int64_t n, int skip_ok, int64_t skip, const char *head,
                      const char *tail) {
  if (idx->dtype_ != LM_I64 || !lm_is_contiguous(idx))
    return lm_error("id check kernel: expected contiguous i64 ids");
  if (idx->numel_ == 0) return 0;
  if (lm_cuda_use(idx) < 0) return -1;
  pthread_mutex_lock(&mu);
  int slot = -1, rc = ready_slots();
  if (rc == 0) rc = take_slot(&slot);
  if (rc == 0) {
    pending *p = &pend[slot];
    p->device = idx->device_ - LM_CUDA0, p->seq = issued++;
    snprintf(p->head, sizeof p->head, "%s", head);
    snprintf(p->tail, sizeof p->tail, "%s", tail);
    LM_LAUNCH(lm_blocks(idx->numel_), LM_THREADS, 0, check_ids_kernel)(
        (const int64_t *)lm_ptr(idx), idx->numel_, n, skip_ok, skip, dslots + slot);
    rc = lm_cuda_launched("id check");
  }
  pthread_mutex_unlock(&mu);
  return rc;
}
