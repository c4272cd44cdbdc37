/* mpi.c: the MPI transport, which moves CPU tensors (and stages others
 * through the host) for collectives.c. */
#include "comm.h"

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
                                          "all_to_all", "broadcast", "barrier",
                                      "send", "recv"};

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
  return rc == MPI_SUCCESS ? 0 : lm_mpi_fail(kind_name[w->kind], rc);
}

static int mpi_test(lm_work *w) {
  int flag = 0, rc = MPI_Test(&w->req, &flag, MPI_STATUS_IGNORE);
  return rc == MPI_SUCCESS ? flag : lm_mpi_fail(kind_name[w->kind], rc);
}

static int test_work(void *w) { return mpi_test(w); }
static int mpi_wait(lm_work *w) { return lm_watch_wait(w->comm, kind_name[w->kind], test_work, w); }

static void mpi_release(lm_work *w) { (void)w; }

const lm_transport lm_mpi_transport = {
    .name = "mpi", .halves_native = 0,
    .start = mpi_start, .wait = mpi_wait, .test = mpi_test, .release = mpi_release,
};
