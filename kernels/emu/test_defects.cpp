/* test_defects.cpp: the emulator fails where a GPU would. Tiny kernels
 * with a defect planted on purpose (compiled only here) run under emu.h
 * next to their correct twins: the twin must give the right answer and
 * the defective one a wrong answer (or a fault), under the schedule seed
 * of the run (LOOM_EMU_SEED; scripts/test_emu.sh runs several):
 *   - a missing __syncthreads between a store to shared memory and another
 *     thread's load of it;
 *   - a missing __syncwarp before a shuffle or an ldmatrix that reads what
 *     other lanes stored (caught in the loose mode, where those do not
 *     order memory, LOOM_EMU_LOOSE_WARPS=1; a GPU's memory model does not
 *     let them either);
 *   - a read of static shared memory before any write (poisoned for every
 *     block, not the previous block's values);
 *   - a read past the end of dynamic shared memory (a guard page: the
 *     kernel faults, in a child process).
 * Ends with "test_emu_defects: N passed, N failed". */
#include "emu.h"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static int passed, failed;
static void expect(const char *what, bool ok) {
  ok ? passed++ : failed++;
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}
static bool same(const float *a, const float *b, int n) {
  for (int i = 0; i < n; i++)
    if (!(a[i] == b[i])) return false;
  return true;
}

/* ---- block barrier: y = x reversed within each block of 256 ---- */
__global__ void reverse_kernel(const float *x, float *y, int barrier) {
  __shared__ float s[256];
  int i = blockIdx.x * 256 + threadIdx.x;
  s[threadIdx.x] = x[i];
  if (barrier) __syncthreads(); /* planted when 0: another thread's slot may not be written yet */
  y[i] = s[255 - threadIdx.x];
}
static void block_barrier_cases() {
  const int B = 8, N = 256 * B;
  std::vector<float> x(N), y(N), want(N);
  for (int i = 0; i < N; i++) x[i] = (float)i, want[i] = (float)(i / 256 * 256 + 255 - i % 256);
  LM_LAUNCH(B, 256, 0, reverse_kernel)(x.data(), y.data(), 1);
  expect("reverse through shared memory with __syncthreads: right", same(y.data(), want.data(), N));
  LM_LAUNCH(B, 256, 0, reverse_kernel)(x.data(), y.data(), 0);
  expect("reverse through shared memory without __syncthreads (planted): wrong", !same(y.data(), want.data(), N));
}

/* ---- warp: lane l adds lane l^2's stored value to its shuffled partner's ---- */
__global__ void shuffle_kernel(const float *x, float *y, int sync) {
  __shared__ float s[256];
  int l = threadIdx.x, i = blockIdx.x * blockDim.x + l;
  s[l] = x[i];
  if (sync) __syncwarp(); /* planted when 0: the shuffle below orders no memory */
  float v = __shfl_xor_sync(0xffffffffu, x[i], 1);
  y[i] = s[l ^ 2] + v;
}
/* ldmatrix: each lane stores the row another lane's address names */
__global__ void ldmatrix_kernel(const uint16_t *x, uint32_t *y, int sync) {
  __shared__ uint16_t s[32 * 8];
  int l = threadIdx.x, w = (l + 5) % 32;
  for (int c = 0; c < 8; c++) s[w * 8 + c] = x[blockIdx.x * 256 + w * 8 + c];
  if (sync) __syncwarp(); /* planted when 0: ldmatrix orders no memory */
  uint32_t r[4];
  lm_emu_ldmatrix(r, s + l * 8, false);
  for (int k = 0; k < 4; k++) y[(blockIdx.x * 32 + l) * 4 + k] = r[k];
}
static void warp_cases(bool loose) {
  bool was = lm_emu::config().loose;
  lm_emu::config().loose = loose;
  const char *mode = loose ? "loose warps" : "strict warps";
  const int B = 16, N = 32 * B;
  std::vector<float> x(N), y(N), want(N);
  for (int i = 0; i < N; i++) x[i] = (float)i;
  for (int i = 0; i < N; i++) want[i] = x[(i & ~31) | ((i & 31) ^ 2)] + x[(i & ~31) | ((i & 31) ^ 1)];
  char what[160];
  LM_LAUNCH(B, 32, 0, shuffle_kernel)(x.data(), y.data(), 1);
  snprintf(what, sizeof what, "%s: store, __syncwarp, shuffle, load another lane's store: right", mode);
  expect(what, same(y.data(), want.data(), N));
  LM_LAUNCH(B, 32, 0, shuffle_kernel)(x.data(), y.data(), 0);
  bool ok = same(y.data(), want.data(), N);
  snprintf(what, sizeof what, "%s: the same without __syncwarp (planted): %s", mode, loose ? "wrong" : "right (strict cannot see it)");
  expect(what, loose ? !ok : ok);

  std::vector<uint16_t> h(256 * B);
  for (size_t i = 0; i < h.size(); i++) h[i] = (uint16_t)(i * 7 + 1);
  std::vector<uint32_t> r(128 * B), rw(128 * B);
  for (int b = 0; b < B; b++) /* register k of lane 4g + t: row 8k + g, columns 2t, 2t + 1 */
    for (int l = 0; l < 32; l++)
      for (int k = 0; k < 4; k++) {
        const uint16_t *row = &h[b * 256 + (8 * k + l / 4) * 8 + 2 * (l % 4)];
        rw[(b * 32 + l) * 4 + k] = (uint32_t)row[0] | (uint32_t)row[1] << 16;
      }
  LM_LAUNCH(B, 32, 0, ldmatrix_kernel)(h.data(), r.data(), 1);
  snprintf(what, sizeof what, "%s: store rows, __syncwarp, ldmatrix: right", mode);
  expect(what, r == rw);
  LM_LAUNCH(B, 32, 0, ldmatrix_kernel)(h.data(), r.data(), 0);
  snprintf(what, sizeof what, "%s: the same without __syncwarp (planted): %s", mode, loose ? "wrong" : "right (strict cannot see it)");
  expect(what, loose ? r != rw : r == rw);
  lm_emu::config().loose = was;
}

/* ---- shared memory poisoned for every block ---- */
__global__ void stale_kernel(float *y) {
  __shared__ float s[64];
  y[blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x]; /* planted: read before any write */
  s[threadIdx.x] = 1.f;
}
__global__ void dynamic_kernel(float *y, int past) {
  LM_DYNAMIC_SMEM(smem);
  float *s = (float *)smem;
  y[threadIdx.x] = s[threadIdx.x + (past ? 32 : 0)]; /* planted when past: 128 bytes past its end */
}
static void smem_cases() {
  std::vector<float> y(64 * 4, 0);
  LM_LAUNCH(4, 64, 0, stale_kernel)(y.data());
  bool nan = true;
  for (float v : y) nan = nan && v != v;
  expect("static shared memory read before a write: NaN in every block (not the last block's values)", nan);
  LM_LAUNCH(1, 32, 128, dynamic_kernel)(y.data(), 0);
  nan = true;
  for (int i = 0; i < 32; i++) nan = nan && y[i] != y[i];
  expect("dynamic shared memory read before a write: NaN", nan);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    LM_LAUNCH(1, 32, 128, dynamic_kernel)(y.data(), 1);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  expect("a read past the end of dynamic shared memory (planted) faults (in a child)",
         WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
}

int main() {
  printf("schedule seed %llu\n", (unsigned long long)lm_emu::config().seed);
  block_barrier_cases();
  warp_cases(false);
  warp_cases(true);
  smem_cases();
  printf("test_emu_defects: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
