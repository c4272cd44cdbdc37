/* nccl.cpp: the NCCL calls loom makes, over MPI. A communicator is an MPI
 * communicator of its ranks, made from the unique id (which names the world
 * rank that made it) by MPI_Comm_create_group, collective over its members
 * only, as ncclCommInitRank is. Calls between ncclGroupStart and
 * ncclGroupEnd are queued and run at ncclGroupEnd (sends and receives
 * posted first, so a group of them cannot deadlock), which returns the
 * first error. Reductions gather every rank's buffer and reduce in rank
 * order, so every rank gets the same bits; bf16/f16 reduce in f32 and round
 * once, f64 in f64. Buffers must be device memory of the communicator's
 * device; work is ordered on the stream given (stream.cpp). */
#include "runtime.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mpi.h>
#include <nccl.h>
#include <string.h>
#include <functional>
#include <vector>

struct ncclComm {
  MPI_Comm mpi;
  int rank, size, device;
};

namespace {
const char MAGIC[8] = "loomemu";
int made;                       /* unique ids this process made */
thread_local int group_depth;
struct queued { bool p2p; std::function<ncclResult_t(std::vector<MPI_Request> &)> run; };
thread_local std::vector<queued> queue;

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

/* checks a buffer and orders it on the stream; an error when it is not
 * memory of the communicator's device */
ncclResult_t buffer(ncclComm_t c, const void *p, size_t count, ncclDataType_t t, cudaStream_t s, const char *what) {
  size_t n = count * type_size(t);
  if (!n) return ncclSuccess;
  if (lm_rt::device_of(p, n) != c->device) {
    lm_rt::note("%s: buffer %p of %zu bytes is not memory of the communicator's device cuda:%d", what, p, n,
                c->device);
    lm_rt::count(lm_rt::C_ERRORS);
    return ncclInvalidArgument;
  }
  lm_rt::work(s); /* ordered on s first (a blocking stream: after the legacy stream's work) */
  lm_rt::touch(s, p);
  return ncclSuccess;
}

/* runs f now, or at ncclGroupEnd inside a group */
ncclResult_t issue(ncclComm_t c, cudaStream_t s, bool p2p, std::function<ncclResult_t(std::vector<MPI_Request> &)> f) {
  if (!c) return ncclInvalidArgument;
  lm_rt::count(lm_rt::C_COLLECTIVES);
  lm_rt::work(s);
  if (group_depth > 0) {
    queue.push_back(queued{p2p, f});
    return ncclSuccess;
  }
  std::vector<MPI_Request> reqs;
  ncclResult_t r = f(reqs);
  if (!reqs.empty()) MPI_Waitall((int)reqs.size(), reqs.data(), MPI_STATUSES_IGNORE);
  return r;
}
ncclResult_t mpi(int rc) { return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError; }
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
  std::vector<queued> q;
  q.swap(queue);
  std::vector<MPI_Request> reqs;
  ncclResult_t first = ncclSuccess;
  for (int pass = 0; pass < 2; pass++) /* sends and receives posted first */
    for (auto &op : q)
      if (op.p2p == (pass == 0)) {
        ncclResult_t r = op.run(reqs);
        if (first == ncclSuccess) first = r;
      }
  if (!reqs.empty()) MPI_Waitall((int)reqs.size(), reqs.data(), MPI_STATUSES_IGNORE);
  return first;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
  if (!type_size(t) || op < 0 || op >= ncclNumOps) return ncclInvalidArgument;
  if (!c || buffer(c, s, count, t, st, "ncclAllReduce") || buffer(c, r, count, t, st, "ncclAllReduce"))
    return ncclInvalidArgument;
  return issue(c, st, false, [=](std::vector<MPI_Request> &) {
    size_t n = count * type_size(t);
    std::vector<char> all(n * c->size);
    ncclResult_t e = mpi(MPI_Allgather(s, (int)n, MPI_BYTE, all.data(), (int)n, MPI_BYTE, c->mpi));
    for (size_t i = 0; e == ncclSuccess && i < count; i++)
      store((char *)r + i * type_size(t), t, reduce_one(all.data(), n, c->size, i, t, op));
    return e;
  });
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t st) {
  if (!type_size(t) || !c || root < 0 || root >= c->size) return ncclInvalidArgument;
  if ((c->rank == root && buffer(c, s, count, t, st, "ncclBroadcast")) || buffer(c, r, count, t, st, "ncclBroadcast"))
    return ncclInvalidArgument;
  return issue(c, st, false, [=](std::vector<MPI_Request> &) {
    size_t n = count * type_size(t);
    if (c->rank == root && s != r) memmove(r, s, n);
    return mpi(MPI_Bcast(r, (int)n, MPI_BYTE, root, c->mpi));
  });
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  if (!type_size(t) || !c) return ncclInvalidArgument;
  if (buffer(c, s, count, t, st, "ncclAllGather") || buffer(c, r, count * c->size, t, st, "ncclAllGather"))
    return ncclInvalidArgument;
  return issue(c, st, false, [=](std::vector<MPI_Request> &) {
    size_t n = count * type_size(t);
    std::vector<char> mine((const char *)s, (const char *)s + n); /* in place: s inside r */
    return mpi(MPI_Allgather(mine.data(), (int)n, MPI_BYTE, r, (int)n, MPI_BYTE, c->mpi));
  });
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t st) {
  if (!type_size(t) || !c || op < 0 || op >= ncclNumOps) return ncclInvalidArgument;
  if (buffer(c, s, count * c->size, t, st, "ncclReduceScatter") || buffer(c, r, count, t, st, "ncclReduceScatter"))
    return ncclInvalidArgument;
  return issue(c, st, false, [=](std::vector<MPI_Request> &) {
    size_t es = type_size(t), n = count * es * c->size;
    std::vector<char> all(n * c->size);
    ncclResult_t e = mpi(MPI_Allgather(s, (int)n, MPI_BYTE, all.data(), (int)n, MPI_BYTE, c->mpi));
    for (size_t i = 0; e == ncclSuccess && i < count; i++)
      store((char *)r + i * es, t, reduce_one(all.data(), n, c->size, c->rank * count + i, t, op));
    return e;
  });
}
ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t c, cudaStream_t st) {
  if (!type_size(t) || !c || op < 0 || op >= ncclNumOps || root < 0 || root >= c->size) return ncclInvalidArgument;
  if (buffer(c, s, count, t, st, "ncclReduce") || (c->rank == root && buffer(c, r, count, t, st, "ncclReduce")))
    return ncclInvalidArgument;
  return issue(c, st, false, [=](std::vector<MPI_Request> &) {
    size_t n = count * type_size(t);
    std::vector<char> all(c->rank == root ? n * c->size : 1);
    ncclResult_t e = mpi(MPI_Gather(s, (int)n, MPI_BYTE, all.data(), (int)n, MPI_BYTE, root, c->mpi));
    if (c->rank == root)
      for (size_t i = 0; e == ncclSuccess && i < count; i++)
        store((char *)r + i * type_size(t), t, reduce_one(all.data(), n, c->size, i, t, op));
    return e;
  });
}
ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  if (!type_size(t) || !c || peer < 0 || peer >= c->size) return ncclInvalidArgument;
  if (buffer(c, s, count, t, st, "ncclSend")) return ncclInvalidArgument;
  return issue(c, st, true, [=](std::vector<MPI_Request> &reqs) {
    reqs.emplace_back();
    return mpi(MPI_Isend(s, (int)(count * type_size(t)), MPI_BYTE, peer, 7, c->mpi, &reqs.back()));
  });
}
ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  if (!type_size(t) || !c || peer < 0 || peer >= c->size) return ncclInvalidArgument;
  if (buffer(c, r, count, t, st, "ncclRecv")) return ncclInvalidArgument;
  return issue(c, st, true, [=](std::vector<MPI_Request> &reqs) {
    reqs.emplace_back();
    return mpi(MPI_Irecv(r, (int)(count * type_size(t)), MPI_BYTE, peer, 7, c->mpi, &reqs.back()));
  });
}
}
