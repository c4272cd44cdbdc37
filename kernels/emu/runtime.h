/* runtime.h: what the files of the emulated CUDA runtime share (the
 * emulated build, LOOM_CUDA=EMULATE: kernels/emu/CMakeLists.txt). The
 * runtime implements, on the CPU, exactly the CUDA runtime, cuBLAS(Lt) and
 * NCCL calls loom makes: device.cpp (devices, properties, errors, the
 * launch checks), memory.cpp (device memory, its protection, copies),
 * stream.cpp (streams, events, the queues of work), fault.cpp (a fault
 * named), gemm.cpp (cuBLAS and cuBLASLt), nccl.cpp (NCCL over MPI),
 * counters.cpp (what a GPU run must not do, counted).
 *
 * The device is asynchronous, as a GPU is: a kernel, a copy, a GEMM or a
 * collective is queued on its stream and runs when the host waits for it
 * (a synchronize, a copy to pageable host memory, an event) or when work
 * the host waits for depends on it; a query of work not yet run answers
 * cudaErrorNotReady (and leaves it as the last error, as CUDA does), then
 * lets the device go on. Device memory can be read and written only by
 * that work: outside it every block is mapped PROT_NONE, so host code that
 * dereferences a device pointer faults, and fault.cpp names it. A kernel
 * given a bad pointer faults when it runs, and the error is sticky: every
 * later call on that device fails, as on a GPU. */
#ifndef LOOM_CUDA_EMU_RUNTIME_H
#define LOOM_CUDA_EMU_RUNTIME_H
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>
#include <functional>
#include <string>
#include <vector>

namespace lm_rt {
/* devices (device.cpp) */
const int MAX_DEVICES = 64;
int device_count();                 /* LOOM_EMU_DEVICES, 1 when unset */
int current();                      /* this thread's device */
/* the current device, with its context made (counted) the first time;
 * every call that needs a context goes through it */
int context();
cudaError_t fail(cudaError_t e);    /* leaves e as the last error, counted as refused; returns e */
void set_last(cudaError_t e);       /* leaves e as the last error (cudaErrorNotReady: not a refusal) */
cudaError_t sticky(int device);     /* the device's sticky error, or cudaSuccess */
void set_sticky(int device, cudaError_t e);
void note(const char *fmt, ...);    /* one line on stderr: what the emulator refused */
/* the emulated GPU (LOOM_EMU_ARCH: sm_90 when unset, sm_80, sm_86, sm_89) */
struct arch {
  const char *sm, *name;
  int major, minor, sms;
  size_t smem_optin, smem_per_sm, memory;
};
const arch &gpu();
const size_t SMEM_DEFAULT = 48 << 10;

/* device memory (memory.cpp) */
/* the device that holds [p, p + n), or -1 when it is not device memory */
int device_of(const void *p, size_t n);
/* the base of the device allocation holding p, or NULL */
const void *block_of(const void *p);
/* mapped pinned host memory (cudaHostAlloc with cudaHostAllocMapped) that
 * a kernel on device d may be given: 1 when p is in such an allocation
 * mapped for d (every device when portable), 0 when it is not mapped
 * memory, -1 when it is but not for d */
int mapped_for(const void *p, int d);
/* the blocks work is about to touch become readable and writable, every
 * other one is closed (PROT_NONE); close_all when the host goes on */
void open_only(const std::vector<const void *> &blocks);
void close_all();
/* what address a is to the emulator (a device block, a guard page, a
 * stack, shared memory), for a fault's message; false when none of these */
bool describe(const void *a, char *buf, size_t len);

/* streams and their queues (stream.cpp) */
struct work {
  std::string what;                  /* for messages: "kernel attn_fwd_kernel<T, D>", "cudaMemcpyAsync ..." */
  std::vector<const void *> blocks;  /* the device blocks it reads or writes */
  std::function<void()> run;
  std::function<bool()> ready;       /* may it run without waiting (a collective: the peers' data came)? */
  cudaError_t fault = cudaSuccess;   /* it faults when it runs (a bad pointer), sticky */
};
/* queues w on stream s (0: the current device's legacy stream), ordered
 * as CUDA orders it; a device with a sticky error takes no more work */
void enqueue(cudaStream_t s, work w);
void drain(cudaStream_t s);         /* the host waits for s's work */
void drain_device(int device);      /* ... for every stream of the device */
void drain_all();                   /* ... for every device */
int device_of_stream(cudaStream_t s);
/* the work running now (a fault names it), NULL on the host */
const work *running();
void install_fault_handler();       /* fault.cpp: once a context is made */

/* counters (counters.cpp) */
enum counter {
  C_CONTEXTS_OTHER,  /* contexts on devices other than the first one used */
  C_SYNC_D2H,        /* synchronous device-to-host copies */
  C_F32_GEMM_AUTOCAST, /* f32 GEMMs while bf16/f16 autocast is on */
  C_UNORDERED_REUSE, /* a block used on a stream not ordered after its last use on another */
  C_KERNELS,         /* kernels run */
  C_GEMMS,           /* GEMMs run */
  C_COLLECTIVES,     /* NCCL collectives run */
  C_ERRORS,          /* calls refused (bad pointer, wrong direction, bad launch) */
  C_MAPPED_KERNELS,  /* kernels given mapped host memory: they read or write it over the bus (no copy, no wait) */
  C_DEVICE_SYNCS,    /* cudaDeviceSynchronize: the host waits for the whole device */
  C_NOT_READY,       /* queries answered cudaErrorNotReady: the host asked before the work ran */
  C_SMEM_REFUSED,    /* kernels refused more shared memory than the device has (the caller composes) */
  C_GROUPED_GEMMS,   /* cublasGemmGroupedBatchedEx calls queued (their problems are not in C_GEMMS) */
  C_N
};
void count(counter c, int64_t n = 1);

/* One element of C type T to and from double, as cuBLAS and NCCL convert
 * (gemm.cpp, nccl.cpp): halves through float, rounding to nearest even. */
template <class T> inline double widen(T v) { return (double)v; }
inline double widen(__half v) { return (double)__half2float(v); }
inline double widen(__nv_bfloat16 v) { return (double)__bfloat162float(v); }
template <class T> inline T narrow(double v) { return (T)v; }
template <> inline __half narrow<__half>(double v) { return __float2half_rn((float)v); }
template <> inline __nv_bfloat16 narrow<__nv_bfloat16>(double v) { return __float2bfloat16_rn((float)v); }
}
/* A library's element functions over its type enum Enum, from its list of
 * X(type id, C type): type_size (0 for a type not listed: callers refuse
 * it before anything loads or stores), load (one element as double) and
 * store (one from double). */
#define LM_RT_SIZE_CASE(id, T) case id: return (int)sizeof(T);
#define LM_RT_LOAD_CASE(id, T) case id: return lm_rt::widen(*(const T *)p);
#define LM_RT_STORE_CASE(id, T) case id: *(T *)p = lm_rt::narrow<T>(v); break;
#define LM_RT_ELEMENT_FUNCTIONS(LIST, Enum)                                                        \
  int type_size(Enum t) {                                                                          \
    switch (t) { LIST(LM_RT_SIZE_CASE) default: return 0; }                                        \
  }                                                                                                \
  double load(const char *p, Enum t) {                                                             \
    switch (t) { LIST(LM_RT_LOAD_CASE) default: return 0; }                                        \
  }                                                                                                \
  void store(char *p, Enum t, double v) {                                                          \
    switch (t) { LIST(LM_RT_STORE_CASE) default: break; }                                          \
  }
#endif
