/* runtime.h: what the files of the emulated CUDA runtime share (the
 * emulated build, LOOM_CUDA=EMULATE: kernels/emu/CMakeLists.txt). The
 * runtime implements, on the CPU, exactly the CUDA runtime, cuBLAS(Lt) and
 * NCCL calls loom makes: device.cpp (devices, properties, errors, the
 * launch checks), memory.cpp (device memory, copies), stream.cpp (streams,
 * events, their order), gemm.cpp (cuBLAS and cuBLASLt), nccl.cpp (NCCL over
 * MPI), counters.cpp (what a GPU run must not do, counted).
 *
 * Every call runs to completion before it returns (a kernel, a copy, a
 * GEMM, a collective): a stream is the order its work was issued in, kept
 * to check that work on two streams touching one block was ordered. */
#ifndef LOOM_CUDA_EMU_RUNTIME_H
#define LOOM_CUDA_EMU_RUNTIME_H
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>

namespace lm_rt {
/* devices (device.cpp) */
int device_count();                 /* LOOM_EMU_DEVICES, 1 when unset */
int current();                      /* this thread's device */
/* the current device, with its context made (counted) the first time;
 * every call that needs a context goes through it */
int context();
cudaError_t fail(cudaError_t e);    /* leaves e as the last error; returns e */
void note(const char *fmt, ...);    /* one line on stderr: what the emulator refused */
const size_t SMEM_DEFAULT = 48 << 10, SMEM_OPTIN = 227 << 10; /* an H100's */

/* device memory (memory.cpp) */
/* the device that holds [p, p + n), or -1 when it is not device memory */
int device_of(const void *p, size_t n);
/* the base of the allocation holding p (its key for the stream checks) */
const void *block_of(const void *p);
/* mapped pinned host memory (cudaHostAlloc with cudaHostAllocMapped) that
 * a kernel on device d may be given: 1 when p is in such an allocation
 * mapped for d (every device when portable), 0 when it is not mapped
 * memory, -1 when it is but not for d */
int mapped_for(const void *p, int d);

/* stream order (stream.cpp): work on stream s touching the block of p */
void touch(cudaStream_t s, const void *p);
void work(cudaStream_t s);          /* s moves on (a kernel, a copy) */

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
