/* fault.cpp: a fault in emulated memory, named. Device memory is closed
 * to the host (memory.cpp), every allocation and the dynamic shared
 * memory end at a page no access may touch, and every emulated thread's
 * stack sits above one (emu.h): an access there stops the process with a
 * line saying what touched what (host code, and its call stack; or the
 * work running on the device: a kernel with its block and thread, a copy,
 * a GEMM, a collective), then dies of the SIGSEGV as it would have. A
 * fault anywhere else goes to the handler that was there before (MPI's,
 * or the default). */
#include "emu.h"
#include "runtime.h"
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

namespace {
struct sigaction before;
char altstack[64 << 10];

void say(const char *s) { (void)!write(2, s, strlen(s)); }

/* what a is among the emulator's own pages (besides the allocations) */
bool describe_emu(const void *a, char *buf, size_t len) {
  uintptr_t x = (uintptr_t)a;
  uintptr_t s = (uintptr_t)lm_emu::smem_area, st = (uintptr_t)lm_emu::stack_area;
  if (s && x >= s + lm_emu::SMEM_MAX && x < s + lm_emu::SMEM_MAX + lm_emu::PAGE) {
    snprintf(buf, len, "%p, %zu bytes past the end of its dynamic shared memory", a, (size_t)(x - s - lm_emu::SMEM_MAX));
    return true;
  }
  if (st && x >= st && x < st + 1024 * lm_emu::SLOT && (x - st) % lm_emu::SLOT < lm_emu::PAGE) {
    snprintf(buf, len, "%p, past the end of the %zu-byte stack of emulated thread %zu (a stack overflow)", a,
             lm_emu::STACK, (size_t)((x - st) / lm_emu::SLOT));
    return true;
  }
  return false;
}

void on_fault(int sig, siginfo_t *si, void *uc) {
  char where[256], line[768];
  if (!lm_rt::describe(si->si_addr, where, sizeof where) && !describe_emu(si->si_addr, where, sizeof where)) {
    sigaction(SIGSEGV, &before, NULL); /* not ours: returning faults again, into the handler before */
    return;
  }
  const lm_rt::work *w = lm_rt::running();
  if (w && w->what.compare(0, 7, "kernel ") == 0)
    snprintf(line, sizeof line, "cuda emulator: %s, block (%u, %u, %u) thread (%u, %u, %u), touched %s\n",
             w->what.c_str(), blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z, where);
  else if (w)
    snprintf(line, sizeof line, "cuda emulator: %s touched %s\n", w->what.c_str(), where);
  else
    snprintf(line, sizeof line,
             "cuda emulator: host code touched device memory: %s. Only kernels, copies, GEMMs and collectives "
             "may read or write it (copy it to the CPU first). The call, innermost first:\n", where);
  say(line);
  if (!w) {
    void *frames[32];
    backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
  }
  (void)sig, (void)uc;
  signal(SIGSEGV, SIG_DFL); /* returning faults again, and the process dies of it */
}
} // namespace

void lm_rt::install_fault_handler() {
  struct sigaction sa, cur;
  sigaction(SIGSEGV, NULL, &cur);
  if (cur.sa_sigaction == on_fault) return;
  stack_t ss;
  ss.ss_sp = altstack, ss.ss_size = sizeof altstack, ss.ss_flags = 0;
  sigaltstack(&ss, NULL); /* a fiber's overflowed stack cannot run the handler */
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &before);
  void *frame[1];
  backtrace(frame, 1); /* loads what backtrace needs now, not in the handler */
}
