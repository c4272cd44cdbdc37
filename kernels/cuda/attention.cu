/* attention.cu: the flash attention forward (FlashAttention-2's loop). A
 * block of 4 warps takes 64 query rows of one batch x head (16 per warp)
 * and walks the keys in tiles of 64: scores S = Q K^T in registers, an
 * online softmax per row (running max m and sum l, earlier output rescaled
 * by exp(m_old - m_new)), P through shared memory into O += P V. At the end
 * O / l is written and lse = m + log l kept for the backward. Causal blocks
 * stop at their diagonal tile and start first, heaviest first. Above D =
 * 128 each tile of queries has two blocks, one per half of O's columns. */
#include "attention.cuh"

template <typename T, int D> struct FwdCfg {
  static const int BR = 64, BC = 64;               /* query rows per block, keys per tile */
  static const int LD = D + lm_tile_pad<T>::value; /* pitch of the Q, K, V tiles */
  static const int LDP = BC + lm_tile_pad<T>::value;
  static const size_t smem = ((size_t)(BR + 2 * BC) * LD + (size_t)ATTN_WARPS * 16 * LDP) * sizeof(T);
  static const int DC = attn_cols<D>::value, NCOL = D / DC; /* O's columns per block */
  static_assert(smem <= attn_smem_max<T, D>::value, "attention tiles exceed the shared memory per block");
};

struct FwdArgs {
  const void *q, *k, *v;
  void *o;
  float *lse;
  int64_t L, S;
  float scale;
  int causal;
  AttnBias bias;
};

template <typename T, int D> __global__ void __launch_bounds__(ATTN_THREADS) attn_fwd_kernel(FwdArgs a) {
  typedef FwdCfg<T, D> K;
  LM_DYNAMIC_SMEM(smem);
  T *sQ = (T *)smem, *sK = sQ + K::BR * K::LD, *sV = sK + K::BC * K::LD, *sP = sV + K::BC * K::LD;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int64_t ntile = (a.L + K::BR - 1) / K::BR, id = blockIdx.x / K::NCOL, b = id / ntile;
  int64_t q0 = (ntile - 1 - id % ntile) * K::BR; /* the last (heaviest when causal) first */
  const int c0 = (int)(blockIdx.x % K::NCOL) * K::DC;
  const T *q = (const T *)a.q + (b * a.L + q0) * D, *k = (const T *)a.k + b * a.S * D;
  const T *v = (const T *)a.v + b * a.S * D;
  T *myQ = sQ + warp * 16 * K::LD, *myP = sP + warp * 16 * K::LDP;
  int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8}; /* this thread's two rows */

  lm_tile_load<T, K::BR, D>(sQ, K::LD, q, a.L - q0);
  float o[K::DC / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < K::DC / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0;
  int64_t kend = a.causal ? attn_min(a.S, q0 + K::BR) : a.S;
  for (int64_t k0 = 0; k0 < kend; k0 += K::BC) {
    __syncthreads(); /* everyone is done with the previous tiles */
    lm_tile_load<T, K::BC, D>(sK, K::LD, k + k0 * D, a.S - k0);
    lm_tile_load<T, K::BC, D>(sV, K::LD, v + k0 * D, a.S - k0);
    __syncthreads();
    float s[K::BC / 8][4];
#pragma unroll
    for (int j = 0; j < K::BC / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0;
    lm_tile<T, D, K::BC / 8>::nt(s, myQ, K::LD, sK, K::LD);
    /* scale, mask, and the new row maxima (over the 4 lanes sharing a row) */
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int j = 0; j < K::BC / 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int64_t col = k0 + 8 * j + 2 * t + (e & 1);
        float x = attn_score(s[j][e], a.bias, b, row[e >> 1], col, a.L, a.S, a.causal, a.scale);
        s[j][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float base[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      base[r] = mx[r] == -INFINITY ? 0.f : mx[r]; /* no key yet: exp(-inf - 0) = 0 */
      alpha[r] = expf(m[r] - base[r]);
      m[r] = mx[r];
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < K::BC / 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float p = expf(s[j][e] - base[e >> 1]);
        s[j][e] = p;
        l[e >> 1] += p;
      }
#pragma unroll
    for (int j = 0; j < K::DC / 8; j++) o[j][0] *= alpha[0], o[j][1] *= alpha[0], o[j][2] *= alpha[1], o[j][3] *= alpha[1];
    lm_tile_store<T, K::BC / 8>(myP, K::LDP, s);
    __syncwarp();
    lm_tile<T, K::BC, K::DC / 8>::nn(o, myP, K::LDP, sV + c0, K::LD);
  }
  /* l was summed per thread; the row's sum is over its 4 lanes */
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  T *out = (T *)a.o + b * a.L * D;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (row[r] >= a.L) continue;
    float inv = l[r] > 0 ? 1 / l[r] : 0;
#pragma unroll
    for (int j = 0; j < K::DC / 8; j++)
      lm_put2(out + row[r] * D + c0 + 8 * j + 2 * t, o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
    if (t == 0 && c0 == 0) a.lse[b * a.L + row[r]] = l[r] > 0 ? m[r] + logf(l[r]) : -INFINITY;
  }
}

static int attention(lm_tensor *o, lm_tensor *lse, const lm_tensor *q, const lm_tensor *k,
                     const lm_tensor *v, const lm_tensor *bias, double scale, int causal) {
  AttnDims d = {0, 0, 0, 0, 0};
  int rc = attn_dims("attention", q, k, v, &d);
  if (rc < 0) return rc;
  AttnBias ab;
  LM_TRY(attn_bias_of("attention", bias, d, &ab));
  LM_TRY(attn_is("attention", "o", o, d.B, d.L, d.D, d.dtype));
  LM_TRY(attn_lse_ok("attention", lse, d));
  if (!attn_aligned(o)) return lm_cuda_unsupported("attention kernel: o not 16-byte aligned");
  if (d.B * d.L == 0) return 0;
  if (lm_cuda_use(o) < 0) return -1;
  FwdArgs a = {lm_ptr(q), lm_ptr(k), lm_ptr(v), lm_ptr(o), (float *)lm_ptr(lse), d.L, d.S, (float)scale, causal, ab};
  return attn_dispatch(d, [&](auto z, auto dim) {
    typedef decltype(z) T;
    const int D = decltype(dim)::value;
    typedef FwdCfg<T, D> K;
    int rc = attn_smem(attn_fwd_kernel<T, D>, K::smem, "attention");
    if (rc < 0) return rc; /* LM_CUDA_UNSUPPORTED (the device has less shared memory): the op composes */
    unsigned blocks = (unsigned)(d.B * ((d.L + K::BR - 1) / K::BR) * K::NCOL);
    LM_LAUNCH(blocks, ATTN_THREADS, K::smem, attn_fwd_kernel<T, D>)(a);
    return lm_cuda_launched("attention");
  });
}

int lm_cuda_attention(lm_tensor *o, lm_tensor *lse, const lm_tensor *q, const lm_tensor *k,
                      const lm_tensor *v, double scale, int causal) {
  return attention(o, lse, q, k, v, NULL, scale, causal);
}
int lm_cuda_attention_bias(lm_tensor *o, lm_tensor *lse, const lm_tensor *q, const lm_tensor *k,
                           const lm_tensor *v, const lm_tensor *bias, double scale) {
  return attention(o, lse, q, k, v, bias, scale, 0);
}
