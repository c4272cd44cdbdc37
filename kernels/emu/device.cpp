/* device.cpp: the emulated devices: their count (LOOM_EMU_DEVICES, so two
 * ranks can own two), the GPU they are (LOOM_EMU_ARCH) with its properties
 * and limits, the current device and its context, errors (the last one, a
 * device's sticky one), and the checks every kernel launch passes. */
#include "emu.h"
#include "runtime.h"
#include <stdarg.h>
#include <map>
#include <mutex>

namespace lm_rt {
static thread_local int cur = 0;
static thread_local cudaError_t last = cudaSuccess;
static bool has_context[MAX_DEVICES];
static cudaError_t sticky_error[MAX_DEVICES];
static int first_context = -1;
static std::mutex mu;
/* kernel -> its opted-in dynamic shared memory (never destroyed) */
static std::map<const void *, int> &smem_optin = *new std::map<const void *, int>;

/* the GPUs a run may emulate: their shared memory per block is what makes
 * loom's kernels choose a path (sm_86/89: 99 KiB, where the big attention
 * tiles do not fit and the op composes) */
static const arch gpus[] = {
    {"sm_90", "NVIDIA H100 80GB HBM3", 9, 0, 132, 227 << 10, 228 << 10, (size_t)79 << 30},
    {"sm_80", "NVIDIA A100-SXM4-80GB", 8, 0, 108, 163 << 10, 164 << 10, (size_t)79 << 30},
    {"sm_86", "NVIDIA RTX A6000", 8, 6, 84, 99 << 10, 100 << 10, (size_t)47 << 30},
    {"sm_89", "NVIDIA L40S", 8, 9, 142, 99 << 10, 100 << 10, (size_t)44 << 30},
};
const arch &gpu() {
  static const arch *a = [] {
    const char *e = getenv("LOOM_EMU_ARCH");
    for (const arch &g : gpus)
      if (e && !strcmp(e, g.sm)) return &g;
    if (e && *e) fprintf(stderr, "cuda emulator: LOOM_EMU_ARCH=%s: expected sm_90, sm_80, sm_86 or sm_89; emulating sm_90\n", e);
    return &gpus[0];
  }();
  return *a;
}

int device_count() {
  static int n = -1;
  if (n < 0) {
    const char *e = getenv("LOOM_EMU_DEVICES");
    n = e && *e ? atoi(e) : 1;
    if (n < 0) n = 0;
    if (n > MAX_DEVICES) n = MAX_DEVICES;
  }
  return n;
}
int current() { return cur; }
int context() {
  bool first = false;
  {
    std::lock_guard<std::mutex> g(mu);
    if (!has_context[cur]) {
      has_context[cur] = first = true;
      if (first_context < 0) first_context = cur;
      else count(C_CONTEXTS_OTHER);
    }
  }
  if (first) install_fault_handler(); /* after MPI_Init, which installs its own */
  return cur;
}
cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) last = e, count(C_ERRORS);
  return e;
}
void set_last(cudaError_t e) { last = e; }
cudaError_t sticky(int d) { return d >= 0 && d < MAX_DEVICES ? sticky_error[d] : cudaSuccess; }
void set_sticky(int d, cudaError_t e) {
  if (d >= 0 && d < MAX_DEVICES && sticky_error[d] == cudaSuccess) sticky_error[d] = e;
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
static int check_launch(lm_emu::launch_info &l) {
  if (device_count() == 0) return cudaErrorNoDevice;
  context();
  if (cudaError_t e = sticky(cur)) return e;
  dim3 g = l.grid, b = l.block;
  unsigned long threads = (unsigned long)b.x * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 || g.x == 0 || g.y == 0 ||
      g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
    note("launch of %s: grid (%u, %u, %u), block (%u, %u, %u): beyond the device's limits", l.name, g.x, g.y, g.z,
         b.x, b.y, b.z);
    return cudaErrorInvalidConfiguration;
  }
  if (threads % 32) note("launch of %s: block of %lu threads (not whole warps): the emulator runs only whole warps", l.name, threads);
  if (threads % 32) return cudaErrorInvalidConfiguration;
  size_t allowed = SMEM_DEFAULT;
  {
    std::lock_guard<std::mutex> lk(mu);
    auto it = smem_optin.find(l.kernel);
    if (it != smem_optin.end()) allowed = (size_t)it->second;
  }
  if (l.smem > allowed) {
    note("launch of %s with %zu bytes of dynamic shared memory, %zu allowed (above 48 KiB a kernel must opt in "
         "with cudaFuncSetAttribute)", l.name, l.smem, allowed);
    return cudaErrorInvalidValue;
  }
  count(C_KERNELS);
  return 0;
}
static void bad_pointer(lm_emu::launch_info &l, const char *why) {
  if (!l.fault) note("kernel %s on cuda:%d was given %s: it faults when it runs", l.name, cur, why);
  l.fault = cudaErrorIllegalAddress;
}
/* a pointer argument: device memory of the kernel's device, mapped host
 * memory for it, or NULL */
static void check_pointer(const void *p, lm_emu::launch_info &l) {
  if (!p) return;
  char why[160];
  if (int m = mapped_for(p, cur)) { /* pinned host memory the device reads over the bus */
    if (m > 0) return count(C_MAPPED_KERNELS);
    snprintf(why, sizeof why, "%p, host memory mapped for another device (not portable)", p);
    return bad_pointer(l, why);
  }
  int d = device_of(p, 1);
  if (d == cur) return;
  if (d < 0) snprintf(why, sizeof why, "%p, which is not device memory (a host pointer?)", p);
  else snprintf(why, sizeof why, "%p, memory of cuda:%d", p, d);
  bad_pointer(l, why);
}
/* any aligned word of an argument that points into a device block: the
 * kernel may touch that block (and no other), which must be its device's */
static void check_word(uint64_t w, lm_emu::launch_info &l) {
  const void *p = (const void *)(uintptr_t)w;
  const void *b = w >= 4096 ? block_of(p) : NULL;
  if (!b) return;
  int d = device_of(b, 1);
  if (d != cur) {
    char why[160];
    snprintf(why, sizeof why, "%p (inside an argument), memory of cuda:%d", p, d);
    bad_pointer(l, why);
  }
  for (const void *x : l.blocks)
    if (x == b) return;
  l.blocks.push_back(b);
}
static void submit(lm_emu::launch_info &l, std::function<void()> &&run) {
  work w;
  w.what = std::string("kernel ") + l.name;
  w.blocks = std::move(l.blocks);
  w.run = std::move(run);
  w.fault = (cudaError_t)l.fault;
  enqueue(0, std::move(w));
}
static void launch_failed(int e) { fail((cudaError_t)e); }
/* a block the caching allocator hands out, poisoned on the legacy stream */
static void poison_block(void *p, size_t n) {
  work w;
  w.what = "poisoning a block the caching allocator hands out";
  w.blocks.push_back(block_of(p));
  w.run = [p, n] { lm_emu_poison(p, n); };
  enqueue(0, std::move(w));
}
__attribute__((constructor)) static void install_checks() {
  lm_emu::launch_check = check_launch;
  lm_emu::pointer_check = check_pointer;
  lm_emu::word_check = check_word;
  lm_emu::submit = submit;
  lm_emu::launch_error = launch_failed;
  lm_emu::poison_block = poison_block;
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
/* a sticky error is never cleared: the device is lost */
cudaError_t cudaGetLastError(void) {
  if (cudaError_t s = sticky(cur)) return s;
  cudaError_t e = last;
  last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return sticky(cur) ? sticky(cur) : last; }
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

/* the emulated GPU (gpu()), as cudaGetDeviceProperties reports it */
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
  if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
  const arch &a = gpu();
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s (emulated)", a.name);
  p->major = a.major, p->minor = a.minor;
  p->totalGlobalMem = a.memory;
  p->sharedMemPerBlock = SMEM_DEFAULT;
  p->sharedMemPerBlockOptin = a.smem_optin;
  p->sharedMemPerMultiprocessor = a.smem_per_sm;
  p->regsPerBlock = 65536, p->regsPerMultiprocessor = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024, p->maxThreadsPerMultiProcessor = a.major == 9 || a.minor == 0 ? 2048 : 1536;
  p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
  p->multiProcessorCount = a.sms;
  p->l2CacheSize = a.major == 9 ? 50 << 20 : 40 << 20;
  p->totalConstMem = 64 << 10;
  p->memoryBusWidth = a.major == 9 ? 5120 : 384;
  p->unifiedAddressing = 1;
  p->pciDeviceID = d;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
  if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
  switch (a) {
  case cudaDevAttrComputeCapabilityMajor: *v = gpu().major; break;
  case cudaDevAttrComputeCapabilityMinor: *v = gpu().minor; break;
  case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
  case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)SMEM_DEFAULT; break;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)gpu().smem_optin; break;
  case cudaDevAttrMultiProcessorCount: *v = gpu().sms; break;
  case cudaDevAttrWarpSize: *v = 32; break;
  default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
/* a kernel asking for more dynamic shared memory than 48 KiB */
cudaError_t cudaFuncSetAttribute(const void *k, cudaFuncAttribute a, int v) {
  if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) return fail(cudaErrorInvalidValue);
  if (v < 0 || (size_t)v > gpu().smem_optin) {
    count(C_SMEM_REFUSED);
    return fail(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> g(mu);
  smem_optin[k] = v;
  return cudaSuccess;
}
}
