/* collectives.c: the public collectives. Each checks its arguments, packs
 * its input into per-rank blocks, hands a work to the tensor's transport
 * (MPI or NCCL) and, once done, finishes it (avg, cast back, unpack). */
#include "comm.h"
#include "../tensor/trace.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char *names[LM_NCOLL] = {"all_reduce", "all_gather", "reduce_scatter",
                                      "all_to_all", "broadcast", "barrier", "send", "recv"};
static int64_t stat_count[LM_NCOLL], stat_bytes[LM_NCOLL];

void lm_comm_stats(int64_t *counts, int64_t *bytes) {
  for (int k = 0; k < LM_NCOLL; k++) {
    if (counts) counts[k] = stat_count[k];
    if (bytes) bytes[k] = stat_bytes[k];
  }
}

const lm_transport *lm_coll_transport(const char *op, const lm_tensor *t) {
  if (!t || t->device_ == LM_CPU) return &lm_mpi_transport;
#ifdef LOOM_HAVE_NCCL
  (void)op;
  return &lm_nccl_transport;
#else
  char dev[32];
  lm_device_name(t->device_, dev, sizeof dev);
  lm_error("%s: tensor is on %s, but this build of loom has no NCCL (CPU tensors only)", op, dev);
  return NULL;
#endif
}

/* Checks shared by every collective taking a tensor. */
int lm_coll_check(const char *op, lm_comm *c, const lm_tensor *t, int min_ndim) {
  if (lm_dist_ensure(op) < 0) return -1;
  if (!c) return lm_error("%s: comm is NULL", op);
  if (!t) return lm_error("%s: expected a tensor, got NULL", op);
  if (t->freed) return lm_error("%s: the tensor was freed (t:free())", op);
  if (t->device_ == LM_META) return lm_error("%s: a meta tensor has no data to communicate", op);
  if (t->dtype_ < 0 || t->dtype_ >= LM_NDTYPES)
    return lm_error("%s: unknown dtype %d", op, t->dtype_);
  if (t->ndim < min_ndim)
    return lm_error("%s: expected a tensor of at least %d dim, got a %d-dim one", op,
                    min_ndim, t->ndim);
  if (t->numel_ * c->size > INT_MAX)
    return lm_error("%s: %lld elements on %d ranks is more than one call moves (2^31)", op,
                    (long long)t->numel_, c->size);
  return 0;
}

static int check_op(const char *name, int op, int dtype) {
  if (op < LM_RED_SUM || op > LM_RED_MIN)
    return lm_error("%s: expected op sum, avg, max or min, got %d", name, op);
  if (op == LM_RED_AVG && !lm_is_float(dtype))
    return lm_error("%s: avg needs a floating dtype, got %s", name, lm_dtype_name(dtype));
  if (dtype == LM_BOOL && op <= LM_RED_AVG)
    return lm_error("%s: sum/avg of bool tensors is not defined (use max or min)", name);
  return 0;
}

static int64_t prod(int ndim, const int64_t *shape, int skip1, int skip2) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++)
    if (d != skip1 && d != skip2) n *= shape[d];
  return n;
}

lm_work *lm_work_new(lm_comm *c, int kind, const lm_transport *tr, int blocking) {
  lm_work *w = calloc(1, sizeof *w);
  int n = c->size;
  if (w) {
    w->scounts = calloc(4 * (size_t)n, sizeof(int));
    w->fsizes = calloc((size_t)n, sizeof(int64_t));
  }
  if (!w || !w->scounts || !w->fsizes) {
    if (w) { free(w->scounts); free(w->fsizes); free(w); }
    lm_error("%s: out of memory", names[kind]);
    return NULL;
  }
  w->sdispls = w->scounts + n;
  w->rcounts = w->scounts + 2 * n;
  w->rdispls = w->scounts + 3 * n;
  w->comm = c;
  w->kind = kind;
  w->tr = tr;
  w->blocking = blocking;
  w->fdim = -1;
  return w;
}

static void drop_buffers(lm_work *w) {
  if (w->recv != w->send) lm_release(w->recv);
  lm_release(w->send);
  w->send = w->recv = NULL;
}

void lm_work_free(lm_work *w) {
  if (!w) return;
  if (w->started && !w->done && !w->failed) lm_work_wait(w);
  if (w->started && !w->done && !w->blocking) lm_progress_hold(-1); /* failed */
  if (w->tr) w->tr->release(w);
  lm_comm_trace_drop(w);
  drop_buffers(w);
  lm_release(w->out);
  free(w->scounts);
  free(w->fsizes);
  free(w);
}

/* Starts w, or frees it and returns NULL. Counts what was issued. */
lm_work *lm_work_launch(lm_work *w, const lm_tensor *t) {
  if (!w) return NULL;
  for (int q = 1; q < w->comm->size; q++) {
    w->sdispls[q] = w->sdispls[q - 1] + w->scounts[q - 1];
    w->rdispls[q] = w->rdispls[q - 1] + w->rcounts[q - 1];
  }
  if (lm_trace_on) lm_comm_trace_begin(w, t);
  if (w->tr->start(w) < 0) {
    w->failed = 1;
    lm_work_free(w);
    return NULL;
  }
  w->started = 1;
  if (!w->blocking) lm_progress_hold(1); /* the watchdog thread drives it while backward computes */
  stat_count[w->kind]++;
  if (t) stat_bytes[w->kind] += t->numel_ * lm_dtype_size(t->dtype_);
  return w;
}

/* A contiguous view of n elements of buf (any shape) starting at `at`. */
static lm_tensor *block_of(lm_tensor *buf, int ndim, const int64_t *shape, int64_t at) {
  int64_t st[LM_MAX_DIMS];
  lm_contiguous_strides(ndim, shape, st);
  return lm_view_of(buf, ndim, shape, st, buf->offset + at);
}

/* A view of t narrowed to [off, off + len) on dim. */
static lm_tensor *narrow(lm_tensor *t, int dim, int64_t off, int64_t len) {
  int64_t sh[LM_MAX_DIMS];
  memcpy(sh, t->shape_, sizeof sh);
  sh[dim] = len;
  return lm_view_of(t, t->ndim, sh, t->stride_, t->offset + off * t->stride_[dim]);
}

/* Copies blocks between a strided tensor cut on dim into sizes[q] rows and
 * a contiguous buffer holding the blocks one after the other. */
static int move_blocks(lm_tensor *t, lm_tensor *buf, int dim, const int64_t *sizes, int k,
                       int to_buf) {
  int64_t off = 0, at = 0;
  for (int q = 0; q < k; q++) {
    lm_tensor *part = narrow(t, dim, off, sizes[q]);
    lm_tensor *blk = part ? block_of(buf, t->ndim, part->shape_, at) : NULL;
    int rc = blk ? (to_buf ? lm_copy_(blk, part) : lm_copy_(part, blk)) : -1;
    at += part ? part->numel_ : 0;
    off += sizes[q];
    lm_release(part);
    lm_release(blk);
    if (rc < 0) return -1;
  }
  return 0;
}

/* The blocks of t (cut on dim) laid out contiguously, in dtype. */
static lm_tensor *pack(lm_tensor *t, int dim, const int64_t *sizes, int k, int dtype) {
  lm_tensor *buf = lm_empty_as(t, t->ndim, t->shape_, dtype);
  if (buf && move_blocks(t, buf, dim, sizes, k, 1) < 0) { lm_release(buf); return NULL; }
  return buf;
}

/* True when blocks cut on dim are already consecutive in a contiguous t. */
static int blocks_in_place(const lm_tensor *t, int dim) {
  return lm_is_contiguous(t) && prod(dim, t->shape_, -1, -1) == 1;
}

static int divide(lm_tensor *t, double by) {
  int64_t n = t->numel_;
  if (t->dtype_ == LM_F64) {
    double *p = lm_data(t);
    for (int64_t i = 0; i < n; i++) p[i] /= by;
  } else if (t->dtype_ == LM_F32) {
    float *p = lm_data(t);
    float f = (float)by;
    for (int64_t i = 0; i < n; i++) p[i] /= f;
  } else {
    return lm_error("avg: cannot divide a %s buffer", lm_dtype_name(t->dtype_));
  }
  return 0;
}

/* After a reduction: avg divides (unless the transport did), then the f32
 * staging buffer is cast back into the result. */
static int finish_reduce(lm_work *w) {
  if (w->op == LM_RED_AVG && w->tr == &lm_mpi_transport)
    LM_TRY(divide(w->recv, (double)w->comm->size));
  if (w->recv != w->out) LM_TRY(lm_copy_(w->out, w->recv));
  return 0;
}

static int finish_unpack(lm_work *w) {
  return move_blocks(w->out, w->recv, w->fdim, w->fsizes, w->comm->size, 0);
}

/* The buffer w receives into: out itself when its blocks cut on dim lie in
 * place, else a scratch that finish_unpack moves into out. */
static void recv_blocks(lm_work *w, int dim) {
  if (!w->out) return;
  if (blocks_in_place(w->out, dim)) {
    w->recv = w->out;
    lm_retain(w->recv);
  } else {
    w->recv = lm_empty_like(w->out);
    w->fdim = dim;
    w->finish = finish_unpack;
  }
}

/* The dtype buffers travel in: halves are reduced in f32 unless the
 * transport reduces them itself. */
static int wire_dtype(const lm_transport *tr, int dtype) {
  return (dtype == LM_BF16 || dtype == LM_F16) && !tr->halves_native ? LM_F32 : dtype;
}

static lm_work *all_reduce_w(lm_comm *c, lm_tensor *t, int op, int blocking) {
  const char *name = "all_reduce";
  if (lm_coll_check(name, c, t, 0) < 0 || check_op(name, op, t->dtype_) < 0) return NULL;
  const lm_transport *tr = lm_coll_transport(name, t);
  if (!tr || lm_check_fingerprint(c, LM_COLL_ALL_REDUCE, op, t, -1, -1, -1, 0) < 0) return NULL;
  lm_work *w = lm_work_new(c, LM_COLL_ALL_REDUCE, tr, blocking);
  if (!w) return NULL;
  w->op = op;
  w->dtype = wire_dtype(tr, t->dtype_);
  w->out = lm_empty_like(t);
  if (w->dtype == t->dtype_) {
    w->send = lm_contiguous(t);
    w->recv = w->out;
    lm_retain(w->recv);
  } else {
    w->send = lm_cast(t, w->dtype);
    w->recv = w->send;
    w->in_place = 1;
  }
  w->finish = finish_reduce;
  if (!w->out || !w->send) { lm_work_free(w); return NULL; }
  return lm_work_launch(w, t);
}

/* Sizes of each rank's block on dim: t's own size everywhere (full < 0), or
 * torch.chunk sizes of full, of which this rank must hold its own. */
static int rank_sizes(const char *name, lm_comm *c, const lm_tensor *t, int dim, int64_t full,
                      int64_t *sizes) {
  for (int q = 0; q < c->size; q++)
    sizes[q] = full < 0 ? t->shape_[dim] : lm_chunk_size(full, c->size, q);
  if (full >= 0 && sizes[c->rank] != t->shape_[dim])
    return lm_error("%s: rank %d of %d holds chunk %d of %lld rows on dim %d, which has %lld "
                    "rows (torch.chunk sizes), got %lld", name, c->rank, c->size, c->rank,
                    (long long)full, dim + 1, (long long)sizes[c->rank],
                    (long long)t->shape_[dim]);
  return 0;
}

static int is_uneven(const int *counts, int k) {
  for (int q = 1; q < k; q++)
    if (counts[q] != counts[0]) return 1;
  return 0;
}

static lm_work *all_gather_w(lm_comm *c, lm_tensor *t, int dim, int64_t full, int blocking) {
  const char *name = "all_gather";
  if (lm_coll_check(name, c, t, 1) < 0) return NULL;
  int d = lm_wrap_dim(name, "dim", dim, t->ndim);
  const lm_transport *tr = lm_coll_transport(name, t);
  if (d < 0 || !tr) return NULL;
  lm_work *w = lm_work_new(c, LM_COLL_ALL_GATHER, tr, blocking);
  if (!w) return NULL;
  if (rank_sizes(name, c, t, d, full, w->fsizes) < 0 ||
      lm_check_fingerprint(c, LM_COLL_ALL_GATHER, -1, t, d, full, full >= 0 ? d : -1, full) < 0) {
    lm_work_free(w);
    return NULL;
  }
  int64_t sh[LM_MAX_DIMS], other = prod(t->ndim, t->shape_, d, -1), total = 0;
  for (int q = 0; q < c->size; q++) {
    w->rcounts[q] = (int)(w->fsizes[q] * other);
    total += w->fsizes[q];
  }
  memcpy(sh, t->shape_, sizeof sh);
  sh[d] = total;
  w->uneven = is_uneven(w->rcounts, c->size);
  w->dtype = t->dtype_;
  w->out = lm_empty_as(t, t->ndim, sh, t->dtype_);
  w->send = lm_contiguous(t);
  recv_blocks(w, d);
  if (!w->out || !w->send || !w->recv) { lm_work_free(w); return NULL; }
  return lm_work_launch(w, t);
}

static lm_work *reduce_scatter_w(lm_comm *c, lm_tensor *t, int op, int dim, int blocking) {
  const char *name = "reduce_scatter";
  if (lm_coll_check(name, c, t, 1) < 0 || check_op(name, op, t->dtype_) < 0) return NULL;
  int d = lm_wrap_dim(name, "dim", dim, t->ndim);
  const lm_transport *tr = lm_coll_transport(name, t);
  if (d < 0 || !tr || lm_check_fingerprint(c, LM_COLL_REDUCE_SCATTER, op, t, d, -1, -1, 0) < 0)
    return NULL;
  lm_work *w = lm_work_new(c, LM_COLL_REDUCE_SCATTER, tr, blocking);
  if (!w) return NULL;
  int64_t sh[LM_MAX_DIMS], other = prod(t->ndim, t->shape_, d, -1);
  for (int q = 0; q < c->size; q++) {
    w->fsizes[q] = lm_chunk_size(t->shape_[d], c->size, q);
    w->rcounts[q] = (int)(w->fsizes[q] * other);
  }
  memcpy(sh, t->shape_, sizeof sh);
  sh[d] = w->fsizes[c->rank];
  w->op = op;
  w->uneven = is_uneven(w->rcounts, c->size);
  w->dtype = wire_dtype(tr, t->dtype_);
  w->out = lm_empty_as(t, t->ndim, sh, t->dtype_);
  if (w->dtype == t->dtype_ && blocks_in_place(t, d)) {
    w->send = t;
    lm_retain(t);
  } else {
    w->send = pack(t, d, w->fsizes, c->size, w->dtype);
  }
  if (w->out && w->dtype == t->dtype_) {
    w->recv = w->out;
    lm_retain(w->recv);
  } else if (w->out) {
    w->recv = lm_empty_as(t, t->ndim, sh, w->dtype);
  }
  w->finish = finish_reduce;
  if (!w->out || !w->send || !w->recv) { lm_work_free(w); return NULL; }
  return lm_work_launch(w, t);
}

static lm_work *all_to_all_w(lm_comm *c, lm_tensor *t, int split_dim, int cat_dim,
                             int64_t full, int blocking) {
  const char *name = "all_to_all";
  if (lm_coll_check(name, c, t, 1) < 0) return NULL;
  int sd = lm_wrap_dim(name, "split_dim", split_dim, t->ndim);
  int cd = sd < 0 ? -1 : lm_wrap_dim(name, "cat_dim", cat_dim, t->ndim);
  const lm_transport *tr = lm_coll_transport(name, t);
  if (sd < 0 || cd < 0 || !tr) return NULL;
  int k = c->size, me = c->rank;
  int64_t n = t->shape_[sd];
  if (sd == cd && (full >= 0 || n % k != 0)) {
    lm_error("all_to_all: split_dim and cat_dim are both %d, so its size must divide evenly "
             "by the %d ranks (and full must be < 0), got %lld (full %lld)", sd + 1, k,
             (long long)n, (long long)full);
    return NULL;
  }
  lm_work *w = lm_work_new(c, LM_COLL_ALL_TO_ALL, tr, blocking);
  if (!w) return NULL;
  int64_t *send_sizes = calloc((size_t)k, sizeof(int64_t));
  if (!send_sizes ||
      (sd != cd && rank_sizes(name, c, t, cd, full, w->fsizes) < 0) ||
      lm_check_fingerprint(c, LM_COLL_ALL_TO_ALL, -1, t, sd, cd, full >= 0 ? cd : -1, full) < 0) {
    free(send_sizes);
    lm_work_free(w);
    return NULL;
  }
  int64_t other = prod(t->ndim, t->shape_, sd, cd), sh[LM_MAX_DIMS];
  memcpy(sh, t->shape_, sizeof sh);
  for (int q = 0; q < k; q++) send_sizes[q] = lm_chunk_size(n, k, q);
  if (sd == cd) {
    for (int q = 0; q < k; q++) w->fsizes[q] = n / k;
    for (int q = 0; q < k; q++) w->scounts[q] = w->rcounts[q] = (int)(other * (n / k));
  } else {
    int64_t cat_total = 0;
    for (int q = 0; q < k; q++) {
      w->scounts[q] = (int)(send_sizes[q] * t->shape_[cd] * other);
      w->rcounts[q] = (int)(send_sizes[me] * w->fsizes[q] * other);
      cat_total += w->fsizes[q];
    }
    sh[sd] = send_sizes[me];
    sh[cd] = cat_total;
  }
  /* decided from sizes every rank knows alike, so all pick the same MPI call */
  w->uneven = n % k != 0 || (sd != cd && full >= 0 && full % k != 0);
  w->dtype = t->dtype_;
  w->out = lm_empty_as(t, t->ndim, sh, t->dtype_);
  w->send = blocks_in_place(t, sd) ? (lm_retain(t), t) : pack(t, sd, send_sizes, k, t->dtype_);
  recv_blocks(w, cd);
  free(send_sizes);
  if (!w->out || !w->send || !w->recv) { lm_work_free(w); return NULL; }
  return lm_work_launch(w, t);
}

static lm_work *broadcast_w(lm_comm *c, lm_tensor *t, int root, int blocking) {
  const char *name = "broadcast";
  if (lm_coll_check(name, c, t, 0) < 0) return NULL;
  if (root < 0 || root >= c->size) {
    lm_error("broadcast: expected a root rank in [0, %d), got %d", c->size, root);
    return NULL;
  }
  const lm_transport *tr = lm_coll_transport(name, t);
  if (!tr || lm_check_fingerprint(c, LM_COLL_BROADCAST, -1, t, root, -1, -1, 0) < 0) return NULL;
  lm_work *w = lm_work_new(c, LM_COLL_BROADCAST, tr, blocking);
  if (!w) return NULL;
  w->root = root;
  w->dtype = t->dtype_;
  w->out = lm_empty_like(t);
  if (w->out && c->rank == root && lm_copy_(w->out, t) < 0) { lm_work_free(w); return NULL; }
  if (!w->out) { lm_work_free(w); return NULL; }
  w->send = w->recv = w->out; /* one reference for both */
  lm_retain(w->out);
  return lm_work_launch(w, t);
}

static lm_work *barrier_w(lm_comm *c, int blocking) {
  if (lm_dist_ensure("barrier") < 0) return NULL;
  if (!c) { lm_error("barrier: comm is NULL"); return NULL; }
  if (lm_check_fingerprint(c, LM_COLL_BARRIER, -1, NULL, -1, -1, -1, 0) < 0) return NULL;
  return lm_work_launch(lm_work_new(c, LM_COLL_BARRIER, &lm_mpi_transport, blocking), NULL);
}

/* ---- completion ---- */

int lm_work_wait(lm_work *w) {
  if (!w) return lm_error("work.wait: work is NULL");
  if (w->failed) return lm_error("work.wait: this %s failed earlier", names[w->kind]);
  if (w->done) return 0;
  int64_t t0 = w->trace ? lm_trace_now() : 0;
  if (w->tr->wait(w) < 0 || (w->finish && w->finish(w) < 0)) {
    w->failed = 1;
    return -1;
  }
  w->done = 1;
  if (w->trace) w->trace->c += lm_trace_now() - t0, lm_comm_trace_end(w);
  if (!w->blocking) lm_progress_hold(-1);
  drop_buffers(w); /* free staging memory as soon as it is useless */
  return 0;
}

int lm_work_test(lm_work *w) {
  if (!w) return lm_error("work.test: work is NULL");
  if (w->done) return 1;
  if (w->failed) return lm_error("work.test: this %s failed earlier", names[w->kind]);
  int r = w->tr->test(w);
  if (r == 1) return lm_work_wait(w) < 0 ? -1 : 1;
  if (r < 0) w->failed = 1;
  return r;
}

lm_tensor *lm_work_result(lm_work *w) {
  if (lm_work_wait(w) < 0) return NULL;
  if (w->out) lm_retain(w->out);
  return w->out;
}

static lm_tensor *run(lm_work *w) {
  if (!w) return NULL;
  lm_tensor *r = lm_work_result(w);
  lm_work_free(w);
  return r;
}

/* ---- public entry points ---- */

lm_tensor *lm_all_reduce(lm_comm *c, lm_tensor *t, int op) { return run(all_reduce_w(c, t, op, 1)); }
lm_tensor *lm_all_gather(lm_comm *c, lm_tensor *t, int dim, int64_t full) {
  return run(all_gather_w(c, t, dim, full, 1));
}
lm_tensor *lm_reduce_scatter(lm_comm *c, lm_tensor *t, int op, int dim) {
  return run(reduce_scatter_w(c, t, op, dim, 1));
}
lm_tensor *lm_all_to_all(lm_comm *c, lm_tensor *t, int split_dim, int cat_dim, int64_t full) {
  return run(all_to_all_w(c, t, split_dim, cat_dim, full, 1));
}
lm_tensor *lm_broadcast(lm_comm *c, lm_tensor *t, int root) { return run(broadcast_w(c, t, root, 1)); }
int lm_barrier(lm_comm *c) {
  lm_work *w = barrier_w(c, 1);
  int rc = w ? lm_work_wait(w) : -1;
  lm_work_free(w);
  return rc;
}

lm_work *lm_all_reduce_async(lm_comm *c, lm_tensor *t, int op) { return all_reduce_w(c, t, op, 0); }
lm_work *lm_all_gather_async(lm_comm *c, lm_tensor *t, int dim, int64_t full) {
  return all_gather_w(c, t, dim, full, 0);
}
lm_work *lm_reduce_scatter_async(lm_comm *c, lm_tensor *t, int op, int dim) {
  return reduce_scatter_w(c, t, op, dim, 0);
}
lm_work *lm_all_to_all_async(lm_comm *c, lm_tensor *t, int split_dim, int cat_dim, int64_t full) {
  return all_to_all_w(c, t, split_dim, cat_dim, full, 0);
}
lm_work *lm_broadcast_async(lm_comm *c, lm_tensor *t, int root) { return broadcast_w(c, t, root, 0); }
lm_work *lm_barrier_async(lm_comm *c) { return barrier_w(c, 0); }
