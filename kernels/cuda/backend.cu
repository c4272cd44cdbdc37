/* backend.cu: the CUDA backend: device discovery and selection, the
 * helpers the kernel files share (errors, the strided walk's setup), and
 * the table registered for CUDA devices (the allocator is alloc.cu). */
#include "common.cuh"
#include "kernels.cuh"
#include <dlfcn.h>
#include <stdio.h>

/* ---- errors ---- */
int lm_cuda_fail(const char *what, cudaError_t e) {
  cudaGetLastError(); /* clear it, so the next call starts clean */
  return lm_error("cuda: %s: %s", what, cudaGetErrorString(e));
}

/* cudaErrorNotReady is never a launch's error: a query (cudaEventQuery,
 * cudaStreamQuery) left it as the last error, and whoever asked has its
 * answer already; taking it for this launch's would fail a good launch. */
int lm_cuda_launched(const char *kernel) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess || e == cudaErrorNotReady ? 0 : lm_cuda_fail(kernel, e);
}

/* ---- devices ---- */
#define MAX_DEVICES 64
static int device_count = -1;              /* -1: not asked yet */
static char no_device_reason[256];
static bool ready[MAX_DEVICES];            /* made current once */

/* why there is no device, in the user's words: the runtime says "driver
 * version is insufficient" also when there is no driver at all (no GPU) */
static void no_device(cudaError_t e) {
#ifdef LOOM_CUDA_EMU_RUNTIME
  void *driver = &no_device_reason; /* the emulated runtime is its own driver */
#else
  void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
#endif
  if (!driver)
    snprintf(no_device_reason, sizeof no_device_reason,
             "cuda: no GPU here: this machine has no NVIDIA driver (libcuda.so.1 is not installed)");
  else if (e == cudaErrorInsufficientDriver)
    snprintf(no_device_reason, sizeof no_device_reason,
             "cuda: the NVIDIA driver is older than this build's CUDA runtime needs (%s)", cudaGetErrorString(e));
  else if (e == cudaErrorNoDevice)
    snprintf(no_device_reason, sizeof no_device_reason, "cuda: no GPU here (%s)", cudaGetErrorString(e));
  else
    snprintf(no_device_reason, sizeof no_device_reason, "cuda: cannot count the GPUs (%s)", cudaGetErrorString(e));
#ifndef LOOM_CUDA_EMU_RUNTIME
  if (driver) dlclose(driver);
#endif
}

static int devices(void) {
  if (device_count < 0) {
    int n = 0; /* left untouched when there is no driver or GPU */
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      no_device(e);
      cudaGetLastError();
      n = 0;
    } else if (n == 0) {
      no_device(cudaErrorNoDevice);
    }
    device_count = n > MAX_DEVICES ? MAX_DEVICES : n;
  }
  if (device_count == 0) lm_error("%s", no_device_reason);
  return device_count;
}

static int set_device(int k) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
  if (cur != k) LM_CUDA_TRY(cudaSetDevice(k));
  ready[k] = true;
  return 0;
}

/* the table's select: device k of this process, made current */
static int cuda_select(int k) {
  int n = devices();
  if (n == 0) return -1;
  if (k < 0 || k >= n) return lm_error("cuda:%d: expected a device in cuda:0..cuda:%d", k, n - 1);
  return set_device(k);
}

int lm_cuda_use(const lm_tensor *t) {
  int k = t->device_ - LM_CUDA0;
#ifdef LOOM_CUDA_HOST_TEST
  if (k < 0) return 0;
#endif
  if (k < 0) return lm_error("cuda: tensor is on the CPU, expected a CUDA tensor");
  if (k >= MAX_DEVICES || !ready[k]) return cuda_select(k);
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == k) return 0;
  LM_CUDA_TRY(cudaSetDevice(k));
  return 0;
}

/* the current device's index (lm_backend_of selected it), or -1 */
int lm_cuda_current_device(void) {
  int k = 0;
  if (cudaGetDevice(&k) != cudaSuccess) {
    cudaGetLastError();
    return devices() == 0 ? -1 : lm_error("cuda: no current device");
  }
  if (k < 0 || k >= MAX_DEVICES) return lm_error("cuda:%d: beyond the %d devices loom keeps", k, MAX_DEVICES);
  return ready[k] || cuda_select(k) == 0 ? k : -1;
}

/* the table's info: runtime, driver and each device, for lm_build_info.
 * Asks the driver only; a machine without a GPU answers why. */
static const char *cuda_info(void) {
  static char buf[1024];
  int rt = 0, drv = 0, n = devices();
  cudaRuntimeGetVersion(&rt), cudaDriverGetVersion(&drv);
  int w = snprintf(buf, sizeof buf, "runtime %d.%d, driver %d.%d, %d device(s)", rt / 1000, rt % 1000 / 10,
                   drv / 1000, drv % 1000 / 10, n);
  if (n == 0) lm_clear_error(), w += snprintf(buf + w, sizeof buf - w, " (%s)", no_device_reason);
  for (int k = 0; k < n && w < (int)sizeof buf; k++) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, k) != cudaSuccess) { cudaGetLastError(); continue; }
    w += snprintf(buf + w, sizeof buf - w, "; cuda:%d %s sm_%d%d %.1f GiB", k, p.name, p.major, p.minor,
                  p.totalGlobalMem / 1073741824.0);
  }
  return buf;
}

/* ---- the table, filled by slot name; registered when libloom loads ---- */
__attribute__((constructor)) static void register_cuda(void) {
  static lm_backend b;
  b.name = "cuda";
  b.select = cuda_select;
  b.count = devices;
  b.info = cuda_info;
  b.check_ids = lm_cuda_check_ids;
#define CUDA_SLOT(slot) b.slot = lm_cuda_##slot;
  LM_SLOTS(CUDA_SLOT)
  LM_FUSED_SLOTS(CUDA_SLOT)
#undef CUDA_SLOT
  b.attention_bias = lm_cuda_attention_bias;
  b.attention_bias_bwd = lm_cuda_attention_bias_bwd;
  lm_register_backend(LM_KIND_CUDA, &b);
}
