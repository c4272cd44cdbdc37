/* nccl.c: the NCCL transport for CUDA tensors (built with LOOM_HAVE_NCCL).
 * One ncclComm per lm_comm, made on first use from a unique id broadcast
 * over MPI; collectives run on a side stream and finish on a cuda event. */
#ifdef LOOM_HAVE_NCCL
#include "comm.h"
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>

static cudaStream_t side; /* blocking stream: ordered after the default stream's work */

static int cuda_fail(const char *what, cudaError_t e) {
  return lm_error("%s: CUDA error: %s", what, cudaGetErrorString(e));
}
static int nccl_fail(const char *what, ncclResult_t r) {
  return lm_error("%s: NCCL error: %s", what, ncclGetErrorString(r));
}

static ncclDataType_t nccl_dtype(int d) {
  switch (d) {
  case LM_F32: return ncclFloat32;
  case LM_F64: return ncclFloat64;
  case LM_BF16: return ncclBfloat16;
  case LM_F16: return ncclFloat16;
  case LM_I32: return ncclInt32;
  case LM_I64: return ncclInt64;
  default: return ncclUint8;
  }
}

static ncclRedOp_t nccl_op(int op) {
  return op == LM_RED_AVG ? ncclAvg : op == LM_RED_MAX ? ncclMax : op == LM_RED_MIN ? ncclMin : ncclSum;
}

static void comm_free(lm_comm *c);

/* The comm's NCCL communicator, made collectively on first use. */
static ncclComm_t nccl_of(lm_comm *c, int device) {
  if (c->nccl) return (ncclComm_t)c->nccl;
  cudaError_t e = cudaSetDevice(device - LM_CUDA0);
  if (e != cudaSuccess) { cuda_fail("nccl init", e); return NULL; }
  if (!side && (e = cudaStreamCreate(&side)) != cudaSuccess) { cuda_fail("nccl init", e); return NULL; }
  ncclUniqueId id;
  ncclResult_t r;
  if (c->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) { nccl_fail("nccl init", r); return NULL; }
  if (lm_comm_bcast_bytes(c, &id, sizeof id, 0) < 0) return NULL;
  ncclComm_t nc;
  if ((r = ncclCommInitRank(&nc, c->size, id, c->rank)) != ncclSuccess) {
    nccl_fail("nccl init", r);
    return NULL;
  }
  c->nccl = nc, c->nccl_free = comm_free;
  return nc;
}

static char *at(lm_tensor *t, int64_t elems) {
  return (char *)lm_data(t) + elems * lm_dtype_size(t->dtype_);
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
    ncclGroupStart();
    for (int q = 0; q < c->size && rc == ncclSuccess; q++)
      rc = ncclBroadcast(s, at(w->recv, w->rdispls[q]), w->rcounts[q], dt, q, nc, side);
    ncclGroupEnd();
    return rc;
  case LM_COLL_REDUCE_SCATTER: {
    if (!w->uneven) return ncclReduceScatter(s, r, w->rcounts[0], dt, op, nc, side);
    int64_t off = 0;
    ncclGroupStart();
    for (int q = 0; q < c->size && rc == ncclSuccess; q++) {
      rc = ncclReduce(at(w->send, off), r, w->rcounts[q], dt, op, q, nc, side);
      off += w->rcounts[q];
    }
    ncclGroupEnd();
    return rc;
  }
  case LM_COLL_ALL_TO_ALL:
    ncclGroupStart();
    for (int q = 0; q < c->size && rc == ncclSuccess; q++) {
      rc = ncclSend(at(w->send, w->sdispls[q]), w->scounts[q], dt, q, nc, side);
      if (rc == ncclSuccess) rc = ncclRecv(at(w->recv, w->rdispls[q]), w->rcounts[q], dt, q, nc, side);
    }
    ncclGroupEnd();
    return rc;
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

static int nccl_test(lm_work *w) {
  cudaError_t e = cudaEventQuery((cudaEvent_t)w->event);
  if (e == cudaErrorNotReady) return 0;
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
typedef int lm_nccl_not_built; /* keeps this translation unit non-empty */
#endif
