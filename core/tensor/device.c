/* device.c: device names and numbers, and the registry of backends: one
 * per device kind, registered by the backend itself when the library loads. */
#include "tensor.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const lm_backend *backends[LM_NKINDS];

int lm_register_backend(int kind, const lm_backend *b) {
  if (kind < 0 || kind >= LM_NKINDS) return lm_error("register_backend: unknown device kind %d", kind);
  if (!b || !b->name || !b->alloc || !b->free || !b->copy || !b->fill)
    return lm_error("register_backend: a backend needs name, alloc, free, copy and fill");
  backends[kind] = b;
  return 0;
}

int lm_device_kind(int device) {
  if (device == LM_CPU) return LM_KIND_CPU;
  if (device >= LM_CUDA0 && device < LM_CUDA0 + 100) return LM_KIND_CUDA;
  return -1;
}

const lm_backend *lm_backend_registered(int device) {
  int kind = lm_device_kind(device);
  return kind >= 0 ? backends[kind] : NULL;
}

const lm_backend *lm_backend_of(int device) {
  int kind = lm_device_kind(device);
  const lm_backend *b = kind >= 0 ? backends[kind] : NULL;
  if (!b) {
    char name[32];
    lm_device_name(device, name, sizeof name);
    lm_error("device %s: this build of loom has no kernels for it", name);
    return NULL;
  }
  if (b->select && b->select(device - (kind == LM_KIND_CUDA ? LM_CUDA0 : 0)) < 0) return NULL;
  return b;
}

int lm_device_available(int device) { return lm_backend_of(device) != NULL; }

int lm_device_from_name(const char *name) {
  if (!name) return lm_error("device: expected \"cpu\", \"cuda\" or \"cuda:N\", got nil");
  if (!strcmp(name, "cpu")) return LM_CPU;
  if (!strcmp(name, "cuda")) return LM_CUDA0;
  if (!strncmp(name, "cuda:", 5)) {
    char *end;
    long k = strtol(name + 5, &end, 10);
    if (*end == 0 && end != name + 5 && k >= 0 && k < 100) return LM_CUDA0 + (int)k;
  }
  return lm_error("device: expected \"cpu\", \"cuda\" or \"cuda:N\", got \"%s\"", name);
}

int lm_device_name(int device, char *buf, int len) {
  if (device == LM_CPU) return snprintf(buf, len, "cpu");
  return snprintf(buf, len, "cuda:%d", device - LM_CUDA0);
}

static int matmul_precision = LM_PRECISION_HIGHEST;

int lm_set_float32_matmul_precision(int p) {
  if (p != LM_PRECISION_HIGHEST && p != LM_PRECISION_HIGH)
    return lm_error("set_float32_matmul_precision: expected \"highest\" or \"high\", got %d", p);
  matmul_precision = p;
  return 0;
}
int lm_float32_matmul_precision(void) { return matmul_precision; }

int lm_device_memory_stats(int device, int64_t *stats) {
  const lm_backend *b = lm_backend_of(device);
  if (!b) return -1;
  if (!b->memory_stats) return lm_error("memory_stats: the %s backend keeps no counters", b->name);
  return b->memory_stats(device - (lm_device_kind(device) == LM_KIND_CUDA ? LM_CUDA0 : 0), stats);
}
