/* test_unary_math.c: the one definition of the unary kinds (core/unary.h)
 * and the CPU kernels that evaluate it. For every kind of the list, so a
 * new kind is tested without a new line here:
 *   - f'(x) agrees with central differences of f(x) (f64);
 *   - the CPU unary kernel in f32 (vectorised, fastmath.h for some kinds)
 *     agrees with f(x) in f64 within 1e-5, and in f64 within 1e-13;
 *   - the CPU unary_grad kernel agrees with g f'(x).
 * Prints "N passed, N failed"; exits non-zero on any failure. */
#include "tensor/tensor.h"
#include "../../kernels/unary_math.h"
#include <stdio.h>
#include <string.h>

static int passed, failed;
#define NAME_(K, F, D, R) #K,
static const char *names[] = {LM_UNARY_KINDS(NAME_)};

/* a property of one kind over many points: the first failure is reported
 * (and ends the loop that checks it); a property counts once */
static void check(int ok, const char *what, int kind, double x, double got, double want) {
  if (ok) return;
  failed++;
  fprintf(stderr, "FAIL %s of %s at x = %.9g: got %.9g, want %.9g\n", what, names[kind], x, got, want);
}
#define PASSED(ok) (passed += (ok) != 0)

/* where kind is defined: positive for the roots, log and pow */
static double point(int kind, int i, int n) {
  double x = -6 + 12.0 * (i + 0.5) / n;
  if (kind == LM_SQRT || kind == LM_RSQRT || kind == LM_LOG || kind == LM_POW_SCALAR) x = 0.05 + fabs(x);
  return x;
}
static const double K0 = -0.5, K1 = 0.7, POW = 3; /* clamp's bounds, pow's exponent */
static double k0_of(int kind) { return kind == LM_POW_SCALAR ? POW : K0; }
/* a kink or a step of f near x (abs at 0, clamp at its bounds, softplus at
 * its threshold): the one-sided differences disagree */
static int near_kink(int kind, double x) {
  double k0 = k0_of(kind), h = 1e-4, f = lm_unary_f64(kind, x, k0, K1);
  double left = (f - lm_unary_f64(kind, x - h, k0, K1)) / h, right = (lm_unary_f64(kind, x + h, k0, K1) - f) / h;
  return fabs(left - right) > 1e-2 * (1 + fabs(left));
}

static void derivatives(void) {
  for (int kind = 0; kind < LM_NUNARY; kind++) {
    if (lm_unary_grad_reads(kind) == LM_D_NONE) continue;
    int ok = 1;
    for (int i = 0; i < 997 && ok; i++) {
      double x = point(kind, i, 997), k0 = k0_of(kind), h = 1e-6;
      if (near_kink(kind, x)) continue;
      double y = lm_unary_f64(kind, x, k0, K1), d = lm_unary_d_f64(kind, x, y, k0, K1);
      double fd = (lm_unary_f64(kind, x + h, k0, K1) - lm_unary_f64(kind, x - h, k0, K1)) / (2 * h);
      ok = fabs(d - fd) <= 1e-6 * (1 + fabs(d));
      check(ok, "f'(x) against central differences", kind, x, d, fd);
    }
    PASSED(ok);
  }
}

static lm_tensor *vec(int n, int dtype) { int64_t s = n; return lm_empty(1, &s, dtype, LM_CPU); }

/* the CPU kernels of every kind against the definition */
static void cpu_kernels(void) {
  enum { N = 4096 };
  const lm_backend *be = lm_backend_of(LM_CPU);
  for (int kind = 0; kind < LM_NUNARY; kind++) {
    if (kind == LM_NOT) continue; /* logical: bool tensors (pointwise_spec) */
    double p[2] = {k0_of(kind), K1};
    lm_tensor *x32 = vec(N, LM_F32), *y32 = vec(N, LM_F32), *x64 = vec(N, LM_F64), *y64 = vec(N, LM_F64);
    float *a = lm_data(x32);
    double *b = lm_data(x64);
    for (int i = 0; i < N; i++) a[i] = (float)point(kind, i, N), b[i] = a[i];
    int ok = be->unary(kind, y32, x32, p) == 0 && be->unary(kind, y64, x64, p) == 0;
    check(ok, "the CPU unary kernel runs", kind, 0, 0, 0);
    const float *f = lm_data(y32);
    const double *g = lm_data(y64);
    for (int i = 0; i < N && ok; i++) {
      double want = lm_unary_f64(kind, b[i], p[0], p[1]);
      ok = fabs(f[i] - want) <= 1e-5 * fabs(want) + 1e-6;
      check(ok, "the CPU f32 kernel against f(x)", kind, b[i], f[i], want);
      /* the same expression, up to how the compiler contracted it into FMAs */
      ok = ok && (fabs(g[i] - want) <= 1e-13 * (fabs(want) + 1) || (g[i] != g[i] && want != want));
      check(ok, "the CPU f64 kernel against f(x)", kind, b[i], g[i], want);
    }
    PASSED(ok);
    if (lm_unary_grad_reads(kind) != LM_D_NONE) { /* g f'(x) with g = 1 + x/8 */
      lm_tensor *g32 = vec(N, LM_F32), *d32 = vec(N, LM_F32);
      float *gv = lm_data(g32);
      for (int i = 0; i < N; i++) gv[i] = 1 + a[i] / 8;
      ok = be->unary_grad(kind, d32, g32, x32, y32, p) == 0;
      check(ok, "the CPU unary_grad kernel runs", kind, 0, 0, 0);
      const float *d = lm_data(d32);
      for (int i = 0; i < N && ok; i++) {
        if (near_kink(kind, b[i])) continue;
        double want = gv[i] * lm_unary_d_f64(kind, b[i], lm_unary_f64(kind, b[i], p[0], p[1]), p[0], p[1]);
        ok = fabs(d[i] - want) <= 2e-5 * fabs(want) + 2e-6;
        check(ok, "the CPU f32 unary_grad kernel against g f'(x)", kind, b[i], d[i], want);
      }
      PASSED(ok);
      lm_release(g32), lm_release(d32);
    }
    lm_release(x32), lm_release(y32), lm_release(x64), lm_release(y64);
  }
}

int main(void) {
  derivatives();
  cpu_kernels();
  printf("test_unary_math: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
