/* copy.cu: strided copy with dtype conversion (on one device, or between
 * the CPU and a GPU, or between GPUs), and fill. */
#include "common.cuh"
#include "kernels.cuh"
#include <stdlib.h>

template <typename T> struct CopySame {
  __host__ __device__ void operator()(char **p) const { *(T *)p[0] = *(const T *)p[1]; }
};
struct CopyFloat { /* f32, bf16, f16 and bool among themselves */
  int sd, dd;
  __host__ __device__ void operator()(char **p) const { lm_dev_storef(p[0], dd, lm_dev_loadf(p[1], sd)); }
};
struct CopyDouble { /* everything else goes through double, as lm_store does */
  int sd, dd;
  __host__ __device__ void operator()(char **p) const { lm_dev_store(p[0], dd, lm_load(p[1], sd)); }
};

static bool floaty(int d) { return d == LM_F32 || d == LM_BF16 || d == LM_F16 || d == LM_BOOL; }

/* dst and src on the same GPU */
static int device_copy(lm_tensor *dst, const lm_tensor *src) {
  const lm_tensor *t[2] = {dst, src};
  int sd = src->dtype_, dd = dst->dtype_, es = lm_dtype_size(dd);
  if (dst->numel_ == 0) return 0;
  if (lm_cuda_use(dst) < 0) return -1;
  if (sd == dd) {
    if (lm_is_contiguous(dst) && lm_is_contiguous(src)) {
      LM_CUDA_TRY(cudaMemcpyAsync(lm_ptr(dst), lm_ptr(src), (size_t)dst->numel_ * es,
                                  cudaMemcpyDeviceToDevice, LM_STREAM));
      return 0;
    }
    switch (es) {
    case 1: return lm_launch<2>(t, CopySame<uint8_t>(), "copy");
    case 2: return lm_launch<2>(t, CopySame<uint16_t>(), "copy");
    case 4: return lm_launch<2>(t, CopySame<uint32_t>(), "copy");
    default: return lm_launch<2>(t, CopySame<uint64_t>(), "copy");
    }
  }
  if (floaty(sd) && floaty(dd)) return lm_launch<2>(t, CopyFloat{sd, dd}, "copy");
  return lm_launch<2>(t, CopyDouble{sd, dd}, "copy");
}

/* A contiguous tensor of like's shape over data (no refcounts, no frees). */
static lm_tensor dense(lm_storage *s, void *data, const lm_tensor *like, int dtype, int device) {
  lm_tensor t;
  memset(&t, 0, sizeof t);
  memset(s, 0, sizeof *s);
  s->refcount = 1, s->device = (int8_t)device, s->data = data;
  s->nbytes = (size_t)like->numel_ * lm_dtype_size(dtype);
  t.refcount = 1, t.ndim = like->ndim, t.dtype_ = (int8_t)dtype, t.device_ = (int8_t)device;
  memcpy(t.shape_, like->shape_, sizeof t.shape_);
  lm_contiguous_strides(t.ndim, t.shape_, t.stride_);
  t.numel_ = like->numel_;
  t.storage = s;
  return t;
}

/* Device scratch on the current device, stream-ordered like tensors. */
static void *scratch(size_t n) { return lm_cuda_alloc(n ? n : 1); }

/* src's values dense in dtype on src's GPU, made current: src's own
 * memory when it already is, else a scratch (*buf, for the caller to free)
 * gathered and converted there; *p points at them. */
static int gather_on_device(const lm_tensor *src, int dtype, void **buf, const char **p) {
  *p = lm_ptr(src);
  LM_TRY(lm_cuda_use(src));
  if (src->dtype_ == dtype && lm_is_contiguous(src)) return 0;
  lm_storage s;
  if (!(*buf = scratch((size_t)src->numel_ * lm_dtype_size(dtype)))) return -1;
  lm_tensor d = dense(&s, *buf, src, dtype, src->device_);
  *p = (const char *)*buf;
  return device_copy(&d, src);
}

static int host_to_device(lm_tensor *dst, const lm_tensor *src) {
  size_t n = (size_t)src->numel_ * lm_dtype_size(src->dtype_);
  lm_storage hs, ds;
  void *host = NULL, *dev = NULL;
  int rc = 0;
  const char *hp = lm_ptr(src);
  if (!lm_is_contiguous(src)) { /* gather on the CPU first */
    if (!(host = malloc(n))) return lm_error("copy: out of memory staging %zu bytes", n);
    lm_tensor h = dense(&hs, host, src, src->dtype_, LM_CPU);
    if (lm_copy_(&h, src) < 0) { free(host); return -1; }
    hp = (const char *)host;
  }
  /* Async from pageable memory (loom's CPU tensors are not pinned): the
   * call returns once the bytes are staged, without waiting for the GPU's
   * queued work, as cudaMemcpy would; host may be freed right after. */
  if (lm_cuda_use(dst) < 0) rc = -1;
  else if (dst->dtype_ == src->dtype_ && lm_is_contiguous(dst)) {
    cudaError_t e = cudaMemcpyAsync(lm_ptr(dst), hp, n, cudaMemcpyHostToDevice, LM_STREAM);
    if (e != cudaSuccess) rc = lm_cuda_fail("copy to the GPU", e);
  } else if (!(dev = scratch(n))) rc = -1;
  else {
    cudaError_t e = cudaMemcpyAsync(dev, hp, n, cudaMemcpyHostToDevice, LM_STREAM);
    if (e != cudaSuccess) rc = lm_cuda_fail("copy to the GPU", e);
    lm_tensor d = dense(&ds, dev, src, src->dtype_, dst->device_);
    if (rc == 0) rc = device_copy(dst, &d);
    lm_cuda_free(dev);
  }
  free(host);
  return rc;
}

static int device_to_host(lm_tensor *dst, const lm_tensor *src) {
  size_t n = (size_t)src->numel_ * lm_dtype_size(dst->dtype_);
  lm_storage hs;
  void *host = NULL, *dev = NULL;
  const char *dp = NULL;
  int rc = gather_on_device(src, dst->dtype_, &dev, &dp); /* convert and gather on the GPU */
  if (rc == 0) {
    bool direct = lm_is_contiguous(dst);
    char *hp = direct ? lm_ptr(dst) : (char *)(host = malloc(n));
    if (!hp) rc = lm_error("copy: out of memory staging %zu bytes", n);
    else {
      /* the caller wants the values now: this waits for the GPU */
      cudaError_t e = cudaMemcpy(hp, dp, n, cudaMemcpyDeviceToHost);
      if (e != cudaSuccess) rc = lm_cuda_fail("copy from the GPU", e);
      /* the queue drained: raise a bad id an earlier op's check found */
      else rc = lm_cuda_ids_report(src->device_ - LM_CUDA0);
    }
    if (rc == 0 && !direct) {
      lm_tensor h = dense(&hs, host, dst, dst->dtype_, LM_CPU);
      rc = lm_copy_(dst, &h);
    }
  }
  if (dev) lm_cuda_free(dev);
  free(host);
  return rc;
}

/* GPU to GPU: gather on the source, copy across, convert on the target. */
static int peer_copy(lm_tensor *dst, const lm_tensor *src) {
  size_t n = (size_t)src->numel_ * lm_dtype_size(src->dtype_);
  lm_storage s2;
  void *a = NULL, *b = NULL;
  const char *sp = NULL;
  int rc = gather_on_device(src, src->dtype_, &a, &sp);
  if (rc == 0) rc = lm_cuda_use(dst);
  if (rc == 0 && !(b = scratch(n))) rc = -1;
  if (rc == 0) {
    cudaError_t e = cudaMemcpyPeer(b, dst->device_ - LM_CUDA0, sp, src->device_ - LM_CUDA0, n);
    if (e != cudaSuccess) rc = lm_cuda_fail("copy between GPUs", e);
    lm_tensor t = dense(&s2, b, src, src->dtype_, dst->device_);
    if (rc == 0) rc = device_copy(dst, &t);
  }
  if (b) lm_cuda_free(b); /* dst's device is current */
  if (a && lm_cuda_use(src) == 0) lm_cuda_free(a);
  lm_cuda_use(dst);
  return rc;
}

int lm_cuda_copy(lm_tensor *dst, const lm_tensor *src) {
  if (dst->numel_ != src->numel_) return lm_error("copy: sizes differ");
  if (dst->numel_ == 0) return 0;
  if (src->device_ == LM_CPU && dst->device_ == LM_CPU) return lm_copy_(dst, src);
  if (src->device_ == LM_CPU) return host_to_device(dst, src);
  if (dst->device_ == LM_CPU) return device_to_host(dst, src);
  if (src->device_ != dst->device_) return peer_copy(dst, src);
  return device_copy(dst, src);
}

template <typename T> struct Fill {
  T v;
  __host__ __device__ void operator()(char **p) const { *(T *)p[0] = v; }
};

int lm_cuda_fill(lm_tensor *t, double v) {
  if (t->numel_ == 0) return 0;
  if (lm_cuda_use(t) < 0) return -1;
  int es = lm_dtype_size(t->dtype_);
  unsigned char b[8] = {0};
  lm_store(b, t->dtype_, v);
  bool same = true;
  for (int k = 1; k < es; k++) same = same && b[k] == b[0];
  if (same && lm_is_contiguous(t)) {
    LM_CUDA_TRY(cudaMemsetAsync(lm_ptr(t), b[0], (size_t)t->numel_ * es, LM_STREAM));
    return 0;
  }
  const lm_tensor *a[1] = {t};
  uint16_t u16; uint32_t u32; uint64_t u64;
  memcpy(&u16, b, 2), memcpy(&u32, b, 4), memcpy(&u64, b, 8);
  switch (es) {
  case 1: return lm_launch<1>(a, Fill<uint8_t>{b[0]}, "fill");
  case 2: return lm_launch<1>(a, Fill<uint16_t>{u16}, "fill");
  case 4: return lm_launch<1>(a, Fill<uint32_t>{u32}, "fill");
  default: return lm_launch<1>(a, Fill<uint64_t>{u64}, "fill");
  }
}
