/* comm.h: the transport layer (core/comm/): communicators, the work of a
 * collective in flight, and the transports that move its bytes (MPI for
 * CPU tensors, NCCL for CUDA tensors). It sees only the tensor layer; the
 * ops above it (ops/collective.c) make collectives differentiable. */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H
#include "../tensor/tensor.h"
#include <mpi.h>

#define LM_COMM_MAGIC 0x6c6f6f6d636f6d6dULL /* "loomcomm": a live lm_comm */
struct lm_comm {
  uint64_t magic;
  MPI_Comm mpi;
  int rank, size;
  int *world_ranks;     /* world rank of each member, for messages */
  int64_t calls;        /* collectives issued on it (call numbers in checks, the watchdog) */
  uint64_t key;         /* the same on every member (watchdog.c) */
  int owned;            /* freed with MPI_Comm_free by lm_comm_free */
  void *nccl;           /* ncclComm_t: init_device_mesh makes it (lm_comm_nccl_init) */
  void (*nccl_free)(lm_comm *c); /* destroys nccl (set by the transport that made it) */
};

/* One collective in flight. collectives.c fills the buffers and counts;
 * a transport moves the bytes; collectives.c finishes (avg, casts, unpack). */
struct lm_work {
  lm_comm *comm;
  const struct lm_transport *tr;
  int blocking;         /* a synchronous call: the transport may block */
  int kind;             /* enum lm_coll_kind */
  int op;               /* enum lm_reduce_op, for reductions */
  int dtype;            /* dtype of send/recv buffers */
  int root;             /* broadcast */
  lm_tensor *send;      /* contiguous send buffer (may alias recv) */
  lm_tensor *recv;      /* contiguous receive buffer */
  lm_tensor *out;       /* the result handed to the caller */
  int *scounts, *sdispls, *rcounts, *rdispls; /* per rank, in elements */
  int uneven;           /* use the v-variants */
  int in_place;         /* send == recv */
  int started, done, failed;
  MPI_Request req;      /* the MPI transport's request */
  void *event;          /* the NCCL transport's cuda event */
  void *p2p;            /* p2p.c's state (peer, tag, requests, header) */
  /* after the transport completes: recv -> out */
  int (*finish)(lm_work *w);
  int fdim;             /* dim the blocks are concatenated on, for unpack */
  int64_t *fsizes;      /* block size of each rank along fdim */
  lm_trace_event *trace; /* its record while tracing (comm_trace.c), else NULL */
};

typedef struct lm_transport {
  const char *name;
  int halves_native;    /* reduces bf16/f16 itself (else staged in f32) */
  int (*start)(lm_work *w);
  int (*wait)(lm_work *w);
  int (*test)(lm_work *w);   /* 1 when complete, 0 pending, -1 error */
  void (*release)(lm_work *w);
} lm_transport;

extern const lm_transport lm_mpi_transport;
#ifdef LOOM_HAVE_NCCL
extern const lm_transport lm_nccl_transport;
#endif

/* communicator.c helpers for the rest of core/comm/ */
int lm_mpi_fail(const char *what, int code); /* -1 with MPI's message for code */
int lm_dist_ensure(const char *who);  /* lm_dist_init, error naming who */
int lm_comm_allgather_i64(lm_comm *c, const int64_t *mine, int n, int64_t *all, const char *what);
int lm_comm_bcast_bytes(lm_comm *c, void *buf, int n, int root);
/* collective: 0 on every member when ok was true on each, else -1 on
 * every member, naming the lowest failing rank (nccl.c's setup) */
int lm_comm_agree(lm_comm *c, int ok, const char *what);
int lm_debug_collectives(void);

/* collectives.c, shared with p2p.c: a work of `kind`, and its start
 * (counted in lm_comm_stats; frees w and returns NULL when it fails) */
lm_work *lm_work_new(lm_comm *c, int kind, const lm_transport *tr, int blocking);
lm_work *lm_work_launch(lm_work *w, const lm_tensor *t);
/* ... the checks of every collective taking a tensor (op names it in
 * errors), and the transport that moves t (MPI for CPU tensors, NCCL) */
int lm_coll_check(const char *op, lm_comm *c, const lm_tensor *t, int min_ndim);
const lm_transport *lm_coll_transport(const char *op, const lm_tensor *t);

/* all_to_all_v.c: all-to-all with uneven splits (PyTorch's
 * all_to_all_single): rows (dim 0) of t go in_splits[q] at a time to rank
 * q; the result holds out_splits[q] rows from each rank q, in rank order
 * (both arrays c->size long, host memory) */
lm_tensor *lm_all_to_all_v(lm_comm *c, lm_tensor *t, const int64_t *out_splits,
                           const int64_t *in_splits);

/* comm_trace.c: a work's trace record, begun at launch (t: its input, or
 * NULL), ended once its wait returns, dropped with a work that failed */
void lm_comm_trace_begin(lm_work *w, const lm_tensor *t);
void lm_comm_trace_end(lm_work *w);
void lm_comm_trace_drop(lm_work *w);

/* watchdog.c: ends the job when ranks can no longer meet; waits that sleep */
int lm_watch_start(int rank, int size, int thread_level);
void lm_watch_finish(void);  /* announces this rank's end, waits for all */
uint64_t lm_watch_key(const int *world_ranks, int size);
void lm_watch_comm(const lm_comm *c, int alive); /* a comm made (1) or freed (0) */
int lm_watch_check(const lm_comm *c, const char *what); /* -1 when a member finished */
int lm_watch_finished(int world_rank); /* 1 once that rank has finished its script */
/* async collectives in flight (+1 started, -1 done): while some are, the
 * watchdog thread calls into MPI often, so they progress during compute */
void lm_progress_hold(int delta);
/* waits for a call on c, polling test(arg) (1 done, 0 pending, -1 error)
 * with growing naps, where the watchdog can see it */
int lm_watch_wait(const lm_comm *c, const char *what, int (*test)(void *), void *arg);

/* fingerprint.c: fingerprints exchanged before each collective (on by default) */
int lm_check_fingerprint(lm_comm *c, int kind, int op, const lm_tensor *t,
                         int64_t a1, int64_t a2, int64_t wild_dim, int64_t wild_size);
#endif
