/* nn.cu: row kernels for softmax and layer/rms norm on contiguous (rows, n)
 * f32/f64 tensors (a block per row), and the embedding gather. */
#include "common.cuh"
#include "kernels.cuh"

/* ---- softmax / log_softmax over the last dim ---- */
template <typename T>
__global__ void __launch_bounds__(LM_ROW_THREADS) softmax_kernel(T *out, const T *x, int64_t rows, int64_t n, int is_log) {
  __shared__ double sm[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *p = x + r * n;
    T *o = out + r * n;
    double m = -INFINITY, s = 0; /* the sum accumulates in double, as on the CPU */
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = (p[j] != p[j] || p[j] > m) ? p[j] : m;
    T mt = (T)lm_block_reduce(m, true, sm);
    if (is_log) {
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += (double)exp(p[j] - mt);
      T lse = mt + (T)log(lm_block_reduce(s, false, sm));
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) o[j] = p[j] - lse;
    } else {
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        T e = exp(p[j] - mt);
        o[j] = e;
        s += (double)e;
      }
      T inv = (T)(1 / lm_block_reduce(s, false, sm));
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) o[j] *= inv;
    }
  }
}

static int rows_of(const lm_tensor *x, int64_t *rows, int64_t *n) {
  *n = x->ndim ? x->shape_[x->ndim - 1] : 1;
  *rows = *n ? x->numel_ / *n : 0;
  return 0;
}

int lm_cuda_softmax(lm_tensor *out, const lm_tensor *x, int log) {
  int64_t rows, n;
  rows_of(x, &rows, &n);
  if (rows == 0 || n == 0) return 0;
  if (!lm_is_contiguous(x) || !lm_is_contiguous(out) || out->dtype_ != x->dtype_)
    return lm_error("softmax kernel: expected contiguous tensors of one dtype");
  if (lm_cuda_use(out) < 0) return -1;
  int threads = lm_row_threads(n);
  if (x->dtype_ == LM_F32)
    softmax_kernel<float><<<lm_blocks(rows, 1), threads, 0, LM_STREAM>>>(
        (float *)lm_ptr(out), (const float *)lm_ptr(x), rows, n, log);
  else if (x->dtype_ == LM_F64)
    softmax_kernel<double><<<lm_blocks(rows, 1), threads, 0, LM_STREAM>>>(
        (double *)lm_ptr(out), (const double *)lm_ptr(x), rows, n, log);
  else
    return lm_error("softmax kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_));
  return lm_cuda_launched("softmax");
}

/* ---- layer_norm (rms = 0) and rms_norm (rms = 1) ---- */
template <typename T> struct NormArgs {
  T *out;
  const T *x, *w, *b;
  int64_t ws, bs; /* element strides of w and b */
  char *mean, *rstd;
  int mdt, rdt;   /* their dtypes */
  int64_t rows, n;
  double eps;
  int rms;
};

/* Statistics and the normalised value in double, as on the CPU. */
template <typename T> __global__ void __launch_bounds__(LM_ROW_THREADS) norm_kernel(NormArgs<T> a) {
  __shared__ double sm[32];
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T *p = a.x + r * a.n;
    T *o = a.out + r * a.n;
    double mean = 0, ss = 0;
    if (!a.rms) {
      double s = 0;
      for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) s += p[j];
      mean = lm_block_reduce(s, false, sm) / (double)a.n;
    }
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
      double d = p[j] - mean;
      ss += d * d;
    }
    double rstd = 1 / sqrt(lm_block_reduce(ss, false, sm) / (double)a.n + a.eps);
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
      double y = (p[j] - mean) * rstd;
      if (a.w) y *= a.w[j * a.ws];
      if (a.b) y += a.b[j * a.bs];
      o[j] = (T)y;
    }
    if (threadIdx.x == 0) {
      if (a.mean) lm_dev_store_as<T>(a.mean + r * lm_dtype_size_dev(a.mdt), a.mdt, (T)mean);
      if (a.rstd) lm_dev_store_as<T>(a.rstd + r * lm_dtype_size_dev(a.rdt), a.rdt, (T)rstd);
    }
  }
}

template <typename T>
static void launch_norm(lm_tensor *out, lm_tensor *mean, lm_tensor *rstd, const lm_tensor *x,
                        const lm_tensor *w, const lm_tensor *b, double eps, int rms,
                        int64_t rows, int64_t n) {
  NormArgs<T> a;
  a.out = (T *)lm_ptr(out), a.x = (const T *)lm_ptr(x);
  a.w = w ? (const T *)lm_ptr(w) : NULL, a.b = b ? (const T *)lm_ptr(b) : NULL;
  a.ws = w && w->ndim ? w->stride_[w->ndim - 1] : 1, a.bs = b && b->ndim ? b->stride_[b->ndim - 1] : 1;
  a.mean = mean ? lm_ptr(mean) : NULL, a.rstd = rstd ? lm_ptr(rstd) : NULL;
  a.mdt = mean ? mean->dtype_ : x->dtype_, a.rdt = rstd ? rstd->dtype_ : x->dtype_;
  a.rows = rows, a.n = n, a.eps = eps, a.rms = rms;
  norm_kernel<T><<<lm_blocks(rows, 1), lm_row_threads(n), 0, LM_STREAM>>>(a);
}

int lm_cuda_norm(lm_tensor *out, lm_tensor *mean, lm_tensor *rstd, const lm_tensor *x,
                 const lm_tensor *w, const lm_tensor *b, double eps, int rms) {
  int64_t rows, n;
  rows_of(x, &rows, &n);
  if (rows == 0 || n == 0) return 0;
  if (!lm_is_contiguous(x) || !lm_is_contiguous(out) || out->dtype_ != x->dtype_ ||
      (w && w->dtype_ != x->dtype_) || (b && b->dtype_ != x->dtype_))
    return lm_error("norm kernel: expected contiguous tensors of one dtype");
  if (lm_cuda_use(out) < 0) return -1;
  if (x->dtype_ == LM_F32) launch_norm<float>(out, mean, rstd, x, w, b, eps, rms, rows, n);
  else if (x->dtype_ == LM_F64) launch_norm<double>(out, mean, rstd, x, w, b, eps, rms, rows, n);
  else return lm_error("norm kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_));
  return lm_cuda_launched("norm");
}

/* ---- embedding: out[r, :] = w[idx[r], :]. The op checks the ids; should
 * one slip through, its row reads as zeros rather than out of bounds. ---- */
template <typename E>
__global__ void __launch_bounds__(LM_THREADS) embedding_kernel(E *out, const E *w, const int64_t *idx, int64_t rows, int64_t d,
                                 int64_t vocab, int64_t ws0, int64_t ws1) {
  int64_t n = rows * d;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / d, j = i - r * d, k = idx[r];
    out[i] = k >= 0 && k < vocab ? w[k * ws0 + j * ws1] : E(0);
  }
}

int lm_cuda_embedding(lm_tensor *out, const lm_tensor *w, const lm_tensor *idx) {
  if (out->numel_ == 0) return 0;
  if (w->ndim != 2 || idx->dtype_ != LM_I64 || out->dtype_ != w->dtype_ ||
      !lm_is_contiguous(out) || !lm_is_contiguous(idx))
    return lm_error("embedding kernel: expected a 2-D weight, contiguous i64 indices and output");
  if (lm_cuda_use(out) < 0) return -1;
  int64_t rows = idx->numel_, d = w->shape_[1], v = w->shape_[0];
  unsigned blocks = lm_blocks(rows * d);
  const int64_t *ip = (const int64_t *)lm_ptr(idx);
  switch (lm_dtype_size(w->dtype_)) {
#define EMB(E)                                                                 \
  embedding_kernel<E><<<blocks, LM_THREADS, 0, LM_STREAM>>>(                   \
      (E *)lm_ptr(out), (const E *)lm_ptr(w), ip, rows, d, v, w->stride_[0], w->stride_[1]); \
  break
  case 1: EMB(uint8_t);
  case 2: EMB(uint16_t);
  case 4: EMB(uint32_t);
  default: EMB(uint64_t);
#undef EMB
  }
  return lm_cuda_launched("embedding");
}

/* ---- index_add: out[idx[r], :] += src[r, :] (embedding's gradient).
 * Atomic adds: rows sharing an id add up in no fixed order. ---- */
template <typename T>
__global__ void __launch_bounds__(LM_THREADS) index_add_kernel(T *out, const int64_t *idx, const T *src, int64_t rows,
                                 int64_t d, int64_t vocab) {
  int64_t n = rows * d;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / d, j = i - r * d, k = idx[r];
    if (k >= 0 && k < vocab) atomicAdd(out + k * d + j, src[i]);
  }
}

int lm_cuda_index_add(lm_tensor *out, const lm_tensor *idx, const lm_tensor *src) {
  int64_t rows = idx->numel_, d = out->ndim == 2 ? out->shape_[1] : 0, v = out->shape_[0];
  if (rows * d == 0) return 0;
  if (out->ndim != 2 || idx->dtype_ != LM_I64 || src->dtype_ != out->dtype_ ||
      !lm_is_contiguous(out) || !lm_is_contiguous(idx) || !lm_is_contiguous(src))
    return lm_error("index_add kernel: expected contiguous (V, n) out, i64 ids, (rows, n) src");
  if (lm_cuda_use(out) < 0) return -1;
  const int64_t *ip = (const int64_t *)lm_ptr(idx);
  if (out->dtype_ == LM_F32)
    index_add_kernel<float><<<lm_blocks(rows * d), LM_THREADS, 0, LM_STREAM>>>(
        (float *)lm_ptr(out), ip, (const float *)lm_ptr(src), rows, d, v);
  else if (out->dtype_ == LM_F64)
    index_add_kernel<double><<<lm_blocks(rows * d), LM_THREADS, 0, LM_STREAM>>>(
        (double *)lm_ptr(out), ip, (const double *)lm_ptr(src), rows, d, v);
  else
    return lm_error("index_add kernel: no kernel for dtype %s", lm_dtype_name(out->dtype_));
  return lm_cuda_launched("index_add");
}
