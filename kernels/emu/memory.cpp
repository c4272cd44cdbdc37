/* memory.cpp: emulated device memory: host memory each allocation of which
 * is recorded with its device, so a copy checks its direction (a host
 * pointer where the kind says device, or the reverse, is an error, as it
 * is on a GPU with the pointer attributes CUDA knows) and a kernel checks
 * that it was handed device memory of its own device (device.cpp). A
 * device holds LOOM_EMU_MEMORY_MIB (80 GiB when unset). */
#include "runtime.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <map>
#include <mutex>

namespace lm_rt {
struct block { size_t size; int device; };
/* by base address; never destroyed: tensors freed by finalizers at exit still find it */
static std::map<uintptr_t, block> &blocks = *new std::map<uintptr_t, block>;
static std::mutex mu;
static size_t used[64];

static size_t capacity() {
  static size_t c = 0;
  if (!c) {
    const char *e = getenv("LOOM_EMU_MEMORY_MIB");
    c = e && *e ? (size_t)atoll(e) << 20 : (size_t)80 << 30;
  }
  return c;
}

/* the block holding p, or blocks.end() */
static std::map<uintptr_t, block>::iterator find(const void *p) {
  uintptr_t a = (uintptr_t)p;
  auto it = blocks.upper_bound(a);
  if (it == blocks.begin()) return blocks.end();
  --it;
  return a < it->first + it->second.size ? it : blocks.end();
}
int device_of(const void *p, size_t n) {
  std::lock_guard<std::mutex> g(mu);
  auto it = find(p);
  if (it == blocks.end()) return -1;
  if ((uintptr_t)p + n > it->first + it->second.size) return -1; /* runs past its block */
  return it->second.device;
}
/* pinned host memory (cudaHostAlloc), by base address: its size, the
 * device current when it was made and its flags */
struct host_block { size_t size; int device; unsigned flags; };
static std::map<uintptr_t, host_block> &host_blocks = *new std::map<uintptr_t, host_block>;
int mapped_for(const void *p, int d) {
  std::lock_guard<std::mutex> g(mu);
  uintptr_t a = (uintptr_t)p;
  auto it = host_blocks.upper_bound(a);
  if (it == host_blocks.begin()) return 0;
  --it;
  if (a >= it->first + it->second.size || !(it->second.flags & cudaHostAllocMapped)) return 0;
  return (it->second.flags & cudaHostAllocPortable) || it->second.device == d ? 1 : -1;
}
const void *block_of(const void *p) {
  std::lock_guard<std::mutex> g(mu);
  auto it = find(p);
  return it == blocks.end() ? p : (const void *)it->first;
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
  if (src_dev && !dst_dev) count(C_SYNC_D2H);
  return cudaSuccess;
}

/* A block of n bytes (cudaMalloc's 256-byte alignment) that ends where a
 * page no access may touch begins: a kernel writing past its allocation
 * faults at the write (run it under gdb to see which), where a GPU would
 * have written over a neighbour in the caching allocator's pool. */
static const size_t PAGE = 4096;
static size_t span(size_t n) { return (n + 255) / 256 * 256; }
static size_t pages(size_t n) { return (span(n) + PAGE - 1) / PAGE * PAGE; }
static void *map_block(size_t n) {
  size_t len = pages(n) + PAGE;
  void *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (a == MAP_FAILED) return NULL;
  mprotect((char *)a + pages(n), PAGE, PROT_NONE);
  return (char *)a + pages(n) - span(n);
}
static void unmap_block(void *p, size_t n) {
  char *a = (char *)p - (pages(n) - span(n));
  munmap(a, pages(n) + PAGE);
}
/* cudaFree's and cudaFreeHost's work, under mu: unmaps the allocation that
 * starts at p, recorded in m, and hands back its record; false, with a note
 * naming the call and the kind of allocation, when none starts there. */
template <class B> static bool end_block(std::map<uintptr_t, B> &m, void *p, const char *call, const char *kind,
                                         B *was) {
  auto it = m.find((uintptr_t)p);
  if (it == m.end()) {
    note("%s(%p): not the start of a %s", call, p, kind);
    return false;
  }
  *was = it->second;
  unmap_block(p, it->second.size); /* the size mapped: n, or 1 for 0 */
  m.erase(it);
  return true;
}

extern "C" {
cudaError_t cudaMalloc(void **p, size_t n) {
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  int d = context();
  std::lock_guard<std::mutex> g(mu);
  if (n > capacity() - used[d]) { *p = NULL; return fail(cudaErrorMemoryAllocation); }
  void *q = map_block(n ? n : 1); /* a 0-byte request still gets an address of its own */
  if (!q) { *p = NULL; return fail(cudaErrorMemoryAllocation); }
  memset(q, 0xA5, n); /* garbage, as fresh device memory is: a read before a write shows */
  blocks[(uintptr_t)q] = block{n ? n : 1, d};
  used[d] += n ? n : 1;
  *p = q;
  return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  std::lock_guard<std::mutex> g(mu);
  block b;
  if (!end_block(blocks, p, "cudaFree", "device allocation", &b)) return fail(cudaErrorInvalidValue);
  used[b.device] -= b.size;
  return cudaSuccess;
}
/* Pinned host memory. Mapped: a kernel may read and write it (device.cpp
 * counts such kernels); with unified addressing (every 64-bit CUDA 12
 * system) its device pointer is its host pointer. A copy treats it as host
 * memory. It ends at a page no access may touch, as device blocks do. */
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
  *p = NULL;
  if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
    return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  int d = context();
  void *q = map_block(n ? n : 1);
  if (!q) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> g(mu);
  host_blocks[(uintptr_t)q] = host_block{n ? n : 1, d, flags};
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
  std::lock_guard<std::mutex> g(mu);
  host_block b;
  return end_block(host_blocks, p, "cudaFreeHost", "cudaHostAlloc allocation", &b) ? cudaSuccess
                                                                                   : fail(cudaErrorInvalidValue);
}
cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
  int d = context();
  std::lock_guard<std::mutex> g(mu);
  *total = capacity(), *fr = capacity() - used[d];
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  context();
  cudaError_t e = check_copy(dst, src, n, kind, "cudaMemcpyAsync");
  if (e != cudaSuccess) return e;
  work(s);
  if (device_of(dst, n) >= 0) touch(s, dst);
  if (device_of(src, n) >= 0) touch(s, src);
  if (n) memmove(dst, src, n);
  return cudaSuccess;
}
/* on the legacy stream, and the host waits for it */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, 0);
  if (e == cudaSuccess) cudaStreamSynchronize(0);
  return e;
}
cudaError_t cudaMemcpyPeer(void *dst, int dd, const void *src, int sd, size_t n) {
  context();
  if (n == 0) return cudaSuccess;
  if (device_of(dst, n) != dd || device_of(src, n) != sd) {
    note("cudaMemcpyPeer of %zu bytes: %p is not memory of cuda:%d or %p is not memory of cuda:%d", n, dst, dd,
         src, sd);
    return fail(cudaErrorInvalidValue);
  }
  work(0), touch(0, dst), touch(0, src);
  memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  context();
  if (n && device_of(p, n) != current()) {
    note("cudaMemsetAsync of %zu bytes at %p: not memory of the current device cuda:%d", n, p, current());
    return fail(cudaErrorInvalidValue);
  }
  work(s), touch(s, p);
  memset(p, v, n);
  return cudaSuccess;
}
}
