/* interrupt.c: Ctrl-C for interactive sessions (the REPL). Once installed,
 * SIGINT (and SIGUSR1, which loomrun --repl forwards to every rank) only
 * sets a flag; lm_op_call sees it at the next op and fails with
 * "interrupted", which reaches Lua as an error that ends the running chunk
 * and not the session. No SA_RESTART: a read waiting for a line returns
 * EINTR, so a line editor can clear its line. */
#include "../tensor/tensor.h"
#include <signal.h>
#include <string.h>

static volatile sig_atomic_t pending;

static void on_signal(int sig) {
  (void)sig;
  pending = 1;
}

int lm_interrupt_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGUSR1, &sa, NULL) < 0)
    return lm_error("interrupt: cannot install the SIGINT handler");
  return 0;
}

int lm_interrupt_pending(void) { return pending; }

void lm_interrupt_clear(void) { pending = 0; }

/* 1 (and the flag cleared) when a Ctrl-C is pending: the caller fails */
int lm_interrupt_take(void) {
  if (!pending) return 0;
  pending = 0;
  return 1;
}

/* Deferred: ops go on; the program polls lm_interrupt_pending between
 * steps (a training loop stops after the step, with its checkpoint, rather
 * than in the middle of an update) */
static int deferred;
void lm_interrupt_defer(int on) { deferred = on != 0; }
int lm_interrupt_take_op(void) { return deferred ? 0 : lm_interrupt_take(); }
