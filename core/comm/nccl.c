/* nccl.c: the NCCL transport for CUDA tensors (built with LOOM_HAVE_NCCL).
 * One ncclComm per lm_comm, made collectively (init_device_mesh makes its
 * groups' at creation) from a unique id broadcast over MPI; collectives run on a side stream and finish on a cuda event. */
#ifdef LOOM_HAVE_NCCL
#include "comm.h"
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>

static cudaStream_t side; /* blocking stream: ordered after the default stream's work */

static int cuda_fail(const char *what, cudaError_t e) {
  cudaGetLastError(); /* clear it (a sticky error stays), so the next launch check is not failed by it */
  return lm_error("%s: CUDA error: %s", what, cudaGetErrorString(e));
}
static int nccl_fail(const char *what, ncclResult_t r) {
  return lm_error("%s: NCCL error: %s", what, ncclGetErrorString(r));
}

static ncclDataType_t nccl_dtype(int d) {
#define NCCL_TYPE(ID, name, type, nccl) case ID: return nccl;
  switch (d) { LM_DTYPES(NCCL_TYPE) default: return ncclUint8; }
#undef NCCL_TYPE
}

static ncclRedOp_t nccl_op(int op) {
  return op == LM_RED_AVG ? ncclAvg : op == LM_RED_MAX ? ncclMax : op == LM_RED_MIN ? ncclMin : ncclSum;
}

static void comm_free(lm_comm *c);

/* Makes c's NCCL communicator, collectively: every member calls it, in the
 * same order of communicators (init_device_mesh makes each of its groups'
 * at creation, lm_comm_nccl_init). Every local step that can fail (the
 * device, the stream, rank 0's unique id) is agreed on before anyone waits
 * in ncclCommInitRank, so a failure raises on every rank instead of
 * leaving the others waiting. */
static int nccl_make(lm_comm *c, int device) { /* (the *_fail helpers return -1: ok becomes 0) */
  if (c->nccl) return 0;
  cudaError_t e = cudaSetDevice(device - LM_CUDA0);
  int ok = e == cudaSuccess || cuda_fail("nccl init", e) == 0;
  if (ok && !side && (e = cudaStreamCreate(&side)) != cudaSuccess) ok = cuda_fail("nccl init", e) == 0;
  ncclUniqueId id;
  ncclResult_t r;
  if (ok && c->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) ok = nccl_fail("nccl init: ncclGetUniqueId", r) == 0;
  LM_TRY(lm_comm_agree(c, ok, "nccl init"));
  LM_TRY(lm_comm_bcast_bytes(c, &id, sizeof id, 0));
  ncclComm_t nc;
  r = ncclCommInitRank(&nc, c->size, id, c->rank);
  LM_TRY(lm_comm_agree(c, r == ncclSuccess || nccl_fail("nccl init: ncclCommInitRank", r) == 0, "nccl init"));
  c->nccl = nc, c->nccl_free = comm_free;
  return 0;
}

int lm_comm_nccl_init(lm_comm *c, int device) {
  if (!c) return lm_error("comm_nccl_init: comm is NULL");
  if (lm_device_kind(device) != LM_KIND_CUDA) return lm_error("comm_nccl_init: expected a CUDA device, got %d", device);
  return nccl_make(c, device);
}

/* The comm's NCCL communicator. A communicator made outside a mesh (a
 * group of dist.new_group) gets it here, on its first CUDA collective,
 * which every member reaches in the same order. */
static ncclComm_t nccl_of(lm_comm *c, int device) {
  return c->nccl || nccl_make(c, device) == 0 ? (ncclComm_t)c->nccl : NULL;
}

static char *at(lm_tensor *t, int64_t elems) {
  return (char *)lm_data(t) + elems * lm_dtype_size(t->dtype_);
}

/* Closes a group opened by ncclGroupStart: the group's calls are issued at
 * ncclGroupEnd, so its result is the collective's (a failed call inside
 * the group still needs the end, and reports first). */
static ncclResult_t group_end(ncclResult_t rc) {
  ncclResult_t e = ncclGroupEnd();
  return rc != ncclSuccess ? rc : e;
}

/* v-variants as grouped point-to-point / rooted calls (NCCL has no *v). */
static ncclResult_t issue(lm_work *w, ncclComm_t nc) {
  lm_comm *c = w->comm;
  ncclDataType_t dt = nccl_dtype(w->dtype);
  ncclRedOp_t op = nccl_op(w->op);
  void *s = w->send ? lm_data(w->send) : NULL, *r = w->recv ? lm_data(w->recv) : NULL;
  size_t n = w->recv ? (size_t)w->recv->numel_ : 0;
  ncclResult_t rc = ncclSuccess;
  switch (w->kind) {
  case LM_COLL_ALL_REDUCE: return ncclAllReduce(w->in_place ? r : s, r, n, dt, op, nc, side);
  case LM_COLL_BROADCAST: return ncclBroadcast(r, r, n, dt, w->root, nc, side);
  case LM_COLL_ALL_GATHER:
    if (!w->uneven) return ncclAllGather(s, r, w->rcounts[0], dt, nc, side);
    if ((rc = ncclGroupStart()) != ncclSuccess) return rc;
    for (int q = 0; q < c->size && rc == ncclSuccess; q++)
      rc = ncclBroadcast(s, at(w->recv, w->rdispls[q]), w->rcounts[q], dt, q, nc, side);
    return group_end(rc);
  case LM_COLL_REDUCE_SCATTER: {
    if (!w->uneven) return ncclReduceScatter(s, r, w->rcounts[0], dt, op, nc, side);
    int64_t off = 0;
    if ((rc = ncclGroupStart()) != ncclSuccess) return rc;
    for (int q = 0; q < c->size && rc == ncclSuccess; q++) {
      rc = ncclReduce(at(w->send, off), r, w->rcounts[q], dt, op, q, nc, side);
      off += w->rcounts[q];
    }
    return group_end(rc);
  }
  case LM_COLL_ALL_TO_ALL:
    if ((rc = ncclGroupStart()) != ncclSuccess) return rc;
    for (int q = 0; q < c->size && rc == ncclSuccess; q++) {
      rc = ncclSend(at(w->send, w->sdispls[q]), w->scounts[q], dt, q, nc, side);
      if (rc == ncclSuccess) rc = ncclRecv(at(w->recv, w->rdispls[q]), w->rcounts[q], dt, q, nc, side);
    }
    return group_end(rc);
  default:
    return ncclInvalidArgument;
  }
}

static int nccl_start(lm_work *w) {
  lm_tensor *t = w->recv ? w->recv : w->send;
  ncclComm_t nc = t ? nccl_of(w->comm, t->device_) : NULL;
  if (!nc) return t ? -1 : lm_error("nccl: a barrier runs over MPI");
  ncclResult_t r = issue(w, nc);
  if (r != ncclSuccess) return nccl_fail("nccl collective", r);
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ev, side);
  if (e != cudaSuccess) return cuda_fail("nccl collective", e);
  w->event = ev;
  /* later work on the default stream waits for the result */
  e = cudaStreamWaitEvent(0, ev, 0);
  return e == cudaSuccess ? 0 : cuda_fail("nccl collective", e);
}

/* A query of an event not yet reached answers cudaErrorNotReady and, as
 * CUDA does, leaves it as the last error: cleared here, or the next
 * kernel's launch check (cudaGetLastError) would fail with it. */
static int nccl_test(lm_work *w) {
  cudaError_t e = cudaEventQuery((cudaEvent_t)w->event);
  if (e == cudaErrorNotReady) {
    if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
    return 0;
  }
  return e == cudaSuccess ? 1 : cuda_fail("nccl test", e);
}

/* polled with naps where the watchdog sees it, as MPI's waits are */
static int test_work(void *w) { return nccl_test(w); }
static int nccl_wait(lm_work *w) { return lm_watch_wait(w->comm, "an NCCL collective", test_work, w); }

static void nccl_release(lm_work *w) {
  if (w->event) cudaEventDestroy((cudaEvent_t)w->event);
  w->event = NULL;
}

static void comm_free(lm_comm *c) {
  if (c->nccl) ncclCommDestroy((ncclComm_t)c->nccl);
  c->nccl = NULL;
}

const lm_transport lm_nccl_transport = {
    .name = "nccl", .halves_native = 1,
    .start = nccl_start, .wait = nccl_wait, .test = nccl_test, .release = nccl_release,
};
#else
#include "comm.h"
/* without NCCL a CUDA tensor's collective fails by itself (collectives.c) */
int lm_comm_nccl_init(lm_comm *c, int device) { (void)c, (void)device; return 0; }
#endif
