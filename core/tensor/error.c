/* error.c: the thread-local message left by a failing call. */
#include "tensor.h"
#include <stdarg.h>
#include <stdio.h>

static _Thread_local char msg[1024];

int lm_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return -1;
}

const char *lm_last_error(void) { return msg[0] ? msg : "unknown error"; }
void lm_clear_error(void) { msg[0] = 0; }
