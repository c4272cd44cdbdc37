/* checksum.c: FNV-1a, the checksum of checkpoint files. */
#include "tensor.h"

uint64_t lm_fnv1a(const void *p, size_t n, uint64_t h) {
  const unsigned char *b = p;
  if (h == 0) h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}
