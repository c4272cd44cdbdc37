/* gemm_dnnl.c: bf16 GEMMs at the hardware's rate through oneDNN's matmul
 * primitive (what PyTorch's CPU bf16 matmul runs): bf16 operands, f32
 * accumulation, the result written as bf16 or f32 by the kernel itself,
 * with AVX512_BF16 dot products (vdpbf16ps) or AMX tiles where the CPU has
 * them. Chosen at run time: only when oneDNN's own CPU dispatch reports
 * bf16 dot products (dnnl_get_effective_cpu_isa, which also honours
 * ONEDNN_MAX_CPU_ISA); elsewhere the plain path (gemm_half.c: widen to f32,
 * sgemm) runs as before. Measured on a 2-vCPU AMD EPYC Zen 5, 1024^3:
 * 835 GFLOP/s against 221 for the widened path and 410 for f32 sgemm
 * (docs/benchmarks.md).
 * f16 stays on the plain path: oneDNN 2.6 has no f16 matmul kernel for
 * CPUs without AVX512_FP16, and this CPU has none.
 *
 * A call the library would run in its reference kernel (a layout its fast
 * kernels do not take: a batch broadcast with stride 0, an operand with no
 * unit stride) is declined, and the plain path runs it. Primitives are
 * created per call: oneDNN's primitive cache makes that ~2 us. */
#include "kernels.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int enabled = 1;   /* lm_cpu_set_bf16_gemm, LOOM_BF16_GEMM=plain */
static int64_t runs;      /* GEMMs run here (lm_cpu_bf16_gemm_runs) */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init(void);

int lm_cpu_set_bf16_gemm(int on) {
  pthread_once(&once, init);
  int old = enabled;
  if (on >= 0) enabled = on != 0;
  return old;
}

int64_t lm_cpu_bf16_gemm_runs(void) { return __atomic_load_n(&runs, __ATOMIC_RELAXED); }

static void read_env(void) {
  const char *e = getenv("LOOM_BF16_GEMM");
  if (e && !strcmp(e, "plain")) enabled = 0;
}

#ifdef LOOM_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

static dnnl_engine_t engine;
static int has_bf16;      /* the CPU has bf16 dot products (oneDNN's dispatch) */

static void init(void) {
  read_env();
  lm_num_threads();   /* sets OpenMP's team size, which oneDNN's kernels take */
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  has_bf16 = (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
  if (has_bf16 && dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) has_bf16 = 0;
}

static int fast(void) {
  pthread_once(&once, init);
  return has_bf16 && enabled;
}

/* the (B,) rows x cols operand t as a oneDNN descriptor: its own strides,
 * the batch dim dropped when there is one batch entry */
static void desc_of(dnnl_memory_desc_t *d, const lm_tensor *t, int nd, dnnl_data_type_t dt) {
  dnnl_dims_t dims, st;
  for (int i = 0; i < nd; i++) dims[i] = t->shape_[3 - nd + i], st[i] = t->stride_[3 - nd + i];
  dnnl_memory_desc_init_by_strides(d, nd, dims, dt, st);
}

/* alpha as an output scale, beta as a sum post-op: c = alpha a b + beta c */
static dnnl_primitive_attr_t attr_of(double alpha, double beta) {
  dnnl_primitive_attr_t at = NULL;
  if (alpha == 1 && beta == 0) return NULL;
  if (dnnl_primitive_attr_create(&at) != dnnl_success) return NULL;
  float s = (float)alpha;
  if (alpha != 1) dnnl_primitive_attr_set_output_scales(at, 1, 0, &s);
  if (beta != 0) {
    dnnl_post_ops_t po;
    dnnl_post_ops_create(&po);
    dnnl_post_ops_append_sum(po, (float)beta);
    dnnl_primitive_attr_set_post_ops(at, po);
    dnnl_post_ops_destroy(po);
  }
  return at;
}

/* the primitive for c = a b in descriptors nd-D, or NULL when oneDNN has
 * none or only its reference kernel for them */
static dnnl_primitive_t primitive(const dnnl_memory_desc_t md[3], double alpha, double beta) {
  dnnl_matmul_desc_t d;
  if (dnnl_matmul_desc_init(&d, &md[0], &md[1], NULL, &md[2]) != dnnl_success) return NULL;
  dnnl_primitive_attr_t at = attr_of(alpha, beta);
  if ((alpha != 1 || beta != 0) && !at) return NULL;
  dnnl_primitive_desc_t pd;
  dnnl_status_t st = dnnl_primitive_desc_create(&pd, &d, at, engine, NULL);
  if (at) dnnl_primitive_attr_destroy(at);
  if (st != dnnl_success) return NULL;
  const char *impl = "ref";
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  dnnl_primitive_t p = NULL;
  if (strncmp(impl, "ref", 3) != 0 && dnnl_primitive_create(&p, pd) != dnnl_success) p = NULL;
  dnnl_primitive_desc_destroy(pd);
  return p;
}

/* run p on the tensors' data; 0 or -1 */
static int execute(dnnl_primitive_t p, const dnnl_memory_desc_t md[3], char *const ptr[3]) {
  dnnl_stream_t s;
  if (dnnl_stream_create(&s, engine, dnnl_stream_default_flags) != dnnl_success) return -1;
  dnnl_memory_t m[3] = {0};
  dnnl_status_t st = dnnl_success;
  for (int i = 0; i < 3 && st == dnnl_success; i++) st = dnnl_memory_create(&m[i], &md[i], engine, ptr[i]);
  if (st == dnnl_success) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]}};
    st = dnnl_primitive_execute(p, s, 3, args);
    if (st == dnnl_success) st = dnnl_stream_wait(s);
  }
  for (int i = 0; i < 3; i++)
    if (m[i]) dnnl_memory_destroy(m[i]);
  dnnl_stream_destroy(s);
  return st == dnnl_success ? 0 : -1;
}

/* c = alpha a b + beta c on batches [b0, b0 + nb) in one primitive: 0
 * done, 1 declined (no fast kernel for this layout), -1 failed */
static int run(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, int64_t b0, int nd, double alpha,
               double beta) {
  const lm_tensor *t[3] = {a, b, c};
  dnnl_memory_desc_t md[3];
  char *ptr[3];
  for (int i = 0; i < 3; i++) {
    dnnl_data_type_t dt = t[i]->dtype_ == LM_F32 ? dnnl_f32 : dnnl_bf16;
    desc_of(&md[i], t[i], nd, dt);
    ptr[i] = lm_ptr(t[i]) + b0 * t[i]->stride_[0] * lm_dtype_size(t[i]->dtype_);
  }
  dnnl_primitive_t p = primitive(md, alpha, beta);
  if (!p) return 1;
  int rc = execute(p, md, ptr);
  dnnl_primitive_destroy(p);
  if (rc == 0) __atomic_fetch_add(&runs, 1, __ATOMIC_RELAXED);
  return rc;
}

int lm_cpu_gemm_dnnl(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha, double beta) {
  if (a->dtype_ != LM_BF16 || !fast()) return 1;
  int64_t B = c->shape_[0];
  int rc = B > 1 ? run(c, a, b, 0, 3, alpha, beta) : 1;   /* all batch entries in one primitive */
  /* else one a batch entry (where oneDNN takes the 3-D layout only in its
   * reference kernel: a broadcast batch); entries share their layout, so
   * only the first can be declined, before anything is written */
  for (int64_t i = 0; rc == 1 && i < B; i++) {
    int r = run(c, a, b, i, 2, alpha, beta);
    if (r == 1 && i == 0) return 1;
    if (r != 0) rc = -1;
    else if (i == B - 1) rc = 0;
  }
  return rc < 0 ? lm_error("gemm: oneDNN's bf16 matmul failed") : rc;
}

const char *lm_cpu_bf16_gemm_info(void) {
  static char buf[160];
  pthread_once(&once, init);
  const dnnl_version_t *v = dnnl_version();
  const char *why = !has_bf16 ? ": the CPU has no bf16 dot products (oneDNN's dispatch)"
                    : !enabled ? " (set off: LOOM_BF16_GEMM=plain or lm_cpu_set_bf16_gemm)" : "";
  if (has_bf16 && enabled)
    snprintf(buf, sizeof buf, "oneDNN %d.%d.%d matmul (%s)", v->major, v->minor, v->patch,
             dnnl_get_effective_cpu_isa() == dnnl_cpu_isa_avx512_core_amx ? "AMX" : "AVX512_BF16");
  else
    snprintf(buf, sizeof buf, "widened to f32, sgemm%s", why);
  return buf;
}

#else /* built without oneDNN: the plain path only */
static void init(void) { read_env(); }

int lm_cpu_gemm_dnnl(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha, double beta) {
  (void)c, (void)a, (void)b, (void)alpha, (void)beta;
  return 1;
}
const char *lm_cpu_bf16_gemm_info(void) { return "widened to f32, sgemm (built without oneDNN)"; }
#endif
