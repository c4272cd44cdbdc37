/* dtype.c: dtype names, sizes and promotion, and lm_store (the
 * conversions every backend shares are in backend.h). */
#include "tensor.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME(ID, name, type, nccl) [ID] = name,
#define SIZE(ID, name, type, nccl) [ID] = sizeof(type),
static const char *names[LM_NDTYPES] = {LM_DTYPES(NAME)};
static const int sizes[LM_NDTYPES] = {LM_DTYPES(SIZE)};

int lm_dtype_from_name(const char *name) {
  if (!name) return lm_error("dtype: expected a name like \"f32\", got nil");
  for (int d = 0; d < LM_NDTYPES; d++)
    if (!strcmp(name, names[d])) return d;
  return lm_error("dtype: expected one of f32, f64, bf16, f16, i32, i64, bool, got \"%s\"", name);
}
const char *lm_dtype_name(int d) { return d >= 0 && d < LM_NDTYPES ? names[d] : "?"; }
int lm_dtype_size(int d) { return d >= 0 && d < LM_NDTYPES ? sizes[d] : 0; }

int lm_compute_dtype(int d) {
  if (d == LM_F64) return LM_F64;
  if (lm_is_float(d)) return LM_F32;
  return LM_I64;
}

/* Floats beat ints, wider beats narrower; bf16 with f16 gives f32. */
int lm_promote(int a, int b) {
  if (a == b) return a;
  static const int rank[LM_NDTYPES] = {[LM_BOOL] = 0, [LM_I32] = 1, [LM_I64] = 2,
                                       [LM_BF16] = 3, [LM_F16] = 3, [LM_F32] = 4, [LM_F64] = 5};
  if (rank[a] == rank[b]) return LM_F32; /* bf16 vs f16 */
  return rank[a] > rank[b] ? a : b;
}

/* Out-of-range conversions to integers are undefined in C; these are
 * defined: NaN becomes 0, values past the ends of int64 saturate, and i32
 * takes the low 32 bits of the int64 value (two's complement wrap, as
 * int32 arithmetic wraps; i32 ops compute in int64 and store here). The
 * Lua layer rejects out-of-range numbers where they enter. */
static int64_t to_i64(double v) {
  if (v != v) return 0;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  return (int64_t)v;
}
static int32_t to_i32(double v) {
  if (v >= -2147483648.0 && v < 2147483648.0) return (int32_t)v;
  if (v != v) return 0;
  if (v <= -9223372036854775808.0) return INT32_MIN;
  if (v >= 9223372036854775808.0) return INT32_MAX;
  return (int32_t)(uint32_t)(uint64_t)(int64_t)v; /* GCC: modulo 2^32 */
}

void lm_store(void *p, int d, double v) {
  switch (d) {
  case LM_F32: *(float *)p = (float)v; break;
  case LM_F64: *(double *)p = v; break;
  case LM_BF16: *(uint16_t *)p = lm_f32_to_bf16((float)v); break;
  case LM_F16: *(uint16_t *)p = lm_f32_to_f16((float)v); break;
  case LM_I32: *(int32_t *)p = to_i32(v); break;
  case LM_I64: *(int64_t *)p = to_i64(v); break;
  default: *(uint8_t *)p = v != 0; break;
  }
}
