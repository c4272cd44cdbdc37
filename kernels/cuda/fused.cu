/* fused.cu: one-pass kernels for the fused slots of core/backend.h that are
 * pointwise or per row: unary_grad, swiglu and its backward, softmax and
 * layer/rms norm backward, rotary embeddings. Each computes in the compute
 * type of its storage type (common.cuh: double for f64, float else) and
 * follows the composed form of core/ops/ formula for formula. */
#include "common.cuh"
#include "kernels.cuh"
#include "../unary_math.h"

/* ---- unary_grad: gx = g * f'(x), y = f(x) ---- */
/* what the derivative of kind reads (core/unary.h) */
static bool differentiable(int kind) { return lm_unary_grad_reads(kind) != LM_D_NONE; }
static bool reads_y(int kind) { return lm_unary_grad_reads(kind) == LM_D_Y; }

template <typename C> struct UnaryGrad { /* p: gx, g, x, y */
  int kind, dgx, dg, dx, dy;
  bool have_y;
  C k0, k1;
  __device__ void operator()(char **p) const {
    C x = lm_ld<C>(p[2], dx), y = 0;
    if (have_y) y = lm_ld<C>(p[3], dy);
    else if (lm_unary_grad_reads(kind) == LM_D_Y) y = lm_unary(kind, x, k0, k1);
    lm_st<C>(p[0], dgx, lm_ld<C>(p[1], dg) * lm_unary_d(kind, x, y, k0, k1));
  }
};

int lm_cuda_unary_grad(int kind, lm_tensor *gx, const lm_tensor *g, const lm_tensor *x,
                       const lm_tensor *y, const double *p) {
  if (!differentiable(kind))
    return lm_error("unary_grad kernel: kind %d has no derivative", kind);
  const lm_tensor *t[4] = {gx, g, x, y ? y : x};
  for (int i = 0; i < 4; i++)
    if (!lm_is_float(t[i]->dtype_))
      return lm_error("unary_grad kernel: expected float tensors, got %s", lm_dtype_name(t[i]->dtype_));
  double k0 = p ? p[0] : 0, k1 = p ? p[1] : 0;
  if (kind == LM_CLAMP) { /* a NaN bound is open, as the forward makes it */
    if (k0 != k0) k0 = -INFINITY;
    if (k1 != k1) k1 = INFINITY;
  }
  bool have_y = y != NULL && reads_y(kind);
  if (gx->dtype_ == LM_F64) {
    UnaryGrad<double> f = {kind, gx->dtype_, g->dtype_, x->dtype_, t[3]->dtype_, have_y, k0, k1};
    return lm_launch<4>(t, f, "unary_grad");
  }
  UnaryGrad<float> f = {kind, gx->dtype_, g->dtype_, x->dtype_, t[3]->dtype_, have_y, (float)k0, (float)k1};
  return lm_launch<4>(t, f, "unary_grad");
}

/* ---- swiglu: out = silu(a) * b; da = g * b * silu'(a), db = g * silu(a) ---- */
template <typename T> __global__ void __launch_bounds__(LM_THREADS) swiglu_kernel(T *out, const T *a, const T *b, int64_t n) {
  typedef typename lm_acc<T>::type C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    C x = lm_to_acc(a[i]);
    out[i] = lm_from_acc<T>(x / (1 + exp(-x)) * lm_to_acc(b[i]));
  }
}

template <typename T>
__global__ void __launch_bounds__(LM_THREADS) swiglu_bwd_kernel(T *da, T *db, const T *g, const T *a, const T *b, int64_t n) {
  typedef typename lm_acc<T>::type C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    C x = lm_to_acc(a[i]), gi = lm_to_acc(g[i]), e = exp(-x), sig = 1 / (1 + e);
    if (da) da[i] = lm_from_acc<T>(gi * lm_to_acc(b[i]) * ((1 + x * (1 - sig)) / (1 + e)));
    if (db) db[i] = lm_from_acc<T>(gi * x * sig);
  }
}

/* every tensor given is contiguous, of ref's dtype and element count */
static int same_dense(const char *what, const lm_tensor *ref, int n, const lm_tensor *const *t) {
  for (int i = 0; i < n; i++) {
    if (!t[i]) continue;
    if (!lm_is_contiguous(t[i]) || t[i]->dtype_ != ref->dtype_ || t[i]->numel_ != ref->numel_)
      return lm_error("%s kernel: expected contiguous tensors of one dtype and size", what);
  }
  return 0;
}

int lm_cuda_swiglu(lm_tensor *out, const lm_tensor *a, const lm_tensor *b) {
  const lm_tensor *t[3] = {out, a, b};
  LM_TRY(same_dense("swiglu", out, 3, t));
  int64_t n = out->numel_;
  if (n == 0) return 0;
  if (lm_cuda_use(out) < 0) return -1;
  return lm_by_float_dtype(out->dtype_, "swiglu kernel", [&](auto z) {
    typedef decltype(z) T;
    LM_LAUNCH(lm_blocks(n), LM_THREADS, 0, swiglu_kernel<T>)(
        (T *)lm_ptr(out), (const T *)lm_ptr(a), (const T *)lm_ptr(b), n);
    return lm_cuda_launched("swiglu");
  });
}

int lm_cuda_swiglu_bwd(lm_tensor *da, lm_tensor *db, const lm_tensor *g, const lm_tensor *a,
                       const lm_tensor *b) {
  const lm_tensor *t[5] = {g, a, b, da, db};
  LM_TRY(same_dense("swiglu_bwd", g, 5, t));
  int64_t n = g->numel_;
  if (n == 0 || (!da && !db)) return 0;
  if (lm_cuda_use(g) < 0) return -1;
  return lm_by_float_dtype(g->dtype_, "swiglu_bwd kernel", [&](auto z) {
    typedef decltype(z) T;
    LM_LAUNCH(lm_blocks(n), LM_THREADS, 0, swiglu_bwd_kernel<T>)(
        da ? (T *)lm_ptr(da) : NULL, db ? (T *)lm_ptr(db) : NULL, (const T *)lm_ptr(g),
        (const T *)lm_ptr(a), (const T *)lm_ptr(b), n);
    return lm_cuda_launched("swiglu_bwd");
  });
}

/* ---- rows: a block per row of a contiguous (rows, n) view ---- */
static void rows_of(const lm_tensor *x, int64_t *rows, int64_t *n) {
  *n = x->ndim ? x->shape_[x->ndim - 1] : 1;
  *rows = *n ? x->numel_ / *n : 0;
}

/* softmax: gx = y * (g - sum(g * y)); log_softmax: gx = g - exp(y) * sum(g) */
template <typename T>
__global__ void __launch_bounds__(LM_ROW_THREADS) softmax_bwd_kernel(T *gx, const T *g, const T *y, int64_t rows, int64_t n, int log) {
  typedef typename lm_acc<T>::type C;
  __shared__ C sm[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *gr = g + r * n, *yr = y + r * n;
    T *o = gx + r * n;
    C s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      s += log ? lm_to_acc(gr[j]) : lm_to_acc(gr[j]) * lm_to_acc(yr[j]);
    s = lm_block_reduce(s, false, sm);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      C gj = lm_to_acc(gr[j]), yj = lm_to_acc(yr[j]);
      o[j] = lm_from_acc<T>(log ? gj - exp(yj) * s : yj * (gj - s));
    }
  }
}

int lm_cuda_softmax_bwd(lm_tensor *gx, const lm_tensor *g, const lm_tensor *y, int log) {
  const lm_tensor *t[3] = {gx, g, y};
  LM_TRY(same_dense("softmax_bwd", gx, 3, t));
  int64_t rows, n;
  rows_of(gx, &rows, &n);
  if (rows == 0 || n == 0) return 0;
  if (lm_cuda_use(gx) < 0) return -1;
  return lm_by_float_dtype(gx->dtype_, "softmax_bwd kernel", [&](auto z) {
    typedef decltype(z) T;
    LM_LAUNCH(lm_blocks(rows, 1), lm_row_threads(n), 0, softmax_bwd_kernel<T>)(
        (T *)lm_ptr(gx), (const T *)lm_ptr(g), (const T *)lm_ptr(y), rows, n, log);
    return lm_cuda_launched("softmax_bwd");
  });
}

/* ---- layer/rms norm backward ----
 * xhat = (x - mean) * rstd (mean 0 for rms), gh = g * w:
 * dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), without the
 * mean(gh) term for rms; dw = sum over rows of g * xhat, db = sum of g. */
struct NormBwd {
  char *dx;
  const char *g, *x, *w, *mean, *rstd;
  int dt, wdt, mdt, rdt;  /* dtypes: dx/g/x, w, mean, rstd */
  int64_t ws;             /* w's element stride */
  int64_t rows, n;
  int rms;
};

template <typename T, typename C> __device__ inline C norm_xhat(const T *xr, int64_t j, C mu, C rstd) {
  return (lm_to_acc(xr[j]) - mu) * rstd;
}

template <typename T> __global__ void __launch_bounds__(LM_ROW_THREADS) norm_dx_kernel(NormBwd a) {
  typedef typename lm_acc<T>::type C;
  __shared__ C sm[32];
  int es = lm_dtype_size_dev(a.wdt);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T *gr = (const T *)a.g + r * a.n, *xr = (const T *)a.x + r * a.n;
    T *o = (T *)a.dx + r * a.n;
    C mu = a.rms ? 0 : lm_ld<C>(a.mean + r * lm_dtype_size_dev(a.mdt), a.mdt);
    C rstd = lm_ld<C>(a.rstd + r * lm_dtype_size_dev(a.rdt), a.rdt);
    C s1 = 0, s2 = 0;
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
      C gh = lm_to_acc(gr[j]);
      if (a.w) gh *= lm_ld<C>(a.w + j * a.ws * es, a.wdt);
      s1 += gh, s2 += gh * norm_xhat<T, C>(xr, j, mu, rstd);
    }
    C m1 = a.rms ? 0 : lm_block_reduce(s1, false, sm) / (C)a.n;
    C m2 = lm_block_reduce(s2, false, sm) / (C)a.n;
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
      C gh = lm_to_acc(gr[j]);
      if (a.w) gh *= lm_ld<C>(a.w + j * a.ws * es, a.wdt);
      o[j] = lm_from_acc<T>(rstd * (gh - m1 - norm_xhat<T, C>(xr, j, mu, rstd) * m2));
    }
  }
}

/* dw, db partial sums: block (32, 8) sums 32 columns over NORM_CHUNK rows
 * into part[chunk][j] (dw) and part[chunks + chunk][j] (db) */
#define NORM_CHUNK 64
template <typename T>
__global__ void __launch_bounds__(LM_THREADS) norm_dwdb_partial(NormBwd a, typename lm_acc<T>::type *part, int64_t chunks) {
  typedef typename lm_acc<T>::type C;
  __shared__ C sw[8][33], sb[8][33];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t j = blockIdx.x * 32 + tx, chunk = blockIdx.y, r1 = (chunk + 1) * NORM_CHUNK;
  C dw = 0, db = 0;
  if (j < a.n) {
    for (int64_t r = chunk * NORM_CHUNK + ty; r < r1 && r < a.rows; r += 8) {
      C mu = a.rms ? 0 : lm_ld<C>(a.mean + r * lm_dtype_size_dev(a.mdt), a.mdt);
      C rstd = lm_ld<C>(a.rstd + r * lm_dtype_size_dev(a.rdt), a.rdt);
      C gj = lm_to_acc(((const T *)a.g)[r * a.n + j]);
      dw += gj * norm_xhat<T, C>((const T *)a.x + r * a.n, j, mu, rstd);
      db += gj;
    }
  }
  sw[ty][tx] = dw, sb[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && j < a.n) {
    for (int k = 1; k < 8; k++) dw += sw[k][tx], db += sb[k][tx];
    part[chunk * a.n + j] = dw;
    part[(chunks + chunk) * a.n + j] = db;
  }
}

/* dw[j], db[j] = the sums of the chunks' partials, in a fixed order */
template <typename C>
__global__ void __launch_bounds__(LM_THREADS) norm_dwdb_final(const C *part, int64_t chunks, int64_t n, char *dw, int dwt,
                                int64_t dws, char *db, int dbt, int64_t dbs) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
    C sw = 0, sb = 0;
    for (int64_t c = 0; c < chunks; c++) sw += part[c * n + j], sb += part[(chunks + c) * n + j];
    if (dw) lm_st<C>(dw + j * dws * lm_dtype_size_dev(dwt), dwt, sw);
    if (db) lm_st<C>(db + j * dbs * lm_dtype_size_dev(dbt), dbt, sb);
  }
}

static int64_t last_stride(const lm_tensor *t) { return t && t->ndim ? t->stride_[t->ndim - 1] : 1; }

int lm_cuda_norm_bwd(lm_tensor *dx, lm_tensor *dw, lm_tensor *db, const lm_tensor *g,
                     const lm_tensor *x, const lm_tensor *w, const lm_tensor *mean,
                     const lm_tensor *rstd, int rms) {
  const lm_tensor *t[3] = {dx, g, x};
  LM_TRY(same_dense("norm_bwd", x, 3, t));
  int64_t rows, n;
  rows_of(x, &rows, &n);
  if (!rstd || (!rms && !mean))
    return lm_error("norm_bwd kernel: expected rstd, and mean for layer_norm");
  if (rstd->numel_ != rows || (!rms && mean->numel_ != rows) || (w && w->numel_ != n) || (dw && dw->numel_ != n) || (db && db->numel_ != n))
    return lm_error("norm_bwd kernel: expected rstd (%lld) and w, dw, db (%lld)", (long long)rows,
                    (long long)n);
  if (rows == 0 || n == 0) return 0;
  if (!lm_is_contiguous(rstd) || (mean && !lm_is_contiguous(mean)))
    return lm_error("norm_bwd kernel: expected contiguous mean and rstd");
  if (lm_cuda_use(x) < 0) return -1;
  NormBwd a;
  a.dx = lm_ptr(dx), a.g = lm_ptr(g), a.x = lm_ptr(x);
  a.w = w ? lm_ptr(w) : NULL, a.mean = mean ? lm_ptr(mean) : NULL, a.rstd = lm_ptr(rstd);
  a.dt = x->dtype_, a.wdt = w ? w->dtype_ : x->dtype_;
  a.mdt = mean ? mean->dtype_ : x->dtype_, a.rdt = rstd->dtype_;
  a.ws = last_stride(w), a.rows = rows, a.n = n, a.rms = rms;
  return lm_by_float_dtype(x->dtype_, "norm_bwd kernel", [&](auto z) {
    typedef decltype(z) T;
    typedef typename lm_acc<T>::type C;
    LM_LAUNCH(lm_blocks(rows, 1), lm_row_threads(n), 0, norm_dx_kernel<T>)(a);
    LM_TRY(lm_cuda_launched("norm_bwd"));
    if (!dw && !db) return 0;
    int64_t chunks = (rows + NORM_CHUNK - 1) / NORM_CHUNK;
    if (chunks > 65535) return lm_error("norm_bwd kernel: %lld rows are too many", (long long)rows);
    C *part = (C *)lm_cuda_alloc((size_t)(2 * chunks * n) * sizeof(C));
    if (!part) return -1;
    dim3 grid((unsigned)((n + 31) / 32), (unsigned)chunks);
    LM_LAUNCH(grid, dim3(32, 8), 0, norm_dwdb_partial<T>)(a, part, chunks);
    LM_LAUNCH(lm_blocks(n), LM_THREADS, 0, norm_dwdb_final<C>)(
        part, chunks, n, dw ? lm_ptr(dw) : NULL, dw ? dw->dtype_ : 0, last_stride(dw),
        db ? lm_ptr(db) : NULL, db ? db->dtype_ : 0, last_stride(db));
    lm_cuda_free(part); /* stream-ordered: the kernels above run first */
    return lm_cuda_launched("norm_bwd (dw, db)");
  });
}

/* ---- rope: pairs (x[2i], x[2i+1]) of contiguous (outer, T, H, D) rotate by
 * sign * angle: (a c - b s, a s + b c), c = cos[t, i], s = sign * sin[t, i] */
struct Rope {
  const char *cos, *sin;
  int cdt, sdt;
  int64_t cs0, cs1, ss0, ss1; /* element strides of cos and sin */
  int64_t T, H, half;         /* half = D / 2 */
  int sign;
};

template <typename T> __global__ void __launch_bounds__(LM_THREADS) rope_kernel(T *out, const T *x, Rope r, int64_t pairs) {
  typedef typename lm_acc<T>::type C;
  int ce = lm_dtype_size_dev(r.cdt), se = lm_dtype_size_dev(r.sdt);
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < pairs; p += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = p % r.half, t = p / r.half / r.H % r.T;
    C c = lm_ld<C>(r.cos + (t * r.cs0 + i * r.cs1) * ce, r.cdt);
    C s = lm_ld<C>(r.sin + (t * r.ss0 + i * r.ss1) * se, r.sdt);
    if (r.sign < 0) s = -s;
    C a = lm_to_acc(x[2 * p]), b = lm_to_acc(x[2 * p + 1]);
    out[2 * p] = lm_from_acc<T>(a * c - b * s);
    out[2 * p + 1] = lm_from_acc<T>(a * s + b * c);
  }
}

int lm_cuda_rope(lm_tensor *out, const lm_tensor *x, const lm_tensor *cos, const lm_tensor *sin,
                 int sign) {
  const lm_tensor *t[2] = {out, x};
  LM_TRY(same_dense("rope", x, 2, t));
  int nd = x->ndim;
  if (nd < 3 || x->shape_[nd - 1] % 2) return lm_error("rope kernel: expected x (..., T, H, D), D even");
  int64_t T = x->shape_[nd - 3], H = x->shape_[nd - 2], half = x->shape_[nd - 1] / 2;
  if (cos->ndim != 2 || sin->ndim != 2 || cos->shape_[0] != T || cos->shape_[1] != half ||
      sin->shape_[0] != T || sin->shape_[1] != half || !lm_is_float(cos->dtype_) || !lm_is_float(sin->dtype_))
    return lm_error("rope kernel: expected float cos and sin of shape (%lld, %lld)", (long long)T,
                    (long long)half);
  int64_t pairs = x->numel_ / 2;
  if (pairs == 0) return 0;
  if (lm_cuda_use(out) < 0) return -1;
  Rope r = {lm_ptr(cos), lm_ptr(sin), cos->dtype_, sin->dtype_, cos->stride_[0], cos->stride_[1],
            sin->stride_[0], sin->stride_[1], T, H, half, sign};
  return lm_by_float_dtype(x->dtype_, "rope kernel", [&](auto z) {
    typedef decltype(z) TT;
    LM_LAUNCH(lm_blocks(pairs), LM_THREADS, 0, rope_kernel<TT>)((TT *)lm_ptr(out),
                                                                    (const TT *)lm_ptr(x), r, pairs);
    return lm_cuda_launched("rope");
  });
}
