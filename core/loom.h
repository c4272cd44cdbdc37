/* loom.h: the one public C API of libloom (tensors, ops, RNG, runtime).
 * LuaJIT reads this file with ffi.cdef after dropping lines that start with
 * '#', so declarations use no macros, no varargs, and plain types only. */
#ifndef LOOM_H
#define LOOM_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* Element types. Values are stable: the Lua layer and files store them. */
enum lm_dtype { LM_F32 = 0, LM_F64 = 1, LM_BF16 = 2, LM_F16 = 3,
                LM_I32 = 4, LM_I64 = 5, LM_BOOL = 6, LM_NDTYPES = 7 };

/* Limits, as enum constants so that Lua reads them too (C.LM_MAX_DIMS):
 * dims of a tensor, dims of a device mesh, tensors one op call takes, and
 * the sizes of lm_attrs. */
enum lm_limit { LM_MAX_DIMS = 8, LM_MAX_MESH = 4, LM_MAX_INPUTS = 256, LM_MAX_ATTR_INTS = 24,
                LM_MAX_ATTR_REALS = 8, LM_MAX_ATTR_HANDLES = 2 };

/* Devices are small integers: 0 is the CPU, 1 + k is cuda:k; meta tensors
 * have shapes and dtypes but no data (ops on them only infer shapes). */
enum lm_device { LM_CPU = 0, LM_CUDA0 = 1, LM_META = 127 };

typedef struct lm_storage lm_storage; /* refcounted buffer, private */
typedef struct lm_node lm_node;       /* autograd node, private */

/* A tensor is a strided view of a storage. Fields are read-only outside the
 * core; sizes and strides are in elements, dims 0-based (Lua adds 1). */
typedef struct lm_tensor {
  int32_t refcount;
  int8_t ndim;
  int8_t dtype_;         /* enum lm_dtype */
  int8_t device_;        /* enum lm_device */
  uint8_t needs_grad;
  uint8_t output_nr;     /* which output of grad_fn this tensor is */
  uint8_t retains_grad;  /* a non-leaf that keeps .grad (retain_grad) */
  uint8_t freed;         /* released early by lm_tensor_free: any use is an error */
  int64_t shape_[LM_MAX_DIMS];
  int64_t stride_[LM_MAX_DIMS];
  int64_t offset;        /* first element, in elements of the storage */
  int64_t numel_;
  lm_storage *storage;
  struct lm_tensor *grad_; /* accumulated gradient of a leaf, or NULL (x.grad in Lua) */
  lm_node *grad_fn_;      /* node that produced it, or NULL for leaves */
  void *dist;             /* DTensor spec, NULL for a plain tensor */
} lm_tensor;

/* Arguments of an op besides its tensors: integers, reals, and handles
 * (a communicator, a generator), each handle tagged with its kind so an op
 * can check it got what it expects. ni, nf, nh count the used entries. */
enum lm_handle_kind { LM_HANDLE_NONE = 0, LM_HANDLE_COMM = 1 };
typedef struct lm_attrs {
  int64_t i[LM_MAX_ATTR_INTS];
  double f[LM_MAX_ATTR_REALS];
  void *h[LM_MAX_ATTR_HANDLES];
  int32_t hk[LM_MAX_ATTR_HANDLES];   /* enum lm_handle_kind of h[k] */
  int32_t ni, nf, nh;
} lm_attrs;

/* Op ids: one per line of op_list.h, the single list of ops (Lua reads
 * them as C.LM_OP_<ID>). */
enum lm_op_id {
#define LM_OP(ID, ...) LM_OP_##ID,
#include "op_list.h"
#undef LM_OP
  LM_NOPS
};

/* Errors: a failing call returns NULL or -1 and leaves a message here. */
const char *lm_last_error(void);
void lm_clear_error(void);

/* dtypes and devices by name ("f32", "cpu", "cuda:1", "meta"; "cuda" is
 * the current CUDA device); -1 when unknown */
int lm_dtype_from_name(const char *name);
const char *lm_dtype_name(int dtype);
int lm_dtype_size(int dtype);
int lm_device_from_name(const char *name);
int lm_device_name(int device, char *buf, int len);
/* 1 when the device exists; makes no device current (no CUDA context) */
int lm_device_available(int device);
/* the CUDA devices this process sees (cudaGetDeviceCount: no context on
 * any of them); 0, with the reason as the error, when there are none */
int lm_cuda_device_count(void);
/* the CUDA device "cuda" names from now on (cuda:k); -1 when out of range */
int lm_set_cuda_device(int k);
/* what this build and its backends are: build options, BLAS and its core,
 * CUDA, cuBLAS and NCCL versions, devices (lines of text) */
const char *lm_build_info(void);

/* Lifetime: every returned tensor holds one reference for the caller. */
lm_tensor *lm_empty(int ndim, const int64_t *shape, int dtype, int device);
lm_tensor *lm_arange(double start, double end, double step, int dtype, int device);
void lm_retain(lm_tensor *t);
void lm_release(lm_tensor *t);
/* Releases t's memory now (a view's storage when it is the last user) and
 * marks t freed; the struct itself goes with the last lm_release. */
int lm_tensor_free(lm_tensor *t);
/* The version of t's storage: every in-place write (fill, copy, random,
 * in-place ops) increments it; autograd checks what it saved. */
int64_t lm_tensor_version(const lm_tensor *t);
void *lm_data(const lm_tensor *t);   /* address of the first element (CPU) */
int lm_is_contiguous(const lm_tensor *t);
int lm_fill_(lm_tensor *t, double value);
int lm_copy_(lm_tensor *dst, const lm_tensor *src); /* same shape, any dtypes */
int64_t lm_allocated_bytes(void);    /* bytes held by live storages */
/* autocast's casts of weights that took the bf16/f16 copy AdamW kept of
 * them, in this process (a weight's copy is written in AdamW's pass and
 * kept until the weight changes; docs/devices.md) */
int64_t lm_low_copy_hits(void);
int64_t lm_storage_count(void);      /* live storages, for leak checks */

/* Ops: called by id (enum lm_op_id); names are for messages and tools. */
int lm_op_find(const char *name);    /* id, or -1 when unknown */
int lm_op_count(void);
const char *lm_op_name(int op);
/* What the table says of an op; -1 for an unknown id. */
typedef struct lm_op_info {
  const char *name;
  int32_t nin, nout;     /* nin -1: any number of tensors */
  int32_t differentiable, sharded, inplace;
} lm_op_info;
int lm_op_info_of(int op, lm_op_info *info);
/* 1 when the backend of device's kind was built with the kernel op runs on
 * (ops built from other ops count as present; the device itself need not
 * be present), 0 when not or when this build has no such backend. */
int lm_op_has_kernel(int op, int device);
int lm_op_call(int op, int nin, lm_tensor *const *in, const lm_attrs *attrs,
               int maxout, lm_tensor **out); /* number of outputs or -1 */
/* Mixed precision on this thread (PyTorch's autocast): GEMMs (matmul,
 * attention) run on bf16/f16 casts of f32 inputs, softmax, norms and losses
 * on f32 casts of low-precision ones; the casts are recorded, so gradients
 * reach f32 parameters in f32. dtype LM_BF16 or LM_F16, -1 for off;
 * returns the previous setting. */
int lm_set_autocast(int dtype);
/* the autocast dtype of this thread, -1 when off */
int lm_autocast_dtype(void);

/* Op profiling: time per op, exclusive of the ops it calls (LOOM_PROFILE=1
 * turns it on and prints a table at exit). */
void lm_profile_enable(int on);
void lm_profile_reset(void);
double lm_profile_seconds(int op);
int64_t lm_profile_calls(int op);

/* ---- tracing (core/tensor/trace.c; loom.profiler, LOOM_PROFILE=trace:FILE) ----
 * While on, the op door records each op call, autograd each backward node,
 * core/comm each collective, and loom.profiler the collections its pacing
 * runs and the step marks, into a buffer that loom.profiler drains and
 * writes as Chrome trace JSON. Off, nothing is recorded (each op tests one
 * flag). Times are CLOCK_MONOTONIC nanoseconds, one clock for every process
 * of a node. */
enum lm_trace_kind { LM_TRACE_OP = 0, LM_TRACE_BACKWARD = 1, LM_TRACE_COLL = 2, LM_TRACE_GC = 3,
                     LM_TRACE_STEP = 4 };
/* inputs described per op; lanes from LM_TRACE_TID_ASYNC on hold the
 * async collectives in flight (one lane each) */
enum lm_trace_limit { LM_TRACE_INPUTS = 4, LM_TRACE_TID_ASYNC = 1000 };
enum lm_trace_flag { LM_TRACE_DTENSOR = 1, LM_TRACE_FAILED = 2 };
typedef struct lm_trace_event {
  int64_t t0, t1;     /* start and end (a step mark: t0 == t1) */
  int64_t bytes;      /* op: fresh bytes the allocator mapped during it; collective: the
                         local input's bytes; gc: bytes it freed */
  int64_t a, b, c;    /* op: allocated and reserved bytes at its end, fresh mappings during it;
                         collective: its group's key, the call's number on the group, ns the
                         caller waited for it; gc: live bytes before, fresh bytes since the last */
  int64_t shape[LM_TRACE_INPUTS][LM_MAX_DIMS]; /* op: its first inputs' shapes; collective:
                         row 0 its input's shape, the rows after the world ranks of its group */
  int32_t kind, id;   /* enum lm_trace_kind; the op id, enum lm_coll_kind, or step number */
  int32_t tid;        /* the thread's lane: 1 the first thread that recorded */
  int32_t device;     /* op: its first input's device (-1: none) */
  int32_t n;          /* op: its inputs; collective: the ranks of its group */
  int32_t rank;       /* collective: this rank in its group */
  int32_t flags;      /* enum lm_trace_flag */
  int8_t ndim[LM_TRACE_INPUTS], dtype[LM_TRACE_INPUTS];
} lm_trace_event;
int lm_trace_enable(int on);                    /* returns the old setting */
int lm_trace_enabled(void);
int64_t lm_trace_now(void);                     /* the trace's clock */
int lm_trace_record(const lm_trace_event *e);   /* an event made outside the core (tid set here); kept only while on */
int64_t lm_trace_pending(void);                 /* events in the buffer */
int64_t lm_trace_drain(lm_trace_event *out, int64_t cap);  /* moves the oldest (at most cap) out */
int64_t lm_trace_dropped(void);   /* events lost to the buffer's cap (LOOM_TRACE_MAX_EVENTS) */
void lm_trace_clear(void);        /* empties the buffer and the dropped count */

/* Counter-based RNG (Philox4x32-10). Element i of a random tensor draws
 * counter offset + g(i), where g is its linear index in the global tensor
 * (global_shape/local_start describe the shard; NULL: t is the whole). */
enum lm_random_kind { LM_UNIFORM = 0, LM_NORMAL = 1, LM_RANDINT = 2 };
void lm_manual_seed(uint64_t seed);
void lm_rng_get_state(uint64_t *seed, uint64_t *offset);
void lm_rng_set_state(uint64_t seed, uint64_t offset);
int lm_random_(lm_tensor *t, int kind, double a, double b,
               const int64_t *global_shape, const int64_t *local_start);
void lm_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Autograd: a tape of nodes recorded by ops while grad mode is on. */
int lm_set_requires_grad(lm_tensor *t, int flag);  /* leaves only */
int lm_is_grad_enabled(void);
int lm_set_grad_enabled(int flag);                 /* returns the old mode */
int lm_backward(lm_tensor *root, lm_tensor *grad); /* grad NULL: ones (scalar) */
lm_tensor *lm_grad(lm_tensor *t);                  /* new ref or NULL */
int lm_set_grad(lm_tensor *t, lm_tensor *grad);    /* grad may be NULL */
int lm_retain_grad(lm_tensor *t);
lm_tensor *lm_detach(lm_tensor *t);                /* alias without history */
/* Called once per leaf whose gradient is complete during lm_backward. */
typedef void (*lm_grad_ready_fn)(lm_tensor *leaf);
void lm_set_grad_ready_callback(lm_grad_ready_fn fn);
/* Pre-backward hooks: t (an op's output) marked with lm_set_pre_backward
 * makes backward call the callback with t's node and output number just
 * before that node's backward runs (FSDP re-gathers parameters there). */
typedef void (*lm_pre_backward_fn)(lm_node *node, int output_nr);
void lm_set_pre_backward_callback(lm_pre_backward_fn fn);
int lm_set_pre_backward(lm_tensor *t, int on);
/* A tensor's data released and restored, its version kept (FSDP frees a
 * gathered parameter after forward and re-gathers it before backward):
 * release frees the storage's buffer (ops on it fail until restored);
 * restore allocates it again and copies src in. */
int lm_release_data(lm_tensor *t);
int lm_restore_data(lm_tensor *t, const lm_tensor *src);

/* 64-bit FNV-1a of n bytes, continuing from h (start with 0): the
 * checksum of loom's checkpoint files. */
uint64_t lm_fnv1a(const void *p, size_t n, uint64_t h);

/* ---- hostile files (core/tensor/st_header.c): a safetensors header parsed
 * with bounded work and every rule of the format checked ---- */
typedef struct lm_st_entry {
  int64_t name, name_len;   /* the name: name_len bytes at strings + name */
  int64_t shape;            /* its dims: shapes[shape .. shape + ndim) */
  int64_t begin, end;       /* data_offsets */
  int32_t ndim, dtype;      /* dtype: an index for lm_st_dtype_name */
} lm_st_entry;
typedef struct lm_st_header {
  lm_st_entry *entries;     /* sorted by name */
  int64_t n;
  int64_t *meta;            /* __metadata__: key, key_len, value, value_len per pair (in strings) */
  int64_t nmeta;
  int64_t *shapes;
  char *strings;            /* every string, NUL-terminated */
  int32_t has_meta;
} lm_st_header;
/* parses len bytes of header JSON for data_len bytes of data; NULL and an
 * error naming the rule broken */
lm_st_header *lm_st_header_parse(const char *json, int64_t len, int64_t data_len);
void lm_st_header_free(lm_st_header *h);
const char *lm_st_dtype_name(int dtype);   /* NULL past the last */
int lm_st_dtype_size(int dtype);
/* the deepest nesting of [ and { in JSON text, counted up to limit + 1 */
int lm_json_depth(const char *s, int64_t len, int limit);

/* Runtime: worker threads for loom's kernels and OpenBLAS alike. */
int lm_num_threads(void);
void lm_set_num_threads(int n);

/* f32 matmuls: "highest" keeps f32 products, "high" lets GPUs use TF32
 * (PyTorch's torch.set_float32_matmul_precision). */
enum lm_precision { LM_PRECISION_HIGHEST = 0, LM_PRECISION_HIGH = 1 };
int lm_set_float32_matmul_precision(int precision);   /* -1 when unknown */
int lm_float32_matmul_precision(void);

/* A device allocator's counters, in bytes (calls for DRIVER_ALLOCS): the
 * memory held by live tensors, its peak, what the allocator keeps reserved,
 * how many allocations it asked the driver (the OS) for and their bytes in
 * all (fresh memory: a count that only grows). */
enum lm_memory_stat { LM_MEM_ALLOCATED = 0, LM_MEM_PEAK = 1, LM_MEM_RESERVED = 2,
                      LM_MEM_DRIVER_ALLOCS = 3, LM_MEM_DRIVER_BYTES = 4, LM_NMEM_STATS = 5 };
/* fills stats[LM_NMEM_STATS]; -1 when the device keeps none */
int lm_device_memory_stats(int device, int64_t *stats);
/* hands the device allocator's cached blocks back (the CPU's to the OS) */
int lm_device_empty_cache(int device);

/* ---- distributed (core/comm/) ---- */
/* Ranks are 0-based. The first distributed call initialises MPI (a world of
 * one without a launcher); MPI is finalised at exit. */
typedef struct lm_comm lm_comm;   /* a communicator: the world or a split of it */
typedef struct lm_work lm_work;   /* a collective in flight */
enum lm_reduce_op { LM_RED_SUM = 0, LM_RED_AVG = 1, LM_RED_MAX = 2, LM_RED_MIN = 3 };
enum lm_coll_kind { LM_COLL_ALL_REDUCE = 0, LM_COLL_ALL_GATHER = 1,
                    LM_COLL_REDUCE_SCATTER = 2, LM_COLL_ALL_TO_ALL = 3,
                    LM_COLL_BROADCAST = 4, LM_COLL_BARRIER = 5,
                    LM_COLL_SEND = 6, LM_COLL_RECV = 7, LM_NCOLL = 8 };
int lm_dist_init(void);               /* idempotent */
int lm_dist_is_initialized(void);
int lm_dist_rank(void);
int lm_dist_world_size(void);
int lm_dist_local_size(void);         /* ranks on this node */
int lm_dist_local_rank(void);         /* this rank's index among them */
int lm_dist_finalize(void);           /* also run at exit */
void lm_abort(int code);              /* MPI_Abort of the whole job */
void lm_dist_set_debug(int on);       /* LOOM_DEBUG_COLLECTIVES=1 at start */
int lm_dist_debug(void);
/* torch.chunk sizes: chunk i of n split in k is min(ceil(n/k), n - i*ceil(n/k)), >= 0 */
int64_t lm_chunk_size(int64_t n, int k, int i);
int64_t lm_chunk_offset(int64_t n, int k, int i);

/* Communicators. Both makers are collective over the parent (or the world). */
lm_comm *lm_comm_world(void);
lm_comm *lm_comm_split(lm_comm *parent, int color, int key);
lm_comm *lm_comm_from_ranks(int n, const int32_t *world_ranks); /* members only */
void lm_comm_free(lm_comm *c);        /* the world comm is not freed */
int lm_comm_rank(const lm_comm *c);
int lm_comm_size(const lm_comm *c);
int lm_comm_world_rank(const lm_comm *c, int rank);
/* ids (1-based) in [1, n] or equal to skip when skip_ok, else an error
 * "op: argument #2 (arg) holds class ..."; on a GPU checked there, raised at
 * the next wait for the device (loss_parallel's check) */
int lm_check_ids_in(const char *op, const char *arg, lm_tensor *ids, int64_t n, int skip_ok,
                    int64_t skip);
/* collective: makes c's NCCL communicator on CUDA device `device` now
 * (init_device_mesh does, for each of its groups in order, so none is made
 * lazily inside an interleaved collective); a failure on any rank raises
 * on every rank. 0 without NCCL in the build. */
int lm_comm_nccl_init(lm_comm *c, int device);

/* Collectives return new contiguous tensors; inputs are only read. Dims are
 * 0-based (negative from the end). full < 0: every rank holds the same size
 * on that dim; full >= 0: rank i holds lm_chunk_size(full, size, i) rows. */
lm_tensor *lm_all_reduce(lm_comm *c, lm_tensor *t, int op);
lm_tensor *lm_all_gather(lm_comm *c, lm_tensor *t, int dim, int64_t full);
lm_tensor *lm_reduce_scatter(lm_comm *c, lm_tensor *t, int op, int dim);
lm_tensor *lm_all_to_all(lm_comm *c, lm_tensor *t, int split_dim, int cat_dim, int64_t full);
lm_tensor *lm_broadcast(lm_comm *c, lm_tensor *t, int root);
int lm_barrier(lm_comm *c);
/* Async forms: wait, then take the result (a new reference; NULL for a barrier). */
lm_work *lm_all_reduce_async(lm_comm *c, lm_tensor *t, int op);
lm_work *lm_all_gather_async(lm_comm *c, lm_tensor *t, int dim, int64_t full);
lm_work *lm_reduce_scatter_async(lm_comm *c, lm_tensor *t, int op, int dim);
lm_work *lm_all_to_all_async(lm_comm *c, lm_tensor *t, int split_dim, int cat_dim, int64_t full);
lm_work *lm_broadcast_async(lm_comm *c, lm_tensor *t, int root);
lm_work *lm_barrier_async(lm_comm *c);
int lm_work_wait(lm_work *w);
int lm_work_test(lm_work *w);         /* 1 done, 0 pending, -1 error */
lm_tensor *lm_work_result(lm_work *w);
void lm_work_free(lm_work *w);        /* waits first if still pending */

/* Point-to-point (core/comm/p2p.c), for pipeline stages and ring attention.
 * Peers are ranks of c (0-based); tag in [0, 32767] tells apart messages
 * between one pair. A header (dtype and shape) travels first, so recv
 * fails naming both shapes when the sender's tensor is not out's shape.
 * One receive at a time per (c, peer, tag): a second is refused while the
 * first is in flight (it could take the first one's header).
 * recv writes into out (contiguous, CPU) and returns 0 or -1. The async
 * forms: lm_work_result gives out back (a new reference) for a recv;
 * lm_irecv with out NULL makes out from the sender's header. */
int lm_send(lm_comm *c, lm_tensor *t, int dst, int tag);
int lm_recv(lm_comm *c, lm_tensor *out, int src, int tag);
lm_work *lm_isend(lm_comm *c, lm_tensor *t, int dst, int tag);
lm_work *lm_irecv(lm_comm *c, lm_tensor *out, int src, int tag);

/* Collectives issued so far, by enum lm_coll_kind: counts and bytes of the
 * local input tensors (arrays of LM_NCOLL). */
void lm_comm_stats(int64_t *counts, int64_t *bytes);

/* ---- DTensor (core/dtensor.c) ---- */
/* A DTensor is a tensor whose storage and shape are this rank's shard and
 * whose `dist` field holds a spec: a mesh, one placement per mesh dim and
 * the global shape. Ops on DTensors first redistribute their inputs as the
 * op's sharding rule asks, then run on the shards; autograd records the
 * shard-local computation and the collectives (each differentiable). */
typedef struct lm_mesh lm_mesh;
enum lm_placement_kind { LM_REPLICATE = 0, LM_SHARD = 1, LM_PARTIAL = 2 };
typedef struct lm_placement {
  int32_t kind;  /* enum lm_placement_kind */
  int32_t dim;   /* the tensor dim of a shard (0-based) */
  int32_t op;    /* the reduce op of a partial (enum lm_reduce_op) */
} lm_placement;

/* A mesh: its shape, this rank's coordinate and one communicator per dim
 * (made by the Lua DeviceMesh; the comms must outlive the mesh). */
lm_mesh *lm_mesh_new(int ndim, const int64_t *shape, const int64_t *coord,
                     lm_comm *const *comms, int device);
void lm_mesh_release(lm_mesh *m);

/* Shape and global offset of the shard held at coordinate coord (NULL: this
 * rank's) for a global shape and placements; torch.chunk sizes. */
int lm_shard_layout(const lm_mesh *m, int nd, const int64_t *global_shape,
                    const lm_placement *pl, const int64_t *coord, int64_t *local_shape,
                    int64_t *offset);
/* from_local: a DTensor viewing `local` (global_shape NULL: computed for
 * even shards as local size times the mesh size). run_check compares the
 * shapes across ranks. Differentiable (the gradient passes through). */
lm_tensor *lm_dtensor_from_local(lm_tensor *local, lm_mesh *m, const lm_placement *pl,
                                 const int64_t *global_shape, int run_check);
/* to_local: the shard as a plain tensor (differentiable). */
lm_tensor *lm_dtensor_to_local(lm_tensor *d);
/* redistribute to new placements, with the conjugate collectives in backward. */
lm_tensor *lm_dtensor_redistribute(lm_tensor *d, const lm_placement *pl);
/* the spec: returns the mesh's ndim (0 for a plain tensor) and fills pl
 * (mesh ndim entries), global_shape and *mesh when not NULL */
int lm_dtensor_spec(const lm_tensor *d, lm_placement *pl, int64_t *global_shape, lm_mesh **mesh);
/* plain 0-dim tensors always mix with DTensors; other plain tensors only
 * while implicit replication is on (returns the old setting) */
int lm_set_implicit_replication(int on);
/* the sharding-decision cache of this thread: hits and misses so far; clear */
void lm_dtensor_rule_stats(int64_t *hits, int64_t *misses);
void lm_dtensor_rule_cache_clear(void);

/* ---- CPU backend (kernels/cpu/gemm.c) ---- */
/* the BLAS loom calls, its build and the kernel core it runs, and its
 * threads, e.g. "OpenBLAS 0.3.21 ... DYNAMIC_ARCH ...; core Zen, 2 threads" */
const char *lm_blas_info(void);
/* bf16 GEMMs: 1 lets them run through oneDNN's bf16 kernels where the CPU
 * has bf16 dot products, 0 forces the plain path (widened to f32, sgemm)
 * everywhere, -1 only asks; returns the setting before (LOOM_BF16_GEMM=plain
 * starts it at 0). lm_cpu_bf16_gemm_runs: the GEMMs (one a batch entry or
 * a batch) the fast path has run in this process. */
int lm_cpu_set_bf16_gemm(int on);
int64_t lm_cpu_bf16_gemm_runs(void);
/* attention calls (forward or backward) whose tile products ran on bf16
 * dot products (kernels/cpu/fused_attn.c: bf16 operands, a build for
 * AVX512_BF16, the switch above on) */
int64_t lm_cpu_bf16_attention_runs(void);

/* ---- text: byte-pair encoding (core/text/bpe.c, loom.tokenizer) ----
 * Ids are tokenizer.json's, 0-based; the Lua layer adds one. Tokens are
 * raw bytes; a merge joins the pair (left, right) into merged at its rank
 * (lower merges first). */
enum lm_bpe_limit { LM_BPE_MAX_VOCAB = 1 << 24, LM_BPE_MAX_TOKEN_BYTES = 1 << 16,
                    LM_BPE_MAX_PIECE_BYTES = 1 << 24 };   /* a piece's scratch: 52 bytes a byte */
typedef struct lm_bpe lm_bpe;
lm_bpe *lm_bpe_new(int32_t n_vocab);
void lm_bpe_free(lm_bpe *b);
int lm_bpe_add_token(lm_bpe *b, const char *bytes, size_t len, int32_t id);
int lm_bpe_add_merge(lm_bpe *b, int32_t left, int32_t right, int32_t merged, int32_t rank);
/* byte_level: the first symbols are bytes, else UTF-8 characters, an unknown
 * one as its bytes' ids in byte_ids[256] (byte fallback; -1: none), else
 * unk_id (-1: none, an error); ignore_merges: a piece in the vocabulary is
 * one token (Llama 3) */
int lm_bpe_set_options(lm_bpe *b, int32_t byte_level, int32_t ignore_merges, int32_t unk_id, const int32_t *byte_ids);
/* fuse_unk: consecutive unknown characters make one unk */
int lm_bpe_set_fuse_unk(lm_bpe *b, int32_t fuse_unk);
/* one pre-tokenized piece, text[start, stop), into out[cap] (cap >= stop -
 * start suffices): the count, -1 on error. (The whole text and offsets, so
 * that a Lua string passes as it is and stays alive during the call.) */
int64_t lm_bpe_encode(const lm_bpe *b, const char *text, size_t start, size_t stop, int32_t *out, int64_t cap);

/* ---- the emulated CUDA device (LOOM_CUDA=EMULATE, kernels/emu/) ---- */
/* Defined only in an emulated build. What its runtime counted since the
 * last reset, into out[0..n) (names: lm_cuda_emu_counter_name(i), NULL past
 * the last); returns how many counters there are. */
int lm_cuda_emu_counters(int64_t *out, int n, int reset);
const char *lm_cuda_emu_counter_name(int i);

/* ---- Ctrl-C for interactive sessions (the REPL, core/tensor/interrupt.c) ----
 * install: SIGINT and SIGUSR1 set a flag instead of ending the process.
 * arm(mode) while a chunk runs: LOCAL, the next op call (and check) fails
 * with "interrupted"; SPMD, the ranks stop together at a collective (its
 * fingerprint carries the flag), or each on its own after a grace second
 * without one. Not armed (OFF), the flag waits for take (a line editor). */
enum lm_interrupt_mode { LM_INTERRUPT_OFF = 0, LM_INTERRUPT_LOCAL = 1, LM_INTERRUPT_SPMD = 2 };
int lm_interrupt_install(void);
void lm_interrupt_arm(int mode);
int lm_interrupt_pending(void);
void lm_interrupt_clear(void);
int lm_interrupt_take(void);   /* 1 and cleared when one was pending, armed or not */
int lm_interrupt_check(void);  /* 1 and cleared when the running code should stop now */
int lm_interrupt_vote(void);   /* SPMD: what the next collective's fingerprint says */
void lm_interrupt_voted(void); /* a collective's vote said stop */

#ifdef __cplusplus
}
#endif
#endif
