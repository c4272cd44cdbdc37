/* mpi.c: MPI runtime (init, ranks, abort, finalize), communicators made by
 * splitting the world, and the MPI transport that moves CPU tensors. */
#include "comm.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int inited, own_mpi, debug = -1;
static lm_comm world;

static int mpi_fail(const char *what, int code) {
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
    if (rc != MPI_SUCCESS) return mpi_fail("dist.init", rc);
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
  return rc == MPI_SUCCESS ? 0 : mpi_fail("dist.finalize", rc);
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

int64_t lm_chunk_size(int64_t n, int k, int i) {
  if (k <= 0 || n <= 0) return 0;
  int64_t c = (n + k - 1) / k, s = n - (int64_t)i * c;
  return s < 0 ? 0 : s < c ? s : c;
}
int64_t lm_chunk_offset(int64_t n, int k, int i) {
  if (k <= 0 || n <= 0) return 0;
  int64_t c = (n + k - 1) / k, o = (int64_t)i * c;
  return o < n ? o : n;
}

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
  if (rc != MPI_SUCCESS) { mpi_fail("comm_split", rc); return NULL; }
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
  if (rc != MPI_SUCCESS) { mpi_fail("comm_from_ranks", rc); return NULL; }
  return wrap_comm(m);
}

void lm_comm_free(lm_comm *c) {
  if (!c || c == &world) return;
  lm_watch_comm(c, 0);
#ifdef LOOM_HAVE_NCCL
  lm_nccl_comm_free(c);
#endif
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
  return rc == MPI_SUCCESS ? flag : mpi_fail("allgather", rc);
}

/* (a small allgather of the core's own: shapes, fingerprints; it waits
 * where the watchdog sees it) */
int lm_comm_allgather_i64(lm_comm *c, const int64_t *mine, int n, int64_t *all, const char *what) {
  MPI_Request req;
  int rc = MPI_Iallgather(mine, n, MPI_INT64_T, all, n, MPI_INT64_T, c->mpi, &req);
  if (rc != MPI_SUCCESS) return mpi_fail("allgather", rc);
  return lm_watch_wait(c, what, test_request, &req);
}

int lm_comm_bcast_bytes(lm_comm *c, void *buf, int n, int root) {
  int rc = MPI_Bcast(buf, n, MPI_BYTE, root, c->mpi);
  return rc == MPI_SUCCESS ? 0 : mpi_fail("broadcast", rc);
}

/* ---- the MPI transport ---- */

static MPI_Datatype mpi_dtype(int dtype) {
  switch (dtype) {
  case LM_F32: return MPI_FLOAT;
  case LM_F64: return MPI_DOUBLE;
  case LM_BF16: case LM_F16: return MPI_UINT16_T; /* moved, never reduced */
  case LM_I32: return MPI_INT32_T;
  case LM_I64: return MPI_INT64_T;
  default: return MPI_UINT8_T;
  }
}

static MPI_Op mpi_op(int op) {
  return op == LM_RED_MAX ? MPI_MAX : op == LM_RED_MIN ? MPI_MIN : MPI_SUM;
}

static const char *kind_name[LM_NCOLL] = {"all_reduce", "all_gather", "reduce_scatter",
                                          "all_to_all", "broadcast", "barrier"};

/* Blocking calls for synchronous collectives (OpenMPI's tuned algorithms
 * beat its nonblocking ones), MPI_I* for async handles. */
static int mpi_start(lm_work *w) {
  MPI_Comm m = w->comm->mpi;
  MPI_Datatype dt = mpi_dtype(w->dtype);
  MPI_Op op = mpi_op(w->op);
  void *s = w->send ? lm_data(w->send) : NULL, *r = w->recv ? lm_data(w->recv) : NULL;
  const void *sb = w->in_place ? MPI_IN_PLACE : s;
  int n = w->recv ? (int)w->recv->numel_ : 0, rc = MPI_SUCCESS, b = 0; /* nonblocking: waits sleep */
  MPI_Request *q = &w->req;
  *q = MPI_REQUEST_NULL;
  int me = w->comm->rank;
  switch (w->kind) {
  case LM_COLL_ALL_REDUCE:
    rc = b ? MPI_Allreduce(sb, r, n, dt, op, m) : MPI_Iallreduce(sb, r, n, dt, op, m, q);
    break;
  case LM_COLL_ALL_GATHER:
    if (w->uneven)
      rc = b ? MPI_Allgatherv(s, w->rcounts[me], dt, r, w->rcounts, w->rdispls, dt, m)
             : MPI_Iallgatherv(s, w->rcounts[me], dt, r, w->rcounts, w->rdispls, dt, m, q);
    else
      rc = b ? MPI_Allgather(s, w->rcounts[0], dt, r, w->rcounts[0], dt, m)
             : MPI_Iallgather(s, w->rcounts[0], dt, r, w->rcounts[0], dt, m, q);
    break;
  case LM_COLL_REDUCE_SCATTER:
    if (w->uneven)
      rc = b ? MPI_Reduce_scatter(s, r, w->rcounts, dt, op, m)
             : MPI_Ireduce_scatter(s, r, w->rcounts, dt, op, m, q);
    else
      rc = b ? MPI_Reduce_scatter_block(s, r, w->rcounts[0], dt, op, m)
             : MPI_Ireduce_scatter_block(s, r, w->rcounts[0], dt, op, m, q);
    break;
  case LM_COLL_ALL_TO_ALL:
    if (w->uneven)
      rc = b ? MPI_Alltoallv(s, w->scounts, w->sdispls, dt, r, w->rcounts, w->rdispls, dt, m)
             : MPI_Ialltoallv(s, w->scounts, w->sdispls, dt, r, w->rcounts, w->rdispls, dt,
                              m, q);
    else
      rc = b ? MPI_Alltoall(s, w->scounts[0], dt, r, w->rcounts[0], dt, m)
             : MPI_Ialltoall(s, w->scounts[0], dt, r, w->rcounts[0], dt, m, q);
    break;
  case LM_COLL_BROADCAST:
    rc = b ? MPI_Bcast(r, n, dt, w->root, m) : MPI_Ibcast(r, n, dt, w->root, m, q);
    break;
  case LM_COLL_BARRIER:
    rc = b ? MPI_Barrier(m) : MPI_Ibarrier(m, q);
    break;
  }
  return rc == MPI_SUCCESS ? 0 : mpi_fail(kind_name[w->kind], rc);
}

static int mpi_test(lm_work *w) {
  int flag = 0, rc = MPI_Test(&w->req, &flag, MPI_STATUS_IGNORE);
  return rc == MPI_SUCCESS ? flag : mpi_fail(kind_name[w->kind], rc);
}

static int test_work(void *w) { return mpi_test(w); }
static int mpi_wait(lm_work *w) { return lm_watch_wait(w->comm, kind_name[w->kind], test_work, w); }

static void mpi_release(lm_work *w) { (void)w; }

const lm_transport lm_mpi_transport = {
    .name = "mpi", .halves_native = 0,
    .start = mpi_start, .wait = mpi_wait, .test = mpi_test, .release = mpi_release,
};
