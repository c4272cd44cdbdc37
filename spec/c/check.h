/* check.h: the C tests' tally. CHECK(cond) counts a pass, or a failure
 * printed with its file, line and condition; check_report() prints
 * "N passed, N failed" and gives main's exit status (1 on any failure). */
#ifndef LOOM_SPEC_CHECK_H
#define LOOM_SPEC_CHECK_H
#include <stdio.h>

static int passed, failed;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (cond) passed++;                                                        \
    else { failed++; fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } \
  } while (0)

static inline int check_report(void) {
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}

#endif
