/* device.cpp: the emulated devices: their count (LOOM_EMU_DEVICES, so two
 * ranks can own two), an H100's properties and limits, the current device
 * and its context, errors, and the checks every kernel launch passes. */
#include "emu.h"
#include "runtime.h"
#include <stdarg.h>
#include <map>
#include <mutex>

namespace lm_rt {
static const int MAX = 64;
static thread_local int cur = 0;
static thread_local cudaError_t last = cudaSuccess;
static bool has_context[MAX];
static int first_context = -1;
static std::mutex mu;
/* kernel -> its opted-in dynamic shared memory (never destroyed) */
static std::map<const void *, int> &smem_optin = *new std::map<const void *, int>;

int device_count() {
  static int n = -1;
  if (n < 0) {
    const char *e = getenv("LOOM_EMU_DEVICES");
    n = e && *e ? atoi(e) : 1;
    if (n < 0) n = 0;
    if (n > MAX) n = MAX;
  }
  return n;
}
int current() { return cur; }
int context() {
  std::lock_guard<std::mutex> g(mu);
  if (!has_context[cur]) {
    has_context[cur] = true;
    if (first_context < 0) first_context = cur;
    else count(C_CONTEXTS_OTHER);
  }
  return cur;
}
cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) last = e, count(C_ERRORS);
  return e;
}
void note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "cuda emulator: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

/* ---- the launch checks (emu.h's hooks) ---- */
static int check_launch(const void *k, dim3 g, dim3 b, size_t smem) {
  if (device_count() == 0) return cudaErrorNoDevice;
  context();
  unsigned long threads = (unsigned long)b.x * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 || g.x == 0 || g.y == 0 ||
      g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
    note("launch of grid (%u, %u, %u), block (%u, %u, %u): beyond an H100's limits", g.x, g.y, g.z, b.x, b.y, b.z);
    return cudaErrorInvalidConfiguration;
  }
  if (threads % 32) note("block of %lu threads (not whole warps): the emulator runs only whole warps", threads);
  if (threads % 32) return cudaErrorInvalidConfiguration;
  size_t allowed = SMEM_DEFAULT;
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = smem_optin.find(k);
    if (it != smem_optin.end()) allowed = (size_t)it->second;
  }
  if (smem > allowed) {
    note("launch with %zu bytes of dynamic shared memory, %zu allowed (above 48 KiB a kernel must opt in "
         "with cudaFuncSetAttribute)", smem, allowed);
    return cudaErrorInvalidValue;
  }
  count(C_KERNELS);
  work(0);
  return 0;
}
static int check_pointer(const void *p, const void *) {
  if (!p) return 0;
  if (int m = mapped_for(p, cur)) { /* pinned host memory the device reads over the bus */
    if (m < 0) {
      note("a kernel on cuda:%d was given %p, host memory mapped for another device (not portable)", cur, p);
      return cudaErrorIllegalAddress;
    }
    count(C_MAPPED_KERNELS);
    return 0;
  }
  int d = device_of(p, 1);
  if (d < 0) {
    note("a kernel was given %p, which is not device memory (a host pointer?)", p);
    return cudaErrorIllegalAddress;
  }
  if (d != cur) {
    note("a kernel on cuda:%d was given %p, memory of cuda:%d", cur, p, d);
    return cudaErrorIllegalAddress;
  }
  touch(0, p);
  return 0;
}
static void launch_failed(int e) { fail((cudaError_t)e); }
__attribute__((constructor)) static void install_checks() {
  lm_emu::launch_check = check_launch;
  lm_emu::pointer_check = check_pointer;
  lm_emu::launch_error = launch_failed;
}
} // namespace lm_rt

using namespace lm_rt;

/* ---- the runtime API ---- */
extern "C" {
cudaError_t cudaGetDeviceCount(int *n) {
  *n = device_count();
  return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaGetDevice(int *d) {
  *d = cur;
  return cudaSuccess;
}
/* since CUDA 12, setting a device makes its primary context */
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
  cur = d;
  context();
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  cudaError_t e = last;
  last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return last; }
const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected (emulated: LOOM_EMU_DEVICES=0)";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  default: return "unknown error";
  }
}
const char *cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }
cudaError_t cudaRuntimeGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

/* an H100 SXM5 80GB (sm_90), as cudaGetDeviceProperties reports it */
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
  if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (emulated)");
  p->major = 9, p->minor = 0;
  p->totalGlobalMem = (size_t)79 << 30;
  p->sharedMemPerBlock = SMEM_DEFAULT;
  p->sharedMemPerBlockOptin = SMEM_OPTIN;
  p->sharedMemPerMultiprocessor = 228 << 10;
  p->regsPerBlock = 65536, p->regsPerMultiprocessor = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024, p->maxThreadsPerMultiProcessor = 2048;
  p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
  p->multiProcessorCount = 132;
  p->l2CacheSize = 50 << 20;
  p->totalConstMem = 64 << 10;
  p->memoryBusWidth = 5120;
  p->unifiedAddressing = 1;
  p->pciDeviceID = d;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
  if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
  switch (a) {
  case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
  case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
  case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
  case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)SMEM_DEFAULT; break;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)SMEM_OPTIN; break;
  case cudaDevAttrMultiProcessorCount: *v = 132; break;
  case cudaDevAttrWarpSize: *v = 32; break;
  default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
/* a kernel asking for more dynamic shared memory than 48 KiB */
cudaError_t cudaFuncSetAttribute(const void *k, cudaFuncAttribute a, int v) {
  if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) return fail(cudaErrorInvalidValue);
  if (v < 0 || (size_t)v > SMEM_OPTIN) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(mu);
  smem_optin[k] = v;
  return cudaSuccess;
}
}
