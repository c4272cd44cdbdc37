/* copy.c: strided copy with dtype conversion, and fill. Dense rows of the
 * common conversions (f32 <-> bf16, f16, f64) run as vectorised loops;
 * strided rows of them go through those loops in blocks gathered on the
 * stack; a transpose (the source's unit stride is not innermost) is copied
 * in tiles, so both sides stay in cache and in the TLB. */
#include "simd.h"
#include "fastmath.h"
#include "iter.h"
#include <string.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

typedef struct { int sd, dd; } conv;
typedef void (*cvt_fn)(int64_t n, void *o, const void *x);

/* round to nearest even, NaN kept quiet: exactly lm_f32_to_bf16 */
LM_CLONES static void f32_to_bf16(int64_t n, void *o_, const void *x_) {
  uint16_t *o = o_;
  const float *x = x_;
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = lm_bits_f32(x[i]);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    o[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
  }
}
LM_CLONES static void bf16_to_f32(int64_t n, void *o_, const void *x_) {
  float *o = o_;
  const uint16_t *x = x_;
  for (int64_t i = 0; i < n; i++) o[i] = lm_f32_bits((uint32_t)x[i] << 16);
}
/* f16: 8 at a time with F16C where the CPU has it (GCC converts _Float16
 * one element at a time even then); else _Float16, which is libgcc's
 * conversion. Both round to nearest even. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(int64_t n, void *o_, const void *x_) {
  uint16_t *o = o_;
  const float *x = x_;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) {
    _Float16 h = (_Float16)x[i];
    memcpy(o + i, &h, 2);
  }
}
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(int64_t n, void *o_, const void *x_) {
  float *o = o_;
  const uint16_t *x = x_;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
  for (; i < n; i++) {
    _Float16 h;
    memcpy(&h, x + i, 2);
    o[i] = (float)h;
  }
}
static bool have_f16c(void) { return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx"); }
#else
#define f32_to_f16_f16c f32_to_f16
#define f16_to_f32_f16c f16_to_f32
static bool have_f16c(void) { return false; }
#endif
static void f32_to_f16(int64_t n, void *o_, const void *x_) {
  _Float16 *o = o_;
  const float *x = x_;
  for (int64_t i = 0; i < n; i++) o[i] = (_Float16)x[i];
}
static void f16_to_f32(int64_t n, void *o_, const void *x_) {
  float *o = o_;
  const _Float16 *x = x_;
  for (int64_t i = 0; i < n; i++) o[i] = (float)x[i];
}
LM_CLONES static void f32_to_f64(int64_t n, void *o_, const void *x_) {
  double *o = o_;
  const float *x = x_;
  for (int64_t i = 0; i < n; i++) o[i] = x[i];
}
LM_CLONES static void f64_to_f32(int64_t n, void *o_, const void *x_) {
  float *o = o_;
  const double *x = x_;
  for (int64_t i = 0; i < n; i++) o[i] = (float)x[i];
}

static cvt_fn converter(int sd, int dd) {
  if (sd == LM_F32 && dd == LM_BF16) return f32_to_bf16;
  if (sd == LM_BF16 && dd == LM_F32) return bf16_to_f32;
  if (sd == LM_F32 && dd == LM_F16) return have_f16c() ? f32_to_f16_f16c : f32_to_f16;
  if (sd == LM_F16 && dd == LM_F32) return have_f16c() ? f16_to_f32_f16c : f16_to_f32;
  if (sd == LM_F32 && dd == LM_F64) return f32_to_f64;
  if (sd == LM_F64 && dd == LM_F32) return f64_to_f32;
  return NULL;
}

void lm_cpu_convert(int64_t n, void *dst, int dd, const void *src, int sd) {
  converter(sd, dd)(n, dst, src);
}

/* n elements of es bytes between strides (bytes) */
static void copy_strided(int64_t n, char *dst, int64_t sd, const char *src, int64_t ss, int es) {
  switch (es) {
  case 2: for (int64_t i = 0; i < n; i++) memcpy(dst + i * sd, src + i * ss, 2); break;
  case 4: for (int64_t i = 0; i < n; i++) memcpy(dst + i * sd, src + i * ss, 4); break;
  case 8: for (int64_t i = 0; i < n; i++) memcpy(dst + i * sd, src + i * ss, 8); break;
  default: for (int64_t i = 0; i < n; i++) memcpy(dst + i * sd, src + i * ss, es); break;
  }
}

/* n elements of es bytes from a stride of s bytes to a dense buffer, and back */
static void gather(int64_t n, char *dst, const char *src, int64_t s, int es) {
  switch (es) {
  case 2: for (int64_t i = 0; i < n; i++) memcpy(dst + 2 * i, src + i * s, 2); break;
  case 4: for (int64_t i = 0; i < n; i++) memcpy(dst + 4 * i, src + i * s, 4); break;
  case 8: for (int64_t i = 0; i < n; i++) memcpy(dst + 8 * i, src + i * s, 8); break;
  default: for (int64_t i = 0; i < n; i++) memcpy(dst + es * i, src + i * s, es); break;
  }
}
static void scatter(int64_t n, char *dst, int64_t s, const char *src, int es) {
  switch (es) {
  case 2: for (int64_t i = 0; i < n; i++) memcpy(dst + i * s, src + 2 * i, 2); break;
  case 4: for (int64_t i = 0; i < n; i++) memcpy(dst + i * s, src + 4 * i, 4); break;
  case 8: for (int64_t i = 0; i < n; i++) memcpy(dst + i * s, src + 8 * i, 8); break;
  default: for (int64_t i = 0; i < n; i++) memcpy(dst + i * s, src + es * i, es); break;
  }
}

enum { BLOCK = 256 };

static void copy_row(int64_t n, char **p, const int64_t *s, void *ctx) {
  const conv *c = ctx;
  int es = lm_dtype_size(c->dd), ses = lm_dtype_size(c->sd);
  if (c->sd == c->dd) { /* bytes, also exact for i64 beyond 2^53 */
    if (s[0] == es && s[1] == es) memcpy(p[0], p[1], n * es);
    else copy_strided(n, p[0], s[0], p[1], s[1], es);
    return;
  }
  cvt_fn f = converter(c->sd, c->dd);
  if (f && s[0] == es && s[1] == ses) { f(n, p[0], p[1]); return; }
  if (f) {
    _Alignas(64) char in[BLOCK * 8], out[BLOCK * 8];
    for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {
      int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
      const char *src = p[1] + i0 * s[1];
      char *dst = p[0] + i0 * s[0];
      if (s[1] == ses) f(m, out, src);
      else gather(m, in, src, s[1], ses), f(m, out, in);
      scatter(m, dst, s[0], out, es);
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) lm_store(p[0] + i * s[0], c->dd, lm_load(p[1] + i * s[1], c->sd));
}

#define TILE_COPY(T)                                                           \
  for (int64_t r = 0; r < rows; r++)                                           \
    for (int64_t i = 0; i < len; i++)                                          \
      *(T *)(p[0] + r * rs[0] + i * s[0]) = *(const T *)(p[1] + r * rs[1] + i * s[1]);

#if defined(__SSE2__)
/* 4 rows of 4 floats at src (sstride bytes apart) into 4 rows at dst
 * (dstride apart) holding the columns: a 4x4 transpose in registers */
static inline void transpose4(char *dst, int64_t dstride, const char *src, int64_t sstride) {
  __m128 r0 = _mm_loadu_ps((const float *)src), r1 = _mm_loadu_ps((const float *)(src + sstride)),
         r2 = _mm_loadu_ps((const float *)(src + 2 * sstride)), r3 = _mm_loadu_ps((const float *)(src + 3 * sstride));
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps((float *)dst, r0), _mm_storeu_ps((float *)(dst + dstride), r1);
  _mm_storeu_ps((float *)(dst + 2 * dstride), r2), _mm_storeu_ps((float *)(dst + 3 * dstride), r3);
}

/* A 4-byte tile whose one side is dense along the rows and the other along
 * the elements (a transpose): 4x4 blocks in registers, the edges by element. */
static bool tile4_transposed(int64_t rows, int64_t len, char **p, const int64_t *rs, const int64_t *s) {
  bool src_rows = rs[1] == 4 && s[0] == 4, src_elems = s[1] == 4 && rs[0] == 4;
  if (!src_rows && !src_elems) return false;
  int64_t r4 = rows & ~(int64_t)3, l4 = len & ~(int64_t)3;
  for (int64_t r = 0; r < r4; r += 4)
    for (int64_t i = 0; i < l4; i += 4) {
      char *d = p[0] + r * rs[0] + i * s[0];
      const char *q = p[1] + r * rs[1] + i * s[1];
      if (src_rows) transpose4(d, rs[0], q, s[1]);
      else transpose4(d, s[0], q, rs[1]);
    }
  for (int64_t r = 0; r < rows; r++) /* the edges */
    for (int64_t i = r < r4 ? l4 : 0; i < len; i++)
      *(uint32_t *)(p[0] + r * rs[0] + i * s[0]) = *(const uint32_t *)(p[1] + r * rs[1] + i * s[1]);
  return true;
}
#else
static bool tile4_transposed(int64_t rows, int64_t len, char **p, const int64_t *rs, const int64_t *s) {
  (void)rows, (void)len, (void)p, (void)rs, (void)s;
  return false;
}
#endif

static void copy_tile(int64_t rows, int64_t len, char **p, const int64_t *rs, const int64_t *s,
                      void *ctx) {
  const conv *c = ctx;
  int es = c->sd == c->dd ? lm_dtype_size(c->dd) : 0;
  if (es == 4 && tile4_transposed(rows, len, p, rs, s)) return;
  if (es == 4) { TILE_COPY(uint32_t) return; }
  if (es == 2) { TILE_COPY(uint16_t) return; }
  if (es == 8) { TILE_COPY(uint64_t) return; }
  for (int64_t r = 0; r < rows; r++) {
    char *q[2] = {p[0] + r * rs[0], p[1] + r * rs[1]};
    copy_row(len, q, s, ctx);
  }
}

int lm_cpu_copy(lm_tensor *dst, const lm_tensor *src) {
  conv c = {src->dtype_, dst->dtype_};
  const lm_tensor *t[2] = {dst, src};
  if (lm_foreach_tiled(t, copy_tile, &c)) return 0;
  lm_foreach(2, t, copy_row, &c);
  return 0;
}

typedef struct { int dtype; double v; } fillv;

static void fill_row(int64_t n, char **p, const int64_t *s, void *ctx) {
  const fillv *f = ctx;
  int es = lm_dtype_size(f->dtype);
  char v[8];
  lm_store(v, f->dtype, f->v);
  if (s[0] == es && es == 4) {
    uint32_t w;
    memcpy(&w, v, 4);
    uint32_t *o = (uint32_t *)p[0];
    for (int64_t i = 0; i < n; i++) o[i] = w;
    return;
  }
  for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], v, es);
}

int lm_cpu_fill(lm_tensor *t, double v) {
  fillv f = {t->dtype_, v};
  const lm_tensor *a[1] = {t};
  lm_foreach(1, a, fill_row, &f);
  return 0;
}
