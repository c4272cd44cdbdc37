/* pointwise.c: unary, binary and where kernels on strided operands, for the
 * compute dtypes f32, f64 and i64 (bool for the logical kinds). f32 unary
 * math runs in one vectorised loop per kind over dense arrays; strided rows
 * go through it in blocks gathered on the stack, so a value does not
 * depend on the layout it came in. */
#include "simd.h"
#include "fastmath.h"
#include "iter.h"
#include "../unary_math.h"
#include <string.h>
#include <tgmath.h>

typedef struct { int kind, dtype; const double *p; } pw;

/* One row: a tight loop when every operand is dense, else strided. */
#define ROW1(T, OT, EXPR)                                                      \
  do {                                                                         \
    if (s[0] == sizeof(OT) && s[1] == sizeof(T)) {                             \
      OT *o = (OT *)p[0]; const T *X = (const T *)p[1];                        \
      for (int64_t i = 0; i < n; i++) { T x = X[i]; o[i] = (OT)(EXPR); }       \
    } else                                                                     \
      for (int64_t i = 0; i < n; i++) {                                        \
        T x = *(const T *)(p[1] + i * s[1]);                                   \
        *(OT *)(p[0] + i * s[0]) = (OT)(EXPR);                                 \
      }                                                                        \
  } while (0)

#define ROW2(T, OT, EXPR)                                                      \
  do {                                                                         \
    if (s[0] == sizeof(OT) && s[1] == sizeof(T) && s[2] == sizeof(T)) {        \
      OT *o = (OT *)p[0]; const T *X = (const T *)p[1], *Y = (const T *)p[2];  \
      for (int64_t i = 0; i < n; i++) { T x = X[i], y = Y[i]; o[i] = (OT)(EXPR); } \
    } else if (s[0] == sizeof(OT) && s[1] == sizeof(T) && s[2] == 0) {         \
      OT *o = (OT *)p[0]; const T *X = (const T *)p[1], y = *(const T *)p[2];  \
      for (int64_t i = 0; i < n; i++) { T x = X[i]; o[i] = (OT)(EXPR); }       \
    } else if (s[0] == sizeof(OT) && s[1] == 0 && s[2] == sizeof(T)) {         \
      OT *o = (OT *)p[0]; const T x = *(const T *)p[1], *Y = (const T *)p[2];  \
      for (int64_t i = 0; i < n; i++) { T y = Y[i]; o[i] = (OT)(EXPR); }       \
    } else                                                                     \
      for (int64_t i = 0; i < n; i++) {                                        \
        T x = *(const T *)(p[1] + i * s[1]), y = *(const T *)(p[2] + i * s[2]); \
        *(OT *)(p[0] + i * s[0]) = (OT)(EXPR);                                 \
      }                                                                        \
  } while (0)

/* f64: each kind's loop made from its f(x) in core/unary.h */
static void unary_f64(int64_t n, char **p, const int64_t *s, void *ctx) {
  typedef f64 lm_real;
  const pw *c = ctx;
  const f64 k0 = c->p ? c->p[0] : 0, k1 = c->p ? c->p[1] : 0;
  (void)k0, (void)k1;
#define CASE(K, F, D, R) case LM_##K: ROW1(f64, f64, F); break;
  switch (c->kind) { LM_UNARY_KINDS(CASE) }
#undef CASE
}

/* f32: the math of fastmath.h (libm for log, sin, cos and pow). n is a
 * multiple of VEC, so every element goes through the vector loop body: a
 * scalar remainder loop may contract a*b+c into FMA differently, and an
 * element's bits would depend on where it sits. */
enum { VEC = 64 };
LM_CLONES static void unary_f32_dense(int kind, int64_t n, float *o, const float *xs, float k0,
                                      float k1) {
  if (n % VEC) __builtin_unreachable();
#define L(E) for (int64_t i = 0; i < n; i++) { float v = xs[i]; o[i] = (E); } break
  switch (kind) { /* fastmath.h's vectorised math where libm's would not vectorise */
  case LM_EXP: L(lm_expf(v));
  case LM_TANH: L(lm_tanhf(v));
  case LM_SIGMOID: L(lm_sigmoidf(v));
  case LM_GELU: L(lm_geluf(v));
  case LM_GELU_TANH: L(lm_gelu_tanhf(v));
  case LM_SILU: L(lm_siluf(v));
  case LM_GELU_D: L(lm_gelu_df(v));
  case LM_GELU_TANH_D: L(lm_gelu_tanh_df(v));
  case LM_SILU_D: L(lm_silu_df(v));
  default: { /* the others as core/unary.h writes them */
    typedef float lm_real;
#define CASE(K, F, D, R) case LM_##K: for (int64_t i = 0; i < n; i++) { float x = xs[i]; o[i] = (F); } break;
    switch (kind) { LM_UNARY_KINDS(CASE) }
#undef CASE
  }
  }
#undef L
}

/* any n: the whole multiples of VEC in place, the rest padded on the stack */
static void unary_f32_any(int kind, int64_t n, float *o, const float *x, float k0, float k1) {
  int64_t body = n - n % VEC;
  if (body) unary_f32_dense(kind, body, o, x, k0, k1);
  if (body == n) return;
  float in[VEC] = {0}, out[VEC];
  memcpy(in, x + body, (n - body) * 4);
  unary_f32_dense(kind, VEC, out, in, k0, k1);
  memcpy(o + body, out, (n - body) * 4);
}

enum { BLOCK = 256 };
static void unary_f32(int64_t n, char **p, const int64_t *s, void *ctx) {
  const pw *c = ctx;
  const float k0 = c->p ? (float)c->p[0] : 0, k1 = c->p ? (float)c->p[1] : 0;
  if (s[0] == 4 && s[1] == 4) {
    unary_f32_any(c->kind, n, (float *)p[0], (const float *)p[1], k0, k1);
    return;
  }
  float in[BLOCK], out[BLOCK];
  for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {
    int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
    const char *src = p[1] + i0 * s[1];
    char *dst = p[0] + i0 * s[0];
    for (int64_t j = 0; j < m; j++) in[j] = *(const float *)(src + j * s[1]);
    unary_f32_any(c->kind, m, out, in, k0, k1);
    for (int64_t j = 0; j < m; j++) *(float *)(dst + j * s[0]) = out[j];
  }
}

/* a double as int64, saturating (clamp's open bounds are +-inf); NaN: 0 */
static int64_t sat_i64(double v) {
  return v != v ? 0 : v <= -0x1p63 ? INT64_MIN : v >= 0x1p63 ? INT64_MAX : (int64_t)v;
}

/* integer arithmetic wraps (two's complement), as PyTorch's: computed in
 * uint64_t, where overflow is defined */
#define WRAP(e) ((int64_t)(uint64_t)(e))
#define NEG_I64(x) WRAP(0 - (uint64_t)(x))

static void unary_int(int64_t n, char **p, const int64_t *s, void *ctx) {
  const pw *c = ctx;
  const int64_t k0 = c->p ? sat_i64(c->p[0]) : 0, k1 = c->p ? sat_i64(c->p[1]) : 0;
  switch (c->kind) {
  case LM_NEG: ROW1(int64_t, int64_t, NEG_I64(x)); break;
  case LM_ABS: ROW1(int64_t, int64_t, x < 0 ? NEG_I64(x) : x); break;
  case LM_RELU: ROW1(int64_t, int64_t, x > 0 ? x : 0); break;
  case LM_CLAMP: ROW1(int64_t, int64_t, x < k0 ? k0 : x > k1 ? k1 : x); break;
  case LM_SIGN: ROW1(int64_t, int64_t, (x > 0) - (x < 0)); break;
  case LM_NOT: ROW1(uint8_t, uint8_t, !x); break;
  }
}

/* U: the type + - * run in (uint64_t for int64, so they wrap) */
#define BINARY(T, U, NAME, DIVEXPR)                                            \
  static void NAME(int64_t n, char **p, const int64_t *s, void *ctx) {         \
    switch (((const pw *)ctx)->kind) {                                         \
    case LM_ADD: ROW2(T, T, (T)((U)x + (U)y)); break;                          \
    case LM_SUB: ROW2(T, T, (T)((U)x - (U)y)); break;                          \
    case LM_MUL: ROW2(T, T, (T)((U)x * (U)y)); break;                          \
    case LM_DIV: ROW2(T, T, DIVEXPR); break;                                   \
    case LM_POW: ROW2(T, T, pow(x, y)); break;                                 \
    case LM_MAXIMUM: ROW2(T, T, (x != x || x > y) ? x : y); break;             \
    case LM_MINIMUM: ROW2(T, T, (x != x || x < y) ? x : y); break;             \
    case LM_EQ: ROW2(T, uint8_t, x == y); break;                               \
    case LM_NE: ROW2(T, uint8_t, x != y); break;                               \
    case LM_LT: ROW2(T, uint8_t, x < y); break;                                \
    case LM_LE: ROW2(T, uint8_t, x <= y); break;                               \
    case LM_GT: ROW2(T, uint8_t, x > y); break;                                \
    case LM_GE: ROW2(T, uint8_t, x >= y); break;                               \
    case LM_AND: ROW2(T, uint8_t, x && y); break;                              \
    case LM_OR: ROW2(T, uint8_t, x || y); break;                               \
    }                                                                          \
  }
BINARY(f32, f32, binary_f32, x / y)
BINARY(f64, f64, binary_f64, x / y)
BINARY(int64_t, uint64_t, binary_i64, y == -1 ? NEG_I64(x) : y ? x / y : 0)
BINARY(uint8_t, unsigned, binary_bool, y ? x / y : 0)

/* bf16/f16 operands or results (f32 mixed in) of the arithmetic kinds: each
 * block of operands widened exactly on the stack, the f32 row, the result
 * rounded once into out's dtype: the bits of casting to f32, computing and
 * casting back, without those passes over memory */
typedef struct { int kind, dt[3]; } pw_low;

/* an operand's block as f32, stepping *u bytes: in place when it is dense
 * f32, one widened value when it is broadcast (0), else widened into buf */
static char *as_f32(float *buf, const char *src, int64_t step, int dt, int64_t m, int64_t *u) {
  *u = step == 0 ? 0 : 4;
  if (step == 4 && dt == LM_F32) return (char *)src;
  if (step == 0) buf[0] = (float)lm_load(src, dt);
  else if (step == 2 && dt != LM_F32) lm_cpu_convert(m, buf, LM_F32, src, dt);
  else
    for (int64_t j = 0; j < m; j++) buf[j] = (float)lm_load(src + j * step, dt);
  return (char *)buf;
}

static void from_f32(char *dst, int64_t step, int dt, const float *src, int64_t m) {
  if (step == 2 && dt != LM_F32) lm_cpu_convert(m, dst, dt, src, LM_F32);
  else
    for (int64_t j = 0; j < m; j++) lm_store(dst + j * step, dt, src[j]);
}

static void binary_f32(int64_t n, char **p, const int64_t *s, void *ctx);

static void binary_low(int64_t n, char **p, const int64_t *s, void *ctx) {
  const pw_low *c = ctx;
  pw f = {c->kind, LM_F32, NULL};
  float a[BLOCK], b[BLOCK], o[BLOCK];
  int64_t u[3] = {4, 4, 4};
  bool direct = s[0] == 4 && c->dt[0] == LM_F32; /* an f32 result is written in place */
  for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {
    int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
    char *q[3] = {direct ? p[0] + i0 * 4 : (char *)o, as_f32(a, p[1] + i0 * s[1], s[1], c->dt[1], m, &u[1]),
                  as_f32(b, p[2] + i0 * s[2], s[2], c->dt[2], m, &u[2])};
    binary_f32(m, q, u, &f);
    if (!direct) from_f32(p[0] + i0 * s[0], s[0], c->dt[0], o, m);
  }
}

static bool low_float(int dt) { return dt == LM_F32 || dt == LM_BF16 || dt == LM_F16; }

static lm_row_fn pick(int dtype, lm_row_fn f32, lm_row_fn f64, lm_row_fn i64, lm_row_fn b) {
  switch (dtype) {
  case LM_F32: return f32;
  case LM_F64: return f64;
  case LM_I64: return i64;
  case LM_BOOL: return b;
  default: return NULL;
  }
}

int lm_cpu_unary(int kind, lm_tensor *out, const lm_tensor *x, const double *p) {
  pw c = {kind, x->dtype_, p};
  lm_row_fn fn = pick(x->dtype_, unary_f32, unary_f64, unary_int, unary_int);
  if (!fn) return lm_error("unary kernel: no kernel for dtype %s", lm_dtype_name(x->dtype_));
  const lm_tensor *t[2] = {out, x};
  lm_foreach(2, t, fn, &c);
  return 0;
}

int lm_cpu_binary(int kind, lm_tensor *out, const lm_tensor *a, const lm_tensor *b) {
  const lm_tensor *t[3] = {out, a, b};
  if (kind < LM_EQ && low_float(out->dtype_) && low_float(a->dtype_) && low_float(b->dtype_) &&
      (out->dtype_ != LM_F32 || a->dtype_ != LM_F32 || b->dtype_ != LM_F32)) {
    pw_low c = {kind, {out->dtype_, a->dtype_, b->dtype_}};
    lm_foreach(3, t, binary_low, &c);
    return 0;
  }
  pw c = {kind, a->dtype_, NULL};
  lm_row_fn fn = pick(a->dtype_, binary_f32, binary_f64, binary_i64, binary_bool);
  if (!fn) return lm_error("binary kernel: no kernel for dtype %s", lm_dtype_name(a->dtype_));
  lm_foreach(3, t, fn, &c);
  return 0;
}

#define WHERE_ROW(T)                                                           \
  for (int64_t i = 0; i < n; i++)                                              \
    *(T *)(p[0] + i * s[0]) = *(const uint8_t *)(p[1] + i * s[1])              \
                                  ? *(const T *)(p[2] + i * s[2])              \
                                  : *(const T *)(p[3] + i * s[3]);

static void where_row(int64_t n, char **p, const int64_t *s, void *ctx) {
  switch (*(const int *)ctx) {
  case 1: WHERE_ROW(uint8_t) break;
  case 2: WHERE_ROW(uint16_t) break;
  case 4: WHERE_ROW(uint32_t) break;
  default: WHERE_ROW(uint64_t) break;
  }
}

int lm_cpu_where(lm_tensor *out, const lm_tensor *c, const lm_tensor *a, const lm_tensor *b) {
  int es = lm_dtype_size(out->dtype_);
  const lm_tensor *t[4] = {out, c, a, b};
  lm_foreach(4, t, where_row, &es);
  return 0;
}
