/* nccl.cpp: the NCCL calls loom makes, over MPI. A communicator is an MPI
 * communicator of its ranks, made from the unique id (which names the world
 * rank that made it) by MPI_Comm_create_group, collective over its members
 * only, as ncclCommInitRank is. Buffers must be device memory of the
 * communicator's device.
 *
 * A call is asynchronous, as on a GPU: queued on its stream, it is posted
 * (its send buffer staged once the stream's earlier work has run, then
 * MPI's nonblocking call) when issued, and completes at its place in the
 * stream, once its peers' data has come: only then is the receive buffer
 * written, so an event recorded after it is not ready before (a query
 * answers cudaErrorNotReady). Calls between ncclGroupStart and ncclGroupEnd
 * are posted together at ncclGroupEnd (sends and receives first), which
 * returns the first error. Reductions gather every rank's buffer and
 * reduce in rank order, so every rank gets the same bits; bf16/f16 reduce
 * in f32 and round once, f64 in f64. */
#include "runtime.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mpi.h>
#include <nccl.h>
#include <string.h>
#include <functional>
#include <memory>
#include <vector>

struct ncclComm {
  MPI_Comm mpi;
  int rank, size, device;
};

namespace {
const char MAGIC[8] = "loomemu";
int made;                       /* unique ids this process made */
thread_local int group_depth;

/* NCCL's element types, X(type, C type), and type_size, load, store */
#define NCCL_TYPES(X)                                                                                   \
  X(ncclInt8, int8_t) X(ncclUint8, uint8_t) X(ncclInt32, int32_t) X(ncclUint32, uint32_t)              \
  X(ncclInt64, int64_t) X(ncclUint64, uint64_t) X(ncclFloat16, __half) X(ncclBfloat16, __nv_bfloat16) \
  X(ncclFloat32, float) X(ncclFloat64, double)
LM_RT_ELEMENT_FUNCTIONS(NCCL_TYPES, ncclDataType_t)
/* element i of the reduction over the size buffers in all (rank-major) */
double reduce_one(const char *all, size_t stride, int size, size_t i, ncclDataType_t t, ncclRedOp_t op) {
  size_t es = type_size(t);
  bool f32 = t == ncclFloat32 || t == ncclFloat16 || t == ncclBfloat16;
  double acc = load(all + i * es, t);
  float accf = (float)acc;
  for (int r = 1; r < size; r++) {
    double v = load(all + r * stride + i * es, t);
    switch (op) {
    case ncclProd: acc *= v, accf *= (float)v; break;
    case ncclMax: acc = v > acc ? v : acc, accf = (float)acc; break;
    case ncclMin: acc = v < acc ? v : acc, accf = (float)acc; break;
    default: acc += v, accf += (float)v; break; /* sum, avg */
    }
  }
  if (f32) acc = accf;
  if (op == ncclAvg) acc = f32 ? (double)(accf / (float)size) : acc / size;
  return acc;
}

/* an error when a buffer is not memory of the communicator's device */
ncclResult_t buffer(ncclComm_t c, const void *p, size_t count, ncclDataType_t t, const char *what) {
  size_t n = count * type_size(t);
  if (!n || lm_rt::device_of(p, n) == c->device) return ncclSuccess;
  lm_rt::note("%s: buffer %p of %zu bytes is not memory of the communicator's device cuda:%d", what, p, n, c->device);
  lm_rt::count(lm_rt::C_ERRORS);
  return ncclInvalidArgument;
}
ncclResult_t mpi(int rc) { return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError; }

/* a call in flight: its staged send buffer, its receive buffer, MPI's requests */
struct flight {
  std::vector<char> send, recv;
  std::vector<MPI_Request> reqs;
  ncclResult_t rc = ncclSuccess;
};
/* a call: what it stages (sn bytes at s), how it posts, how it finishes
 * (the result into its receive buffer) */
struct call {
  const char *what;
  cudaStream_t st;
  bool p2p;
  const void *s;
  size_t sn;
  void *r;
  std::function<ncclResult_t(flight &)> post;
  std::function<void(flight &)> finish;
};
thread_local std::vector<call> &group = *new std::vector<call>;

const void *block_of(const void *p) { return p ? lm_rt::block_of(p) : NULL; }

/* posts the calls (sends and receives first): each is staged and posted
 * by work on its stream, which runs now with the stream's earlier work;
 * then queues each one's completion; the first error */
ncclResult_t launch(std::vector<call> &calls) {
  std::vector<std::shared_ptr<flight>> f;
  std::vector<cudaStream_t> used;
  for (int pass = 0; pass < 2; pass++)
    for (call &k : calls) {
      if (k.p2p != (pass == 0)) continue;
      auto fl = std::make_shared<flight>();
      f.push_back(fl);
      lm_rt::work w;
      w.what = std::string(k.what) + " (posting)";
      if (const void *b = block_of(k.s)) w.blocks.push_back(b);
      const void *s = k.s;
      size_t sn = k.sn;
      auto post = k.post;
      w.run = [fl, s, sn, post] {
        fl->send.assign((const char *)s, (const char *)s + sn);
        fl->rc = post(*fl);
      };
      lm_rt::enqueue(k.st, std::move(w));
      bool seen = false;
      for (cudaStream_t u : used) seen = seen || u == k.st;
      if (!seen) used.push_back(k.st);
    }
  for (cudaStream_t u : used) lm_rt::drain(u);
  ncclResult_t first = ncclSuccess;
  size_t i = 0;
  for (int pass = 0; pass < 2; pass++)
    for (call &k : calls) {
      if (k.p2p != (pass == 0)) continue;
      auto fl = f[i++];
      if (first == ncclSuccess) first = fl->rc;
      lm_rt::work w;
      w.what = k.what;
      for (const void *b : {block_of(k.s), block_of(k.r)})
        if (b && (w.blocks.empty() || w.blocks[0] != b)) w.blocks.push_back(b);
      w.ready = [fl] {
        int done = 0;
        MPI_Testall((int)fl->reqs.size(), fl->reqs.data(), &done, MPI_STATUSES_IGNORE);
        return done != 0;
      };
      auto finish = k.finish;
      w.run = [fl, finish] {
        MPI_Waitall((int)fl->reqs.size(), fl->reqs.data(), MPI_STATUSES_IGNORE);
        if (finish && fl->rc == ncclSuccess) finish(*fl);
      };
      lm_rt::enqueue(k.st, std::move(w));
    }
  return first;
}

/* issues k now, or at ncclGroupEnd inside a group */
ncclResult_t issue(ncclComm_t c, call k) {
  if (!c) return ncclInvalidArgument;
  if (lm_rt::sticky(c->device)) return ncclUnhandledCudaError;
  lm_rt::count(lm_rt::C_COLLECTIVES);
  if (group_depth > 0) {
    group.push_back(std::move(k));
    return ncclSuccess;
  }
  std::vector<call> one{std::move(k)};
  return launch(one);
}
} // namespace

extern "C" {
const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
  case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
  case ncclSystemError: return "system error (emulated NCCL: MPI failed)";
  default: return "error (emulated NCCL)";
  }
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return ncclInvalidUsage;
  int w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  memset(id, 0, sizeof *id);
  memcpy(id->internal, MAGIC, 8);
  int tag = 20000 + made++ % 10000;
  memcpy(id->internal + 8, &w, 4), memcpy(id->internal + 12, &tag, 4);
  return ncclSuccess;
}
/* members tell the id's maker their world ranks; it answers with the table */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  if (memcmp(id.internal, MAGIC, 8) || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  if (lm_rt::device_count() == 0) return ncclUnhandledCudaError;
  int root, tag, w;
  memcpy(&root, id.internal + 8, 4), memcpy(&tag, id.internal + 12, 4);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  std::vector<int> table(nranks, -1);
  if (rank == 0) {
    if (w != root) return ncclInvalidUsage;
    table[0] = w;
    for (int i = 1; i < nranks; i++) {
      int pair[2];
      MPI_Recv(pair, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (pair[0] > 0 && pair[0] < nranks) table[pair[0]] = pair[1];
    }
    for (int i = 1; i < nranks; i++) MPI_Send(table.data(), nranks, MPI_INT, table[i], tag, MPI_COMM_WORLD);
  } else {
    int pair[2] = {rank, w};
    MPI_Send(pair, 2, MPI_INT, root, tag, MPI_COMM_WORLD);
    MPI_Recv(table.data(), nranks, MPI_INT, root, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  MPI_Group world, g;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_incl(world, nranks, table.data(), &g);
  ncclComm *c = new ncclComm();
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &c->mpi);
  MPI_Group_free(&g), MPI_Group_free(&world);
  if (rc != MPI_SUCCESS) { delete c; return ncclSystemError; }
  c->rank = rank, c->size = nranks, c->device = lm_rt::context();
  *comm = c;
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclSuccess;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Comm_free(&c->mpi);
  delete c;
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() {
  group_depth++;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  std::vector<call> q;
  q.swap(group);
  return launch(q);
}


ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
  if (!type_size(t) || op < 0 || op >= ncclNumOps) return ncclInvalidArgument;
  if (!c || buffer(c, s, count, t, "ncclAllReduce") || buffer(c, r, count, t, "ncclAllReduce")) return ncclInvalidArgument;
  size_t n = count * type_size(t);
  return issue(c, call{"ncclAllReduce", st, false, s, n, r, [=](flight &f) {
    f.recv.resize(n * c->size), f.reqs.resize(1);
    return mpi(MPI_Iallgather(f.send.data(), (int)n, MPI_BYTE, f.recv.data(), (int)n, MPI_BYTE, c->mpi, &f.reqs[0]));
  }, [=](flight &f) {
    for (size_t i = 0; i < count; i++) store((char *)r + i * type_size(t), t, reduce_one(f.recv.data(), n, c->size, i, t, op));
  }});
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t st) {
  if (!type_size(t) || !c || root < 0 || root >= c->size) return ncclInvalidArgument;
  if ((c->rank == root && buffer(c, s, count, t, "ncclBroadcast")) || buffer(c, r, count, t, "ncclBroadcast"))
    return ncclInvalidArgument;
  size_t n = count * type_size(t);
  bool mine = c->rank == root;
  return issue(c, call{"ncclBroadcast", st, false, mine ? s : NULL, mine ? n : 0, r, [=](flight &f) {
    if (!mine) f.send.resize(n);
    f.reqs.resize(1);
    return mpi(MPI_Ibcast(f.send.data(), (int)n, MPI_BYTE, root, c->mpi, &f.reqs[0]));
  }, [=](flight &f) { if (n) memcpy(r, f.send.data(), n); }});
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  if (!type_size(t) || !c) return ncclInvalidArgument;
  if (buffer(c, s, count, t, "ncclAllGather") || buffer(c, r, count * c->size, t, "ncclAllGather"))
    return ncclInvalidArgument;
  size_t n = count * type_size(t);
  return issue(c, call{"ncclAllGather", st, false, s, n, r, [=](flight &f) {
    f.recv.resize(n * c->size), f.reqs.resize(1);
    return mpi(MPI_Iallgather(f.send.data(), (int)n, MPI_BYTE, f.recv.data(), (int)n, MPI_BYTE, c->mpi, &f.reqs[0]));
  }, [=](flight &f) { if (n) memcpy(r, f.recv.data(), f.recv.size()); }});
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t st) {
  if (!type_size(t) || !c || op < 0 || op >= ncclNumOps) return ncclInvalidArgument;
  if (buffer(c, s, count * c->size, t, "ncclReduceScatter") || buffer(c, r, count, t, "ncclReduceScatter"))
    return ncclInvalidArgument;
  size_t es = type_size(t), n = count * es * c->size;
  return issue(c, call{"ncclReduceScatter", st, false, s, n, r, [=](flight &f) {
    f.recv.resize(n * c->size), f.reqs.resize(1);
    return mpi(MPI_Iallgather(f.send.data(), (int)n, MPI_BYTE, f.recv.data(), (int)n, MPI_BYTE, c->mpi, &f.reqs[0]));
  }, [=](flight &f) {
    for (size_t i = 0; i < count; i++)
      store((char *)r + i * es, t, reduce_one(f.recv.data(), n, c->size, c->rank * count + i, t, op));
  }});
}
ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t c, cudaStream_t st) {
  if (!type_size(t) || !c || op < 0 || op >= ncclNumOps || root < 0 || root >= c->size) return ncclInvalidArgument;
  bool mine = c->rank == root;
  if (buffer(c, s, count, t, "ncclReduce") || (mine && buffer(c, r, count, t, "ncclReduce"))) return ncclInvalidArgument;
  size_t n = count * type_size(t);
  return issue(c, call{"ncclReduce", st, false, s, n, mine ? r : NULL, [=](flight &f) {
    f.recv.resize(mine ? n * c->size : 1), f.reqs.resize(1);
    return mpi(MPI_Igather(f.send.data(), (int)n, MPI_BYTE, f.recv.data(), (int)n, MPI_BYTE, root, c->mpi, &f.reqs[0]));
  }, [=](flight &f) {
    if (mine)
      for (size_t i = 0; i < count; i++) store((char *)r + i * type_size(t), t, reduce_one(f.recv.data(), n, c->size, i, t, op));
  }});
}
ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  if (!type_size(t) || !c || peer < 0 || peer >= c->size) return ncclInvalidArgument;
  if (buffer(c, s, count, t, "ncclSend")) return ncclInvalidArgument;
  size_t n = count * type_size(t);
  return issue(c, call{"ncclSend", st, true, s, n, NULL, [=](flight &f) {
    f.reqs.resize(1);
    return mpi(MPI_Isend(f.send.data(), (int)n, MPI_BYTE, peer, 7, c->mpi, &f.reqs[0]));
  }, nullptr});
}
ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  if (!type_size(t) || !c || peer < 0 || peer >= c->size) return ncclInvalidArgument;
  if (buffer(c, r, count, t, "ncclRecv")) return ncclInvalidArgument;
  size_t n = count * type_size(t);
  return issue(c, call{"ncclRecv", st, true, NULL, 0, r, [=](flight &f) {
    f.recv.resize(n), f.reqs.resize(1);
    return mpi(MPI_Irecv(f.recv.data(), (int)n, MPI_BYTE, peer, 7, c->mpi, &f.reqs[0]));
  }, [=](flight &f) { if (n) memcpy(r, f.recv.data(), n); }});
}
}
