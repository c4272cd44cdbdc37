/* attention.cuh: what the flash attention kernels share (attention.cu, the
 * forward; attention_bwd.cu, the backward): the checks of a call, the
 * dispatch by dtype and head dim, the shared-memory setup, and the row
 * masks. Every kernel works on tiles of rows in shared memory with the
 * tile products of tile.cuh; no (L, S) matrix is ever in global memory.
 *
 * What the kernels take: contiguous q (B, L, D), k (B, S, D), v (B, S, D)
 * of one dtype, f32, bf16 or f16, with D = 64, 128, 192 or 256 and 16-byte
 * aligned data. Above 128 a block computes the scores over all D but
 * accumulates only half of the output columns (attn_cols), so the
 * accumulators stay the size of D = 128's and do not spill: the grid has
 * twice the blocks and the scores are computed twice. Other calls (f64, another head dim, E != Ev, an odd alignment)
 * return LM_CUDA_UNSUPPORTED with an error starting "unsupported:", which
 * the op layer answers with the composed form. */
#ifndef LOOM_CUDA_ATTENTION_CUH
#define LOOM_CUDA_ATTENTION_CUH
#include "tile.cuh"
#include <type_traits>

#define ATTN_WARPS 4
#define ATTN_THREADS (32 * ATTN_WARPS)
/* the most dynamic shared memory a block may opt into on sm_80 (163 KiB;
 * sm_90: 227 KiB): each kernel's tiles are checked against it when built
 * (scripts/check_cuda_resources.sh checks the static part) */
#define ATTN_SMEM_MAX (163 * 1024)
/* sm_90's: f32 tiles of D > 128 need it (sm_80 answers LM_CUDA_UNSUPPORTED
 * at the launch, and f32 composes in f32); 16-bit tiles fit sm_80 */
#define ATTN_SMEM_MAX_SM90 (227 * 1024)
template <typename T, int D> struct attn_smem_max {
  static const size_t value = sizeof(T) == 4 && D > 128 ? ATTN_SMEM_MAX_SM90 : ATTN_SMEM_MAX;
};
/* output columns per block: all of D up to 128, half above */
template <int D> struct attn_cols {
  static const int value = D <= 128 ? D : D / 2;
  static_assert(D % value == 0 && value % 16 == 0, "column split in whole mma tiles");
};

struct AttnDims {
  int64_t B, L, S;
  int D, dtype;
};

static inline bool attn_aligned(const lm_tensor *t) { return t && ((uintptr_t)lm_ptr(t) & 15) == 0; }

/* t is a contiguous 3-D (B, rows, D) of dtype; -1 with an error otherwise */
static inline int attn_is(const char *what, const char *arg, const lm_tensor *t, int64_t B,
                          int64_t rows, int64_t D, int dtype) {
  if (!t || t->ndim != 3 || t->shape_[0] != B || t->shape_[1] != rows || t->shape_[2] != D ||
      t->dtype_ != dtype || !lm_is_contiguous(t))
    return lm_error("%s kernel: expected %s a contiguous (%lld, %lld, %lld) tensor of %s", what, arg,
                    (long long)B, (long long)rows, (long long)D, lm_dtype_name(dtype));
  return 0;
}

/* q, k, v's dims, or -1 (a bad call) or LM_CUDA_UNSUPPORTED */
static inline int attn_dims(const char *what, const lm_tensor *q, const lm_tensor *k,
                            const lm_tensor *v, AttnDims *d) {
  if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3)
    return lm_error("%s kernel: expected 3-D q, k, v (batch x heads, length, dim)", what);
  d->B = q->shape_[0], d->L = q->shape_[1], d->S = k->shape_[1], d->dtype = q->dtype_;
  int64_t E = q->shape_[2], Ev = v->shape_[2];
  if (d->dtype == LM_F64 || !lm_is_float(d->dtype))
    return lm_cuda_unsupported("%s kernel: no kernel for dtype %s", what, lm_dtype_name(d->dtype));
  if (E != Ev || (E != 64 && E != 128 && E != 192 && E != 256))
    return lm_cuda_unsupported("%s kernel: head dims (%lld, %lld), expected both 64, 128, 192 or 256",
                               what, (long long)E, (long long)Ev);
  d->D = (int)E;
  LM_TRY(attn_is(what, "q", q, d->B, d->L, E, d->dtype));
  LM_TRY(attn_is(what, "k", k, d->B, d->S, E, d->dtype));
  LM_TRY(attn_is(what, "v", v, d->B, d->S, E, d->dtype));
  if (!attn_aligned(q) || !attn_aligned(k) || !attn_aligned(v))
    return lm_cuda_unsupported("%s kernel: q, k, v not 16-byte aligned", what);
  if (d->B * (((d->L > d->S ? d->L : d->S) + 63) / 64) * (E / (E <= 128 ? E : E / 2)) > INT32_MAX)
    return lm_cuda_unsupported("%s kernel: more than 2^31 tiles", what);
  return 0;
}

/* lse is a contiguous (B, L) f32 tensor */
static inline int attn_lse_ok(const char *what, const lm_tensor *lse, const AttnDims &d) {
  if (!lse || lse->dtype_ != LM_F32 || lse->numel_ != d.B * d.L || !lm_is_contiguous(lse))
    return lm_error("%s kernel: expected lse a contiguous (%lld, %lld) f32 tensor", what,
                    (long long)d.B, (long long)d.L);
  return 0;
}

/* f(T(), std::integral_constant<int, D>()) for the storage type T of dtype
 * and head dim D (attn_dims admitted both) */
template <typename T, typename F> int attn_dispatch_dim(int D, F f) {
  switch (D) {
  case 64: return f(T(), std::integral_constant<int, 64>());
  case 128: return f(T(), std::integral_constant<int, 128>());
  case 192: return f(T(), std::integral_constant<int, 192>());
  default: return f(T(), std::integral_constant<int, 256>());
  }
}
template <typename F> int attn_dispatch(const AttnDims &d, F f) {
  switch (d.dtype) {
  case LM_F32: return attn_dispatch_dim<float>(d.D, f);
  case LM_BF16: return attn_dispatch_dim<__nv_bfloat16>(d.D, f);
  default: return attn_dispatch_dim<__half>(d.D, f);
  }
}

/* Lets kernel use `bytes` of dynamic shared memory (above 48 KiB a kernel
 * must ask); a device with less answers LM_CUDA_UNSUPPORTED. */
template <typename K> int attn_smem(K *kernel, size_t bytes, const char *name) {
#if defined(LOOM_CUDA_EMULATE) && !defined(LOOM_CUDA_EMU_RUNTIME) /* test_emu.cpp: no runtime */
  (void)kernel, (void)bytes, (void)name;
  return 0;
#endif
  cudaError_t e = cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return lm_cuda_unsupported("%s kernel: %zu bytes of shared memory per block (%s)", name, bytes,
                               cudaGetErrorString(e));
  }
  return 0;
}

/* score (query row, key col) is kept: in range, and not above the diagonal
 * when causal (key j for query i when j <= i) */
__device__ __forceinline__ bool attn_keep(int64_t row, int64_t col, int64_t L, int64_t S, int causal) {
  return row < L && col < S && !(causal && col > row);
}

/* an additive f32 bias on the scaled scores (a mask), by strides; p NULL:
 * none. attn_bias_of checks the tensor (B, L, S) f32. */
struct AttnBias {
  const float *p;
  int64_t sb, sl, ss;
};
static inline int attn_bias_of(const char *what, const lm_tensor *t, const AttnDims &d, AttnBias *b) {
  *b = AttnBias{NULL, 0, 0, 0};
  if (!t) return 0;
  if (t->ndim != 3 || t->dtype_ != LM_F32 || t->shape_[0] != d.B || t->shape_[1] != d.L || t->shape_[2] != d.S)
    return lm_error("%s kernel: expected bias a (%lld, %lld, %lld) f32 tensor", what, (long long)d.B,
                    (long long)d.L, (long long)d.S);
  *b = AttnBias{(const float *)lm_ptr(t), t->stride_[0], t->stride_[1], t->stride_[2]};
  return 0;
}
/* the scaled score of (row, col) with its bias, -inf where not kept */
__device__ __forceinline__ float attn_score(float s, const AttnBias &bias, int64_t b, int64_t row, int64_t col,
                                            int64_t L, int64_t S, int causal, float scale) {
  if (!attn_keep(row, col, L, S, causal)) return -INFINITY;
  return bias.p ? s * scale + bias.p[b * bias.sb + row * bias.sl + col * bias.ss] : s * scale;
}
/* its probability given the row's lse (0 for a dropped key: a row with no
 * key has lse -inf too) */
__device__ __forceinline__ float attn_prob(float x, float lse) { return x == -INFINITY ? 0.f : expf(x - lse); }

__device__ __forceinline__ int64_t attn_min(int64_t a, int64_t b) { return a < b ? a : b; }

#endif
