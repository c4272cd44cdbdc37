/* emu.h: runs CUDA kernels of kernels/ on the CPU, for a machine without a
 * GPU. Included before a kernel file, it turns a launch (LM_LAUNCH) into a
 * loop over the grid that runs each block's threads as coroutines (a
 * six-register stack switch on x86-64, ucontext elsewhere) in one OS
 * thread: a thread runs until it reaches a barrier (__syncthreads,
 * __syncwarp, a shuffle, an mma, an ldmatrix), and a barrier opens when
 * every thread it waits for has arrived. mma.m16n8k16 and ldmatrix follow
 * the PTX ISA's definitions of their fragments, independently of how
 * tile.cuh uses them.
 *
 * The schedule is adversarial and seeded (LOOM_EMU_SEED=N, 1 when unset):
 * the next thread to run is drawn at random; an opened block barrier
 * releases its warps in random subsets, so a warp may run to its next
 * barrier before another has run at all; a warp barrier opens as soon as
 * its last lane arrives. With LOOM_EMU_LOOSE_WARPS=1 a shuffle, mma or
 * ldmatrix waits only for the lanes whose values it needs (ldmatrix reads
 * each row when its lane arrives), so it orders no other memory access of
 * the warp, as on a GPU without __syncwarp. Shared memory is poisoned
 * (poison.h: NaN in every float dtype) for every block, static as well as
 * dynamic, and the dynamic part ends at a page no access may touch.
 *
 * What it checks: the kernels' index arithmetic, masks, loops, barriers
 * between phases, and the host code around them. What it cannot: the
 * hardware's timing, memory ordering beyond barriers, and speed.
 *
 * The state is C++17 inline variables: one copy however many kernel files
 * include this (the emulated build, kernels/emu/CMakeLists.txt, includes it
 * in every kernel file of kernels/cuda/). That build's runtime (runtime.h)
 * sets the hooks below, which check each launch and queue it on its stream;
 * test_emu.cpp leaves them unset, and a launch runs at once. */
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
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include "poison.h"

/* one block runs at a time: a static is its shared memory; all of them sit
 * in one section, which every block starts with poisoned */
#undef __shared__
#define __shared__ static __attribute__((section("lm_emu_shared"), aligned(16)))
#define __launch_bounds__(...)
extern "C" unsigned char __start_lm_emu_shared[] __attribute__((weak));
extern "C" unsigned char __stop_lm_emu_shared[] __attribute__((weak));

namespace lm_emu {
enum { RUN = 0, WAIT_BLOCK = 1, WAIT_WARP = 2, DONE = 3, YIELD = 4 };
struct Thread {
#ifdef __x86_64__
  void *sp; /* its saved stack pointer (lm_emu_switch) */
#else
  ucontext_t ctx;
#endif
  int state;
};
static const size_t STACK = 64 << 10, PAGE = 4096;
inline std::vector<Thread> threads;
/* maps len bytes whose first (or last) page no access may touch */
static inline char *map_guarded(size_t len, bool guard_last) {
  void *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (a == MAP_FAILED) { fprintf(stderr, "emu: cannot map %zu bytes\n", len); abort(); }
  mprotect(guard_last ? (char *)a + len - PAGE : (char *)a, PAGE, PROT_NONE);
  return (char *)a;
}
/* 1024 stacks, each above a page no access may touch: a thread that
 * overflows its stack faults there instead of writing over another's */
static const size_t SLOT = STACK + PAGE;
inline char *stack_area;
static inline char *stack_of(int i) {
  if (!stack_area) {
    stack_area = map_guarded(1024 * SLOT, false);
    for (int t = 1; t < 1024; t++) mprotect(stack_area + t * SLOT, PAGE, PROT_NONE);
  }
  return stack_area + (size_t)i * SLOT + PAGE;
}
/* dynamic shared memory: up to SMEM_MAX bytes ending where a page no access
 * may touch begins; a launch's smem (rounded up to 16 bytes) ends there */
static const size_t SMEM_MAX = 256 << 10;
inline char *smem_area;
inline unsigned char *dynamic_smem; /* LM_DYNAMIC_SMEM: this launch's */
#ifdef __x86_64__
inline void *scheduler;
#else
inline ucontext_t scheduler;
#endif
inline int current, nthreads;
inline std::function<void()> body;
inline uint64_t exchange[1024];   /* a shuffle's values, by thread */
inline uint32_t mma_a[1024][4], mma_b[1024][2];
inline const void *ldm_row[1024]; /* an ldmatrix's row addresses, by thread */
inline uint16_t ldm_data[1024][8]; /* loose: the row each thread read when it arrived */
inline uint32_t arrived[1024], consumed[1024]; /* loose: collectives each thread deposited for, read */
inline long barriers;             /* opened, for the report */
inline uint64_t progress;         /* loose: deposits and reads made (a yielding lane that moved on) */

/* the schedule's settings, from the environment once (test_emu.cpp
 * changes them between its cases) */
struct settings { uint64_t seed; bool loose; };
static inline settings &config() {
  static settings s = [] {
    const char *e = getenv("LOOM_EMU_SEED"), *l = getenv("LOOM_EMU_LOOSE_WARPS");
    return settings{e && *e ? strtoull(e, NULL, 10) : 1, l && *l == '1'};
  }();
  return s;
}
inline uint64_t blocks_run; /* every block's schedule draws from (seed, its number) */
struct rng { /* splitmix64 */
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL, z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return (uint32_t)((next() >> 32) * n >> 32); }
};

/* What a launch hands the runtime's hooks: the blocks of device memory its
 * arguments point into, and the error its first bad pointer would fault
 * with when it runs (an illegal address is found on a GPU only then). */
struct launch_info {
  const void *kernel;
  const char *name; /* the kernel as the launch names it: "attn_fwd_kernel<T, D>" */
  dim3 grid, block;
  size_t smem;
  std::vector<const void *> blocks;
  int fault;
};
/* The emulated runtime's hooks (unset: none, and a launch runs at once;
 * poison_block: alloc.cu's blocks are not poisoned).
 * launch_check answers 0 for a launch it takes, or the error (cudaError_t)
 * that the launch leaves as the last error instead; pointer_check looks at
 * a pointer argument (device memory of the current device, mapped host
 * memory, or NULL, else info.fault); word_check at every aligned word of
 * every argument (a pointer inside a struct: its block is recorded); submit
 * queues the launch's work. */
inline int (*launch_check)(launch_info &);
inline void (*pointer_check)(const void *p, launch_info &);
inline void (*word_check)(uint64_t w, launch_info &);
inline void (*submit)(launch_info &, std::function<void()> &&work);
inline void (*launch_error)(int e);
/* poisons n bytes of device memory at p, stream-ordered (alloc.cu: every
 * block the caching allocator hands out) */
inline void (*poison_block)(void *p, size_t n);
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

/* A warp collective: deposit() leaves this lane's part, read() takes the
 * parts of the lanes in `need` (a mask of lanes of this warp); `feeds` are
 * the lanes that read this one's. By default the whole warp meets before
 * and after (every lane's earlier stores are seen, as __syncwarp makes
 * them); loose, a lane waits only for the lanes in need to have deposited
 * and, before it goes on, for those in feeds to have read. */
template <typename D, typename R> static inline void lm_emu_collective(uint32_t need, uint32_t feeds, D deposit, R read) {
  if (!lm_emu::config().loose) {
    deposit();
    __syncwarp();
    read();
    __syncwarp();
    return;
  }
  int me = lm_emu_linear(), base = me & ~31;
  uint32_t k = ++lm_emu::arrived[me];
  deposit();
  lm_emu::progress++;
  auto all = [&](uint32_t mask, const uint32_t *count) {
    for (int l = 0; l < 32; l++)
      if ((mask >> l & 1) && count[base + l] < k) return false;
    return true;
  };
  while (!all(need, lm_emu::arrived)) lm_emu_wait(lm_emu::YIELD);
  read();
  lm_emu::consumed[me] = k;
  lm_emu::progress++;
  while (!all(feeds, lm_emu::consumed)) lm_emu_wait(lm_emu::YIELD);
}

template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
  static_assert(sizeof(T) <= 8, "shuffle of a word");
  int me = lm_emu_linear(), src = (me & ~31) | ((me & 31) ^ o);
  uint32_t pair = 1u << ((me & 31) ^ o);
  T r;
  lm_emu_collective(pair, pair, [&] { memcpy(&lm_emu::exchange[me], &v, sizeof v); },
                    [&] { memcpy(&r, &lm_emu::exchange[src], sizeof r); });
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
  /* rows g, g + 8 of A: lanes 4g..4g+3; columns 2t, 2t+1 of B: lanes 8t..8t+7 */
  uint32_t need = 0xFu << 4 * g | 0xFFu << 8 * t, feeds = 0xFu << 4 * g | 0x11111111u << (g >> 1);
  float A[16][16], B[16][8];
  lm_emu_collective(need, feeds, [&] {
    memcpy(lm_emu::mma_a[me], a, sizeof a);
    memcpy(lm_emu::mma_b[me], b, sizeof b);
  }, [&] {
    for (int L = 0; L < 32; L++) {
      if (!(need >> L & 1)) continue;
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
  });
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
 * 2t+1, col g); the first element in the low half. Loose, each lane reads
 * its row when it arrives. */
static inline void lm_emu_ldmatrix(uint32_t (&r)[4], const void *row, bool trans) {
  int me = lm_emu_linear(), base = me & ~31, l = me & 31, g = l >> 2, t = l & 3;
  if ((uintptr_t)row & 15) { fprintf(stderr, "emu: ldmatrix row address %p not 16-byte aligned\n", row); abort(); }
  /* the lanes whose rows this lane's registers hold, and those holding this lane's row */
  uint32_t need = trans ? 0x03030303u << 2 * t : 0x01010101u << g;
  uint32_t feeds = trans ? 0x11111111u << ((l & 7) >> 1) : 0xFu << 4 * (l & 7);
  bool loose = lm_emu::config().loose;
  auto word = [&](int lane, int col) -> uint16_t {
    return loose ? lm_emu::ldm_data[base + lane][col] : ((const uint16_t *)lm_emu::ldm_row[base + lane])[col];
  };
  lm_emu_collective(need, feeds, [&] {
    if (loose) memcpy(lm_emu::ldm_data[me], row, 16);
    else lm_emu::ldm_row[me] = row;
  }, [&] {
    for (int i = 0; i < 4; i++) {
      uint16_t lo = trans ? word(8 * i + 2 * t, g) : word(8 * i + g, 2 * t);
      uint16_t hi = trans ? word(8 * i + 2 * t + 1, g) : word(8 * i + g, 2 * t + 1);
      r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
  });
}

namespace lm_emu {
static void trampoline() {
  body();
  threads[current].state = DONE;
  LM_EMU_TO_SCHEDULER(threads[current]);
}

static inline void start_threads() {
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
    arrived[i] = consumed[i] = 0;
  }
}

/* Runs body for every thread of one block until all are done. The
 * threads that may run are those of the released warps; the next one runs
 * is drawn at random, until it waits. A warp barrier opens when its last
 * lane arrives; when nothing may run, the next random subset of the warps
 * a block barrier let go is released, or the block barrier opens (exited
 * threads count as arrived) and lets every warp go. */
static void run_block(dim3 block) {
  nthreads = (int)(block.x * block.y * block.z);
  if (nthreads > 1024 || nthreads % 32) { fprintf(stderr, "emu: block of %d threads\n", nthreads); abort(); }
  int nwarps = nthreads / 32;
  threads.assign(nthreads, Thread());
  start_threads();
  rng r{config().seed * 0x2545F4914F6CDD1DULL + blocks_run++};
  std::vector<int> ready, held; /* runnable threads; warps let go but not released yet */
  auto let_go = [&] {
    held.clear();
    for (int w = 0; w < nwarps; w++) held.push_back(w);
  };
  auto release = [&] { /* a random subset of the held warps: their threads waiting at the block barrier run */
    uint32_t n = 1 + r.below((uint32_t)held.size());
    for (uint32_t k = 0; k < n; k++) {
      uint32_t j = r.below((uint32_t)held.size());
      int w = held[j];
      held[j] = held.back(), held.pop_back();
      for (int i = 32 * w; i < 32 * w + 32; i++)
        if (threads[i].state != DONE) threads[i].state = RUN, ready.push_back(i);
    }
  };
  let_go();
  int done = 0, stalled = 0;
  for (;;) {
    if (ready.empty()) {
      if (!held.empty()) { release(); continue; }
      int at_block = 0;
      for (int i = 0; i < nthreads; i++) at_block += threads[i].state == WAIT_BLOCK;
      if (done == nthreads) return;
      if (at_block + done != nthreads) { fprintf(stderr, "emu: deadlock (threads wait at different barriers)\n"); abort(); }
      barriers++;
      let_go();
      continue;
    }
    uint32_t j = r.below((uint32_t)ready.size());
    int i = ready[j];
    current = i;
    threadIdx = dim3(i % block.x, i / block.x % block.y, i / (block.x * block.y));
    threads[i].state = RUN;
    uint64_t before = progress;
    LM_EMU_TO_THREAD(threads[i]);
    int s = threads[i].state;
    if (s == YIELD) { /* waits for lanes of its warp in a loose collective */
      stalled = progress == before ? stalled + 1 : 0;
      if (stalled > 64 * (int)ready.size() + 4096) { fprintf(stderr, "emu: deadlock (a warp collective some lanes never reach)\n"); abort(); }
      continue;
    }
    stalled = 0;
    ready[j] = ready.back(), ready.pop_back();
    if (s == DONE) done++;
    if (s == WAIT_WARP) { /* the last lane opens its warp's barrier */
      int w = i >> 5, n = 0;
      for (int l = 32 * w; l < 32 * w + 32; l++) n += threads[l].state == WAIT_WARP;
      if (n == 32) {
        for (int l = 32 * w; l < 32 * w + 32; l++) threads[l].state = RUN, ready.push_back(l);
        barriers++;
      }
    }
  }
}

/* runs the grid of a launch: every block with its shared memory poisoned */
template <typename... P>
void run_grid(void (*kernel)(P...), const std::tuple<P...> &params, dim3 grid, dim3 block, size_t smem) {
  if (!smem_area) smem_area = map_guarded(SMEM_MAX + PAGE, true);
  size_t dyn = (smem + 15) / 16 * 16;
  dynamic_smem = (unsigned char *)smem_area + SMEM_MAX - dyn;
  gridDim = grid, blockDim = block;
  body = [&] { std::apply(kernel, params); };
  size_t statics = __start_lm_emu_shared ? (size_t)(__stop_lm_emu_shared - __start_lm_emu_shared) : 0;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        blockIdx = dim3(x, y, z);
        lm_emu_poison(dynamic_smem, dyn);
        if (statics) lm_emu_poison(__start_lm_emu_shared, statics);
        run_block(block);
      }
  body = nullptr;
}

/* A kernel argument: a pointer (checked), a struct with a `base` array of
 * them (lm_walk: its operands, checked), and every aligned word of any
 * argument (a pointer inside a struct: its block is recorded). */
template <typename T, typename = void> struct has_base : std::false_type {};
template <typename T> struct has_base<T, std::void_t<decltype(std::declval<T>().base[0])>> : std::true_type {};
template <typename T, typename = void> struct has_narg : std::false_type {};
template <typename T> struct has_narg<T, std::void_t<decltype(std::declval<T>().narg)>> : std::true_type {};
template <typename T> void check_arg(const T &v, launch_info &info) {
  if constexpr (std::is_pointer_v<T>) pointer_check((const void *)v, info);
  else if constexpr (has_base<T>::value) {
    typedef std::remove_reference_t<decltype(v.base)> B;
    if constexpr (std::is_array_v<B>) {
      size_t n = std::extent_v<B>;
      if constexpr (has_narg<T>::value) n = (size_t)v.narg; /* lm_walk: the operands it has */
      for (size_t i = 0; i < n; i++) pointer_check((const void *)v.base[i], info);
    } else if constexpr (std::is_pointer_v<B>) pointer_check((const void *)v.base, info);
  }
  if constexpr (alignof(T) >= 8)
    for (size_t o = 0; o + 8 <= sizeof(T); o += 8) {
      uint64_t w;
      memcpy(&w, (const char *)&v + o, 8);
      word_check(w, info);
    }
}

template <typename... P> struct launcher {
  dim3 grid, block;
  size_t smem;
  void (*kernel)(P...);
  const char *name;
  /* the arguments are copied now, as a launch copies them */
  template <typename... A> void operator()(A... args) {
    std::tuple<P...> params(static_cast<P>(args)...);
    if (!launch_check) {
      if (smem > SMEM_MAX) { fprintf(stderr, "emu: %zu bytes of shared memory\n", smem); abort(); }
      run_grid(kernel, params, grid, block, smem);
      return;
    }
    launch_info info{(const void *)kernel, name, grid, block, smem, {}, 0};
    if (int e = launch_check(info)) { launch_error(e); return; }
    std::apply([&](const P &...p) { (check_arg(p, info), ...); }, params);
    auto k = kernel;
    dim3 g = grid, b = block;
    size_t sm = smem;
    submit(info, [k, params, g, b, sm] { run_grid(k, params, g, b, sm); });
  }
};
template <typename... P> launcher<P...> launch(dim3 grid, dim3 block, size_t smem, void (*k)(P...), const char *name) {
  return launcher<P...>{grid, block, smem, k, name};
}
} // namespace lm_emu

#define LM_LAUNCH(grid, block, smem, ...) lm_emu::launch((grid), (block), (smem), __VA_ARGS__, #__VA_ARGS__)
#define LM_DYNAMIC_SMEM(name) unsigned char *name = lm_emu::dynamic_smem
#endif
