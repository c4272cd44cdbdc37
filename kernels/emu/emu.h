/* emu.h: runs CUDA kernels of kernels/ on the CPU, for a machine without a
 * GPU. Included before a kernel file, it turns a launch (LM_LAUNCH) into a
 * loop over the grid that runs each block's threads as coroutines
 * (a six-register stack switch on x86-64, ucontext elsewhere) in one OS thread: a thread runs until it reaches a barrier
 * (__syncthreads, __syncwarp, a shuffle, an mma), and a barrier opens when
 * every thread it waits for has arrived. Threads run in a shuffled order
 * (seeded), so a read that a barrier does not order after its write shows.
 * mma.m16n8k16 and ldmatrix follow the PTX ISA's definitions of their
 * fragments, independently of how tile.cuh uses them.
 *
 * What it checks: the kernels' index arithmetic, masks, loops, barriers
 * between phases, and the host code around them. What it cannot: the
 * hardware's timing, memory ordering beyond barriers, and speed.
 *
 * The state is C++17 inline variables: one copy however many kernel files
 * include this (the emulated build, kernels/emu/CMakeLists.txt, includes it
 * in every kernel file of kernels/cuda/). That build's runtime (runtime.h) sets the
 * hooks below, which check each launch against the device it emulates;
 * test_emu.cpp leaves them unset. */
#ifndef LOOM_CUDA_EMU_H
#define LOOM_CUDA_EMU_H
#define LOOM_CUDA_EMULATE 1
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <functional>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#undef __shared__
#define __shared__ static /* one block runs at a time: a static is its shared memory */
#define __launch_bounds__(...)

namespace lm_emu {
enum { RUN = 0, WAIT_BLOCK = 1, WAIT_WARP = 2, DONE = 3 };
struct Thread {
#ifdef __x86_64__
  void *sp;  /* its saved stack pointer (lm_emu_switch) */
#else
  ucontext_t ctx;
#endif
  int state;
};
static const size_t STACK = 64 << 10;
inline std::vector<Thread> threads;
/* 1024 stacks, each above a page no access may touch: a thread that
 * overflows its stack faults there instead of writing over another's */
static const size_t GUARD = 4096, SLOT = STACK + GUARD;
inline char *stack_area;
static inline char *stack_of(int i) {
  if (!stack_area) {
    void *a = mmap(NULL, 1024 * SLOT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (a == MAP_FAILED) { fprintf(stderr, "emu: cannot map the threads' stacks\n"); abort(); }
    for (int t = 0; t < 1024; t++) mprotect((char *)a + t * SLOT, GUARD, PROT_NONE);
    stack_area = (char *)a;
  }
  return stack_area + (size_t)i * SLOT + GUARD;
}
#ifdef __x86_64__
inline void *scheduler;
#else
inline ucontext_t scheduler;
#endif
inline int current, nthreads;
inline std::function<void()> body;
inline unsigned long seed = 1;
inline unsigned char dynamic_smem[256 << 10] __attribute__((aligned(16)));
inline uint64_t exchange[1024];     /* a shuffle's values, by thread */
inline uint32_t mma_a[1024][4], mma_b[1024][2];
inline const void *ldm_row[1024];    /* an ldmatrix's row addresses, by thread */
inline long barriers;                /* opened, for the report */
/* The emulated runtime's checks (unset: none). launch_check answers 0 to
 * run a launch of kernel k, or an error (cudaError_t) that the launch leaves
 * as the last error instead of running; pointer_check answers 0 for a
 * pointer a kernel may be given (device memory of the current device, or
 * NULL), else an error, and reports it. */
inline int (*launch_check)(const void *k, dim3 grid, dim3 block, size_t smem);
inline int (*pointer_check)(const void *p, const void *k);
inline void (*launch_error)(int e);
} // namespace lm_emu

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

/* lm_emu_switch(&save, to): saves the callee-saved registers on this stack
 * and its pointer in save, then resumes the stack `to` (what swapcontext
 * does, without its two signal-mask system calls per switch: a thread
 * switch costs nanoseconds, so a kernel of a million threads runs). Weak:
 * every file that includes this header defines it, the linker keeps one. */
#ifdef __x86_64__
extern "C" void lm_emu_switch(void **save, void *to);
asm(".text\n.weak lm_emu_switch\n.type lm_emu_switch,@function\nlm_emu_switch:\n"
    "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
    "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
    "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\nret\n"
    ".size lm_emu_switch, .-lm_emu_switch\n");
#define LM_EMU_TO_SCHEDULER(t) lm_emu_switch(&(t).sp, lm_emu::scheduler)
#define LM_EMU_TO_THREAD(t) lm_emu_switch(&lm_emu::scheduler, (t).sp)
#else
#define LM_EMU_TO_SCHEDULER(t) swapcontext(&(t).ctx, &lm_emu::scheduler)
#define LM_EMU_TO_THREAD(t) swapcontext(&lm_emu::scheduler, &(t).ctx)
#endif

static inline int lm_emu_linear() { return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)); }

static inline void lm_emu_wait(int what) {
  lm_emu::threads[lm_emu::current].state = what;
  LM_EMU_TO_SCHEDULER(lm_emu::threads[lm_emu::current]);
}
/* one OS thread runs every emulated thread: a read-modify-write is atomic */
template <typename T> static inline T atomicAdd(T *p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
template <typename T> static inline T atomicCAS(T *p, T compare, T v) {
  T old = *p;
  if (old == compare) *p = v;
  return old;
}
static inline void __syncthreads() { lm_emu_wait(lm_emu::WAIT_BLOCK); }
static inline void __syncwarp(unsigned = 0xffffffffu) { lm_emu_wait(lm_emu::WAIT_WARP); }

template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
  static_assert(sizeof(T) <= 8, "shuffle of a word");
  int me = lm_emu_linear();
  memcpy(&lm_emu::exchange[me], &v, sizeof v);
  __syncwarp();
  T r;
  memcpy(&r, &lm_emu::exchange[(me & ~31) | ((me & 31) ^ o)], sizeof r);
  __syncwarp();
  return r;
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: lane 4g + t holds
 * A (16 x 16): a0 = (g, 2t), (g, 2t+1); a1 = (g+8, 2t..); a2 = (g, 2t+8..);
 * a3 = (g+8, 2t+8..); B (16 x 8, k x n): b0 = (2t, g), (2t+1, g);
 * b1 = (2t+8, g), (2t+9, g); C: c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = row g+8.
 * The first element of a pair is the low half of the register. */
static inline float lm_emu_half(uint32_t r, int hi, bool f16) {
  uint16_t h = (uint16_t)(hi ? r >> 16 : r & 0xffff);
  if (f16) {
    __half_raw raw;
    raw.x = h;
    return __half2float(__half(raw));
  }
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline void lm_emu_mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool f16) {
  int me = lm_emu_linear(), base = me & ~31, g = (me & 31) >> 2, t = me & 3;
  memcpy(lm_emu::mma_a[me], a, sizeof a);
  memcpy(lm_emu::mma_b[me], b, sizeof b);
  __syncwarp();
  float A[16][16], B[16][8];
  for (int L = 0; L < 32; L++) {
    int gg = L >> 2, tt = L & 3;
    const uint32_t *ra = lm_emu::mma_a[base + L], *rb = lm_emu::mma_b[base + L];
    for (int h = 0; h < 2; h++) {
      A[gg][2 * tt + h] = lm_emu_half(ra[0], h, f16);
      A[gg + 8][2 * tt + h] = lm_emu_half(ra[1], h, f16);
      A[gg][2 * tt + 8 + h] = lm_emu_half(ra[2], h, f16);
      A[gg + 8][2 * tt + 8 + h] = lm_emu_half(ra[3], h, f16);
      B[2 * tt + h][gg] = lm_emu_half(rb[0], h, f16);
      B[2 * tt + 8 + h][gg] = lm_emu_half(rb[1], h, f16);
    }
  }
  __syncwarp();
  for (int e = 0; e < 4; e++) {
    int row = g + (e >> 1) * 8, col = 2 * t + (e & 1);
    double s = c[e];
    for (int k = 0; k < 16; k++) s += (double)A[row][k] * B[k][col];
    c[e] = (float)s;
  }
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the
 * address of row l % 8 of tile l / 8 (16-byte aligned); register i of lane
 * 4g + t gets tile i's (row g, cols 2t, 2t+1), or transposed its (rows 2t,
 * 2t+1, col g); the first element in the low half. */
static inline void lm_emu_ldmatrix(uint32_t (&r)[4], const void *row, bool trans) {
  int me = lm_emu_linear(), base = me & ~31, g = (me & 31) >> 2, t = me & 3;
  if ((uintptr_t)row & 15) { fprintf(stderr, "emu: ldmatrix row address %p not 16-byte aligned\n", row); abort(); }
  lm_emu::ldm_row[me] = row;
  __syncwarp();
  for (int i = 0; i < 4; i++) {
    uint16_t lo, hi;
    if (!trans) {
      const uint16_t *p = (const uint16_t *)lm_emu::ldm_row[base + 8 * i + g];
      lo = p[2 * t], hi = p[2 * t + 1];
    } else {
      lo = ((const uint16_t *)lm_emu::ldm_row[base + 8 * i + 2 * t])[g];
      hi = ((const uint16_t *)lm_emu::ldm_row[base + 8 * i + 2 * t + 1])[g];
    }
    r[i] = (uint32_t)lo | (uint32_t)hi << 16;
  }
  __syncwarp();
}

namespace lm_emu {
static void trampoline() {
  body();
  threads[current].state = DONE;
  LM_EMU_TO_SCHEDULER(threads[current]);
}

/* runs body for every thread of one block until all are done */
static void run_block(dim3 block) {
  nthreads = (int)(block.x * block.y * block.z);
  if (nthreads > 1024 || nthreads % 32) { fprintf(stderr, "emu: block of %d threads\n", nthreads); abort(); }
  threads.assign(nthreads, Thread());
  for (int i = 0; i < nthreads; i++) {
#ifdef __x86_64__ /* six zeroed registers, then trampoline as the return address */
    void **top = (void **)(stack_of(i) + STACK);
    void **sp = top - 8;
    for (int r = 0; r < 6; r++) sp[r] = NULL;
    sp[6] = (void *)trampoline, sp[7] = NULL;
    threads[i].sp = sp;
#else
    getcontext(&threads[i].ctx);
    threads[i].ctx.uc_stack.ss_sp = stack_of(i);
    threads[i].ctx.uc_stack.ss_size = STACK;
    threads[i].ctx.uc_link = NULL;
    makecontext(&threads[i].ctx, trampoline, 0);
#endif
    threads[i].state = RUN;
  }
  std::mt19937 rng(seed++);
  std::vector<int> order(nthreads);
  for (int i = 0; i < nthreads; i++) order[i] = i;
  for (;;) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int i : order) {
      if (threads[i].state != RUN) continue;
      current = i;
      threadIdx = dim3(i % block.x, i / block.x % block.y, i / (block.x * block.y));
      LM_EMU_TO_THREAD(threads[i]);
    }
    int done = 0, at_block = 0;
    for (int i = 0; i < nthreads; i++) done += threads[i].state == DONE, at_block += threads[i].state == WAIT_BLOCK;
    if (done == nthreads) return;
    bool opened = false;
    for (int w = 0; w < nthreads / 32; w++) { /* a warp barrier opens when its whole warp waits */
      int n = 0;
      for (int l = 0; l < 32; l++) n += threads[32 * w + l].state == WAIT_WARP;
      if (n == 32) {
        for (int l = 0; l < 32; l++) threads[32 * w + l].state = RUN;
        opened = true, barriers++;
      }
    }
    if (!opened && at_block + done == nthreads) { /* exited threads count as arrived */
      for (int i = 0; i < nthreads; i++)
        if (threads[i].state == WAIT_BLOCK) threads[i].state = RUN;
      opened = true, barriers++;
    }
    if (!opened) { fprintf(stderr, "emu: deadlock (threads wait at different barriers)\n"); abort(); }
  }
}

/* a kernel argument that is a pointer, or a struct with a `base` array of
 * them (lm_walk), must be device memory of the current device */
template <typename T, typename = void> struct has_base : std::false_type {};
template <typename T> struct has_base<T, std::void_t<decltype(std::declval<T>().base[0])>> : std::true_type {};
template <typename T, typename = void> struct has_narg : std::false_type {};
template <typename T> struct has_narg<T, std::void_t<decltype(std::declval<T>().narg)>> : std::true_type {};
template <typename T> int check_arg(const T &v, const void *k) {
  if constexpr (std::is_pointer_v<T>) return pointer_check((const void *)v, k);
  else if constexpr (has_base<T>::value) {
    typedef std::remove_reference_t<decltype(v.base)> B;
    if constexpr (std::is_array_v<B>) {
      size_t n = std::extent_v<B>;
      if constexpr (has_narg<T>::value) n = (size_t)v.narg; /* lm_walk: the operands it has */
      for (size_t i = 0; i < n; i++)
        if (int e = pointer_check((const void *)v.base[i], k)) return e;
    } else if constexpr (std::is_pointer_v<B>) return pointer_check((const void *)v.base, k);
  }
  return 0;
}

template <typename... P> struct launcher {
  dim3 grid, block;
  size_t smem;
  void (*kernel)(P...);
  template <typename... A> void operator()(A... args) {
    std::tuple<P...> params(static_cast<P>(args)...);
    if (launch_check) {
      int e = launch_check((const void *)kernel, grid, block, smem);
      if (!e) e = std::apply([&](const P &...p) { int r = 0; ((r = r ? r : check_arg(p, (const void *)kernel)), ...); return r; }, params);
      if (e) { launch_error(e); return; }
    }
    gridDim = grid, blockDim = block;
    body = [&] { std::apply(kernel, params); };
    for (unsigned z = 0; z < grid.z; z++)
      for (unsigned y = 0; y < grid.y; y++)
        for (unsigned x = 0; x < grid.x; x++) {
          blockIdx = dim3(x, y, z);
          memset(dynamic_smem, 0x7F, sizeof dynamic_smem); /* poison (huge or NaN in every dtype) */
          run_block(block);
        }
  }
};
template <typename... P> launcher<P...> launch(dim3 grid, dim3 block, size_t smem, void (*k)(P...)) {
  if (smem > sizeof dynamic_smem && !launch_check) { fprintf(stderr, "emu: %zu bytes of shared memory\n", smem); abort(); }
  return launcher<P...>{grid, block, smem, k};
}
} // namespace lm_emu

#define LM_LAUNCH(grid, block, smem, ...) lm_emu::launch((grid), (block), (smem), __VA_ARGS__)
#define LM_DYNAMIC_SMEM(name) unsigned char *name = lm_emu::dynamic_smem
#endif
