/* poison.h: the emulator's poison, what fresh device memory, blocks the
 * caching allocator hands out, shared memory and async copies' pinned
 * destinations hold until written: the 16-bit word 0x7FFF repeated, a
 * quiet NaN in every float dtype loom has (f32 0x7FFF7FFF, f64
 * 0x7FFF7FFF7FFF7FFF, bf16 and f16 0x7FFF) and a huge id in i32 and i64.
 * Positive on purpose: LuaJIT keeps its own values in the negative quiet
 * NaNs, so a 0xFF..FF "NaN" read through the FFI comes back as nil. */
#ifndef LOOM_CUDA_EMU_POISON_H
#define LOOM_CUDA_EMU_POISON_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline void lm_emu_poison(void *p, size_t n) {
  unsigned char *b = (unsigned char *)p;
  size_t i = 0;
  if ((uintptr_t)b & 1) b[i++] = 0x7F; /* the high byte of a word that starts before p */
  uint16_t w = 0x7FFF;
  for (; i + 2 <= n; i += 2) memcpy(b + i, &w, 2);
  if (i < n) b[i] = 0xFF;
}
#endif
