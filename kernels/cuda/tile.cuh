/* tile.cuh: warp-level tile products in shared memory for the attention
 * kernels, with one accumulator layout for every dtype.
 *
 * A warp multiplies a 16-row tile A (16 x KD) by B (KD x 8*NJ) into float
 * accumulators acc[NJ][4] laid out as the tensor cores' mma.m16n8k16 C
 * fragment (PTX ISA, "Matrix Fragments for mma.m16n8k16"): with lane = 4g + t
 * (g = lane / 4, t = lane % 4), acc[j][0], acc[j][1] hold row g, columns
 * 8j + 2t and 8j + 2t + 1; acc[j][2], acc[j][3] the same columns of row g + 8.
 * bf16/f16 tiles run on the tensor cores (mma.sync, f32 accumulation, sm_80
 * and later); f32 tiles compute the same fragment with FMAs in f32, so the
 * attention kernels are written once for every dtype.
 *
 * Every operand is in shared memory, rows contiguous ("k" along a row for A
 * and for B given transposed): mma_nt reads B as Bt (8*NJ x KD), mma_nn as B
 * (KD x 8*NJ). 16-bit fragments load with ldmatrix (transposing for mma_nn).
 * Row pitches are a multiple of 16 bytes plus 16 (lm_tile_pad), so the
 * eight rows an ldmatrix phase reads fall on 32 different banks. */
#ifndef LOOM_CUDA_TILE_CUH
#define LOOM_CUDA_TILE_CUH
#include "common.cuh"
#include <type_traits>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the attention kernels need sm_80 or later (mma.sync on bf16)"
#endif

/* elements of padding after each shared-memory row: 16 bytes */
template <typename T> struct lm_tile_pad { static const int value = 16 / (int)sizeof(T); };

/* ---- 16-bit operands: the tensor cores ---- */
#ifdef LOOM_CUDA_EMULATE /* kernels/emu/: the instruction as the PTX ISA defines it */
__device__ __forceinline__ void lm_mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                       __nv_bfloat16) {
  lm_emu_mma(c, a, b, false);
}
__device__ __forceinline__ void lm_mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], __half) {
  lm_emu_mma(c, a, b, true);
}
#else
/* the instruction for operand type T, named ptx in the PTX ISA */
#define LM_MMA_SYNC(T, ptx)                                                                              \
  __device__ __forceinline__ void lm_mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], T) { \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." ptx "." ptx ".f32 {%0,%1,%2,%3}, "              \
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                              \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                        \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));                    \
  }
LM_MMA_SYNC(__nv_bfloat16, "bf16")
LM_MMA_SYNC(__half, "f16")
#undef LM_MMA_SYNC
#endif

/* ldmatrix: four 8x8 tiles of 16-bit elements from shared memory; lane l
 * gives the address of row l % 8 of tile l / 8 (16-byte aligned). Register
 * i of lane 4g + t gets tile i's (row g, columns 2t, 2t+1), or with TRANS
 * its (rows 2t, 2t+1, column g), the first in the low half. */
template <bool TRANS> __device__ __forceinline__ void lm_ldmatrix_x4(uint32_t (&r)[4], const void *row) {
#ifdef LOOM_CUDA_EMULATE
  lm_emu_ldmatrix(r, row, TRANS);
#else
  uint32_t s = (uint32_t)__cvta_generic_to_shared(row);
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
#endif
}

/* The A fragment of rows 0..15, columns k0..k0+15 of a row-major tile: lane
 * l points at row l % 16, column k0 + 8 (l / 16), so the four tiles are
 * (rows 0-7, k0), (rows 8-15, k0), (rows 0-7, k0+8), (rows 8-15, k0+8): the
 * registers (row g, cols 2t..), (row g+8, ..), (row g, cols 2t+8..), (row g+8, ..). */
template <typename T> __device__ __forceinline__ void lm_frag_a(uint32_t (&a)[4], const T *A, int lda, int k0) {
  int lane = threadIdx.x & 31;
  lm_ldmatrix_x4<false>(a, A + (lane & 15) * lda + k0 + (lane >> 4) * 8);
}

/* B fragments of n-tiles j and j + 1 (b[0], b[1] each: k = 2t.. and
 * 2t+8.., column g), from Bt (n x k, row-major): tiles (n 8j.., k0),
 * (n 8j.., k0+8), (n 8j+8.., k0), (n 8j+8.., k0+8) */
template <typename T> __device__ __forceinline__ void lm_frag_bt2(uint32_t (&b)[4], const T *Bt, int ldb, int j, int k0) {
  int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  lm_ldmatrix_x4<false>(b, Bt + (8 * j + r + (m >> 1) * 8) * ldb + k0 + (m & 1) * 8);
}
/* the same from B (k x n, row-major), transposed on the way: tiles
 * (k0.., n 8j), (k0+8.., n 8j), (k0.., n 8j+8), (k0+8.., n 8j+8) */
template <typename T> __device__ __forceinline__ void lm_frag_b2(uint32_t (&b)[4], const T *B, int ldb, int j, int k0) {
  int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  lm_ldmatrix_x4<true>(b, B + (k0 + r + (m & 1) * 8) * ldb + 8 * j + (m >> 1) * 8);
}

/* acc += A (16 x KD, row-major) @ B on tensor cores, NJ n-tiles of 8; B is
 * Bt (n x k, row-major) when BT, else B (k x n, row-major) */
template <bool BT, typename T, int KD, int NJ>
__device__ __forceinline__ void lm_mma_16(float (&acc)[NJ][4], const T *A, int lda, const T *B, int ldb) {
  static_assert(NJ % 2 == 0 && KD % 16 == 0, "n-tiles in pairs, k in steps of 16");
  /* k up to 128 unrolled whole; above, 4 steps at a time, so the fragments
   * loaded ahead do not spill the D = 256 backward's accumulators */
  constexpr int UNROLL = KD > 128 ? 4 : KD / 16;
  (void)UNROLL; /* the host compiler (kernels/emu) ignores the pragma */
#pragma unroll UNROLL
  for (int k0 = 0; k0 < KD; k0 += 16) {
    uint32_t a[4];
    lm_frag_a(a, A, lda, k0);
#pragma unroll
    for (int j = 0; j < NJ; j += 2) {
      uint32_t b[4];
      if (BT) lm_frag_bt2(b, B, ldb, j, k0);
      else lm_frag_b2(b, B, ldb, j, k0);
      uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      lm_mma(acc[j], a, b0, T());
      lm_mma(acc[j + 1], a, b1, T());
    }
  }
}

/* ---- f32 operands: the same fragment with FMAs ----
 * B as lm_mma_16 takes it; Bt rows are read 4 k at a time (float4), B rows
 * 2 columns at a time (float2) */
template <bool BT, int KD, int NJ>
__device__ __forceinline__ void lm_mma_f32(float (&acc)[NJ][4], const float *A, int lda, const float *B, int ldb) {
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float *a0 = A + g * lda, *a1 = a0 + 8 * lda;
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    if constexpr (BT) {
      const float *b0 = B + (8 * j + 2 * t) * ldb, *b1 = b0 + ldb;
#pragma unroll 4
      for (int k = 0; k < KD; k += 4) {
        float4 x0 = *(const float4 *)(a0 + k), x1 = *(const float4 *)(a1 + k);
        float4 y0 = *(const float4 *)(b0 + k), y1 = *(const float4 *)(b1 + k);
        acc[j][0] += x0.x * y0.x + x0.y * y0.y + x0.z * y0.z + x0.w * y0.w;
        acc[j][1] += x0.x * y1.x + x0.y * y1.y + x0.z * y1.z + x0.w * y1.w;
        acc[j][2] += x1.x * y0.x + x1.y * y0.y + x1.z * y0.z + x1.w * y0.w;
        acc[j][3] += x1.x * y1.x + x1.y * y1.y + x1.z * y1.z + x1.w * y1.w;
      }
    } else {
      const float *b = B + 8 * j + 2 * t;
#pragma unroll 4
      for (int k = 0; k < KD; k++) {
        float2 y = *(const float2 *)(b + k * ldb);
        float x0 = a0[k], x1 = a1[k];
        acc[j][0] += x0 * y.x, acc[j][1] += x0 * y.y;
        acc[j][2] += x1 * y.x, acc[j][3] += x1 * y.y;
      }
    }
  }
}

/* the one name the kernels call: tensor cores for 16-bit T, FMAs for f32;
 * nt takes B as Bt (n x k), nn as B (k x n) */
template <bool BT, typename T, int KD, int NJ>
__device__ __forceinline__ void lm_mma_tile(float (&acc)[NJ][4], const T *A, int lda, const T *B, int ldb) {
  if constexpr (std::is_same<T, float>::value) lm_mma_f32<BT, KD, NJ>(acc, A, lda, B, ldb);
  else lm_mma_16<BT, T, KD, NJ>(acc, A, lda, B, ldb);
}
template <typename T, int KD, int NJ> struct lm_tile {
  static __device__ __forceinline__ void nt(float (&acc)[NJ][4], const T *A, int lda, const T *Bt, int ldb) {
    lm_mma_tile<true, T, KD, NJ>(acc, A, lda, Bt, ldb);
  }
  static __device__ __forceinline__ void nn(float (&acc)[NJ][4], const T *A, int lda, const T *B, int ldb) {
    lm_mma_tile<false, T, KD, NJ>(acc, A, lda, B, ldb);
  }
};

/* ---- moving tiles ---- */
/* ROWS rows of COLS elements from global g (rows COLS apart) into shared s
 * (pitch lds), 16 bytes per thread and step; rows from nvalid on read as
 * zeros. g must be 16-byte aligned, COLS * sizeof(T) a multiple of 16. */
template <typename T, int ROWS, int COLS>
__device__ __forceinline__ void lm_tile_load(T *s, int lds, const T *g, int64_t nvalid) {
  const int cpr = COLS * (int)sizeof(T) / 16; /* 16-byte chunks per row */
  for (int i = threadIdx.x; i < ROWS * cpr; i += blockDim.x) {
    int r = i / cpr, c = i - r * cpr;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < nvalid) v = ((const uint4 *)(g + (int64_t)r * COLS))[c];
    ((uint4 *)(s + r * lds))[c] = v;
  }
}

/* two adjacent elements from floats */
__device__ __forceinline__ void lm_put2(float *p, float x, float y) { *(float2 *)p = make_float2(x, y); }
__device__ __forceinline__ void lm_put2(__nv_bfloat16 *p, float x, float y) {
  *(__nv_bfloat162 *)p = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void lm_put2(__half *p, float x, float y) { *(__half2 *)p = __floats2half2_rn(x, y); }

/* the warp's accumulator tile (16 x 8*NJ) into shared S (pitch ld) as T */
template <typename T, int NJ>
__device__ __forceinline__ void lm_tile_store(T *S, int ld, const float (&acc)[NJ][4]) {
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    lm_put2(S + g * ld + 8 * j + 2 * t, acc[j][0], acc[j][1]);
    lm_put2(S + (g + 8) * ld + 8 * j + 2 * t, acc[j][2], acc[j][3]);
  }
}

#endif
