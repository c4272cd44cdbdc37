/* device.c: device names and numbers, the registry of backends (one per
 * device kind, registered by the backend itself when the library loads),
 * the meta device's table, and the settings devices share. */
#include "tensor.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const lm_backend *backends[LM_NKINDS];
static int cuda_current; /* the device "cuda" names */

/* meta tensors have no data: nothing to allocate, copy into or fill
 * (lm_copy_ refuses to copy out of one; ops on them only infer shapes) */
static char meta_byte;
static void *meta_alloc(size_t n) { (void)n; return &meta_byte; }
static void meta_free(void *p) { (void)p; }
static int meta_copy(lm_tensor *dst, const lm_tensor *src) { (void)dst, (void)src; return 0; }
static int meta_fill(lm_tensor *t, double v) { (void)t, (void)v; return 0; }
static const lm_backend meta_backend = {
    .name = "meta", .alloc = meta_alloc, .free = meta_free, .copy = meta_copy, .fill = meta_fill};
__attribute__((constructor)) static void register_meta(void) { lm_register_backend(LM_KIND_META, &meta_backend); }

int lm_register_backend(int kind, const lm_backend *b) {
  if (kind < 0 || kind >= LM_NKINDS) return lm_error("register_backend: unknown device kind %d", kind);
  if (!b || !b->name || !b->alloc || !b->free || !b->copy || !b->fill)
    return lm_error("register_backend: a backend needs name, alloc, free, copy and fill");
  backends[kind] = b;
  return 0;
}

int lm_device_kind(int device) {
  if (device == LM_CPU) return LM_KIND_CPU;
  if (device == LM_META) return LM_KIND_META;
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

/* Asks the backend's count, selecting no device: init_device_mesh and
 * train.lua ask on every rank, and selecting would make a context on each
 * GPU asked about (the review's item 1). */
int lm_device_available(int device) {
  int kind = lm_device_kind(device);
  const lm_backend *b = kind >= 0 ? backends[kind] : NULL;
  if (!b || !b->count) return lm_backend_of(device) != NULL; /* no device to select */
  int n = b->count(), k = device - LM_CUDA0;
  if (n <= 0) return 0; /* count said why */
  if (k >= n) return lm_error("cuda:%d: expected a device in cuda:0..cuda:%d", k, n - 1), 0;
  return 1;
}

int lm_cuda_device_count(void) {
  const lm_backend *b = backends[LM_KIND_CUDA];
  if (!b) return lm_error("device cuda: this build of loom has no kernels for it"), 0;
  return b->count ? b->count() : 1;
}

int lm_device_from_name(const char *name) {
  if (!name) return lm_error("device: expected \"cpu\", \"cuda\", \"cuda:N\" or \"meta\", got nil");
  if (!strcmp(name, "cpu")) return LM_CPU;
  if (!strcmp(name, "meta")) return LM_META;
  if (!strcmp(name, "cuda")) return LM_CUDA0 + cuda_current;
  if (!strncmp(name, "cuda:", 5)) {
    char *end;
    long k = strtol(name + 5, &end, 10);
    if (*end == 0 && end != name + 5 && k >= 0 && k < 100) return LM_CUDA0 + (int)k;
  }
  return lm_error("device: expected \"cpu\", \"cuda\", \"cuda:N\" or \"meta\", got \"%s\"", name);
}

int lm_device_name(int device, char *buf, int len) {
  if (device == LM_CPU) return snprintf(buf, len, "cpu");
  if (device == LM_META) return snprintf(buf, len, "meta");
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

int lm_device_empty_cache(int device) {
  const lm_backend *b = lm_backend_of(device);
  if (!b) return -1;
  if (b->empty_cache) b->empty_cache(device - (lm_device_kind(device) == LM_KIND_CUDA ? LM_CUDA0 : 0));
  return 0;
}

int lm_set_cuda_device(int k) {
  if (k < 0 || k >= 100) return lm_error("set_device: expected a CUDA device index in [0, 100), got %d", k);
  cuda_current = k;
  return 0;
}

const char *lm_build_info(void) {
  static char buf[4096];
  int n = snprintf(buf, sizeof buf, "loom: built %s%s%s\n",
#ifdef LOOM_HAVE_CUDA
                   "with CUDA",
#else
                   "without CUDA",
#endif
#ifdef LOOM_HAVE_NCCL
                   ", with NCCL",
#else
                   ", without NCCL",
#endif
#ifdef __SANITIZE_ADDRESS__
                   ", with ASan"
#else
                   ""
#endif
  );
  for (int k = 0; k < LM_NKINDS && n < (int)sizeof buf; k++) {
    const lm_backend *b = backends[k];
    if (!b || k == LM_KIND_META) continue;
    n += snprintf(buf + n, sizeof buf - n, "%s: %s\n", b->name, b->info ? b->info() : "present");
  }
  return buf;
}
