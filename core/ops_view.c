/* ops_view.c: shape ops. Most return views sharing the input's storage;
 * reshape copies only when no view can express it. Dims in attrs are
 * 0-based and may be negative (from the end). */
#include "internal.h"
#include <string.h>

static int fill_shape(const char *op, const lm_tensor *x, const lm_attrs *a, int64_t *shape) {
  int infer = -1;
  int64_t known = 1;
  if (a->ni > LM_MAX_DIMS) return lm_error("%s: expected at most %d sizes, got %d", op, LM_MAX_DIMS, a->ni);
  for (int d = 0; d < a->ni; d++) {
    shape[d] = a->i[d];
    if (shape[d] == -1) {
      if (infer >= 0) return lm_error("%s: only one size may be -1", op);
      infer = d;
    } else if (shape[d] < 0) {
      return lm_error("%s: expected sizes >= 0 (or one -1), got %lld in dim %d", op,
                      (long long)shape[d], d + 1);
    } else known *= shape[d];
  }
  if (infer >= 0) {
    if (known == 0 || x->numel_ % known)
      return lm_error("%s: cannot infer the -1 size: %lld elements do not divide by %lld", op,
                      (long long)x->numel_, (long long)known);
    shape[infer] = x->numel_ / known;
    known *= shape[infer];
  }
  if (known != x->numel_)
    return lm_error("%s: shape has %lld elements, the tensor has %lld", op, (long long)known,
                    (long long)x->numel_);
  return 0;
}

/* Strides for viewing x with a new shape without copying, following
 * PyTorch's computeStride; returns -1 (no error set) when impossible. */
static int view_strides(const lm_tensor *x, int nd, const int64_t *shape, int64_t *stride) {
  if (x->numel_ == 0 || x->ndim == 0) { lm_contiguous_strides(nd, shape, stride); return 0; }
  int vd = nd - 1;
  int64_t chunk = 1, base_stride = x->ndim ? x->stride_[x->ndim - 1] : 1;
  for (int td = x->ndim - 1; td >= 0; td--) {
    chunk *= x->shape[td];
    if (td == 0 || (x->shape[td - 1] != 1 && x->stride_[td - 1] != chunk * base_stride)) {
      int64_t acc = 1;
      while (vd >= 0 && (acc < chunk || shape[vd] == 1)) {
        stride[vd] = acc * base_stride;
        acc *= shape[vd];
        vd--;
      }
      if (acc != chunk) return -1;
      if (td > 0) { chunk = 1; base_stride = x->stride_[td - 1]; }
    }
  }
  for (; vd >= 0; vd--) stride[vd] = 1; /* leading size-1 dims */
  return 0;
}

static int fw_view(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  int64_t shape[LM_MAX_DIMS], stride[LM_MAX_DIMS];
  LM_TRY(fill_shape("view", in[0], a, shape));
  if (view_strides(in[0], a->ni, shape, stride) < 0)
    return lm_error("view: the tensor's strides do not allow this shape without a copy "
                    "(call contiguous() first, or use reshape)");
  return (*out = lm_view_of(in[0], a->ni, shape, stride, in[0]->offset)) ? 0 : -1;
}

static int fw_reshape(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  int64_t shape[LM_MAX_DIMS], stride[LM_MAX_DIMS];
  LM_TRY(fill_shape("reshape", in[0], a, shape));
  if (view_strides(in[0], a->ni, shape, stride) == 0)
    return (*out = lm_view_of(in[0], a->ni, shape, stride, in[0]->offset)) ? 0 : -1;
  lm_tensor *c = lm_contiguous(in[0]);
  if (!c) return -1;
  lm_contiguous_strides(a->ni, shape, stride);
  *out = lm_view_of(c, a->ni, shape, stride, c->offset);
  lm_release(c);
  return *out ? 0 : -1;
}

/* backward of every op whose gradient is the incoming one reshaped */
static int bw_reshape(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  const lm_tensor *x = n->in[0];
  lm_attrs a = {.ni = x->ndim};
  memcpy(a.i, x->shape, x->ndim * sizeof *x->shape);
  lm_tensor *g = gout[0];
  lm_tensor *r = lm_call("reshape", 1, &g, &a);
  gin[0] = lm_grad_like(r, x);
  lm_release(r);
  return gin[0] ? 0 : -1;
}

static int fw_transpose(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  const lm_tensor *x = in[0];
  int d0 = lm_wrap_dim("transpose", "dim0", a->i[0], x->ndim);
  int d1 = lm_wrap_dim("transpose", "dim1", a->i[1], x->ndim);
  if (d0 < 0 || d1 < 0) return -1;
  int64_t shape[LM_MAX_DIMS], stride[LM_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape), memcpy(stride, x->stride_, sizeof stride);
  if (x->ndim > 0) {
    shape[d0] = x->shape[d1], shape[d1] = x->shape[d0];
    stride[d0] = x->stride_[d1], stride[d1] = x->stride_[d0];
  }
  return (*out = lm_view_of(x, x->ndim, shape, stride, x->offset)) ? 0 : -1;
}

static int bw_transpose(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *g = gout[0];
  gin[0] = lm_call("transpose", 1, &g, &n->attrs);
  return gin[0] ? 0 : -1;
}

static int fw_permute(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  const lm_tensor *x = in[0];
  if (a->ni != x->ndim)
    return lm_error("permute: expected %d dims (one per dim of the tensor), got %d", x->ndim, a->ni);
  int64_t shape[LM_MAX_DIMS], stride[LM_MAX_DIMS];
  int seen[LM_MAX_DIMS] = {0};
  for (int d = 0; d < x->ndim; d++) {
    int s = lm_wrap_dim("permute", "dims", a->i[d], x->ndim);
    if (s < 0) return -1;
    if (seen[s]++) return lm_error("permute: dim %d appears twice", s + 1);
    shape[d] = x->shape[s], stride[d] = x->stride_[s];
  }
  return (*out = lm_view_of(x, x->ndim, shape, stride, x->offset)) ? 0 : -1;
}

static int bw_permute(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_attrs inv = {.ni = n->attrs.ni};
  for (int d = 0; d < n->attrs.ni; d++) {
    int64_t s = n->attrs.i[d];
    inv.i[s < 0 ? s + n->attrs.ni : s] = d;
  }
  lm_tensor *g = gout[0];
  gin[0] = lm_call("permute", 1, &g, &inv);
  return gin[0] ? 0 : -1;
}

/* attrs: dim, start (0-based), length */
static int fw_narrow(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  const lm_tensor *x = in[0];
  if (x->ndim == 0) return lm_error("narrow: expected a tensor with at least 1 dim, got a scalar");
  int d = lm_wrap_dim("narrow", "dim", a->i[0], x->ndim);
  if (d < 0) return -1;
  int64_t start = a->i[1], len = a->i[2];
  if (start < 0 || len < 0 || start + len > x->shape[d])
    return lm_error("narrow: start %lld and length %lld do not fit in dim %d of size %lld",
                    (long long)start + 1, (long long)len, d + 1, (long long)x->shape[d]);
  int64_t shape[LM_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[d] = len;
  return (*out = lm_view_of(x, x->ndim, shape, x->stride_, x->offset + start * x->stride_[d])) ? 0 : -1;
}

static int bw_narrow(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *x = n->in[0], *g = lm_empty_like(x), *slot = NULL;
  lm_attrs a = n->attrs;
  a.i[0] = lm_wrap_dim("narrow", "dim", a.i[0], x->ndim);
  int rc = g && lm_fill_(g, 0) == 0 ? 0 : -1;
  if (rc == 0) {
    lm_tensor *gg = g;
    slot = lm_call("narrow", 1, &gg, &a);
    rc = slot ? lm_copy_(slot, gout[0]) : -1;
  }
  lm_release(slot);
  if (rc < 0) { lm_release(g); return -1; }
  gin[0] = g;
  return 0;
}

/* attrs: the target shape; -1 keeps a size */
static int fw_expand(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  const lm_tensor *x = in[0];
  if (a->ni < x->ndim || a->ni > LM_MAX_DIMS)
    return lm_error("expand: expected at least %d sizes, got %d", x->ndim, a->ni);
  int64_t shape[LM_MAX_DIMS], stride[LM_MAX_DIMS];
  int lead = a->ni - x->ndim;
  for (int d = 0; d < a->ni; d++) {
    int s = d - lead;
    int64_t want = a->i[d];
    if (s < 0) {
      if (want < 0) return lm_error("expand: size -1 is not allowed in a new leading dim %d", d + 1);
      shape[d] = want, stride[d] = 0;
    } else if (want == -1 || want == x->shape[s]) {
      shape[d] = x->shape[s], stride[d] = x->stride_[s];
    } else if (x->shape[s] == 1 && want >= 0) {
      shape[d] = want, stride[d] = 0;
    } else {
      return lm_error("expand: dim %d has size %lld, which can only expand from 1, to %lld",
                      s + 1, (long long)x->shape[s], (long long)want);
    }
  }
  return (*out = lm_view_of(x, a->ni, shape, stride, x->offset)) ? 0 : -1;
}

/* gradient of ops that broadcast or copy: summed back to the input */
static int bw_identity(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  return (gin[0] = lm_grad_like(gout[0], n->in[0])) ? 0 : -1;
}

static int fw_contiguous(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin, (void)a;
  return (*out = lm_contiguous(in[0])) ? 0 : -1;
}

static int fw_clone(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin, (void)a;
  *out = lm_empty_like(in[0]);
  return *out && lm_copy_(*out, in[0]) == 0 ? 0 : -1;
}

/* attrs: i[0] = dtype */
static int fw_to(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  if (a->i[0] < 0 || a->i[0] >= LM_NDTYPES) return lm_error("to: unknown dtype %lld", (long long)a->i[0]);
  return (*out = lm_cast(in[0], (int)a->i[0])) ? 0 : -1;
}

/* attrs: dim; a new size-1 dim is inserted before it (dim may be ndim) */
static int fw_unsqueeze(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  const lm_tensor *x = in[0];
  if (x->ndim == LM_MAX_DIMS) return lm_error("unsqueeze: the tensor already has %d dims", LM_MAX_DIMS);
  int d = lm_wrap_dim("unsqueeze", "dim", a->i[0], x->ndim + 1);
  if (d < 0) return -1;
  int64_t shape[LM_MAX_DIMS], stride[LM_MAX_DIMS];
  for (int k = 0, s = 0; k <= x->ndim; k++) {
    if (k == d) { shape[k] = 1, stride[k] = s < x->ndim ? x->shape[s] * x->stride_[s] : 1; continue; }
    shape[k] = x->shape[s], stride[k] = x->stride_[s], s++;
  }
  return (*out = lm_view_of(x, x->ndim + 1, shape, stride, x->offset)) ? 0 : -1;
}

/* attrs: dim (ni = 1), or none to drop every size-1 dim */
static int fw_squeeze(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  (void)nin;
  const lm_tensor *x = in[0];
  int only = -1;
  if (a->ni > 0 && (only = lm_wrap_dim("squeeze", "dim", a->i[0], x->ndim)) < 0) return -1;
  int64_t shape[LM_MAX_DIMS], stride[LM_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (x->shape[d] == 1 && (only < 0 || only == d)) continue;
    shape[nd] = x->shape[d], stride[nd++] = x->stride_[d];
  }
  return (*out = lm_view_of(x, nd, shape, stride, x->offset)) ? 0 : -1;
}

/* cat(t1, ..., tn; dim): sizes agree except along dim */
static int fw_cat(lm_tensor *const *in, int nin, const lm_attrs *a, lm_tensor **out) {
  if (nin < 1) return lm_error("cat: expected at least one tensor, got none");
  const lm_tensor *x = in[0];
  if (x->ndim == 0) return lm_error("cat: argument #1 is a scalar; cat needs at least 1 dim");
  int d = lm_wrap_dim("cat", "dim", a->i[0], x->ndim);
  if (d < 0) return -1;
  int64_t shape[LM_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[d] = 0;
  int dt = x->dtype_;
  for (int k = 0; k < nin; k++) {
    if (in[k]->ndim != x->ndim)
      return lm_error("cat: argument #%d has %d dims, argument #1 has %d", k + 1, in[k]->ndim, x->ndim);
    for (int e = 0; e < x->ndim; e++)
      if (e != d && in[k]->shape[e] != x->shape[e])
        return lm_error("cat: argument #%d has size %lld in dim %d, argument #1 has %lld", k + 1,
                        (long long)in[k]->shape[e], e + 1, (long long)x->shape[e]);
    shape[d] += in[k]->shape[d];
    dt = lm_promote(dt, in[k]->dtype_);
  }
  lm_tensor *r = lm_empty_as(x, x->ndim, shape, dt);
  if (!r) return -1;
  int64_t at = 0;
  for (int k = 0; k < nin; k++) {
    lm_attrs na = {.i = {d, at, in[k]->shape[d]}, .ni = 3};
    lm_tensor *slot = lm_call("narrow", 1, &r, &na);
    int rc = slot ? lm_copy_(slot, in[k]) : -1;
    lm_release(slot);
    if (rc < 0) { lm_release(r); return -1; }
    at += in[k]->shape[d];
  }
  *out = r;
  return 0;
}

static int bw_cat(const lm_node *n, lm_tensor *const *gout, lm_tensor **gin) {
  int d = lm_wrap_dim("cat", "dim", n->attrs.i[0], n->in[0]->ndim);
  int64_t at = 0;
  lm_tensor *g = gout[0];
  for (int k = 0; k < n->nin; k++) {
    lm_attrs na = {.i = {d, at, n->in[k]->shape[d]}, .ni = 3};
    at += n->in[k]->shape[d];
    if (!n->in[k]->needs_grad) continue;
    lm_tensor *slice = lm_call("narrow", 1, &g, &na);
    gin[k] = lm_grad_like(slice, n->in[k]);
    lm_release(slice);
    if (!gin[k]) return -1;
  }
  return 0;
}

#define OP(NAME, NIN, BW, RULE) {#NAME, NIN, 1, fw_##NAME, BW, RULE, 0}
const lm_op_def lm_ops_view[] = {
    OP(view, 1, bw_reshape, lm_rule_view),
    OP(reshape, 1, bw_reshape, lm_rule_view),
    OP(transpose, 1, bw_transpose, lm_rule_transpose),
    OP(permute, 1, bw_permute, lm_rule_permute),
    OP(narrow, 1, bw_narrow, lm_rule_narrow),
    OP(expand, 1, bw_identity, lm_rule_expand),
    OP(contiguous, 1, bw_identity, lm_rule_linear_pw),
    OP(clone, 1, bw_identity, lm_rule_linear_pw),
    OP(to, 1, bw_identity, lm_rule_linear_pw),
    OP(unsqueeze, 1, bw_reshape, lm_rule_unsqueeze),
    OP(squeeze, 1, bw_reshape, lm_rule_squeeze),
    OP(cat, -1, bw_cat, lm_rule_cat),
    {0}};
