/* counters.cpp: what the emulated runtime counts (runtime.h's counter), for
 * loom.cuda.emu_counters(): the things a real GPU run must not do read 0
 * in the specs that assert them (spec/cuda_emu_spec.lua). */
#include "runtime.h"
#include <atomic>

static std::atomic<int64_t> counts[lm_rt::C_N];
static const char *names[lm_rt::C_N] = {"contexts_other_device", "sync_d2h_copies", "f32_gemms_under_autocast",
                                        "unordered_stream_reuse", "kernels", "gemms", "collectives",
                                        "refused_calls", "mapped_host_kernels", "device_syncs", "not_ready_queries",
                                        "shared_memory_refusals", "grouped_gemms"};

void lm_rt::count(counter c, int64_t n) { counts[c] += n; }

extern "C" {
/* the counters' names, NULL past the last */
const char *lm_cuda_emu_counter_name(int i) { return i >= 0 && i < lm_rt::C_N ? names[i] : NULL; }
/* the counters into out[0..n), zeroed after when reset (the contexts
 * counter is not: a context, once made, stays); returns how many there are */
int lm_cuda_emu_counters(int64_t *out, int n, int reset) {
  for (int i = 0; i < n && i < lm_rt::C_N; i++) {
    out[i] = counts[i];
    if (reset && i != lm_rt::C_CONTEXTS_OTHER) counts[i] = 0;
  }
  return lm_rt::C_N;
}
}
