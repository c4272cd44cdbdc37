-- gc_pacing.lua: when loom.tensor asks LuaJIT for a full collection. A
-- tensor's memory is C memory the collector cannot see, so every tensor
-- made from C calls pressure() (loom.tensor's wrap).
local ffi = require("ffi")
require("loom.posix")   -- clock_gettime, loom_timespec
local C = require("loom.lib").C

local M = {}

-- the machine's memory in bytes (/proc/meminfo; 8 GiB where it cannot be read)
local function ram_bytes()
  local f = io.open("/proc/meminfo", "rb")
  local kb = f and tonumber((f:read("*a") or ""):match("MemTotal:%s*(%d+) kB"))
  if f then f:close() end
  return kb and kb * 1024 or 8 * 2^30
end

-- LuaJIT cannot see C memory: collect when live tensor bytes double, but
-- never let garbage grow past an eighth of the machine's memory over what
-- was live (big dead tensors would otherwise pile up to the live size: 8 GB
-- ones made in a loop ran a 24 GB machine out of memory). LOOM_GC_CAP_MB
-- sets that allowance. A full collection walks every live Lua object: with
-- many small tensors alive (a model's parameters, saved activations) one
-- takes milliseconds, and collecting every second 64 MB output would cost
-- more than computing it. So the allowance also grows with what the last
-- collection took (GC_AMORTISE bytes per CPU second of it: at 10 GB/s of
-- writing outputs, a fifth of the time goes to collecting), and the CPU
-- allocator caches the blocks a collection frees, so the next outputs reuse
-- resident pages. Garbage in reused blocks costs memory only; garbage that
-- makes the allocator take fresh pages from the OS costs their first touch
-- (about 3 GB/s here): a collection runs once the fresh bytes since the last
-- one would take longer to touch than it took (FRESH_RATE).
local gc_floor = 64 * 2^20
local GC_AMORTISE, FRESH_RATE = 50e9, 3e9
local cap_mb = tonumber(os.getenv("LOOM_GC_CAP_MB") or "")
local gc_threshold, gc_cap = gc_floor, cap_mb and cap_mb * 2^20 or math.max(gc_floor, ram_bytes() / 8)
local gc_ts = ffi.new("loom_timespec")
local function cpu_now()   -- this thread's CPU time: neighbours on a shared machine do not inflate it
  ffi.C.loom_clock_gettime(3, gc_ts)   -- CLOCK_THREAD_CPUTIME_ID
  return tonumber(gc_ts.tv_sec) + tonumber(gc_ts.tv_nsec) * 1e-9
end
local mem = ffi.new("int64_t[?]", C.LM_NMEM_STATS)
local function cpu_fresh()   -- the bytes the CPU allocator has mapped fresh from the OS, in all
  C.lm_device_memory_stats(0, mem)
  return tonumber(mem[C.LM_MEM_DRIVER_BYTES])
end
local gc_took, took_eff = 0, 0   -- the CPU seconds of the last collection, the cheaper of the last two
local seen_live, fresh_at_gc = 0, 0
-- fresh_wait: how many collections' time of fresh pages the next one waits
-- for. A collection that frees less than half the fresh bytes that prompted
-- it says those pages hold live data (a model being built: 184 collections
-- for a 350M one), and the next waits twice as long; one that frees more
-- starts again from 1.
local fresh_wait, MAX_WAIT = 1, 1024
local collections = 0   -- how many it asked for (M.collections(): a spec counts them)
function M.collections() return collections end
-- a collection in the trace (loom.profiler), while one is being made
local gc_event = ffi.new("lm_trace_event")
local function trace_gc(t0, before, after, fresh)
  gc_event.kind, gc_event.t0, gc_event.t1 = C.LM_TRACE_GC, t0, C.lm_trace_now()
  gc_event.a, gc_event.b, gc_event.bytes = before, fresh, before - after
  C.lm_trace_record(gc_event)
end
local function collect()
  collections = collections + 1
  local before, fresh = tonumber(C.lm_allocated_bytes()), cpu_fresh() - fresh_at_gc
  local traced = C.lm_trace_enabled() == 1 and C.lm_trace_now()
  local t0 = cpu_now()
  collectgarbage()
  local t = cpu_now() - t0
  if traced then trace_gc(traced, before, tonumber(C.lm_allocated_bytes()), fresh) end
  -- one that swept a pile of dead objects is followed by a cheap one, and
  -- says nothing of the next
  took_eff, gc_took = math.min(gc_took, t), t
  local after = tonumber(C.lm_allocated_bytes())
  gc_threshold = after + math.max(gc_floor, math.min(math.max(after, took_eff * GC_AMORTISE), gc_cap))
  fresh_wait = before - after < fresh / 2 and math.min(fresh_wait * 2, MAX_WAIT) or 1
  fresh_at_gc, seen_live = cpu_fresh(), after
end
local function gc_pressure()
  local live = tonumber(C.lm_allocated_bytes())
  if live > gc_threshold then return collect() end
  if live > seen_live + 2^20 then   -- a large block since the last look: fresh pages?
    seen_live = live
    -- only the large blocks' mappings count: blocks under 1 MiB come from
    -- malloc's heap, whose growth is the live set's (a small model's
    -- activations), and counting them cost a collection per MiB of forward
    if (cpu_fresh() - fresh_at_gc) / FRESH_RATE > took_eff * fresh_wait then collect() end
  elseif live < seen_live then
    seen_live = live
  end
end
M.pressure = gc_pressure

return M
