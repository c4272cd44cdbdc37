/* communicator.c: the MPI runtime (init, ranks, abort, finalize) and
 * communicators made by splitting the world; the transports that move
 * bytes over them are mpi.c (CPU tensors) and nccl.c (CUDA tensors). */
#include "comm.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int inited, own_mpi, debug = -1;
static lm_comm world;

int lm_mpi_fail(const char *what, int code) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(code, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "code %d", code);
  return lm_error("%s: MPI error: %s", what, s);
}

static int mpi_finalized(void) {
  int f = 0;
  MPI_Finalized(&f);
  return f;
}

static void at_exit(void) { lm_dist_finalize(); }

static int *identity_ranks(int n) {
  int *r = malloc(sizeof *r * (n > 0 ? n : 1));
  for (int i = 0; r && i < n; i++) r[i] = i;
  return r;
}

int lm_dist_init(void) {
  if (inited) return 0;
  if (mpi_finalized()) return lm_error("dist.init: MPI was already finalised in this process");
  int flag = 0, provided, rc;
  MPI_Initialized(&flag);
  if (!flag) {
    /* MULTIPLE: the watchdog's thread calls MPI beside the main thread. */
    rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return lm_mpi_fail("dist.init", rc);
    own_mpi = 1;
    atexit(at_exit);
  }
  /* Errors come back as codes we turn into messages, instead of aborting. */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  world.magic = LM_COMM_MAGIC;
  world.mpi = MPI_COMM_WORLD;
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.size);
  world.world_ranks = identity_ranks(world.size);
  world.key = lm_watch_key(world.world_ranks, world.size);
  if (!flag) MPI_Query_thread(&provided);
  else provided = MPI_THREAD_SINGLE; /* someone else's MPI: no thread of ours */
  lm_dist_debug();
  inited = 1;
  lm_watch_comm(&world, 1);
  return own_mpi ? lm_watch_start(world.rank, world.size, provided) : 0;
}

int lm_dist_ensure(const char *who) {
  if (inited) return 0;
  if (lm_dist_init() < 0) return lm_error("%s: %s", who, lm_last_error());
  return 0;
}

int lm_dist_is_initialized(void) { return inited; }
int lm_dist_rank(void) { return lm_dist_ensure("dist.rank") < 0 ? -1 : world.rank; }
int lm_dist_world_size(void) { return lm_dist_ensure("dist.world_size") < 0 ? -1 : world.size; }

/* From the launcher's environment: a split by node would be collective. */
int lm_dist_local_size(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *e = getenv(vars[i]);
    if (e && atoi(e) > 0) return atoi(e);
  }
  return inited ? world.size : 1;
}

int lm_dist_local_rank(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *e = getenv(vars[i]);
    if (e && *e) return atoi(e);
  }
  return inited ? world.rank : 0;
}

int lm_dist_finalize(void) {
  if (!inited || !own_mpi || mpi_finalized()) return 0;
  lm_watch_finish();
  int rc = MPI_Finalize();
  return rc == MPI_SUCCESS ? 0 : lm_mpi_fail("dist.finalize", rc);
}

void lm_abort(int code) {
  fflush(stdout);
  fflush(stderr);
  int flag = 0;
  MPI_Initialized(&flag);
  if (flag && !mpi_finalized()) MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code);
}

/* The check that every rank calls the same collective is on unless
 * LOOM_CHECK_COLLECTIVES=0 (LOOM_DEBUG_COLLECTIVES, its old name, too). */
void lm_dist_set_debug(int on) { debug = on != 0; }
int lm_dist_debug(void) {
  if (debug < 0) {
    const char *e = getenv("LOOM_CHECK_COLLECTIVES");
    if (!e) e = getenv("LOOM_DEBUG_COLLECTIVES");
    debug = !e || !*e || strcmp(e, "0") != 0;
  }
  return debug;
}
int lm_debug_collectives(void) { return lm_dist_debug(); }

/* ---- communicators ---- */

lm_comm *lm_comm_world(void) {
  return lm_dist_ensure("comm_world") < 0 ? NULL : &world;
}

static lm_comm *wrap_comm(MPI_Comm m) {
  lm_comm *c = calloc(1, sizeof *c);
  if (!c) { lm_error("comm: out of memory"); return NULL; }
  c->magic = LM_COMM_MAGIC;
  c->mpi = m;
  c->owned = 1;
  MPI_Comm_rank(m, &c->rank);
  MPI_Comm_size(m, &c->size);
  c->world_ranks = malloc(sizeof(int) * c->size);
  int *mine = identity_ranks(c->size);
  MPI_Group g, wg;
  MPI_Comm_group(m, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Group_translate_ranks(g, c->size, mine, wg, c->world_ranks);
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  free(mine);
  c->key = lm_watch_key(c->world_ranks, c->size);
  lm_watch_comm(c, 1);
  return c;
}

lm_comm *lm_comm_split(lm_comm *parent, int color, int key) {
  if (lm_dist_ensure("comm_split") < 0) return NULL;
  if (!parent) parent = &world;
  if (color < 0) {
    lm_error("comm_split: expected color >= 0, got %d", color);
    return NULL;
  }
  MPI_Comm m;
  int rc = MPI_Comm_split(parent->mpi, color, key, &m);
  if (rc != MPI_SUCCESS) { lm_mpi_fail("comm_split", rc); return NULL; }
  return wrap_comm(m);
}

lm_comm *lm_comm_from_ranks(int n, const int32_t *ranks) {
  if (lm_dist_ensure("comm_from_ranks") < 0) return NULL;
  if (n <= 0 || !ranks) {
    lm_error("comm_from_ranks: expected at least one rank, got %d", n);
    return NULL;
  }
  int member = 0, *r = malloc(sizeof *r * n);
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= world.size) {
      lm_error("comm_from_ranks: rank %d is not in [0, %d)", (int)ranks[i], world.size);
      free(r);
      return NULL;
    }
    for (int j = 0; j < i; j++)
      if (ranks[j] == ranks[i]) {
        lm_error("comm_from_ranks: rank %d appears twice", (int)ranks[i]);
        free(r);
        return NULL;
      }
    r[i] = ranks[i];
    member |= r[i] == world.rank;
  }
  if (!member) {
    lm_error("comm_from_ranks: this rank (%d) is not in the list", world.rank);
    free(r);
    return NULL;
  }
  MPI_Group wg, g;
  MPI_Comm m;
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Group_incl(wg, n, r, &g);
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, g, 0, &m);
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  free(r);
  if (rc != MPI_SUCCESS) { lm_mpi_fail("comm_from_ranks", rc); return NULL; }
  return wrap_comm(m);
}

void lm_comm_free(lm_comm *c) {
  if (!c || c == &world) return;
  lm_watch_comm(c, 0);
  if (c->nccl_free) c->nccl_free(c); /* left by the transport that made c->nccl */
  if (c->owned && !mpi_finalized()) MPI_Comm_free(&c->mpi);
  free(c->world_ranks);
  c->magic = 0;
  free(c);
}

int lm_comm_rank(const lm_comm *c) { return c ? c->rank : lm_error("comm_rank: comm is NULL"); }
int lm_comm_size(const lm_comm *c) { return c ? c->size : lm_error("comm_size: comm is NULL"); }
int lm_comm_world_rank(const lm_comm *c, int rank) {
  if (!c) return lm_error("comm_world_rank: comm is NULL");
  if (rank < 0 || rank >= c->size)
    return lm_error("comm_world_rank: expected a rank in [0, %d), got %d", c->size, rank);
  return c->world_ranks[rank];
}

static int test_request(void *req) {
  int flag = 0, rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
  return rc == MPI_SUCCESS ? flag : lm_mpi_fail("allgather", rc);
}

/* (a small allgather of the core's own: shapes, fingerprints; it waits
 * where the watchdog sees it) */
int lm_comm_allgather_i64(lm_comm *c, const int64_t *mine, int n, int64_t *all, const char *what) {
  MPI_Request req;
  int rc = MPI_Iallgather(mine, n, MPI_INT64_T, all, n, MPI_INT64_T, c->mpi, &req);
  if (rc != MPI_SUCCESS) return lm_mpi_fail("allgather", rc);
  return lm_watch_wait(c, what, test_request, &req);
}

int lm_comm_bcast_bytes(lm_comm *c, void *buf, int n, int root) {
  int rc = MPI_Bcast(buf, n, MPI_BYTE, root, c->mpi);
  return rc == MPI_SUCCESS ? 0 : lm_mpi_fail("broadcast", rc);
}

/* Every member says whether its part of a collective setup worked; all
 * return 0, or all -1 naming the lowest failing rank (its own message on
 * that rank), so no rank goes on to wait for one that gave up. */
int lm_comm_agree(lm_comm *c, int ok, const char *what) {
  int mine = ok ? c->size : c->rank, first = c->size;
  char why[256] = "";
  if (!ok) snprintf(why, sizeof why, "%s", lm_last_error());
  int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c->mpi);
  if (rc != MPI_SUCCESS) return lm_mpi_fail(what, rc);
  if (first == c->size) return 0;
  if (first == c->rank) return lm_error("%s", why);
  return lm_error("%s: rank %d of this communicator (world rank %d) failed, so every rank stops",
                  what, first, c->world_ranks[first]);
}
