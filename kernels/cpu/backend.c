/* backend.c: the CPU backend, one table of kernels (see lm_backend). */
#include "kernels.h"
#include <stdlib.h>
#include <string.h>

/* each slot of LM_SLOTS and LM_FUSED_SLOTS by its lm_cpu_ kernel */
#define CPU_SLOT(slot) .slot = lm_cpu_##slot,
static lm_backend cpu_backend = {
    .name = "cpu",
    .info = lm_blas_info,
    LM_SLOTS(CPU_SLOT)
    LM_FUSED_SLOTS(CPU_SLOT)
    .attention_strided = 1,
    .binary_low = 1,
};

/* LOOM_CPU_FUSED=0 leaves the fused slots empty, so ops run their composed
 * forms: how the specs check those on a machine whose backend has both. */
static void drop_fused(lm_backend *b) {
#define DROP(slot) b->slot = NULL;
  LM_FUSED_SLOTS(DROP)
#undef DROP
}

/* Registered when libloom loads: the CPU is always there. */
__attribute__((constructor)) static void register_cpu(void) {
  const char *e = getenv("LOOM_CPU_FUSED");
  if (e && !strcmp(e, "0")) drop_fused(&cpu_backend);
  lm_register_backend(LM_KIND_CPU, &cpu_backend);
}
