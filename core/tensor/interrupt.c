/* interrupt.c: Ctrl-C for interactive sessions (the REPL). Once installed,
 * SIGINT (and SIGUSR1, which loomrun --repl forwards to every rank) only
 * sets a flag, which the REPL arms while a chunk runs:
 *  - one process (LM_INTERRUPT_LOCAL): the next op call fails with
 *    "interrupted", as does the REPL's hook between Lua instructions, and
 *    the error ends the running chunk, not the session;
 *  - SPMD (LM_INTERRUPT_SPMD): ranks must stop at the same point, so the
 *    flag is voted on at each collective (its fingerprint carries it:
 *    comm/fingerprint.c), and every rank of the group fails that same
 *    collective; a rank that meets no collective within LM_INTERRUPT_GRACE
 *    (pure Lua, local ops) stops on its own and marks its next fingerprint
 *    (drain), so a peer waiting in a collective on the same communicator
 *    fails it as interrupted instead of waiting forever.
 * Not armed, the flag is left for the line editor (lm_interrupt_take).
 * No SA_RESTART: a read waiting for a line returns EINTR, so a line editor
 * can clear its line. It lives in the tensor layer, where the op door
 * (entry/) and the collectives (comm/) can both see it. */
#include "tensor.h"
#include <signal.h>
#include <string.h>
#include <time.h>

#define LM_INTERRUPT_GRACE 1.0 /* seconds a SPMD rank waits for a collective to stop at */

static volatile sig_atomic_t pending;
static volatile double since; /* when the first pending signal came (monotonic seconds) */
static int mode;              /* enum lm_interrupt_mode */
static int drain;             /* SPMD: this rank stopped on its own; its next fingerprint says so */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* async-signal-safe */
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void on_signal(int sig) {
  (void)sig;
  if (!pending) since = now();
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

void lm_interrupt_arm(int m) { mode = m; }

int lm_interrupt_pending(void) { return pending; }

void lm_interrupt_clear(void) { pending = 0; }

/* 1 (and the flag cleared) when a Ctrl-C is pending, armed or not: a
 * line editor's check */
int lm_interrupt_take(void) {
  if (!pending) return 0;
  pending = 0;
  return 1;
}

/* 1 (and the flag cleared) when the running code should stop now: an op
 * call's check and the REPL hook's */
int lm_interrupt_check(void) {
  if (!pending || mode == LM_INTERRUPT_OFF) return 0;
  if (mode == LM_INTERRUPT_SPMD) {
    if (now() - since < LM_INTERRUPT_GRACE) return 0;
    drain = 1;
  }
  pending = 0;
  return 1;
}

/* what this rank's next collective fingerprint says: stop here */
int lm_interrupt_vote(void) { return (mode == LM_INTERRUPT_SPMD && pending) || drain; }

/* a collective's vote said stop (on every member alike) */
void lm_interrupt_voted(void) {
  pending = 0;
  drain = 0;
}
