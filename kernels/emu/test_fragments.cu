/* test_fragments.cu: the first thing to run on a GPU: the warp tile products of
 * tile.cuh (mma.sync m16n8k16 and ldmatrix for bf16 and f16, the FMA twin
 * for f32; A @ B^T and A @ B) and lm_tile_store, one warp per product,
 * against a double reference on the host. Every attention kernel stands on
 * these fragment layouts; if the hardware disagrees with the PTX ISA's
 * tables as tile.cuh reads them, this fails in a second, before anything
 * slower runs. Built by kernels/cuda (nvcc, LOOM_CUDA=ON) as
 * test_cuda_fragments, the first step of scripts/gpu_first_run.sh; built by
 * kernels/emu as test_emu_fragments (the same source under emu.h), which
 * must pass too. Prints "test_fragments: N passed, N failed". */
#include "../cuda/tile.cuh"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

/* one warp: C (16 x 8NJ, f32) = A (16 x KD) @ B, B given as Bt (8NJ x KD)
 * when BT, else as B (KD x 8NJ); all row-major, dense in global memory */
template <typename T, int KD, int NJ, bool BT> __global__ void tile_kernel(const T *A, const T *B, float *C) {
  const int PAD = lm_tile_pad<T>::value, LDA = KD + PAD, LDB = (BT ? KD : 8 * NJ) + PAD, LDC = 8 * NJ + 4;
  __shared__ T sA[16 * (KD + 16)], sB[8 * NJ * KD + 64 * 16];
  __shared__ float sC[16 * (8 * NJ + 4)];
  int lane = threadIdx.x;
  for (int i = lane; i < 16 * KD; i += 32) sA[i / KD * LDA + i % KD] = A[i];
  int brows = BT ? 8 * NJ : KD, bcols = BT ? KD : 8 * NJ;
  for (int i = lane; i < brows * bcols; i += 32) sB[i / bcols * LDB + i % bcols] = B[i];
  __syncwarp();
  float acc[NJ][4];
  for (int j = 0; j < NJ; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0;
  if (BT) lm_tile<T, KD, NJ>::nt(acc, sA, LDA, sB, LDB);
  else lm_tile<T, KD, NJ>::nn(acc, sA, LDA, sB, LDB);
  lm_tile_store<float, NJ>(sC, LDC, acc);
  __syncwarp();
  for (int i = lane; i < 16 * 8 * NJ; i += 32) C[i] = sC[i / (8 * NJ) * LDC + i % (8 * NJ)];
}

static float rounded(double v, float) { return (float)v; }
static float rounded(double v, __nv_bfloat16) { return __bfloat162float(__float2bfloat16_rn((float)v)); }
static float rounded(double v, __half) { return __half2float(__float2half_rn((float)v)); }
template <typename T> static T stored(float v);
template <> float stored<float>(float v) { return v; }
template <> __nv_bfloat16 stored<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __half stored<__half>(float v) { return __float2half_rn(v); }

/* device memory (the emulated build runs kernels on host memory) */
template <typename X> static X *to_device(const std::vector<X> &h) {
  X *p = NULL;
#ifdef LOOM_CUDA_EMULATE
  p = (X *)malloc(h.size() * sizeof(X));
  memcpy(p, h.data(), h.size() * sizeof(X));
#else
  if (cudaMalloc(&p, h.size() * sizeof(X)) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(2); }
  cudaMemcpy(p, h.data(), h.size() * sizeof(X), cudaMemcpyHostToDevice);
#endif
  return p;
}
template <typename X> static void to_host(std::vector<X> &h, const X *p) {
#ifdef LOOM_CUDA_EMULATE
  memcpy(h.data(), p, h.size() * sizeof(X));
#else
  cudaError_t e = cudaMemcpy(h.data(), p, h.size() * sizeof(X), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) { fprintf(stderr, "kernel or copy failed: %s\n", cudaGetErrorString(e)); exit(2); }
#endif
}
static void release(void *p) {
#ifdef LOOM_CUDA_EMULATE
  free(p);
#else
  cudaFree(p);
#endif
}

static int passed, failed;
template <typename T, int KD, int NJ, bool BT> static void product(const char *type) {
  const int N = 8 * NJ;
  std::vector<float> a(16 * KD), b(KD * N); /* b as B (KD x N), values rounded to T */
  unsigned s = 12345 + KD * 7 + NJ;
  auto next = [&] { s = s * 1103515245u + 12345u; return ((s >> 8) % 2001) / 1000.0 - 1; };
  for (float &v : a) v = rounded(next(), T());
  for (float &v : b) v = rounded(next(), T());
  std::vector<T> ha(a.size()), hb(b.size());
  for (size_t i = 0; i < a.size(); i++) ha[i] = stored<T>(a[i]);
  for (int k = 0; k < KD; k++) /* B, or Bt (N x KD) */
    for (int n = 0; n < N; n++) hb[BT ? n * KD + k : k * N + n] = stored<T>(b[k * N + n]);
  std::vector<float> c(16 * N, NAN);
  T *da = to_device(ha), *db = to_device(hb);
  float *dc = to_device(c);
  LM_LAUNCH(1, 32, 0, tile_kernel<T, KD, NJ, BT>)(da, db, dc);
  to_host(c, dc);
  double err = 0;
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < N; n++) {
      double want = 0;
      for (int k = 0; k < KD; k++) want += (double)a[m * KD + k] * b[k * N + n];
      double d = fabs(c[m * N + n] - want);
      err = d > err || d != d ? d : err;
    }
  bool ok = err <= 1e-4;
  ok ? passed++ : failed++;
  printf("%s %-5s A (16 x %d) @ %s (%s): max |err| %.3g\n", ok ? "ok  " : "FAIL", type, KD, BT ? "Bt" : "B ",
         N == 16 ? "16 columns" : "32 columns", err);
  release(da), release(db), release(dc);
}

template <typename T> static void products(const char *type) {
  product<T, 16, 2, true>(type), product<T, 16, 2, false>(type);
  product<T, 64, 4, true>(type), product<T, 64, 4, false>(type);
}

int main() {
  products<__nv_bfloat16>("bf16");
  products<__half>("f16");
  products<float>("f32");
  printf("test_fragments: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
