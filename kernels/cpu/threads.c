/* threads.c: one thread count for loom's kernels, OpenBLAS and oneDNN
 * (whose OpenMP regions take the default team size). It starts at
 * LOOM_NUM_THREADS, else the number of cores. */
#include "kernels.h"
#include <stdlib.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

void openblas_set_num_threads(int n);

static int nthreads;

static void init(void) {
  if (nthreads) return;
  const char *e = getenv("LOOM_NUM_THREADS");
  int n = e ? atoi(e) : 0;
  if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  lm_set_num_threads(n);
}

int lm_num_threads(void) { init(); return nthreads; }

void lm_set_num_threads(int n) {
  nthreads = n < 1 ? 1 : n;
  openblas_set_num_threads(nthreads);
#ifdef _OPENMP
  omp_set_num_threads(nthreads);
#endif
}

/* Below ~32k elements a parallel region costs more than it saves. */
int lm_threads_for(int64_t work) {
#ifdef _OPENMP
  init();
  int64_t by_work = work / 32768;
  if (by_work < 1) return 1;
  return by_work < nthreads ? (int)by_work : nthreads;
#else
  (void)work;
  return 1;
#endif
}
