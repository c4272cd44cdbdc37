/* memory.cpp: emulated device memory. Each allocation is a mapping of its
 * own, recorded with its device, between two pages no access may touch,
 * and ending exactly where the second begins (cudaMalloc's 256-byte
 * alignment at the start). It is born poisoned (poison.h: NaN in every
 * float dtype) and closed (PROT_NONE): only the work that runs on the
 * device (stream.cpp) opens the blocks it was given, so host code that
 * dereferences device memory faults (fault.cpp names it). A copy checks
 * its direction (a host pointer where the kind says device, or the
 * reverse, is an error, as on a GPU with the pointer attributes CUDA
 * knows) and is queued like a kernel; a kernel checks that it was handed
 * device memory of its own device (device.cpp). A device holds
 * LOOM_EMU_MEMORY_MIB (80 GiB when unset). */
#include "runtime.h"
#include "poison.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <map>
#include <memory>
#include <mutex>

namespace lm_rt {
static const size_t PAGE = 4096;
/* a mapping: [guard page][data pages][guard page], the allocation ending
 * with the data pages */
struct block { size_t size; int device; char *map; size_t data_len; };
/* by address of the allocation; never destroyed: tensors freed by
 * finalizers at exit still find it */
static std::map<uintptr_t, block> &blocks = *new std::map<uintptr_t, block>;
static std::recursive_mutex mu;
static size_t used[MAX_DEVICES];

static size_t capacity() {
  static size_t c = 0;
  if (!c) {
    const char *e = getenv("LOOM_EMU_MEMORY_MIB");
    c = e && *e ? (size_t)atoll(e) << 20 : (size_t)80 << 30;
  }
  return c;
}

/* the block holding p, or blocks.end() */
template <class B> static typename std::map<uintptr_t, B>::iterator find(std::map<uintptr_t, B> &m, const void *p) {
  uintptr_t a = (uintptr_t)p;
  auto it = m.upper_bound(a);
  if (it == m.begin()) return m.end();
  --it;
  return a < it->first + it->second.size ? it : m.end();
}
int device_of(const void *p, size_t n) {
  std::lock_guard<std::recursive_mutex> g(mu);
  auto it = find(blocks, p);
  if (it == blocks.end()) return -1;
  if ((uintptr_t)p + n > it->first + it->second.size) return -1; /* runs past its block */
  return it->second.device;
}
const void *block_of(const void *p) {
  std::lock_guard<std::recursive_mutex> g(mu);
  auto it = find(blocks, p);
  return it == blocks.end() ? NULL : (const void *)it->first;
}
/* pinned host memory (cudaHostAlloc), by base address: its size, the
 * device current when it was made and its flags */
struct host_block { size_t size; int device; unsigned flags; char *map; size_t data_len; };
static std::map<uintptr_t, host_block> &host_blocks = *new std::map<uintptr_t, host_block>;
int mapped_for(const void *p, int d) {
  std::lock_guard<std::recursive_mutex> g(mu);
  auto it = find(host_blocks, p);
  if (it == host_blocks.end() || !(it->second.flags & cudaHostAllocMapped)) return 0;
  return (it->second.flags & cudaHostAllocPortable) || it->second.device == d ? 1 : -1;
}
static bool pinned(const void *p, size_t n) {
  std::lock_guard<std::recursive_mutex> g(mu);
  auto it = find(host_blocks, p);
  return it != host_blocks.end() && (uintptr_t)p + n <= it->first + it->second.size;
}

/* ---- mappings ---- */
static size_t span(size_t n) { return (n + 255) / 256 * 256; }
static size_t data_pages(size_t n) { return (span(n) + PAGE - 1) / PAGE * PAGE; }
/* n bytes between guard pages, poisoned; *map and *len: the data pages */
static void *map_block(size_t n, char **map, size_t *len) {
  *len = data_pages(n);
  char *a = (char *)mmap(NULL, *len + 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (a == MAP_FAILED) return NULL;
  mprotect(a, PAGE, PROT_NONE), mprotect(a + PAGE + *len, PAGE, PROT_NONE);
  *map = a;
  char *p = a + PAGE + *len - span(n);
  lm_emu_poison(p, span(n)); /* garbage, as fresh device memory is: a read before a write shows */
  return p;
}
static void unmap_block(char *map, size_t len) { munmap(map, len + 2 * PAGE); }

/* ---- protection: open while work runs, closed otherwise ---- */
static std::vector<uintptr_t> &open_now = *new std::vector<uintptr_t>;
static void protect(uintptr_t base, bool open) {
  auto it = blocks.find(base);
  if (it != blocks.end())
    mprotect(it->second.map + PAGE, it->second.data_len, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}
void open_only(const std::vector<const void *> &want) {
  std::lock_guard<std::recursive_mutex> g(mu);
  auto wanted = [&](uintptr_t b) {
    for (const void *w : want)
      if ((uintptr_t)w == b) return true;
    return false;
  };
  std::vector<uintptr_t> keep;
  for (uintptr_t b : open_now) {
    if (wanted(b)) keep.push_back(b);
    else protect(b, false);
  }
  for (const void *w : want) {
    bool is_open = false;
    for (uintptr_t b : keep) is_open = is_open || b == (uintptr_t)w;
    if (!is_open) protect((uintptr_t)w, true), keep.push_back((uintptr_t)w);
  }
  open_now.swap(keep);
}
void close_all() { open_only({}); }

/* ---- what an address is, for a fault's message ---- */
template <class B>
static bool describe_in(std::map<uintptr_t, B> &m, const void *a, const char *kind, char *buf, size_t len) {
  uintptr_t x = (uintptr_t)a;
  for (auto &kv : m) {
    const B &b = kv.second;
    uintptr_t lo = (uintptr_t)b.map, hi = lo + b.data_len + 2 * PAGE, start = kv.first, end = start + b.size;
    if (x < lo || x >= hi) continue;
    if (x < start)
      snprintf(buf, len, "%p, %zu bytes before the start of %s %p (%zu bytes, cuda:%d)", a, (size_t)(start - x), kind,
               (void *)start, b.size, b.device);
    else if (x >= end)
      snprintf(buf, len, "%p, %zu bytes past the end of %s %p (%zu bytes, cuda:%d)", a, (size_t)(x - end), kind,
               (void *)start, b.size, b.device);
    else
      snprintf(buf, len, "%p, byte %zu of %s %p (%zu bytes, cuda:%d)", a, (size_t)(x - start), kind, (void *)start,
               b.size, b.device);
    return true;
  }
  return false;
}
bool describe(const void *a, char *buf, size_t len) {
  return describe_in(blocks, a, "device allocation", buf, len) ||
         describe_in(host_blocks, a, "pinned host allocation", buf, len);
}
} // namespace lm_rt

using namespace lm_rt;

/* checks both ends of a copy of n bytes against its kind; 0 or an error */
static cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *what) {
  if (n == 0) return cudaSuccess;
  int dd = device_of(dst, n), sd = device_of(src, n);
  bool dst_dev = dd >= 0, src_dev = sd >= 0;
  bool want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault) want_dst = dst_dev, want_src = src_dev;
  if (kind == cudaMemcpyHostToHost) want_dst = want_src = false;
  if (dst_dev != want_dst || src_dev != want_src) {
    note("%s of %zu bytes, kind %d: destination %p is %s memory, source %p is %s memory (is a pointer on "
         "the wrong side, or does it run past its allocation?)", what, n, (int)kind, dst,
         dst_dev ? "device" : "host (or not device)", src, src_dev ? "device" : "host (or not device)");
    return fail(cudaErrorInvalidMemcpyDirection);
  }
  return cudaSuccess;
}
/* cudaFree's and cudaFreeHost's work, under mu: unmaps the allocation that
 * starts at p, recorded in m, and hands back its record; false, with a note
 * naming the call and the kind of allocation, when none starts there. */
template <class B> static bool end_block(std::map<uintptr_t, B> &m, void *p, const char *call, const char *kind, B *was) {
  auto it = m.find((uintptr_t)p);
  if (it == m.end()) {
    note("%s(%p): not the start of a %s", call, p, kind);
    return false;
  }
  *was = it->second;
  unmap_block(it->second.map, it->second.data_len);
  m.erase(it);
  return true;
}

extern "C" {
cudaError_t cudaMalloc(void **p, size_t n) {
  *p = NULL;
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  int d = context();
  if (cudaError_t e = sticky(d)) return fail(e);
  std::lock_guard<std::recursive_mutex> g(mu);
  size_t m = n ? n : 1; /* a 0-byte request still gets an address of its own */
  if (m > capacity() - used[d]) return fail(cudaErrorMemoryAllocation);
  block b{m, d, NULL, 0};
  void *q = map_block(m, &b.map, &b.data_len);
  if (!q) return fail(cudaErrorMemoryAllocation);
  mprotect(b.map + PAGE, b.data_len, PROT_NONE); /* closed until work opens it */
  blocks[(uintptr_t)q] = b;
  used[d] += m;
  *p = q;
  install_fault_handler(); /* again, should MPI_Init have put its own in since */
  return cudaSuccess;
}
/* as on a GPU, freeing waits for the device's work */
cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  int d = device_of(p, 1);
  if (d >= 0) drain_device(d);
  std::lock_guard<std::recursive_mutex> g(mu);
  block b;
  if (!end_block(blocks, p, "cudaFree", "device allocation", &b)) return fail(cudaErrorInvalidValue);
  for (auto it = open_now.begin(); it != open_now.end(); ++it)
    if (*it == (uintptr_t)p) { open_now.erase(it); break; }
  used[b.device] -= b.size;
  return cudaSuccess;
}
/* Pinned host memory. Mapped: a kernel may read and write it (device.cpp
 * counts such kernels); with unified addressing (every 64-bit CUDA 12
 * system) its device pointer is its host pointer. A copy treats it as host
 * memory, and is asynchronous with it. It lies between guard pages. */
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
  *p = NULL;
  if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
    return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  int d = context();
  host_block b{n ? n : 1, d, flags, NULL, 0};
  void *q = map_block(b.size, &b.map, &b.data_len);
  if (!q) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::recursive_mutex> g(mu);
  host_blocks[(uintptr_t)q] = b;
  *p = q;
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void **pd, void *p, unsigned flags) {
  *pd = NULL;
  if (flags != 0) return fail(cudaErrorInvalidValue);
  context();
  if (mapped_for(p, current()) <= 0) {
    note("cudaHostGetDevicePointer(%p): not mapped host memory (cudaHostAllocMapped) of this device", p);
    return fail(cudaErrorInvalidValue);
  }
  *pd = p;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
  if (!p) return cudaSuccess;
  drain_all(); /* work may still read or write it */
  std::lock_guard<std::recursive_mutex> g(mu);
  host_block b;
  return end_block(host_blocks, p, "cudaFreeHost", "cudaHostAlloc allocation", &b) ? cudaSuccess
                                                                                   : fail(cudaErrorInvalidValue);
}
cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
  int d = context();
  std::lock_guard<std::recursive_mutex> g(mu);
  *total = capacity(), *fr = capacity() - used[d];
  return cudaSuccess;
}

/* A copy, queued on stream s. From pageable host memory the bytes are
 * staged now (the caller may free them when the call returns); to
 * pageable host memory the call waits for the copy (CUDA: synchronous for
 * the host); to pinned host memory it does not, and the destination holds
 * poison until the copy runs. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  int d = context();
  if (cudaError_t e = check_copy(dst, src, n, kind, "cudaMemcpyAsync")) return e;
  if (cudaError_t e = sticky(d)) return fail(e);
  if (n == 0) return cudaSuccess;
  const void *db = block_of(dst), *sb = block_of(src);
  if (!db && !sb) { memmove(dst, src, n); return cudaSuccess; } /* host to host: synchronous */
  work w;
  char what[96];
  snprintf(what, sizeof what, "cudaMemcpyAsync (%zu bytes, %s to %s)", n, sb ? "device" : "host", db ? "device" : "host");
  w.what = what;
  if (db) w.blocks.push_back(db);
  if (sb && sb != db) w.blocks.push_back(sb);
  if (!sb && !pinned(src, n)) {
    auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
    w.run = [dst, staged] { memcpy(dst, staged->data(), staged->size()); };
  } else {
    w.run = [dst, src, n] { memmove(dst, src, n); };
  }
  bool to_pageable = !db && !pinned(dst, n);
  if (!db && !to_pageable) lm_emu_poison(dst, n);
  enqueue(s, std::move(w));
  if (to_pageable) {
    count(C_SYNC_D2H);
    drain(s);
    return sticky(d) ? fail(sticky(d)) : cudaSuccess;
  }
  return cudaSuccess;
}
/* on the legacy stream, and the host waits for it */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, 0);
  if (e != cudaSuccess) return e;
  drain(0);
  return sticky(current()) ? fail(sticky(current())) : cudaSuccess;
}
/* serialized with the work of both devices: runs after theirs, at once */
cudaError_t cudaMemcpyPeer(void *dst, int dd, const void *src, int sd, size_t n) {
  context();
  if (n == 0) return cudaSuccess;
  if (device_of(dst, n) != dd || device_of(src, n) != sd) {
    note("cudaMemcpyPeer of %zu bytes: %p is not memory of cuda:%d or %p is not memory of cuda:%d", n, dst, dd,
         src, sd);
    return fail(cudaErrorInvalidValue);
  }
  if (cudaError_t e = sticky(dd) ? sticky(dd) : sticky(sd)) return fail(e);
  drain_device(sd), drain_device(dd);
  open_only({block_of(dst), block_of(src)});
  memmove(dst, src, n);
  close_all();
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  int d = context();
  if (n && device_of(p, n) != d) {
    note("cudaMemsetAsync of %zu bytes at %p: not memory of the current device cuda:%d", n, p, d);
    return fail(cudaErrorInvalidValue);
  }
  if (cudaError_t e = sticky(d)) return fail(e);
  if (n == 0) return cudaSuccess;
  work w;
  w.what = "cudaMemsetAsync";
  w.blocks.push_back(block_of(p));
  w.run = [p, v, n] { memset(p, v, n); };
  enqueue(s, std::move(w));
  return cudaSuccess;
}
}
