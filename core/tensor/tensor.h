/* tensor.h: the tensor layer, the bottom of the core: storages and views,
 * layout and broadcasting, dtype rules, the device backends, and the parts
 * of a tensor that layers above own (autograd's node, dist's spec). */
#ifndef LOOM_TENSOR_H
#define LOOM_TENSOR_H
#include "../backend.h"

/* ---- parts owned by the layers above ----
 * A tensor's grad_fn_ (an autograd node) and dist (a DTensor spec) each
 * start with an lm_part, so this layer can let go of them, and copy a
 * spec onto an alias, without knowing what they are. */
typedef struct lm_part lm_part;
typedef struct lm_part_ops {
  void (*release)(lm_part *p, lm_tensor *owner); /* drops owner's reference */
  lm_part *(*copy)(const lm_part *p);            /* a new part for another tensor */
} lm_part_ops;
struct lm_part { const lm_part_ops *ops; };

/* ---- layout (tensor.c, layout.c) ---- */
/* A new tensor sharing t's storage with the given layout (a view); stride
 * NULL: contiguous. */
lm_tensor *lm_view_of(const lm_tensor *t, int ndim, const int64_t *shape,
                      const int64_t *stride, int64_t offset);
lm_tensor *lm_empty_like(const lm_tensor *t);
lm_tensor *lm_empty_as(const lm_tensor *t, int ndim, const int64_t *shape, int dtype);
lm_tensor *lm_contiguous(lm_tensor *t);      /* new ref: t itself or a copy */
lm_tensor *lm_cast(lm_tensor *t, int dtype); /* new ref: t itself or a copy */
int64_t lm_shape_numel(int ndim, const int64_t *shape);
int lm_check_shape(const char *op, const char *arg, int ndim, const int64_t *shape);
int lm_wrap_dim(const char *op, const char *arg, int64_t dim, int ndim); /* -1 on error */
/* Broadcast view of t to shape (new ref), or NULL with an error naming op. */
lm_tensor *lm_broadcast_to(const char *op, const char *arg, const lm_tensor *t, int ndim,
                           const int64_t *shape);
/* t's spec copied onto d (an alias of t): a DTensor's alias stays one. */
int lm_copy_parts(lm_tensor *d, const lm_tensor *t);

/* an in-place write to t's storage: autograd's saved tensors notice it */
static inline void lm_bump_version(lm_tensor *t) {
  if (t->storage) __atomic_add_fetch(&t->storage->version, 1, __ATOMIC_RELAXED);
}

/* ---- kept low-precision copies of weights (low_copy.c) ----
 * Autocast casts every f32 weight to bf16 in every forward. An optimizer
 * that has just written a weight writes that cast in the same pass over
 * memory and keeps it on the weight's storage; the next cast of the weight
 * takes it while the storage is unchanged since (its version; handing out
 * a raw data pointer counts as a change). */
/* t's kept copy in dtype (a new ref), or NULL, without an error, when none is valid */
lm_tensor *lm_low_copy_of(const lm_tensor *t, int dtype);
/* t, a contiguous f32 leaf, was cast to dtype (bf16/f16): its storage asks for a kept copy */
void lm_low_copy_want(const lm_tensor *t, int dtype);
/* where an optimizer writes t's copy (borrowed; owned by t's storage), or
 * NULL when none is wanted */
lm_tensor *lm_low_copy_target(const lm_tensor *t);
/* the copy just written matches t's storage as it is now */
void lm_low_copy_done(const lm_tensor *t);

/* ---- dtype rules (dtype.c) ---- */
/* The dtype kernels compute in: f64 stays, other floats use f32, ints i64. */
int lm_compute_dtype(int dtype);
int lm_promote(int a, int b);                   /* result dtype of a op b */

/* ---- devices (device.c) ---- */
/* The backend of a device (made current), or NULL with an error. */
const lm_backend *lm_backend_of(int device);
int lm_device_kind(int device);   /* enum lm_device_kind, -1 when unknown */
/* the backend registered for a device's kind, whether or not such a
 * device is present (NULL without an error when none is) */
const lm_backend *lm_backend_registered(int device);

#endif
