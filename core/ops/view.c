/* view.c: shape ops. Most return views sharing the input's storage;
 * reshape copies only when no view can express it. Dims in attrs are
 * 0-based and may be negative (from the end). */
#include "op.h"
#include <string.h>

/* ---- view, reshape (attrs: the sizes; one may be -1) ---- */
int lm_shape_view(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)nin;
  const char *name = lm_op_table[op].name;
  int infer = -1;
  int64_t known = 1, numel = lm_shape_numel(in[0].ndim, in[0].shape);
  if (a->ni > LM_MAX_DIMS) return lm_error("%s: expected at most %d sizes, got %d", name, LM_MAX_DIMS, a->ni);
  *out = (lm_meta){.ndim = a->ni, .dtype = in[0].dtype};
  for (int d = 0; d < a->ni; d++) {
    out->shape[d] = a->i[d];
    if (a->i[d] == -1) {
      if (infer >= 0) return lm_error("%s: only one size may be -1", name);
      infer = d;
    } else if (a->i[d] < 0) {
      return lm_error("%s: expected sizes >= 0 (or one -1), got %lld in dim %d", name,
                      (long long)a->i[d], d + 1);
    } else if (known > 0 && a->i[d] > INT64_MAX / known) {
      return lm_error("%s: sizes multiply past 2^63 at dim %d (%lld)", name, d + 1, (long long)a->i[d]);
    } else known *= a->i[d];
  }
  if (infer >= 0) {
    if (known == 0 || numel % known)
      return lm_error("%s: cannot infer the -1 size: %lld elements do not divide by %lld", name,
                      (long long)numel, (long long)known);
    out->shape[infer] = numel / known;
    known *= out->shape[infer];
  }
  if (known != numel)
    return lm_error("%s: shape has %lld elements, the tensor has %lld", name, (long long)known,
                    (long long)numel);
  return 0;
}

/* Strides for viewing x with a new shape without copying, following
 * PyTorch's computeStride; returns -1 (no error set) when impossible. */
static int view_strides(const lm_tensor *x, int nd, const int64_t *shape, int64_t *stride) {
  if (x->numel_ == 0 || x->ndim == 0) { lm_contiguous_strides(nd, shape, stride); return 0; }
  int vd = nd - 1;
  int64_t chunk = 1, base_stride = x->ndim ? x->stride_[x->ndim - 1] : 1;
  for (int td = x->ndim - 1; td >= 0; td--) {
    chunk *= x->shape_[td];
    if (td == 0 || (x->shape_[td - 1] != 1 && x->stride_[td - 1] != chunk * base_stride)) {
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

int lm_fw_view(const lm_call *c, lm_tensor **out) {
  const lm_meta *m = &c->out[0];
  int64_t stride[LM_MAX_DIMS];
  if (view_strides(c->in[0], m->ndim, m->shape, stride) < 0)
    return lm_error("view: the tensor's strides do not allow this shape without a copy "
                    "(call contiguous() first, or use reshape)");
  return (*out = lm_view_of(c->in[0], m->ndim, m->shape, stride, c->in[0]->offset)) ? 0 : -1;
}

int lm_fw_reshape(const lm_call *c, lm_tensor **out) {
  const lm_meta *m = &c->out[0];
  int64_t stride[LM_MAX_DIMS];
  if (view_strides(c->in[0], m->ndim, m->shape, stride) == 0)
    return (*out = lm_view_of(c->in[0], m->ndim, m->shape, stride, c->in[0]->offset)) ? 0 : -1;
  lm_tensor *x = lm_contiguous(c->in[0]);
  *out = x ? lm_view_of(x, m->ndim, m->shape, NULL, x->offset) : NULL;
  lm_release(x);
  return *out ? 0 : -1;
}

/* backward of every op whose gradient is the incoming one reshaped */
int lm_bw_reshape(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  const lm_tensor *x = n->in[0];
  lm_attrs a = {.ni = x->ndim};
  memcpy(a.i, x->shape_, x->ndim * sizeof *x->shape_);
  lm_tensor *g = gout[0], *r = lm_run(LM_OP_RESHAPE, 1, &g, &a);
  gin[0] = lm_grad_like(r, x);
  lm_release(r);
  return gin[0] ? 0 : -1;
}

/* gradient of ops that broadcast or copy: summed back to the input */
int lm_bw_identity(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  return (gin[0] = lm_grad_like(gout[0], n->in[0])) ? 0 : -1;
}

/* ---- transpose (attrs: dim0, dim1) ---- */
int lm_shape_transpose(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin;
  if (lm_need_ints("transpose", a, 2, "dim0, dim1")) return -1;
  int d0 = lm_wrap_dim("transpose", "dim0", a->i[0], in[0].ndim);
  int d1 = lm_wrap_dim("transpose", "dim1", a->i[1], in[0].ndim);
  if (d0 < 0 || d1 < 0) return -1;
  *out = in[0];
  if (in[0].ndim > 0) out->shape[d0] = in[0].shape[d1], out->shape[d1] = in[0].shape[d0];
  return 0;
}

int lm_fw_transpose(const lm_call *c, lm_tensor **out) {
  const lm_tensor *x = c->in[0];
  int64_t stride[LM_MAX_DIMS];
  memcpy(stride, x->stride_, sizeof stride);
  if (x->ndim > 0) {
    int d0 = lm_wrap_dim("", "", c->a->i[0], x->ndim), d1 = lm_wrap_dim("", "", c->a->i[1], x->ndim);
    stride[d0] = x->stride_[d1], stride[d1] = x->stride_[d0];
  }
  return (*out = lm_view_of(x, x->ndim, c->out[0].shape, stride, x->offset)) ? 0 : -1;
}

int lm_bw_transpose(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *g = gout[0];
  return (gin[0] = lm_run(LM_OP_TRANSPOSE, 1, &g, &n->attrs)) ? 0 : -1;
}

/* ---- permute (attrs: the source dim of each dim) ---- */
int lm_shape_permute(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin;
  int nd = in[0].ndim, seen[LM_MAX_DIMS] = {0};
  if (a->ni != nd)
    return lm_error("permute: expected %d dims (one per dim of the tensor), got %d", nd, a->ni);
  *out = in[0];
  for (int d = 0; d < nd; d++) {
    int s = lm_wrap_dim("permute", "dims", a->i[d], nd);
    if (s < 0) return -1;
    if (seen[s]++) return lm_error("permute: dim %d appears twice", s + 1);
    out->shape[d] = in[0].shape[s];
  }
  return 0;
}

int lm_fw_permute(const lm_call *c, lm_tensor **out) {
  const lm_tensor *x = c->in[0];
  int64_t stride[LM_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) stride[d] = x->stride_[lm_wrap_dim("", "", c->a->i[d], x->ndim)];
  return (*out = lm_view_of(x, x->ndim, c->out[0].shape, stride, x->offset)) ? 0 : -1;
}

int lm_bw_permute(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_attrs inv = {.ni = n->attrs.ni};
  for (int d = 0; d < n->attrs.ni; d++) {
    int64_t s = n->attrs.i[d];
    inv.i[s < 0 ? s + n->attrs.ni : s] = d;
  }
  lm_tensor *g = gout[0];
  return (gin[0] = lm_run(LM_OP_PERMUTE, 1, &g, &inv)) ? 0 : -1;
}

/* ---- narrow (attrs: dim, start (0-based), length) ---- */
int lm_shape_narrow(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin;
  const lm_meta *x = &in[0];
  if (x->ndim == 0) return lm_error("narrow: expected a tensor with at least 1 dim, got a scalar");
  if (lm_need_ints("narrow", a, 3, "dim, start, length")) return -1;
  int d = lm_wrap_dim("narrow", "dim", a->i[0], x->ndim);
  if (d < 0) return -1;
  int64_t start = a->i[1], len = a->i[2];
  if (start < 0 || len < 0 || start > x->shape[d] - len)
    return lm_error("narrow: start %lld and length %lld do not fit in dim %d of size %lld",
                    (long long)start + 1, (long long)len, d + 1, (long long)x->shape[d]);
  *out = *x;
  out->shape[d] = len;
  return 0;
}

int lm_fw_narrow(const lm_call *c, lm_tensor **out) {
  const lm_tensor *x = c->in[0];
  int d = lm_wrap_dim("", "", c->a->i[0], x->ndim);
  int64_t at = x->offset + c->a->i[1] * x->stride_[d];
  return (*out = lm_view_of(x, x->ndim, c->out[0].shape, x->stride_, at)) ? 0 : -1;
}

int lm_bw_narrow(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_tensor *g = lm_empty_like(n->in[0]), *slot = NULL;
  int rc = g && lm_fill_(g, 0) == 0 && (slot = lm_run(LM_OP_NARROW, 1, &g, &n->attrs)) ? lm_copy_(slot, gout[0]) : -1;
  lm_release(slot);
  if (rc < 0) { lm_release(g); return -1; }
  gin[0] = g;
  return 0;
}

/* ---- expand (attrs: the target shape; -1 keeps a size) ---- */
int lm_shape_expand(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin;
  const lm_meta *x = &in[0];
  if (a->ni < x->ndim || a->ni > LM_MAX_DIMS)
    return lm_error("expand: expected %d to %d sizes, got %d", x->ndim, LM_MAX_DIMS, a->ni);
  int lead = a->ni - x->ndim;
  *out = (lm_meta){.ndim = a->ni, .dtype = x->dtype};
  for (int d = 0; d < a->ni; d++) {
    int s = d - lead;
    int64_t want = a->i[d];
    if (s < 0) {
      if (want < 0) return lm_error("expand: size -1 is not allowed in a new leading dim %d", d + 1);
      out->shape[d] = want;
    } else if (want == -1 || want == x->shape[s]) {
      out->shape[d] = x->shape[s];
    } else if (x->shape[s] == 1 && want >= 0) {
      out->shape[d] = want;
    } else {
      return lm_error("expand: dim %d has size %lld, which can only expand from 1, to %lld",
                      s + 1, (long long)x->shape[s], (long long)want);
    }
  }
  return 0;
}

int lm_fw_expand(const lm_call *c, lm_tensor **out) {
  return (*out = lm_broadcast_to("expand", "input", c->in[0], c->out[0].ndim, c->out[0].shape)) ? 0 : -1;
}

/* ---- contiguous, clone, to (attrs: i[0] = dtype) ---- */
int lm_shape_same(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin, (void)a;
  *out = in[0];
  return 0;
}

int lm_fw_contiguous(const lm_call *c, lm_tensor **out) {
  return (*out = lm_contiguous(c->in[0])) ? 0 : -1;
}

int lm_fw_clone(const lm_call *c, lm_tensor **out) {
  *out = lm_empty_like(c->in[0]);
  return *out && lm_copy_(*out, c->in[0]) == 0 ? 0 : -1;
}

int lm_shape_to(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin;
  if (a->ni < 1 || a->i[0] < 0 || a->i[0] >= LM_NDTYPES)
    return lm_error("to: unknown dtype %lld", (long long)(a->ni ? a->i[0] : -1));
  *out = in[0];
  out->dtype = (int32_t)a->i[0];
  return 0;
}

/* attrs: i[0] the dtype; i[1] 1 for autocast's own cast (none hands its
 * result to Lua but through autograd): a weight's (an f32 leaf that
 * requires grad) then takes the copy its optimizer kept, and asks for one
 * when there is none (tensor.h) */
int lm_fw_to(const lm_call *c, lm_tensor **out) {
  lm_tensor *x = c->in[0];
  int dt = c->out[0].dtype;
  bool weight = c->a->ni > 1 && c->a->i[1] == 1 && x->needs_grad && !x->grad_fn_ && x->dtype_ == LM_F32 &&
                dt != LM_F32;
  if (weight && (*out = lm_low_copy_of(x, dt))) return 0;
  if (weight) lm_low_copy_want(x, dt);
  return (*out = lm_cast(x, dt)) ? 0 : -1;
}

/* ---- to_device (attrs: i[0] = the device): a copy on another device,
 * whose gradient goes back to the source's; onto meta it only keeps the
 * shape, out of meta it refuses (there is no data) ---- */
int lm_fw_to_device(const lm_call *c, lm_tensor **out) {
  lm_tensor *x = c->in[0];
  int device = (int)c->a->i[0];
  if (c->a->ni < 1 || lm_device_kind(device) < 0) return lm_error("to: unknown device %lld", (long long)c->a->i[0]);
  if (x->device_ == LM_META && device != LM_META)
    return lm_error("to: a meta tensor has no data to copy (use to_empty(), then initialise it)");
  if (device == x->device_) { lm_retain(x); *out = x; return 0; }
  *out = lm_empty(x->ndim, x->shape_, x->dtype_, device);
  if (*out && lm_copy_(*out, x) < 0) { lm_release(*out); *out = NULL; }
  return *out ? 0 : -1;
}

int lm_bw_to_device(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  lm_attrs back = {.i = {n->in[0]->device_}, .ni = 1};
  lm_tensor *g = gout[0], *h = lm_run(LM_OP_TO_DEVICE, 1, &g, &back);
  gin[0] = lm_grad_like(h, n->in[0]);
  lm_release(h);
  return gin[0] ? 0 : -1;
}

/* ---- unsqueeze (attrs: dim; a new size-1 dim goes before it, dim may be ndim) ---- */
int lm_shape_unsqueeze(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin;
  const lm_meta *x = &in[0];
  if (x->ndim == LM_MAX_DIMS) return lm_error("unsqueeze: the tensor already has %d dims", LM_MAX_DIMS);
  if (lm_need_ints("unsqueeze", a, 1, "dim")) return -1;
  int d = lm_wrap_dim("unsqueeze", "dim", a->i[0], x->ndim + 1);
  if (d < 0) return -1;
  *out = (lm_meta){.ndim = x->ndim + 1, .dtype = x->dtype};
  for (int k = 0, s = 0; k <= x->ndim; k++) out->shape[k] = k == d ? 1 : x->shape[s++];
  return 0;
}

int lm_fw_unsqueeze(const lm_call *c, lm_tensor **out) {
  const lm_tensor *x = c->in[0];
  int d = lm_wrap_dim("", "", c->a->i[0], x->ndim + 1);
  int64_t stride[LM_MAX_DIMS];
  for (int k = 0, s = 0; k <= x->ndim; k++)
    if (k == d) stride[k] = s < x->ndim ? x->shape_[s] * x->stride_[s] : 1;
    else stride[k] = x->stride_[s++];
  return (*out = lm_view_of(x, x->ndim + 1, c->out[0].shape, stride, x->offset)) ? 0 : -1;
}

/* ---- squeeze (attrs: dim (ni = 1), or none to drop every size-1 dim) ---- */
static int squeeze_dim(const lm_attrs *a, int ndim, int *only) {
  *only = -1;
  return a->ni > 0 && (*only = lm_wrap_dim("squeeze", "dim", a->i[0], ndim)) < 0 ? -1 : 0;
}

int lm_shape_squeeze(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op, (void)nin;
  int only;
  LM_TRY(squeeze_dim(a, in[0].ndim, &only));
  *out = (lm_meta){.dtype = in[0].dtype};
  for (int d = 0; d < in[0].ndim; d++)
    if (!(in[0].shape[d] == 1 && (only < 0 || only == d))) out->shape[out->ndim++] = in[0].shape[d];
  return 0;
}

int lm_fw_squeeze(const lm_call *c, lm_tensor **out) {
  const lm_tensor *x = c->in[0];
  int only, nd = 0;
  int64_t stride[LM_MAX_DIMS];
  squeeze_dim(c->a, x->ndim, &only);
  for (int d = 0; d < x->ndim; d++)
    if (!(x->shape_[d] == 1 && (only < 0 || only == d))) stride[nd++] = x->stride_[d];
  return (*out = lm_view_of(x, nd, c->out[0].shape, stride, x->offset)) ? 0 : -1;
}

/* ---- cat(t1, ..., tn; dim): sizes agree except along dim ---- */
int lm_shape_cat(int op, int nin, const lm_meta *in, const lm_attrs *a, lm_meta *out) {
  (void)op;
  if (nin < 1) return lm_error("cat: expected at least one tensor, got none");
  const lm_meta *x = &in[0];
  if (x->ndim == 0) return lm_error("cat: argument #1 is a scalar; cat needs at least 1 dim");
  if (lm_need_ints("cat", a, 1, "dim")) return -1;
  int d = lm_wrap_dim("cat", "dim", a->i[0], x->ndim);
  if (d < 0) return -1;
  *out = *x;
  out->shape[d] = 0;
  for (int k = 0; k < nin; k++) {
    if (in[k].ndim != x->ndim)
      return lm_error("cat: argument #%d has %d dims, argument #1 has %d", k + 1, in[k].ndim, x->ndim);
    for (int e = 0; e < x->ndim; e++)
      if (e != d && in[k].shape[e] != x->shape[e])
        return lm_error("cat: argument #%d has size %lld in dim %d, argument #1 has %lld", k + 1,
                        (long long)in[k].shape[e], e + 1, (long long)x->shape[e]);
    out->shape[d] += in[k].shape[d];
    out->dtype = lm_promote(out->dtype, in[k].dtype);
  }
  return 0;
}

int lm_fw_cat(const lm_call *c, lm_tensor **out) {
  int d = lm_wrap_dim("cat", "dim", c->a->i[0], c->in[0]->ndim);
  lm_tensor *r = lm_empty_meta(&c->out[0], c->in[0]);
  if (!r) return -1;
  int64_t at = 0;
  for (int k = 0; k < c->nin; k++) {
    lm_attrs na = {.i = {d, at, c->in[k]->shape_[d]}, .ni = 3};
    lm_tensor *slot = lm_run(LM_OP_NARROW, 1, &r, &na);
    int rc = slot ? lm_copy_(slot, c->in[k]) : -1;
    lm_release(slot);
    if (rc < 0) { lm_release(r); return -1; }
    at += c->in[k]->shape_[d];
  }
  *out = r;
  return 0;
}

int lm_bw_cat(const lm_saved *n, lm_tensor *const *gout, lm_tensor **gin) {
  int d = lm_wrap_dim("cat", "dim", n->attrs.i[0], n->in[0]->ndim);
  int64_t at = 0;
  lm_tensor *g = gout[0];
  for (int k = 0; k < n->nin; k++) {
    lm_attrs na = {.i = {d, at, n->in[k]->shape_[d]}, .ni = 3};
    at += n->in[k]->shape_[d];
    if (!n->in[k]->needs_grad) continue;
    lm_tensor *slice = lm_run(LM_OP_NARROW, 1, &g, &na);
    gin[k] = lm_grad_like(slice, n->in[k]);
    lm_release(slice);
    if (!gin[k]) return -1;
  }
  return 0;
}
