/* loss.cu: cross entropy over class ids in one pass over each row of logits
 * (a block per row, the vocabulary walked in strides by its threads), with
 * an online log-sum-exp: no softmax is ever stored. Semantics of
 * core/backend.h: with class weights w (1 without), label smoothing eps and
 * C classes, for a row x with target t (rows whose target is `ignore` give 0)
 *   loss = -(1 - eps) w_t (x_t - lse) - eps / C * sum_c w_c (x_c - lse)
 *   d loss / d x_c = p_c ((1 - eps) w_t + eps / C * sum(w)) - (1 - eps) w_t [c = t] - eps / C * w_c
 * with p_c = exp(x_c - lse). */
#include "common.cuh"
#include "kernels.cuh"

/* a running max m and sum s of exp(x - m) */
template <typename C> struct MaxSum { C m, s; };

template <typename C> __device__ inline MaxSum<C> ms_add(MaxSum<C> a, C x) {
  if (x == -INFINITY) return a;                 /* exp(-inf) adds nothing */
  if (x > a.m) a.s = a.s * exp(a.m - x) + 1, a.m = x;
  else a.s += exp(x - a.m);                      /* NaN x makes s NaN */
  return a;
}

template <typename C> __device__ inline MaxSum<C> ms_merge(MaxSum<C> a, MaxSum<C> b) {
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  C m = a.m > b.m ? a.m : b.m;
  return MaxSum<C>{m, a.s * exp(a.m - m) + b.s * exp(b.m - m)};
}

/* the block's merged MaxSum, in every thread; sm holds 32 of them */
template <typename C> __device__ MaxSum<C> ms_block_reduce(MaxSum<C> v, MaxSum<C> *sm) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1)
    v = ms_merge(v, MaxSum<C>{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  __syncthreads();
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  if (warp == 0) {
    MaxSum<C> u = lane < nw ? sm[lane] : MaxSum<C>{-INFINITY, 0};
    for (int o = 16; o > 0; o >>= 1)
      u = ms_merge(u, MaxSum<C>{__shfl_xor_sync(0xffffffffu, u.m, o), __shfl_xor_sync(0xffffffffu, u.s, o)});
    if (lane == 0) sm[0] = u;
  }
  __syncthreads();
  return sm[0];
}

struct CeArgs {
  const char *x, *target, *w, *lse_in, *gloss;
  char *loss, *lse, *dx;
  int wdt, ldt, edt, gdt;            /* dtypes of w, loss, lse, gloss */
  int64_t ts, ws, ls, es, gs;        /* element strides of target, w, loss, lse, gloss */
  int64_t N, C, ignore;
  double eps;
};

template <typename T> __device__ inline int64_t ce_target(const CeArgs &a, int64_t r) {
  int64_t t = ((const int64_t *)a.target)[r * a.ts];
  return t == a.ignore || t < 0 || t >= a.C ? -1 : t; /* the op checks ids; -1: skip the row */
}

template <typename T, typename C> __device__ inline C ce_w(const CeArgs &a, int64_t c) {
  return a.w ? lm_ld<C>(a.w + c * a.ws * lm_dtype_size_dev(a.wdt), a.wdt) : (C)1;
}

template <typename T> __global__ void __launch_bounds__(LM_ROW_THREADS) ce_fwd_kernel(CeArgs a) {
  typedef typename lm_acc<T>::type C;
  __shared__ MaxSum<C> sm[32];
  __shared__ C sc[32];
  const bool smooth = a.eps > 0;
  for (int64_t r = blockIdx.x; r < a.N; r += gridDim.x) {
    const T *x = (const T *)a.x + r * a.C;
    C x0 = lm_to_acc(x[0]); /* sums of w (x - x0): no cancellation from a common offset */
    MaxSum<C> ms = {-INFINITY, 0};
    C swx = 0, sw = 0;
    for (int64_t c = threadIdx.x; c < a.C; c += blockDim.x) {
      C v = lm_to_acc(x[c]);
      ms = ms_add(ms, v);
      if (smooth) {
        C wc = ce_w<T, C>(a, c);
        swx += wc * (v - x0), sw += wc;
      }
    }
    ms = ms_block_reduce(ms, sm);
    if (smooth) swx = lm_block_reduce(swx, false, sc), sw = lm_block_reduce(sw, false, sc);
    if (threadIdx.x == 0) {
      C lse = ms.m + log(ms.s), loss = 0;
      int64_t t = ce_target<T>(a, r);
      if (t >= 0) {
        if (a.eps < 1) loss -= (C)(1 - a.eps) * ce_w<T, C>(a, t) * (lm_to_acc(x[t]) - lse);
        if (smooth) loss -= (C)(a.eps / (double)a.C) * (swx - (lse - x0) * sw);
      }
      lm_st<C>(a.loss + r * a.ls * lm_dtype_size_dev(a.ldt), a.ldt, loss);
      lm_st<C>(a.lse + r * a.es * lm_dtype_size_dev(a.edt), a.edt, lse);
    }
  }
}

template <typename T> __global__ void __launch_bounds__(LM_ROW_THREADS) ce_bwd_kernel(CeArgs a) {
  typedef typename lm_acc<T>::type C;
  __shared__ C sc[32];
  const bool smooth = a.eps > 0;
  const C k = (C)(a.eps / (double)a.C), keep = (C)(1 - a.eps);
  for (int64_t r = blockIdx.x; r < a.N; r += gridDim.x) {
    const T *x = (const T *)a.x + r * a.C;
    T *dx = (T *)a.dx + r * a.C;
    int64_t t = ce_target<T>(a, r);
    if (t < 0) { /* ignored: no gradient */
      for (int64_t c = threadIdx.x; c < a.C; c += blockDim.x) dx[c] = lm_from_acc<T>((C)0);
      continue;
    }
    C sw = (C)a.C;
    if (smooth && a.w) {
      C s = 0;
      for (int64_t c = threadIdx.x; c < a.C; c += blockDim.x) s += ce_w<T, C>(a, c);
      sw = lm_block_reduce(s, false, sc);
    }
    C g = lm_ld<C>(a.gloss + r * a.gs * lm_dtype_size_dev(a.gdt), a.gdt);
    C lse = lm_ld<C>(a.lse_in + r * a.es * lm_dtype_size_dev(a.edt), a.edt);
    C wt = ce_w<T, C>(a, t), A = keep * wt + k * sw;
    for (int64_t c = threadIdx.x; c < a.C; c += blockDim.x) {
      C d = exp(lm_to_acc(x[c]) - lse) * A;
      if (c == t) d -= keep * wt;
      if (smooth) d -= k * ce_w<T, C>(a, c);
      dx[c] = lm_from_acc<T>(g * d);
    }
  }
}

/* the element stride of a vector (any dims of size 1 around it; 0 for one element) */
static int64_t stride1(const lm_tensor *t) {
  for (int d = 0; d < t->ndim; d++)
    if (t->shape_[d] > 1) return t->stride_[d];
  return 0;
}

/* checks and the arguments both directions share */
static int ce_args(CeArgs *a, const lm_tensor *x, const lm_tensor *target, const lm_tensor *w,
                   int64_t ignore, double eps) {
  memset(a, 0, sizeof *a);
  if (x->ndim != 2 || !lm_is_contiguous(x))
    return lm_error("cross_entropy kernel: expected contiguous logits (N, C)");
  a->N = x->shape_[0], a->C = x->shape_[1];
  if (target->dtype_ != LM_I64 || target->numel_ != a->N)
    return lm_error("cross_entropy kernel: expected i64 targets (%lld)", (long long)a->N);
  if (w && (w->numel_ != a->C || !lm_is_float(w->dtype_)))
    return lm_error("cross_entropy kernel: expected float class weights (%lld)", (long long)a->C);
  a->x = lm_ptr(x), a->target = lm_ptr(target), a->ts = stride1(target);
  a->w = w ? lm_ptr(w) : NULL, a->wdt = w ? (int)w->dtype_ : (int)LM_F32, a->ws = w ? stride1(w) : 0;
  a->ignore = ignore, a->eps = eps;
  return 0;
}

static int rows_ok(const char *what, const lm_tensor *t, int64_t n) {
  if (!t || t->numel_ != n || !lm_is_float(t->dtype_))
    return lm_error("cross_entropy kernel: expected a float %s of %lld rows", what, (long long)n);
  return 0;
}

int lm_cuda_cross_entropy(lm_tensor *loss, lm_tensor *lse, const lm_tensor *x,
                          const lm_tensor *target, const lm_tensor *w, int64_t ignore, double eps) {
  CeArgs a;
  LM_TRY(ce_args(&a, x, target, w, ignore, eps));
  LM_TRY(rows_ok("loss", loss, a.N));
  LM_TRY(rows_ok("lse", lse, a.N));
  if (a.N == 0) return 0;
  if (a.C == 0) return lm_error("cross_entropy kernel: expected at least one class");
  if (lm_cuda_use(x) < 0) return -1;
  a.loss = lm_ptr(loss), a.ldt = loss->dtype_, a.ls = stride1(loss);
  a.lse = lm_ptr(lse), a.edt = lse->dtype_, a.es = stride1(lse);
  return lm_by_float_dtype(x->dtype_, "cross_entropy kernel", [&](auto z) {
    typedef decltype(z) T;
    LM_LAUNCH(lm_blocks(a.N, 1), lm_row_threads(a.C), 0, ce_fwd_kernel<T>)(a);
    return lm_cuda_launched("cross_entropy");
  });
}

int lm_cuda_cross_entropy_bwd(lm_tensor *dx, const lm_tensor *gloss, const lm_tensor *x,
                              const lm_tensor *target, const lm_tensor *w, const lm_tensor *lse,
                              int64_t ignore, double eps) {
  CeArgs a;
  LM_TRY(ce_args(&a, x, target, w, ignore, eps));
  LM_TRY(rows_ok("lse", lse, a.N));
  if (!gloss || !lm_is_float(gloss->dtype_) || (gloss->numel_ != a.N && gloss->numel_ != 1))
    return lm_error("cross_entropy kernel: expected a float gloss of %lld rows or one", (long long)a.N);
  if (!lm_is_contiguous(dx) || dx->dtype_ != x->dtype_ || dx->numel_ != x->numel_)
    return lm_error("cross_entropy kernel: expected a contiguous dx of the logits' shape and dtype");
  if (a.N == 0 || a.C == 0) return 0;
  if (lm_cuda_use(x) < 0) return -1;
  a.dx = lm_ptr(dx), a.lse_in = lm_ptr(lse), a.edt = lse->dtype_, a.es = stride1(lse);
  a.gloss = lm_ptr(gloss), a.gdt = gloss->dtype_, a.gs = stride1(gloss);
  return lm_by_float_dtype(x->dtype_, "cross_entropy_bwd kernel", [&](auto z) {
    typedef decltype(z) T;
    LM_LAUNCH(lm_blocks(a.N, 1), lm_row_threads(a.C), 0, ce_bwd_kernel<T>)(a);
    return lm_cuda_launched("cross_entropy_bwd");
  });
}
