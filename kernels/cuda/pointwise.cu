/* pointwise.cu: unary, binary and where on strided operands, with the
 * kinds and compute dtypes of kernels/cpu/pointwise.c: f32, f64 and i64
 * (bool for the logical kinds; comparisons write bool as uint8); the unary
 * math is core/unary.h's. */
#include "common.cuh"
#include "kernels.cuh"
#include "../unary_math.h"

template <typename T> struct UnaryF {
  int kind;
  T k0, k1;
  __host__ __device__ void operator()(char **p) const {
    *(T *)p[0] = lm_unary(kind, *(const T *)p[1], k0, k1);
  }
};

struct UnaryInt {
  int kind;
  int64_t k0, k1;
  __host__ __device__ void operator()(char **p) const {
    if (kind == LM_NOT) { *(uint8_t *)p[0] = !*(const uint8_t *)p[1]; return; }
    int64_t x = *(const int64_t *)p[1], y = x;
    switch (kind) {
    case LM_NEG: y = -x; break;
    case LM_ABS: y = x < 0 ? -x : x; break;
    case LM_RELU: y = x > 0 ? x : 0; break;
    case LM_CLAMP: y = x < k0 ? k0 : x > k1 ? k1 : x; break;
    case LM_SIGN: y = (x > 0) - (x < 0); break;
    }
    *(int64_t *)p[0] = y;
  }
};

/* Clamp bounds may be infinite: saturate instead of the C cast's UB. */
static int64_t to_i64(double v) {
  if (v != v) return 0;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  return (int64_t)v;
}

int lm_cuda_unary(int kind, lm_tensor *out, const lm_tensor *x, const double *p) {
  const lm_tensor *t[2] = {out, x};
  double k0 = p ? p[0] : 0, k1 = p ? p[1] : 0;
  if (kind < 0 || kind >= LM_NUNARY) return lm_error("unary kernel: unknown kind %d", kind);
  switch (x->dtype_) {
  case LM_F32: return lm_launch<2>(t, UnaryF<float>{kind, (float)k0, (float)k1}, "unary");
  case LM_F64: return lm_launch<2>(t, UnaryF<double>{kind, k0, k1}, "unary");
  case LM_I64:
  case LM_BOOL: return lm_launch<2>(t, UnaryInt{kind, to_i64(k0), to_i64(k1)}, "unary");
  default: return lm_error("unary kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_));
  }
}

template <typename T> __host__ __device__ inline T div_of(T x, T y) { return y ? x / y : 0; }
template <> __host__ __device__ inline float div_of(float x, float y) { return x / y; }
template <> __host__ __device__ inline double div_of(double x, double y) { return x / y; }

template <typename T> __host__ __device__ inline T pow_of(T x, T y) { return (T)pow((double)x, (double)y); }
template <> __host__ __device__ inline float pow_of(float x, float y) { return powf(x, y); }

template <typename T> struct Binary {
  int kind;
  __host__ __device__ void operator()(char **p) const {
    T x = *(const T *)p[1], y = *(const T *)p[2];
    if (kind >= LM_EQ) {
      bool r = false;
      switch (kind) {
      case LM_EQ: r = x == y; break;
      case LM_NE: r = x != y; break;
      case LM_LT: r = x < y; break;
      case LM_LE: r = x <= y; break;
      case LM_GT: r = x > y; break;
      case LM_GE: r = x >= y; break;
      case LM_AND: r = x && y; break;
      case LM_OR: r = x || y; break;
      }
      *(uint8_t *)p[0] = r;
      return;
    }
    T r = 0;
    switch (kind) {
    case LM_ADD: r = x + y; break;
    case LM_SUB: r = x - y; break;
    case LM_MUL: r = x * y; break;
    case LM_DIV: r = div_of<T>(x, y); break;
    case LM_POW: r = pow_of<T>(x, y); break;
    case LM_MAXIMUM: r = (x != x || x > y) ? x : y; break;
    case LM_MINIMUM: r = (x != x || x < y) ? x : y; break;
    }
    *(T *)p[0] = r;
  }
};

int lm_cuda_binary(int kind, lm_tensor *out, const lm_tensor *a, const lm_tensor *b) {
  const lm_tensor *t[3] = {out, a, b};
  if (kind < 0 || kind >= LM_NBINARY) return lm_error("binary kernel: unknown kind %d", kind);
  if (b->dtype_ != a->dtype_)
    return lm_error("binary kernel: operands differ in dtype (%s, %s)", lm_dtype_name(a->dtype_),
                    lm_dtype_name(b->dtype_));
  switch (a->dtype_) {
  case LM_F32: return lm_launch<3>(t, Binary<float>{kind}, "binary");
  case LM_F64: return lm_launch<3>(t, Binary<double>{kind}, "binary");
  case LM_I64: return lm_launch<3>(t, Binary<int64_t>{kind}, "binary");
  case LM_BOOL: return lm_launch<3>(t, Binary<uint8_t>{kind}, "binary");
  default: return lm_error("binary kernel: no kernel for dtype %s", lm_dtype_name(a->dtype_));
  }
}

template <typename T> struct Where {
  __host__ __device__ void operator()(char **p) const {
    *(T *)p[0] = *(const uint8_t *)p[1] ? *(const T *)p[2] : *(const T *)p[3];
  }
};

int lm_cuda_where(lm_tensor *out, const lm_tensor *c, const lm_tensor *a, const lm_tensor *b) {
  const lm_tensor *t[4] = {out, c, a, b};
  switch (lm_dtype_size(out->dtype_)) {
  case 1: return lm_launch<4>(t, Where<uint8_t>(), "where");
  case 2: return lm_launch<4>(t, Where<uint16_t>(), "where");
  case 4: return lm_launch<4>(t, Where<uint32_t>(), "where");
  default: return lm_launch<4>(t, Where<uint64_t>(), "where");
  }
}
