/* stream.cpp: emulated streams and events. Work runs when issued, so an
 * event is complete once recorded; what is kept is the order CUDA would
 * guarantee, as vector clocks: each stream counts its work and knows how
 * far it has waited for every other stream (an event it waited on, the
 * legacy default stream's implicit order with blocking streams, the host
 * having synchronized). Work on a stream that touches a block last touched
 * by work on another stream it is not ordered after counts as
 * C_UNORDERED_REUSE: on a GPU the two could overlap (a block freed on one
 * stream and reused on another without an event is the usual case). */
#include "runtime.h"
#include <map>
#include <mutex>
#include <vector>

namespace lm_rt {
typedef std::vector<int64_t> clock_t_;
struct stream_state {
  bool blocking;
  int64_t seq;       /* work issued */
  clock_t_ known;    /* by stream id: how much of its work this stream is ordered after */
};
struct use { int stream; int64_t seq; };
static std::mutex mu;
/* id 0: the legacy default stream; never destroyed (work may come from finalizers at exit) */
static std::vector<stream_state> &streams = *new std::vector<stream_state>{{true, 0, {}}};
static clock_t_ &host_known = *new clock_t_;             /* what the host has waited for */
static std::map<const void *, use> &last_use = *new std::map<const void *, use>; /* by block */

static void merge(clock_t_ &a, const clock_t_ &b) {
  if (a.size() < b.size()) a.resize(b.size(), 0);
  for (size_t i = 0; i < b.size(); i++) a[i] = a[i] > b[i] ? a[i] : b[i];
}
/* a handle's id: 0 for the legacy stream (0, cudaStreamLegacy) */
static int id_of(cudaStream_t s) {
  uintptr_t h = (uintptr_t)s;
  if (h == 0 || h == 1 || h == 2) return 0; /* legacy; per-thread default treated as legacy */
  return (int)(h >> 4);
}
static cudaStream_t handle_of(int id) { return (cudaStream_t)(uintptr_t)(id << 4); }

static void work_locked(int id) {
  stream_state &s = streams[id];
  merge(s.known, host_known);
  if (id == 0) { /* the legacy stream waits for every blocking stream's earlier work */
    for (size_t k = 1; k < streams.size(); k++)
      if (streams[k].blocking) {
        if (s.known.size() <= k) s.known.resize(k + 1, 0);
        s.known[k] = streams[k].seq;
      }
  } else if (s.blocking) { /* and a blocking stream waits for the legacy stream's */
    if (s.known.empty()) s.known.resize(1, 0);
    s.known[0] = streams[0].seq;
  }
  s.seq++;
  if (s.known.size() <= (size_t)id) s.known.resize(id + 1, 0);
  s.known[id] = s.seq;
}
void work(cudaStream_t h) {
  std::lock_guard<std::mutex> g(mu);
  work_locked(id_of(h));
}
void touch(cudaStream_t h, const void *p) {
  const void *b = block_of(p);
  std::lock_guard<std::mutex> g(mu);
  int id = id_of(h);
  auto it = last_use.find(b);
  if (it != last_use.end() && it->second.stream != id) {
    const clock_t_ &k = streams[id].known;
    int64_t seen = (size_t)it->second.stream < k.size() ? k[it->second.stream] : 0;
    if (seen < it->second.seq) {
      count(C_UNORDERED_REUSE);
      note("block %p used on stream %d, last used on stream %d with no event or sync between them", b, id,
           it->second.stream);
    }
  }
  last_use[b] = use{id, streams[id].seq};
}
static void host_waits(int id) { /* the host waited for stream id's work so far */
  if (host_known.size() <= (size_t)id) host_known.resize(id + 1, 0);
  host_known[id] = streams[id].seq;
}
} // namespace lm_rt

using namespace lm_rt;

struct emu_event { clock_t_ at; };

extern "C" {
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  context();
  std::lock_guard<std::mutex> g(mu);
  streams.push_back(stream_state{!(flags & cudaStreamNonBlocking), 0, {}});
  *s = handle_of((int)streams.size() - 1);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::lock_guard<std::mutex> g(mu);
  host_waits(id_of(s));
  return cudaSuccess;
}
/* the host waits for every stream (the emulator does not keep a stream's device) */
cudaError_t cudaDeviceSynchronize(void) {
  context();
  count(C_DEVICE_SYNCS);
  std::lock_guard<std::mutex> g(mu);
  for (size_t i = 0; i < streams.size(); i++) host_waits((int)i);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
  context();
  *e = (cudaEvent_t) new emu_event();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete (emu_event *)e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(mu);
  ((emu_event *)e)->at = streams[id_of(s)].known;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(mu);
  merge(streams[id_of(s)].known, ((emu_event *)e)->at);
  return cudaSuccess;
}
/* the work an event follows has run: it is complete */
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(mu);
  merge(host_known, ((emu_event *)e)->at);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cudaEventQuery(e); }
}
