/* tensor.c: storages, tensor lifetime, views, copies and casts. */
#include "tensor.h"
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic int64_t live_bytes, live_storages;

int64_t lm_allocated_bytes(void) { return live_bytes; }
int64_t lm_storage_count(void) { return live_storages; }

static void init_tensor(lm_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                        int dtype, int device) {
  t->refcount = 1;
  t->ndim = (int8_t)ndim;
  t->dtype_ = (int8_t)dtype;
  t->device_ = (int8_t)device;
  if (ndim) memcpy(t->shape_, shape, ndim * sizeof *shape);
  if (stride && ndim) memcpy(t->stride_, stride, ndim * sizeof *stride);
  else lm_contiguous_strides(ndim, shape, t->stride_);
  t->numel_ = lm_shape_numel(ndim, shape);
}

static lm_tensor *new_tensor(int ndim, const int64_t *shape, const int64_t *stride,
                             int dtype, int device) {
  lm_tensor *t = calloc(1, sizeof *t);
  if (!t) { lm_error("out of memory"); return NULL; }
  init_tensor(t, ndim, shape, stride, dtype, device);
  return t;
}

/* A new tensor and its storage are one block; buffers up to INLINE_BYTES
 * on the CPU follow them in it (malloc's 16-byte alignment suits every
 * dtype), so a small op result costs one malloc and one free. */
typedef struct {
  lm_tensor t;
  lm_storage s;
  _Alignas(16) unsigned char data[];
} owner_block;
enum { INLINE_BYTES = 256 };

lm_tensor *lm_empty(int ndim, const int64_t *shape, int dtype, int device) {
  if (ndim > 0 && !shape) { lm_error("empty: shape is NULL"); return NULL; }
  if (lm_check_shape("empty", "size", ndim, shape) < 0) return NULL;
  if (dtype < 0 || dtype >= LM_NDTYPES) {
    lm_error("empty: unknown dtype %d", dtype);
    return NULL;
  }
  const lm_backend *be = lm_backend_of(device);
  if (!be) return NULL;
  size_t nbytes = device == LM_META ? 0 : (size_t)lm_shape_numel(ndim, shape) * lm_dtype_size(dtype);
  bool inl = device == LM_CPU && nbytes <= INLINE_BYTES;
  owner_block *b = malloc(sizeof *b + (inl ? nbytes : 0));
  lm_clear_error();
  void *data = !b ? NULL : inl ? b->data : be->alloc(nbytes ? nbytes : 1);
  if (!data) { /* the backend's reason (e.g. the bytes free on a GPU), else ours */
    char why[512];
    snprintf(why, sizeof why, "%s", b ? lm_last_error() : "no memory for the tensor");
    free(b);
    lm_error("empty: out of memory allocating %zu bytes on %s: %s", nbytes, be->name, why);
    return NULL;
  }
  memset(b, 0, sizeof *b);
  init_tensor(&b->t, ndim, shape, NULL, dtype, device);
  b->s = (lm_storage){.refcount = 1, .device = (int8_t)device, .data_inline = inl,
                      .nbytes = nbytes, .data = data, .owner = &b->t};
  b->t.storage = &b->s;
  live_bytes += (int64_t)nbytes;
  live_storages++;
  return &b->t;
}

lm_tensor *lm_view_of(const lm_tensor *t, int ndim, const int64_t *shape,
                      const int64_t *stride, int64_t offset) {
  lm_tensor *v = new_tensor(ndim, shape, stride, t->dtype_, t->device_);
  if (!v) return NULL;
  v->storage = t->storage;
  __atomic_add_fetch(&t->storage->refcount, 1, __ATOMIC_RELAXED);
  v->offset = offset;
  return v;
}

lm_tensor *lm_empty_as(const lm_tensor *t, int ndim, const int64_t *shape, int dtype) {
  return lm_empty(ndim, shape, dtype, t->device_);
}
lm_tensor *lm_empty_like(const lm_tensor *t) {
  return lm_empty(t->ndim, t->shape_, t->dtype_, t->device_);
}

void lm_retain(lm_tensor *t) {
  if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
}

/* Drops one of the references counted at rc; true when it was the last.
 * A count of 1 needs no atomic: it is ours, so no one else can see it. */
static bool drop(int32_t *rc) {
  return __atomic_load_n(rc, __ATOMIC_ACQUIRE) == 1 ||
         __atomic_sub_fetch(rc, 1, __ATOMIC_ACQ_REL) == 0;
}

/* Hands s's buffer back to its backend. Freeing selects no device (a
 * failed select, e.g. after an earlier CUDA error, must not turn into a
 * NULL call); a device kind without a backend cannot have made the buffer,
 * so there is nothing to hand back. */
static void free_data(lm_storage *s) {
  const lm_backend *b = lm_backend_registered(s->device);
  if (b && b->free) b->free(s->data);
}

/* The last reference frees the buffer, and the block holding the storage
 * (its owner tensor's, dead by then: it held a reference) unless the owner
 * was freed early while Lua still holds it: its lm_release frees the block. */
static void release_storage(lm_storage *s) {
  if (!drop(&s->refcount)) return;
  s->refcount = 0;
  if (s->data) { /* NULL: its buffer was released (lm_release_data), bytes uncounted then */
    if (!s->data_inline) free_data(s);
    live_bytes -= (int64_t)s->nbytes;
  }
  live_storages--;
  s->data = NULL;
  lm_release(s->low);
  s->low = NULL;
  if (!s->owner_pinned) free(s->owner);
}

static void release_part(lm_part *p, lm_tensor *owner) {
  if (p) p->ops->release(p, owner);
}

void lm_release(lm_tensor *t) {
  if (!t || !drop(&t->refcount)) return;
  lm_release(t->grad_);
  release_part((lm_part *)t->dist, t);
  release_part((lm_part *)t->grad_fn_, t);
  lm_storage *s = t->storage;
  if (s && s->owner == t && t->freed) { /* its storage reference went at lm_tensor_free */
    s->owner_pinned = 0;
    if (s->refcount == 0) free(t);
    return;
  }
  if (!s || s->owner != t) free(t); /* else the storage frees t's block */
  if (s) release_storage(s);
}

/* the caller may write through it: a kept low-precision copy goes stale */
void *lm_data(const lm_tensor *t) {
  if (!t || t->freed || !t->storage) return NULL;
  t->storage->low_version = -1;
  return lm_ptr(t);
}

int64_t lm_tensor_version(const lm_tensor *t) { return t && t->storage ? t->storage->version : 0; }

int lm_tensor_free(lm_tensor *t) {
  if (!t) return lm_error("free: tensor is NULL");
  if (t->freed) return 0;
  t->freed = 1;
  lm_release(t->grad_), t->grad_ = NULL;
  release_part((lm_part *)t->dist, t), t->dist = NULL;
  release_part((lm_part *)t->grad_fn_, t), t->grad_fn_ = NULL;
  lm_storage *s = t->storage;
  if (s && s->owner != t) t->storage = NULL; /* a view: it lets go of the storage */
  else if (s) s->owner_pinned = 1;           /* the owner: the block holds t, kept until lm_release */
  if (s) release_storage(s);
  return 0;
}

static int check_live(const char *op, const lm_tensor *t, const char *arg) {
  if (!t) return lm_error("%s: %s is NULL", op, arg);
  if (t->freed) return lm_error("%s: %s was freed (t:free())", op, arg);
  return 0;
}

int lm_fill_(lm_tensor *t, double v) {
  LM_TRY(check_live("fill", t, "tensor"));
  const lm_backend *be = lm_backend_of(t->device_);
  int rc = be ? be->fill(t, v) : -1;
  lm_bump_version(t);
  return rc;
}

int lm_copy_parts(lm_tensor *d, const lm_tensor *t) {
  const lm_part *p = t->dist;
  if (!p) return 0;
  if (d->dist) release_part((lm_part *)d->dist, d), d->dist = NULL;
  return (d->dist = p->ops->copy(p)) ? 0 : -1;
}

int lm_copy_(lm_tensor *dst, const lm_tensor *src) {
  LM_TRY(check_live("copy", dst, "destination"));
  LM_TRY(check_live("copy", src, "source"));
  if (dst->device_ == LM_META) return 0; /* nothing to write */
  if (src->device_ == LM_META)
    return lm_error("copy: the source is a meta tensor, which has no data (materialise it with to_empty first)");
  if (dst->ndim != src->ndim || memcmp(dst->shape_, src->shape_, dst->ndim * 8))
    return lm_error("copy: source and destination shapes differ");
  /* across devices, the accelerator's backend copies to, from and between its devices */
  const lm_backend *be = lm_backend_of(dst->device_ != LM_CPU ? dst->device_ : src->device_);
  int rc = be ? be->copy(dst, src) : -1;
  lm_bump_version(dst);
  return rc;
}

lm_tensor *lm_contiguous(lm_tensor *t) {
  if (lm_is_contiguous(t)) { lm_retain(t); return t; }
  lm_tensor *c = lm_empty_like(t);
  if (c && lm_copy_(c, t) < 0) { lm_release(c); return NULL; }
  return c;
}

lm_tensor *lm_cast(lm_tensor *t, int dtype) {
  if (t->dtype_ == dtype) { lm_retain(t); return t; }
  lm_tensor *c = lm_empty_as(t, t->ndim, t->shape_, dtype);
  if (c && lm_copy_(c, t) < 0) { lm_release(c); return NULL; }
  return c;
}

lm_tensor *lm_arange(double start, double end, double step, int dtype, int device) {
  if (step == 0 || (end - start) / step < 0) {
    lm_error("arange: expected step with the sign of end - start, got start %g end %g step %g",
             start, end, step);
    return NULL;
  }
  int64_t n = (int64_t)((end - start) / step);
  if (start + n * step != end && (end - start - n * step) / step > 0) n++;
  lm_tensor *t = lm_empty(1, &n, LM_F64, LM_CPU);
  if (!t) return NULL;
  double *p = lm_data(t);
  for (int64_t i = 0; i < n; i++) p[i] = start + i * step;
  lm_tensor *r = lm_empty(1, &n, dtype, device);
  if (r && lm_copy_(r, t) < 0) { lm_release(r); r = NULL; }
  lm_release(t);
  return r;
}

int lm_release_data(lm_tensor *t) {
  LM_TRY(check_live("release_data", t, "tensor"));
  lm_storage *s = t->storage;
  if (!s || !s->data || s->data_inline || t->device_ == LM_META) return 0;
  free_data(s);
  live_bytes -= (int64_t)s->nbytes;
  s->data = NULL;
  return 0;
}

int lm_restore_data(lm_tensor *t, const lm_tensor *src) {
  LM_TRY(check_live("restore_data", t, "tensor"));
  lm_storage *s = t->storage;
  if (s && !s->data && t->device_ != LM_META) {
    const lm_backend *be = lm_backend_of(s->device);
    if (!be || !(s->data = be->alloc(s->nbytes ? s->nbytes : 1)))
      return lm_error("restore_data: out of memory for %zu bytes", s->nbytes);
    live_bytes += (int64_t)s->nbytes;
  }
  int64_t v = lm_tensor_version(t);
  int rc = src ? lm_copy_(t, src) : 0;
  if (s) s->version = v; /* the same values again: not a change autograd must see */
  return rc;
}

/* a view of t broadcast to shape (stride 0 along the dims it repeats) */
lm_tensor *lm_broadcast_to(const char *op, const char *arg, const lm_tensor *t, int ndim,
                           const int64_t *shape) {
  int64_t stride[LM_MAX_DIMS];
  int lead = ndim - t->ndim;
  if (lead < 0) {
    lm_error("%s: %s has %d dims, cannot broadcast to %d", op, arg, t->ndim, ndim);
    return NULL;
  }
  for (int d = 0; d < ndim; d++) {
    int s = d - lead;
    if (s < 0) { stride[d] = 0; continue; }
    if (t->shape_[s] == shape[d]) stride[d] = shape[d] == 1 ? 0 : t->stride_[s];
    else if (t->shape_[s] == 1) stride[d] = 0;
    else {
      lm_error("%s: %s has size %lld in dim %d, cannot broadcast to %lld", op, arg,
               (long long)t->shape_[s], s + 1, (long long)shape[d]);
      return NULL;
    }
  }
  return lm_view_of(t, ndim, shape, stride, t->offset);
}
