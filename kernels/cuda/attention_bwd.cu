/* attention_bwd.cu: the flash attention backward, in three kernels that
 * recompute the probabilities P = exp(scale * Q K^T - lse) tile by tile
 * from the lse the forward kept:
 *   attn_dot:  Dd[i] = sum_e dO[i, e] O[i, e] (f32, in scratch)
 *   attn_dkdv: per 64 keys, over query tiles of 32: dV += P^T dO and
 *              dK += dS^T Q, dS = P (dP - Dd), dP = dO V^T (computed
 *              transposed, keys as rows)
 *   attn_dq:   per 64 queries, over key tiles of 32: dQ += dS K
 * Splitting dQ from dK/dV recomputes two products but needs no atomics:
 * every gradient is written once, by one block, in a fixed order. Above
 * D = 128 both kernels have two blocks per tile, one per half of the
 * gradients' columns (attn_cols): the products over D are computed twice,
 * the accumulators are D = 128's. */
#include "attention.cuh"

struct BwdArgs {
  const void *q, *k, *v, *o, *g;
  void *dq, *dk, *dv;
  const float *lse;
  float *dd;
  int64_t B, L, S;
  float scale;
  int causal;
  AttnBias bias;
};

/* ---- Dd: a warp per row ---- */
template <typename T, int D> __global__ void __launch_bounds__(LM_THREADS) attn_dot_kernel(BwdArgs a) {
  int lane = threadIdx.x & 31;
  int64_t rows = a.B * a.L, w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  for (int64_t r = w; r < rows; r += ((int64_t)gridDim.x * blockDim.x) >> 5) {
    const T *g = (const T *)a.g + r * D, *o = (const T *)a.o + r * D;
    float s = 0;
    for (int e = lane; e < D; e += 32) s += lm_to_acc(g[e]) * lm_to_acc(o[e]);
    s = lm_warp_sum(s);
    if (lane == 0) a.dd[r] = s;
  }
}

/* ---- dK, dV ---- */
template <typename T, int D> struct DkdvCfg {
  static const int BK = 64, BQ = 32;                /* keys per block, queries per tile */
  static const int LD = D + lm_tile_pad<T>::value;  /* pitch of the K, V, Q, dO tiles */
  static const int LDP = BQ + lm_tile_pad<T>::value; /* pitch of P^T and dS^T */
  static const size_t smem = ((size_t)(2 * BK + 2 * BQ) * LD + (size_t)2 * ATTN_WARPS * 16 * LDP) * sizeof(T) +
                             2 * BQ * sizeof(float);
  static const int DC = attn_cols<D>::value, NCOL = D / DC; /* gradient columns per block */
  static_assert(smem <= attn_smem_max<T, D>::value, "attention tiles exceed the shared memory per block");
};

/* BIAS: with a mask's bias, a kernel of its own so that the unmasked one
 * keeps its registers (0 spills in both: scripts/check_cuda_resources.sh;
 * indexing the bias per element from scratch spilled bf16/f16 D=64 on sm_90) */
template <typename T, int D, bool BIAS>
__global__ void __launch_bounds__(ATTN_THREADS) attn_dkdv_kernel(BwdArgs a) {
  typedef DkdvCfg<T, D> K;

  LM_DYNAMIC_SMEM(smem);
  T *sK = (T *)smem, *sV = sK + K::BK * K::LD, *sQ = sV + K::BK * K::LD, *sG = sQ + K::BQ * K::LD;
  T *sP = sG + K::BQ * K::LD, *sS = sP + ATTN_WARPS * 16 * K::LDP;
  float *sLse = (float *)(sS + ATTN_WARPS * 16 * K::LDP), *sDd = sLse + K::BQ;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int64_t ntile = (a.S + K::BK - 1) / K::BK, id = blockIdx.x / K::NCOL, b = id / ntile;
  int64_t k0 = id % ntile * K::BK; /* causal: the first key tiles have the most queries */
  const int c0 = (int)(blockIdx.x % K::NCOL) * K::DC;
  const T *q = (const T *)a.q + b * a.L * D, *go = (const T *)a.g + b * a.L * D;
  T *myP = sP + warp * 16 * K::LDP, *myS = sS + warp * 16 * K::LDP;
  const T *myK = sK + warp * 16 * K::LD, *myV = sV + warp * 16 * K::LD;
  int64_t key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8}; /* this thread's two key rows */
  const float *kb[2] = {NULL, NULL}; /* the bias of this thread's keys, by query row */
  if (BIAS)
    for (int r = 0; r < 2; r++) kb[r] = a.bias.p + b * a.bias.sb + (key[r] < a.S ? key[r] : 0) * a.bias.ss;

  lm_tile_load<T, K::BK, D>(sK, K::LD, (const T *)a.k + (b * a.S + k0) * D, a.S - k0);
  lm_tile_load<T, K::BK, D>(sV, K::LD, (const T *)a.v + (b * a.S + k0) * D, a.S - k0);
  float dk[K::DC / 8][4], dv[K::DC / 8][4];
#pragma unroll
  for (int j = 0; j < K::DC / 8; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[j][e] = dv[j][e] = 0;
  for (int64_t q0 = a.causal ? k0 / K::BQ * K::BQ : 0; q0 < a.L; q0 += K::BQ) {
    __syncthreads(); /* everyone is done with the previous tiles */
    lm_tile_load<T, K::BQ, D>(sQ, K::LD, q + q0 * D, a.L - q0);
    lm_tile_load<T, K::BQ, D>(sG, K::LD, go + q0 * D, a.L - q0);
    for (int i = threadIdx.x; i < K::BQ; i += blockDim.x) {
      bool in = q0 + i < a.L;
      sLse[i] = in ? a.lse[b * a.L + q0 + i] : 0;
      sDd[i] = in ? a.dd[b * a.L + q0 + i] : 0;
    }
    __syncthreads();
    float s[K::BQ / 8][4], dp[K::BQ / 8][4]; /* keys as rows, queries as columns */
#pragma unroll
    for (int j = 0; j < K::BQ / 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0;
    lm_tile<T, D, K::BQ / 8>::nt(s, myK, K::LD, sQ, K::LD);  /* S^T = K Q^T */
    lm_tile<T, D, K::BQ / 8>::nt(dp, myV, K::LD, sG, K::LD); /* dP^T = V dO^T */
#pragma unroll
    for (int j = 0; j < K::BQ / 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int c = 8 * j + 2 * t + (e & 1);
        float x = !attn_keep(q0 + c, key[e >> 1], a.L, a.S, a.causal) ? -INFINITY
                  : BIAS ? s[j][e] * a.scale + kb[e >> 1][(q0 + c) * a.bias.sl] : s[j][e] * a.scale;
        float p = attn_prob(x, sLse[c]);
        s[j][e] = p;
        dp[j][e] = p * (dp[j][e] - sDd[c]); /* dS^T */
      }
    lm_tile_store<T, K::BQ / 8>(myP, K::LDP, s);
    lm_tile_store<T, K::BQ / 8>(myS, K::LDP, dp);
    __syncwarp();
    lm_tile<T, K::BQ, K::DC / 8>::nn(dv, myP, K::LDP, sG + c0, K::LD); /* dV += P^T dO */
    lm_tile<T, K::BQ, K::DC / 8>::nn(dk, myS, K::LDP, sQ + c0, K::LD); /* dK += dS^T Q */
  }
  T *dkp = (T *)a.dk + b * a.S * D, *dvp = (T *)a.dv + b * a.S * D;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (key[r] >= a.S) continue;
#pragma unroll
    for (int j = 0; j < K::DC / 8; j++) {
      int64_t at = key[r] * D + c0 + 8 * j + 2 * t;
      if (a.dk) lm_put2(dkp + at, dk[j][2 * r] * a.scale, dk[j][2 * r + 1] * a.scale);
      if (a.dv) lm_put2(dvp + at, dv[j][2 * r], dv[j][2 * r + 1]);
    }
  }
}

/* ---- dQ ---- */
template <typename T, int D> struct DqCfg {
  static const int BQ = 64, BK = 32;                /* queries per block, keys per tile */
  static const int LD = D + lm_tile_pad<T>::value;
  static const int LDP = BK + lm_tile_pad<T>::value;
  static const size_t smem = ((size_t)(2 * BQ + 2 * BK) * LD + (size_t)ATTN_WARPS * 16 * LDP) * sizeof(T);
  static const int DC = attn_cols<D>::value, NCOL = D / DC; /* gradient columns per block */
  static_assert(smem <= attn_smem_max<T, D>::value, "attention tiles exceed the shared memory per block");
};

template <typename T, int D> __global__ void __launch_bounds__(ATTN_THREADS) attn_dq_kernel(BwdArgs a) {
  typedef DqCfg<T, D> K;
  LM_DYNAMIC_SMEM(smem);
  T *sQ = (T *)smem, *sG = sQ + K::BQ * K::LD, *sK = sG + K::BQ * K::LD, *sV = sK + K::BK * K::LD;
  T *sS = sV + K::BK * K::LD;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int64_t ntile = (a.L + K::BQ - 1) / K::BQ, id = blockIdx.x / K::NCOL, b = id / ntile;
  int64_t q0 = (ntile - 1 - id % ntile) * K::BQ; /* the last (heaviest when causal) first */
  const int c0 = (int)(blockIdx.x % K::NCOL) * K::DC;
  const T *k = (const T *)a.k + b * a.S * D, *v = (const T *)a.v + b * a.S * D;
  T *myS = sS + warp * 16 * K::LDP;
  const T *myQ = sQ + warp * 16 * K::LD, *myG = sG + warp * 16 * K::LD;
  int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float lse[2], dd[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    bool in = row[r] < a.L;
    lse[r] = in ? a.lse[b * a.L + row[r]] : 0;
    dd[r] = in ? a.dd[b * a.L + row[r]] : 0;
  }

  lm_tile_load<T, K::BQ, D>(sQ, K::LD, (const T *)a.q + (b * a.L + q0) * D, a.L - q0);
  lm_tile_load<T, K::BQ, D>(sG, K::LD, (const T *)a.g + (b * a.L + q0) * D, a.L - q0);
  float dq[K::DC / 8][4];
#pragma unroll
  for (int j = 0; j < K::DC / 8; j++) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0;
  int64_t kend = a.causal ? attn_min(a.S, q0 + K::BQ) : a.S;
  for (int64_t k0 = 0; k0 < kend; k0 += K::BK) {
    __syncthreads();
    lm_tile_load<T, K::BK, D>(sK, K::LD, k + k0 * D, a.S - k0);
    lm_tile_load<T, K::BK, D>(sV, K::LD, v + k0 * D, a.S - k0);
    __syncthreads();
    float s[K::BK / 8][4], dp[K::BK / 8][4];
#pragma unroll
    for (int j = 0; j < K::BK / 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0;
    lm_tile<T, D, K::BK / 8>::nt(s, myQ, K::LD, sK, K::LD);  /* S = Q K^T */
    lm_tile<T, D, K::BK / 8>::nt(dp, myG, K::LD, sV, K::LD); /* dP = dO V^T */
#pragma unroll
    for (int j = 0; j < K::BK / 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int r = e >> 1;
        int64_t col = k0 + 8 * j + 2 * t + (e & 1);
        float p = attn_prob(attn_score(s[j][e], a.bias, b, row[r], col, a.L, a.S, a.causal, a.scale), lse[r]);
        dp[j][e] = p * (dp[j][e] - dd[r]); /* dS */
      }
    lm_tile_store<T, K::BK / 8>(myS, K::LDP, dp);
    __syncwarp();
    lm_tile<T, K::BK, K::DC / 8>::nn(dq, myS, K::LDP, sK + c0, K::LD); /* dQ += dS K */
  }
  T *out = (T *)a.dq + b * a.L * D;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (row[r] >= a.L) continue;
#pragma unroll
    for (int j = 0; j < K::DC / 8; j++)
      lm_put2(out + row[r] * D + c0 + 8 * j + 2 * t, dq[j][2 * r] * a.scale, dq[j][2 * r + 1] * a.scale);
  }
}

/* ---- the slot ---- */
template <typename T, int D> static int attn_bwd_launch(BwdArgs &a) {
  typedef DkdvCfg<T, D> KV;
  typedef DqCfg<T, D> KQ;
  LM_LAUNCH(lm_blocks(a.B * a.L * 32), LM_THREADS, 0, attn_dot_kernel<T, D>)(a);
  LM_TRY(lm_cuda_launched("attention_bwd (dO . O)"));
  if ((a.dk || a.dv) && a.S > 0) {
    auto kernel = a.bias.p ? attn_dkdv_kernel<T, D, true> : attn_dkdv_kernel<T, D, false>;
    int rc = attn_smem(kernel, KV::smem, "attention_bwd");
    if (rc < 0) return rc; /* LM_CUDA_UNSUPPORTED: the op composes (as LM_TRY's -1 would not let it) */
    unsigned blocks = (unsigned)(a.B * ((a.S + KV::BK - 1) / KV::BK) * KV::NCOL);
    LM_LAUNCH(blocks, ATTN_THREADS, KV::smem, kernel)(a);
    LM_TRY(lm_cuda_launched("attention_bwd (dk, dv)"));
  }
  if (a.dq) {
    int rc = attn_smem(attn_dq_kernel<T, D>, KQ::smem, "attention_bwd");
    if (rc < 0) return rc;
    unsigned blocks = (unsigned)(a.B * ((a.L + KQ::BQ - 1) / KQ::BQ) * KQ::NCOL);
    LM_LAUNCH(blocks, ATTN_THREADS, KQ::smem, attn_dq_kernel<T, D>)(a);
    LM_TRY(lm_cuda_launched("attention_bwd (dq)"));
  }
  return 0;
}

/* dq, dk, dv may each be NULL (not wanted) */
static int attention_bwd(lm_tensor *dq, lm_tensor *dk, lm_tensor *dv, const lm_tensor *g, const lm_tensor *q,
                         const lm_tensor *k, const lm_tensor *v, const lm_tensor *o, const lm_tensor *lse,
                         const lm_tensor *bias, double scale, int causal) {
  const char *what = "attention_bwd";
  AttnDims d = {0, 0, 0, 0, 0};
  int rc = attn_dims(what, q, k, v, &d);
  if (rc < 0) return rc;
  AttnBias ab;
  LM_TRY(attn_bias_of(what, bias, d, &ab));
  LM_TRY(attn_is(what, "g", g, d.B, d.L, d.D, d.dtype));
  LM_TRY(attn_is(what, "o", o, d.B, d.L, d.D, d.dtype));
  LM_TRY(attn_lse_ok(what, lse, d));
  if (dq) LM_TRY(attn_is(what, "dq", dq, d.B, d.L, d.D, d.dtype));
  if (dk) LM_TRY(attn_is(what, "dk", dk, d.B, d.S, d.D, d.dtype));
  if (dv) LM_TRY(attn_is(what, "dv", dv, d.B, d.S, d.D, d.dtype));
  const lm_tensor *al[5] = {g, o, dq, dk, dv};
  for (int i = 0; i < 5; i++)
    if (al[i] && !attn_aligned(al[i])) return lm_cuda_unsupported("%s kernel: tensors not 16-byte aligned", what);
  if (lm_cuda_use(q) < 0) return -1;
  if (d.B * d.L == 0) { /* no queries: nothing flows to k and v */
    if (dk && dk->numel_) LM_TRY(lm_cuda_fill(dk, 0));
    if (dv && dv->numel_) LM_TRY(lm_cuda_fill(dv, 0));
    return 0;
  }
  BwdArgs a = {lm_ptr(q), lm_ptr(k), lm_ptr(v), lm_ptr(o), lm_ptr(g), dq ? lm_ptr(dq) : NULL,
               dk ? lm_ptr(dk) : NULL, dv ? lm_ptr(dv) : NULL, (const float *)lm_ptr(lse), NULL,
               d.B, d.L, d.S, (float)scale, causal, ab};
  a.dd = (float *)lm_cuda_alloc((size_t)(d.B * d.L) * sizeof(float));
  if (!a.dd) return -1;
  rc = attn_dispatch(d, [&](auto z, auto dim) {
    return attn_bwd_launch<decltype(z), decltype(dim)::value>(a);
  });
  lm_cuda_free(a.dd); /* stream-ordered: the kernels above run first */
  return rc;
}

int lm_cuda_attention_bwd(lm_tensor *dq, lm_tensor *dk, lm_tensor *dv, const lm_tensor *g,
                          const lm_tensor *q, const lm_tensor *k, const lm_tensor *v,
                          const lm_tensor *o, const lm_tensor *lse, double scale, int causal) {
  return attention_bwd(dq, dk, dv, g, q, k, v, o, lse, NULL, scale, causal);
}
int lm_cuda_attention_bias_bwd(lm_tensor *dq, lm_tensor *dk, lm_tensor *dv, const lm_tensor *g,
                               const lm_tensor *q, const lm_tensor *k, const lm_tensor *v,
                               const lm_tensor *o, const lm_tensor *lse, const lm_tensor *bias, double scale) {
  return attention_bwd(dq, dk, dv, g, q, k, v, o, lse, bias, scale, 0);
}
