/* p2p.c: point-to-point send and recv of CPU tensors over MPI, for pipeline
 * stages (activations forward, gradients back) and ring attention (K/V
 * blocks around a ring). A header with the dtype and shape goes first on
 * the same tag, so a receiver whose buffer does not match fails with both
 * shapes named instead of reading garbage or truncating. */
#include "comm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HDR_DTYPE, HDR_NDIM, HDR_SHAPE, HDR_LEN = HDR_SHAPE + LM_MAX_DIMS, MAX_TAG = 32767 };

typedef struct {
  int peer, tag, stage;     /* recv: stage 0 waits for the header, 1 for the data */
  int pending;              /* a recv listed in `inflight` below */
  int64_t hdr[HDR_LEN];
  MPI_Request req[2];
} p2p_state;

/* Receives in flight, by (comm, peer, tag): a second one on the same three
 * could take the first one's header and the other's data, so it is refused. */
enum { MAX_OPEN = 4096 };
static struct { const lm_comm *c; int peer, tag; } inflight[MAX_OPEN];
static int nopen;

static int open_index(const lm_comm *c, int peer, int tag) {
  for (int i = 0; i < nopen; i++)
    if (inflight[i].c == c && inflight[i].peer == peer && inflight[i].tag == tag) return i;
  return -1;
}
static void close_recv(lm_work *w) {
  p2p_state *s = w->p2p;
  int i = s->pending ? open_index(w->comm, s->peer, s->tag) : -1;
  if (i >= 0) inflight[i] = inflight[--nopen];
  s->pending = 0;
}

static const char *what(const lm_work *w) { return w->kind == LM_COLL_SEND ? "send" : "recv"; }

static void header_of(const lm_tensor *t, int64_t *h) {
  memset(h, 0, HDR_LEN * sizeof *h);
  h[HDR_DTYPE] = t->dtype_;
  h[HDR_NDIM] = t->ndim;
  for (int d = 0; d < t->ndim; d++) h[HDR_SHAPE + d] = t->shape_[d];
}

/* "f32 [2, 3]" */
static void describe(const int64_t *h, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s [", h[HDR_DTYPE] >= 0 && h[HDR_DTYPE] < LM_NDTYPES
                                         ? lm_dtype_name((int)h[HDR_DTYPE]) : "?");
  for (int d = 0; d < h[HDR_NDIM] && d < LM_MAX_DIMS && n < (int)len; d++)
    n += snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)h[HDR_SHAPE + d]);
  if (n < (int)len) snprintf(buf + n, len - n, "]");
}

static int data_count(const lm_tensor *t) { return (int)(t->numel_ * lm_dtype_size(t->dtype_)); }

static int p2p_start(lm_work *w) {
  p2p_state *s = w->p2p;
  MPI_Comm m = w->comm->mpi;
  int rc;
  s->req[0] = s->req[1] = MPI_REQUEST_NULL;
  if (w->kind == LM_COLL_SEND) {
    header_of(w->send, s->hdr);
    rc = MPI_Isend(s->hdr, HDR_LEN, MPI_INT64_T, s->peer, s->tag, m, &s->req[0]);
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend(lm_data(w->send), data_count(w->send), MPI_BYTE, s->peer, s->tag, m,
                     &s->req[1]);
  } else {
    rc = MPI_Irecv(s->hdr, HDR_LEN, MPI_INT64_T, s->peer, s->tag, m, &s->req[0]);
  }
  return rc == MPI_SUCCESS ? 0 : lm_mpi_fail(what(w), rc);
}

/* a header from the wire, checked before it sizes anything */
static int header_ok(const int64_t *h) {
  if (h[HDR_DTYPE] < 0 || h[HDR_DTYPE] >= LM_NDTYPES || h[HDR_NDIM] < 0 || h[HDR_NDIM] > LM_MAX_DIMS)
    return 0;
  int64_t n = lm_dtype_size((int)h[HDR_DTYPE]);
  for (int d = 0; d < h[HDR_NDIM]; d++) {
    if (h[HDR_SHAPE + d] < 0 || (h[HDR_SHAPE + d] > 0 && n > 2147483647LL / h[HDR_SHAPE + d])) return 0;
    n *= h[HDR_SHAPE + d];
  }
  return 1;
}

/* recv, once the header is in: out made to its measure (when the caller
 * gave none), then the data's receive when it matches out */
static int recv_data(lm_work *w) {
  p2p_state *s = w->p2p;
  if (!header_ok(s->hdr))
    return lm_error("recv: rank %d sent a malformed header (tag %d)", s->peer, s->tag);
  if (!w->recv) {
    w->recv = lm_empty((int)s->hdr[HDR_NDIM], s->hdr + HDR_SHAPE, (int)s->hdr[HDR_DTYPE], LM_CPU);
    if (!w->recv) return -1;
    w->out = w->recv;
    lm_retain(w->out);
  }
  int64_t mine[HDR_LEN];
  header_of(w->recv, mine);
  if (memcmp(mine, s->hdr, sizeof mine) != 0) {
    char got[160], want[160];
    describe(s->hdr, got, sizeof got);
    describe(mine, want, sizeof want);
    return lm_error("recv: rank %d sent a %s tensor (tag %d), but the receiving tensor is %s",
                    s->peer, got, s->tag, want);
  }
  s->stage = 1;
  int rc = MPI_Irecv(lm_data(w->recv), data_count(w->recv), MPI_BYTE, s->peer, s->tag,
                     w->comm->mpi, &s->req[0]);
  return rc == MPI_SUCCESS ? 0 : lm_mpi_fail("recv", rc);
}

static int p2p_test(lm_work *w) {
  p2p_state *s = w->p2p;
  int flag = 0, rc = MPI_Testall(2, s->req, &flag, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) return lm_mpi_fail(what(w), rc);
  if (flag && w->kind == LM_COLL_RECV && s->stage == 0) {
    if (recv_data(w) < 0) { close_recv(w); return -1; }
    return p2p_test(w);
  }
  if (flag && w->kind == LM_COLL_RECV) close_recv(w);
  if (!flag && lm_watch_finished(w->comm->world_ranks[s->peer]))
    return lm_error("%s: rank %d finished its script while this rank waits to %s it (tag %d)",
                    what(w), w->comm->world_ranks[s->peer],
                    w->kind == LM_COLL_SEND ? "send to" : "receive from", s->tag);
  return flag;
}

static int test_work(void *w) { return p2p_test(w); }
/* a message already in needs no watchdog (its sender may have finished since) */
static int p2p_wait(lm_work *w) {
  int r = p2p_test(w);
  if (r != 0) return r < 0 ? -1 : 0;
  return lm_watch_wait(w->comm, what(w), test_work, w);
}

static void p2p_release(lm_work *w) {
  p2p_state *s = w->p2p;
  if (!s) return;
  close_recv(w);
  for (int i = 0; i < 2; i++)
    if (s->req[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&s->req[i]);
      MPI_Request_free(&s->req[i]);
    }
  free(s);
  w->p2p = NULL;
}

static const lm_transport p2p_transport = {
    .name = "mpi-p2p", .halves_native = 1,
    .start = p2p_start, .wait = p2p_wait, .test = p2p_test, .release = p2p_release,
};

/* a recv may take no tensor (t NULL): it makes one of the sender's shape */
static int check(const char *name, lm_comm *c, const lm_tensor *t, int peer, int tag, int may_be_null) {
  if (lm_dist_ensure(name) < 0) return -1;
  if (!c) return lm_error("%s: comm is NULL", name);
  if (!t && !may_be_null) return lm_error("%s: expected a tensor, got NULL", name);
  if (t && t->freed) return lm_error("%s: the tensor was freed (t:free())", name);
  if (t && t->device_ != LM_CPU) {
    char dev[32];
    lm_device_name(t->device_, dev, sizeof dev);
    return lm_error("%s: expected a cpu tensor, got one on %s (p2p moves CPU tensors only)",
                    name, dev);
  }
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return lm_error("%s: expected a peer rank in [0, %d) other than this rank (%d), got %d",
                    name, c->size, c->rank, peer);
  if (tag < 0 || tag > MAX_TAG)
    return lm_error("%s: expected a tag in [0, %d], got %d", name, MAX_TAG, tag);
  if (t && (int64_t)t->numel_ * lm_dtype_size(t->dtype_) > 2147483647LL)
    return lm_error("%s: %lld elements is more than one message moves (2 GiB)", name,
                    (long long)t->numel_);
  return 0;
}

static lm_work *p2p_w(lm_comm *c, lm_tensor *t, int peer, int tag, int kind, int blocking) {
  const char *name = kind == LM_COLL_SEND ? "send" : "recv";
  if (check(name, c, t, peer, tag, kind == LM_COLL_RECV) < 0) return NULL;
  if (t && kind == LM_COLL_RECV && !lm_is_contiguous(t)) {
    lm_error("recv: the receiving tensor must be contiguous (call :contiguous() first)");
    return NULL;
  }
  lm_work *w = lm_work_new(c, kind, &p2p_transport, blocking);
  p2p_state *s = w ? calloc(1, sizeof *s) : NULL;
  if (!s) {
    if (w) lm_error("%s: out of memory", name);
    lm_work_free(w);
    return NULL;
  }
  s->peer = peer, s->tag = tag;
  w->p2p = s;
  if (kind == LM_COLL_RECV) {
    if (open_index(c, peer, tag) >= 0 || nopen == MAX_OPEN) {
      lm_error("recv: a receive from rank %d with tag %d is still in flight on this group; wait for it "
               "or use another tag", peer, tag);
      lm_work_free(w);
      return NULL;
    }
    inflight[nopen].c = c, inflight[nopen].peer = peer, inflight[nopen].tag = tag, nopen++;
    s->pending = 1;
  }
  if (kind == LM_COLL_SEND) {
    w->send = lm_contiguous(t);
    if (!w->send) { lm_work_free(w); return NULL; }
  } else if (t) {
    w->recv = w->out = t;
    lm_retain(t), lm_retain(t);
  }
  return lm_work_launch(w, t);
}

static int run(lm_work *w) {
  int rc = w ? lm_work_wait(w) : -1;
  lm_work_free(w);
  return rc;
}

int lm_send(lm_comm *c, lm_tensor *t, int dst, int tag) {
  return run(p2p_w(c, t, dst, tag, LM_COLL_SEND, 1));
}
int lm_recv(lm_comm *c, lm_tensor *out, int src, int tag) {
  return run(p2p_w(c, out, src, tag, LM_COLL_RECV, 1));
}
lm_work *lm_isend(lm_comm *c, lm_tensor *t, int dst, int tag) {
  return p2p_w(c, t, dst, tag, LM_COLL_SEND, 0);
}
lm_work *lm_irecv(lm_comm *c, lm_tensor *out, int src, int tag) {
  return p2p_w(c, out, src, tag, LM_COLL_RECV, 0);
}
