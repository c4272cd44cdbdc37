/* gemm.cpp: cuBLAS's cublasGemmStridedBatchedEx and
 * cublasGemmGroupedBatchedEx and cuBLASLt's matmul, as
 * their documentation defines them: column-major matrices, op(A) (m x k)
 * times op(B) (k x n) into C (m x n), lda/ldb/ldc and batch strides in
 * elements, alpha and beta in the scale type (f32, f64 for 64F compute).
 * Operands are read exactly (bf16 and f16 widen to f32 without rounding),
 * TF32 compute rounds them to 10 mantissa bits, products accumulate in f32
 * (OpenBLAS's sgemm on the widened copies; f64 compute in dgemm) and the
 * result rounds once into C's type. C is not read when beta is 0. */
#include "runtime.h"
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cblas.h>
#include <string.h>
#include <vector>

extern "C" int lm_set_autocast(int dtype); /* core: -1 when off */

namespace {
struct handle { cudaStream_t stream; };
struct layout { cudaDataType t; uint64_t rows, cols; int64_t ld; int32_t batch; int64_t stride; };
struct desc { cublasComputeType_t compute; cudaDataType scale; cublasOperation_t ta, tb; };
struct pref { uint64_t ws; };

/* the matrix types the emulated GEMMs take, X(type, C type), and
 * type_size, load, store */
#define GEMM_TYPES(X) X(CUDA_R_64F, double) X(CUDA_R_32F, float) X(CUDA_R_16BF, __nv_bfloat16) X(CUDA_R_16F, __half)
LM_RT_ELEMENT_FUNCTIONS(GEMM_TYPES, cudaDataType)
float tf32(float f) { /* round to nearest even at 10 mantissa bits */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1)) & ~0x1fffu;
  memcpy(&f, &u, 4);
  return f;
}

/* op(X), rows x cols of it (X's columns ld elements apart, in type t), as a
 * dense column-major rows x cols: in d64 for f64 compute, else in d32
 * (rounded to TF32 when asked) */
void densify(const char *X, cublasOperation_t op, int64_t rows, int64_t cols, int64_t ld, cudaDataType t,
             bool f64, bool round_tf32, std::vector<double> &d64, std::vector<float> &d32) {
  int es = type_size(t);
  for (int64_t j = 0; j < cols; j++)
    for (int64_t i = 0; i < rows; i++) {
      int64_t off = op == CUBLAS_OP_N ? i + j * ld : j + i * ld;
      double v = load(X + off * es, t);
      if (f64) d64[i + j * rows] = v;
      else d32[i + j * rows] = round_tf32 ? tf32((float)v) : (float)v;
    }
}

/* The opaque objects of the API: a new one behind its handle type, and its
 * end; a cuBLAS or cuBLASLt handle needs a device and makes its context. */
template <class T, class H> cublasStatus_t make(H *out, const T &v) {
  *out = (H) new T(v);
  return CUBLAS_STATUS_SUCCESS;
}
template <class T, class H> cublasStatus_t drop(H h) {
  delete (T *)h;
  return CUBLAS_STATUS_SUCCESS;
}
template <class H> cublasStatus_t make_handle(H *out) {
  if (lm_rt::device_count() == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  lm_rt::context();
  return make(out, handle{0});
}

/* one problem in cuBLAS's terms */
struct problem {
  cublasOperation_t ta, tb;
  int64_t m, n, k, batch;
  const char *A, *B, *C;
  char *D;
  cudaDataType at, bt, ct, dt;
  int64_t lda, ldb, ldc, ldd, sa, sb, sc, sd;
  cublasComputeType_t compute;
  double alpha, beta;
};

/* the bytes a strided batch of rows x cols (ld apart) spans */
size_t extent(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride, cudaDataType t) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (size_t)(((batch - 1) * stride + (cols - 1) * ld + rows) * type_size(t));
}
bool on_device(const void *p, size_t n, const char *what) {
  if (n == 0) return true;
  if (lm_rt::device_of(p, n) == lm_rt::current()) return true;
  lm_rt::note("GEMM operand %s at %p (%zu bytes) is not memory of the current device cuda:%d", what, p, n,
              lm_rt::current());
  lm_rt::count(lm_rt::C_ERRORS);
  return false;
}

/* sizes >= 0, transposes cuBLAS knows, and each leading dimension at
 * least the rows of its column-major operand (1 when it has none) */
cublasStatus_t check_sizes(const problem &p) {
  for (cublasOperation_t t : {p.ta, p.tb})
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  int64_t arows = p.ta == CUBLAS_OP_N ? p.m : p.k, brows = p.tb == CUBLAS_OP_N ? p.k : p.n;
  if (p.lda < (arows > 1 ? arows : 1) || p.ldb < (brows > 1 ? brows : 1) || p.ldc < (p.m > 1 ? p.m : 1) ||
      p.ldd < (p.m > 1 ? p.m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}
/* the work counts a GEMM queued (and one f32 under autocast) */
void count_gemm(cudaDataType t, lm_rt::counter what) {
  int autocast = lm_set_autocast(-1);
  lm_set_autocast(autocast);
  if (t == CUDA_R_32F && autocast >= 0) lm_rt::count(lm_rt::C_F32_GEMM_AUTOCAST);
  lm_rt::count(what);
}

void compute(const problem &p);
cublasStatus_t run(const problem &p, cudaStream_t stream) {
  bool f64 = p.compute == CUBLAS_COMPUTE_64F || p.compute == CUBLAS_COMPUTE_64F_PEDANTIC;
  bool half = p.at == CUDA_R_16BF || p.at == CUDA_R_16F;
  bool ok = p.at == p.bt && p.ct == p.dt &&
            (f64 ? p.at == CUDA_R_64F && p.ct == CUDA_R_64F
                 : (p.at == CUDA_R_32F && p.ct == CUDA_R_32F) || (half && (p.ct == p.at || p.ct == CUDA_R_32F)));
  if (!ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (cublasStatus_t s = check_sizes(p)) return s;
  int64_t arows = p.ta == CUBLAS_OP_N ? p.m : p.k, acols = p.ta == CUBLAS_OP_N ? p.k : p.m;
  int64_t brows = p.tb == CUBLAS_OP_N ? p.k : p.n, bcols = p.tb == CUBLAS_OP_N ? p.n : p.k;
  if (!on_device(p.A, extent(arows, acols, p.lda, p.batch, p.sa, p.at), "A") ||
      !on_device(p.B, extent(brows, bcols, p.ldb, p.batch, p.sb, p.bt), "B") ||
      (p.beta != 0 && !on_device(p.C, extent(p.m, p.n, p.ldc, p.batch, p.sc, p.ct), "C")) ||
      !on_device(p.D, extent(p.m, p.n, p.ldd, p.batch, p.sd, p.dt), "D"))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  if (lm_rt::sticky(lm_rt::current())) return CUBLAS_STATUS_EXECUTION_FAILED;
  count_gemm(p.at, lm_rt::C_GEMMS);
  lm_rt::work w;
  char what[96];
  snprintf(what, sizeof what, "cuBLAS GEMM (m %lld, n %lld, k %lld, batch %lld)", (long long)p.m, (long long)p.n,
           (long long)p.k, (long long)p.batch);
  w.what = what;
  for (const void *q : {(const void *)p.A, (const void *)p.B, p.beta != 0 ? (const void *)p.C : NULL, (const void *)p.D}) {
    const void *b = q ? lm_rt::block_of(q) : NULL;
    bool have = !b;
    for (const void *x : w.blocks) have = have || x == b;
    if (!have) w.blocks.push_back(b);
  }
  w.run = [p] { compute(p); };
  lm_rt::enqueue(stream, std::move(w));
  return CUBLAS_STATUS_SUCCESS;
}

/* A grouped call's problems (their pointers still unset) and its pointer
 * arrays, in device memory: read when the work runs, as a GPU's kernel
 * reads them. A matrix that is not memory of the device faults then. */
void run_grouped(std::vector<problem> ps, const void *const *A, const void *const *B, void *const *C, int device) {
  std::vector<const void *> blocks = {lm_rt::block_of(A), lm_rt::block_of(B), lm_rt::block_of(C)};
  for (size_t j = 0; j < ps.size(); j++) {
    problem &p = ps[j];
    p.A = (const char *)A[j], p.B = (const char *)B[j], p.C = p.D = (char *)C[j];
    int64_t arows = p.ta == CUBLAS_OP_N ? p.m : p.k, acols = p.ta == CUBLAS_OP_N ? p.k : p.m;
    int64_t brows = p.tb == CUBLAS_OP_N ? p.k : p.n, bcols = p.tb == CUBLAS_OP_N ? p.n : p.k;
    struct { const void *at; size_t n; } m[3] = {{p.A, extent(arows, acols, p.lda, 1, 0, p.at)},
                                                 {p.B, extent(brows, bcols, p.ldb, 1, 0, p.bt)},
                                                 {p.D, extent(p.m, p.n, p.ldd, 1, 0, p.dt)}};
    for (int i = 0; i < 3; i++) {
      if (m[i].n == 0) continue;
      if (lm_rt::device_of(m[i].at, m[i].n) != device) {
        lm_rt::note("cuBLAS grouped GEMM: problem %zu's %c at %p (%zu bytes) is not memory of cuda:%d: it faults",
                    j, "ABC"[i], m[i].at, m[i].n, device);
        lm_rt::set_sticky(device, cudaErrorIllegalAddress);
        return;
      }
      blocks.push_back(lm_rt::block_of(m[i].at));
    }
  }
  lm_rt::open_only(blocks); /* the matrices too, now that the pointers are known */
  for (const problem &p : ps) compute(p);
}

/* the product, when it runs on the device */
void compute(const problem &p) {
  bool f64 = p.compute == CUBLAS_COMPUTE_64F || p.compute == CUBLAS_COMPUTE_64F_PEDANTIC;
  int as = type_size(p.at), bs = type_size(p.bt), cs = type_size(p.ct);
  bool round_tf32 = p.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  std::vector<double> a64, b64, c64;
  std::vector<float> a32, b32, c32;
  for (int64_t q = 0; q < p.batch; q++) {
    const char *A = p.A + q * p.sa * as, *B = p.B + q * p.sb * bs;
    /* op(A) as a dense column-major m x k, op(B) as k x n */
    if (f64) a64.assign(p.m * p.k, 0), b64.assign(p.k * p.n, 0), c64.assign(p.m * p.n, 0);
    else a32.assign(p.m * p.k, 0), b32.assign(p.k * p.n, 0), c32.assign(p.m * p.n, 0);
    densify(A, p.ta, p.m, p.k, p.lda, p.at, f64, round_tf32, a64, a32);
    densify(B, p.tb, p.k, p.n, p.ldb, p.bt, f64, round_tf32, b64, b32);
    int m = (int)p.m, n = (int)p.n, k = (int)p.k;
    if (m && n && k) {
      if (f64) cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a64.data(), m, b64.data(), k,
                           0.0, c64.data(), m);
      else cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a32.data(), m, b32.data(), k,
                       0.0f, c32.data(), m);
    }
    const char *C = p.C + q * p.sc * cs;
    char *D = p.D + q * p.sd * cs;
    for (int64_t j = 0; j < p.n; j++)
      for (int64_t i = 0; i < p.m; i++) {
        double ab = f64 ? c64[i + j * p.m] : c32[i + j * p.m];
        double v;
        if (f64) v = p.alpha * ab + (p.beta != 0 ? p.beta * load(C + (i + j * p.ldc) * cs, p.ct) : 0);
        else { /* scale type f32: alpha * ab + beta * c in f32 */
          float r = (float)p.alpha * (float)ab;
          if (p.beta != 0) r += (float)p.beta * (float)load(C + (i + j * p.ldc) * cs, p.ct);
          v = r;
        }
        store(D + (i + j * p.ldd) * cs, p.dt, v);
      }
  }
}
} // namespace

extern "C" {
/* ---- cuBLAS ---- */
cublasStatus_t cublasCreate_v2(cublasHandle_t *h) { return make_handle(h); }
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) { return drop<handle>(h); }
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  ((handle *)h)->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void *ws, size_t n) {
  return !n || lm_rt::device_of(ws, n) >= 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                          int n, int k, const void *alpha, const void *A, cudaDataType at,
                                          int lda, long long sa, const void *B, cudaDataType bt, int ldb,
                                          long long sb, const void *beta, void *C, cudaDataType ct, int ldc,
                                          long long sc, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  bool f64 = compute == CUBLAS_COMPUTE_64F;
  problem p{ta, tb, m, n, k, batch, (const char *)A, (const char *)B, (const char *)C, (char *)C, at, bt, ct, ct,
            lda, ldb, ldc, ldc, sa, sb, sc, sc, compute,
            f64 ? *(const double *)alpha : *(const float *)alpha, f64 ? *(const double *)beta : *(const float *)beta};
  return run(p, ((handle *)h)->stream);
}

/* cuBLAS 12.5's grouped GEMM: group i is group_size[i] problems of one
 * shape (transa, m, n, k, ld, alpha, beta: host arrays by group), their
 * matrices' pointers in Aarray, Barray, Carray (device memory, one per
 * problem, in group order). The types cuBLAS documents for it: compute
 * 32F with A, B and C all 32F, 16BF or 16F; 32F_FAST_TF32 with all 32F;
 * alpha and beta f32. Counted as one grouped GEMM (not in gemms). */
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t ta[],
                                          const cublasOperation_t tb[], const int m[], const int n[],
                                          const int k[], const void *alpha, const void *const A[], cudaDataType at,
                                          const int lda[], const void *const B[], cudaDataType bt, const int ldb[],
                                          const void *beta, void *const C[], cudaDataType ct, const int ldc[],
                                          int group_count, const int group_size[], cublasComputeType_t compute) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (group_count < 0 || (group_count > 0 && (!ta || !tb || !m || !n || !k || !alpha || !lda || !ldb || !beta ||
                                              !ldc || !group_size)))
    return CUBLAS_STATUS_INVALID_VALUE;
  bool half = at == CUDA_R_16BF || at == CUDA_R_16F;
  bool ok = at == bt && bt == ct &&
            ((compute == CUBLAS_COMPUTE_32F && (half || at == CUDA_R_32F)) ||
             (compute == CUBLAS_COMPUTE_32F_FAST_TF32 && at == CUDA_R_32F));
  if (!ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  std::vector<problem> ps;
  for (int i = 0; i < group_count; i++) {
    problem p{ta[i], tb[i], m[i], n[i], k[i], 1, NULL, NULL, NULL, NULL, at, bt, ct, ct, lda[i], ldb[i], ldc[i],
              ldc[i], 0, 0, 0, 0, compute, ((const float *)alpha)[i], ((const float *)beta)[i]};
    if (group_size[i] < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (cublasStatus_t s = check_sizes(p)) return s;
    ps.insert(ps.end(), group_size[i], p);
  }
  if (ps.empty()) return CUBLAS_STATUS_SUCCESS;
  int d = lm_rt::current();
  if (lm_rt::sticky(d)) return CUBLAS_STATUS_EXECUTION_FAILED;
  lm_rt::work w;
  char what[96];
  snprintf(what, sizeof what, "cuBLAS grouped GEMM (%d groups, %zu problems)", group_count, ps.size());
  w.what = what;
  size_t bytes = ps.size() * sizeof(void *);
  for (const void *arr : {(const void *)A, (const void *)B, (const void *)C}) {
    if (lm_rt::device_of(arr, bytes) == d) { w.blocks.push_back(lm_rt::block_of(arr)); continue; }
    if (!w.fault) lm_rt::note("cuBLAS grouped GEMM on cuda:%d was given the pointer array %p (%zu bytes), not "
                              "memory of that device: it faults when it runs", d, arr, bytes);
    w.fault = cudaErrorIllegalAddress;
  }
  count_gemm(at, lm_rt::C_GROUPED_GEMMS);
  w.run = [ps, A, B, C, d] { run_grouped(ps, A, B, C, d); };
  lm_rt::enqueue(((handle *)h)->stream, std::move(w));
  return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLASLt ---- */
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { return make_handle(h); }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return drop<handle>(h); }
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (!type_size(t)) return CUBLAS_STATUS_NOT_SUPPORTED;
  return make(l, layout{t, rows, cols, ld, 1, 0});
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { return drop<layout>(l); }
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,
                                                const void *buf, size_t n) {
  layout *L = (layout *)l;
  if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && n == 4) memcpy(&L->batch, buf, 4);
  else if (a == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && n == 8) memcpy(&L->stride, buf, 8);
  else if (a == CUBLASLT_MATRIX_LAYOUT_ORDER && n == 4 && *(const int32_t *)buf == CUBLASLT_ORDER_COL) {}
  else { lm_rt::note("cublasLtMatrixLayoutSetAttribute %d (%zu bytes): not emulated", (int)a, n); return CUBLAS_STATUS_NOT_SUPPORTED; }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c, cudaDataType_t scale) {
  return make(d, desc{c, scale, CUBLAS_OP_N, CUBLAS_OP_N});
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { return drop<desc>(d); }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                              const void *buf, size_t n) {
  desc *D = (desc *)d;
  if (n != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  if (a == CUBLASLT_MATMUL_DESC_TRANSA) memcpy(&D->ta, buf, 4);
  else if (a == CUBLASLT_MATMUL_DESC_TRANSB) memcpy(&D->tb, buf, 4);
  else { lm_rt::note("cublasLtMatmulDescSetAttribute %d: not emulated", (int)a); return CUBLAS_STATUS_NOT_SUPPORTED; }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) { return make(p, pref{0}); }
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { return drop<pref>(p); }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void *buf,
                                                    size_t n) {
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && n == 8) memcpy(&((pref *)p)->ws, buf, 8);
  else if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; /* the alignments: uint32 */
  return CUBLAS_STATUS_SUCCESS;
}
/* one algorithm for any problem the emulated matmul takes */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int n,
                                              cublasLtMatmulHeuristicResult_t *r, int *found) {
  if (n < 1) return CUBLAS_STATUS_INVALID_VALUE;
  memset(r, 0, sizeof *r);
  r->algo.data[0] = 0x10017ULL;
  r->state = CUBLAS_STATUS_SUCCESS, r->wavesCount = 1;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb,
                              const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *Dp,
                              cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsn,
                              cudaStream_t stream) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  const desc *D = (const desc *)d;
  const layout *a = (const layout *)la, *b = (const layout *)lb, *c = (const layout *)lc, *dl = (const layout *)ld;
  if (algo && algo->data[0] != 0x10017ULL) return CUBLAS_STATUS_INVALID_VALUE;
  if (wsn && lm_rt::device_of(ws, wsn) < 0) return CUBLAS_STATUS_INVALID_VALUE;
  int64_t m = (int64_t)c->rows, n = (int64_t)c->cols;
  int64_t k = D->ta == CUBLAS_OP_N ? (int64_t)a->cols : (int64_t)a->rows;
  int64_t am = D->ta == CUBLAS_OP_N ? (int64_t)a->rows : (int64_t)a->cols;
  int64_t bk = D->tb == CUBLAS_OP_N ? (int64_t)b->rows : (int64_t)b->cols;
  int64_t bn = D->tb == CUBLAS_OP_N ? (int64_t)b->cols : (int64_t)b->rows;
  if (am != m || bk != k || bn != n || dl->rows != c->rows || dl->cols != c->cols || a->batch != c->batch ||
      b->batch != c->batch || dl->batch != c->batch) {
    lm_rt::note("cublasLtMatmul: layouts that do not fit: A %llux%llu, B %llux%llu, C %llux%llu, batches %d %d %d",
                (unsigned long long)a->rows, (unsigned long long)a->cols, (unsigned long long)b->rows,
                (unsigned long long)b->cols, (unsigned long long)c->rows, (unsigned long long)c->cols, a->batch,
                b->batch, c->batch);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (D->scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  problem p{D->ta, D->tb, m, n, k, c->batch, (const char *)A, (const char *)B, (const char *)C, (char *)Dp,
            a->t, b->t, c->t, dl->t, a->ld, b->ld, c->ld, dl->ld, a->stride, b->stride, c->stride, dl->stride,
            D->compute, *(const float *)alpha, *(const float *)beta};
  return run(p, stream);
}
}
