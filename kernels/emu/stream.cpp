/* stream.cpp: emulated streams, events and the queues of work. Each
 * stream (a legacy default stream per device, and those made) queues its
 * work in issue order; the work runs when the host waits for it (a stream
 * or device synchronize, an event synchronize, a copy to pageable host
 * memory) or when work it waits for must run first: an event a stream
 * waits on, and the legacy stream's implicit order (it waits for every
 * blocking stream's earlier work, and they for its), are waits in the
 * queue. A query (cudaEventQuery, cudaStreamQuery) of work not yet run
 * answers cudaErrorNotReady, leaves it as the last error as CUDA does,
 * and then lets that work run (a collective only once its peers' data has
 * come), so the next query may succeed. A kernel that faults (a bad
 * pointer) leaves its device's sticky error; the device drops its work.
 *
 * Kept beside the queues, the order CUDA guarantees as vector clocks: each
 * stream counts its work and knows how far it has waited for every other
 * stream. Work on a stream that touches a block last touched by work on
 * another stream it is not ordered after counts as C_UNORDERED_REUSE: on a
 * GPU the two could overlap (a block freed on one stream and reused on
 * another without an event is the usual case). */
#include "runtime.h"
#include <deque>
#include <map>
#include <mutex>
#include <vector>

namespace lm_rt {
typedef std::vector<int64_t> clock_t_;
struct item {
  int64_t seq;             /* its number on the stream; 0: a wait */
  int wait_stream;         /* a wait: that stream's work up to wait_seq runs first */
  int64_t wait_seq;
  work w;
};
struct stream_state {
  int device;
  bool blocking;
  int64_t seq, done;       /* work issued, work run (by number) */
  clock_t_ known;          /* by stream id: how much of its work this stream is ordered after */
  std::deque<item> q;
};
struct use { int stream; int64_t seq; };
static std::recursive_mutex mu;
/* ids 0..MAX_DEVICES-1: the devices' legacy streams, then the streams made;
 * never destroyed (work may come from finalizers at exit) */
static std::vector<stream_state *> &streams = *[] {
  auto *v = new std::vector<stream_state *>;
  for (int d = 0; d < MAX_DEVICES; d++) v->push_back(new stream_state{d, true, 0, 0, {}, {}});
  return v;
}();
static clock_t_ &host_known = *new clock_t_;             /* what the host has waited for */
static std::map<const void *, use> &last_use = *new std::map<const void *, use>; /* by block */
static const work *now_running;
static int depth; /* of run_until: the blocks close when the outermost returns */

static void merge(clock_t_ &a, const clock_t_ &b) {
  if (a.size() < b.size()) a.resize(b.size(), 0);
  for (size_t i = 0; i < b.size(); i++) a[i] = a[i] > b[i] ? a[i] : b[i];
}
static int64_t &at(clock_t_ &c, size_t i) {
  if (c.size() <= i) c.resize(i + 1, 0);
  return c[i];
}
/* a handle's id: the current device's legacy stream for 0 (and the
 * per-thread default stream, treated as legacy) */
static int id_of(cudaStream_t s) {
  uintptr_t h = (uintptr_t)s;
  if (h == 0 || h == 1 || h == 2) return current();
  return (int)(h >> 4);
}
static cudaStream_t handle_of(int id) { return (cudaStream_t)(uintptr_t)((uintptr_t)id << 4); }
static bool legacy(int id) { return id < MAX_DEVICES; }
static bool pending(int id) { return streams[id]->done < streams[id]->seq; }

/* ---- stream order, as vector clocks ---- */
static void order_locked(int id) {
  stream_state &s = *streams[id];
  merge(s.known, host_known);
  for (size_t k = 0; k < streams.size(); k++) {
    stream_state &o = *streams[k];
    if ((int)k == id || o.device != s.device || !o.blocking || !s.blocking) continue;
    if (legacy(id) || legacy((int)k)) at(s.known, k) = o.seq; /* the legacy stream's implicit order */
  }
  s.seq++;
  at(s.known, id) = s.seq;
}
static void touch_locked(int id, const void *b) {
  auto it = last_use.find(b);
  if (it != last_use.end() && it->second.stream != id) {
    int64_t seen = at(streams[id]->known, it->second.stream);
    if (seen < it->second.seq) {
      count(C_UNORDERED_REUSE);
      note("block %p used on stream %d, last used on stream %d with no event or sync between them", b, id,
           it->second.stream);
    }
  }
  last_use[b] = use{id, streams[id]->seq};
}
static void host_waits(int id) { at(host_known, id) = streams[id]->seq; }

/* ---- running the queues ---- */
static void execute(item &it, int device) {
  if (sticky(device)) return; /* the device is lost: its work is dropped */
  if (it.w.fault) {
    note("%s faulted (%s): every later call on cuda:%d fails", it.w.what.c_str(), "an illegal memory access", device);
    set_sticky(device, it.w.fault);
    return;
  }
  open_only(it.w.blocks);
  const work *was = now_running;
  now_running = &it.w;
  it.w.run();
  now_running = was;
}
/* runs stream id's work up to number upto (and what it waits for); false
 * when, not blocking, it stopped at work that is not ready */
static bool run_until(int id, int64_t upto, bool blocking) {
  depth++;
  bool ok = true;
  while (streams[id]->done < upto && !streams[id]->q.empty()) {
    item &front = streams[id]->q.front();
    if (front.seq == 0) {
      if (!(ok = run_until(front.wait_stream, front.wait_seq, blocking))) break;
      streams[id]->q.pop_front();
      continue;
    }
    if (!blocking && front.w.ready && !sticky(streams[id]->device) && !front.w.ready()) { ok = false; break; }
    item it = std::move(front);
    streams[id]->q.pop_front();
    execute(it, streams[id]->device);
    streams[id]->done = it.seq;
  }
  if (--depth == 0) close_all();
  return ok && streams[id]->done >= upto;
}
static void wait_for(int id, int other, int64_t seq) { /* stream id waits for other's work up to seq */
  if (streams[other]->done >= seq) return;
  streams[id]->q.push_back(item{0, other, seq, work()});
}

void enqueue(cudaStream_t h, work w) {
  std::lock_guard<std::recursive_mutex> g(mu);
  int id = id_of(h);
  stream_state &s = *streams[id];
  if (sticky(s.device)) return;
  if (s.blocking) /* the legacy stream's implicit order, as waits */
    for (size_t k = 0; k < streams.size(); k++) {
      stream_state &o = *streams[k];
      if ((int)k != id && o.device == s.device && o.blocking && (legacy(id) || legacy((int)k)) && pending((int)k))
        wait_for(id, (int)k, o.seq);
    }
  order_locked(id);
  for (const void *b : w.blocks) touch_locked(id, b);
  s.q.push_back(item{s.seq, -1, 0, std::move(w)});
}
void drain(cudaStream_t h) {
  std::lock_guard<std::recursive_mutex> g(mu);
  int id = id_of(h);
  run_until(id, streams[id]->seq, true);
  host_waits(id);
}
void drain_device(int d) {
  std::lock_guard<std::recursive_mutex> g(mu);
  for (size_t k = 0; k < streams.size(); k++)
    if (streams[k]->device == d) run_until((int)k, streams[k]->seq, true), host_waits((int)k);
}
void drain_all() {
  for (int d = 0; d < MAX_DEVICES; d++) drain_device(d);
}
int device_of_stream(cudaStream_t h) {
  std::lock_guard<std::recursive_mutex> g(mu);
  return streams[id_of(h)]->device;
}
const work *running() { return now_running; }
} // namespace lm_rt

using namespace lm_rt;

/* an event: the point of its stream's work it was recorded at */
struct emu_event { int stream = -1; int64_t seq = 0; clock_t_ at; };

/* a query of work up to (id, seq): done, or NotReady (left as the last
 * error) after letting the work run as far as it can */
static cudaError_t query(int id, int64_t seq, const clock_t_ &at) {
  int d = streams[id]->device;
  if (sticky(d)) return sticky(d);
  if (streams[id]->done >= seq) {
    merge(host_known, at);
    return cudaSuccess;
  }
  count(C_NOT_READY);
  set_last(cudaErrorNotReady);
  run_until(id, seq, false);
  return cudaErrorNotReady;
}

extern "C" {
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  int d = context();
  std::lock_guard<std::recursive_mutex> g(mu);
  streams.push_back(new stream_state{d, !(flags & cudaStreamNonBlocking), 0, 0, {}, {}});
  *s = handle_of((int)streams.size() - 1);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
/* its work still runs (as CUDA lets it finish); the stream is kept */
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  drain(s);
  cudaError_t e = sticky(device_of_stream(s));
  return e ? fail(e) : cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(mu);
  int id = id_of(s);
  clock_t_ all;
  at(all, id) = streams[id]->seq;
  return query(id, streams[id]->seq, all);
}
/* the host waits for every stream of the current device */
cudaError_t cudaDeviceSynchronize(void) {
  int d = context();
  count(C_DEVICE_SYNCS);
  drain_device(d);
  return sticky(d) ? fail(sticky(d)) : cudaSuccess;
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
  std::lock_guard<std::recursive_mutex> g(mu);
  emu_event *ev = (emu_event *)e;
  int id = id_of(s);
  if (cudaError_t err = sticky(streams[id]->device)) return fail(err);
  ev->stream = id, ev->seq = streams[id]->seq, ev->at = streams[id]->known;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> g(mu);
  emu_event *ev = (emu_event *)e;
  int id = id_of(s);
  merge(streams[id]->known, ev->at);
  if (ev->stream >= 0 && ev->stream != id) wait_for(id, ev->stream, ev->seq);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> g(mu);
  emu_event *ev = (emu_event *)e;
  if (ev->stream < 0) return cudaSuccess; /* never recorded: complete */
  return query(ev->stream, ev->seq, ev->at);
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> g(mu);
  emu_event *ev = (emu_event *)e;
  if (ev->stream < 0) return cudaSuccess;
  run_until(ev->stream, ev->seq, true);
  merge(host_known, ev->at);
  cudaError_t err = sticky(streams[ev->stream]->device);
  return err ? fail(err) : cudaSuccess;
}
}
