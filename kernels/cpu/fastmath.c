/* fastmath.c: the clamp bounds of lm_expf, -88 and 89 (see fastmath.h). */
#include "fastmath.h"

__attribute__((visibility("hidden"))) uint32_t lm_expf_bounds[2] = {0xc2b00000u, 0x42b20000u};
