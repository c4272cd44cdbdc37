-- bench_comm.lua: collective latency and bus bandwidth, next to memcpy
-- bandwidth measured in the same run.
--   scripts/loomrun -n 2 scripts/bench_comm.lua [--json out.json] [--max-mib 64]
-- Bus bandwidth follows nccl-tests: all_reduce algbw * 2(n-1)/n, all_gather
-- and reduce_scatter algbw * (n-1)/n, algbw = full tensor bytes / time.
local ffi = require("ffi")
local loom = require("loom")
local dist = require("loom.distributed")
local bench = require("loom.train.bench")
local now = bench.now

local o = bench.args(arg, { json = "", ["max-mib"] = 64 }, "bench_comm.lua")
local json_path, max_mib = o.json ~= "" and o.json or nil, o["max-mib"]

local n, me = dist.world_size(), dist.rank()
local function say(...) if me == 0 then print(string.format(...)) end end

-- seconds per call of fn, the slowest rank's, over iters calls after warmup
local function time_it(iters, fn)
  for _ = 1, math.min(3, iters) do fn() end
  dist.barrier()
  local t0 = now()
  for _ = 1, iters do fn() end
  local dt = (now() - t0) / iters
  return dist.all_reduce(loom.tensor({ dt }, { dtype = "f64" }), "max"):item()
end

local function iters_for(bytes) return math.max(5, math.min(2000, math.floor(2^28 / bytes))) end

-- memcpy of the same bytes, one thread, in this process
local function memcpy_gbs(bytes)
  local a, b = ffi.new("uint8_t[?]", bytes), ffi.new("uint8_t[?]", bytes)
  ffi.fill(a, bytes, 1)
  local iters = iters_for(bytes)
  for _ = 1, 2 do ffi.copy(b, a, bytes) end
  local t0 = now()
  for _ = 1, iters do ffi.copy(b, a, bytes) end
  local dt = (now() - t0) / iters
  return bytes / dt / 1e9
end

say("loom bench_comm: %d ranks, %d threads each, LOOM_DEBUG_COLLECTIVES=%s", n,
    loom.num_threads(), tostring(dist.debug_collectives()))

-- latency: 4-byte all_reduce (one f32), through the whole Lua -> C path
local one = loom.tensor({ 1 })
local lat = time_it(20000, function() dist.all_reduce(one, "sum"):free() end)
say("all_reduce 4 B latency: %.2f us (Lua call, output allocation and MPI_Allreduce)", lat * 1e6)
local barrier_lat = time_it(20000, function() dist.barrier() end)
say("barrier latency:        %.2f us", barrier_lat * 1e6)

local rows = {}
say("")
say("%10s %9s | %12s %12s %12s | %12s", "bytes", "iters", "all_reduce", "all_gather",
    "red_scatter", "memcpy")
say("%10s %9s | %12s %12s %12s | %12s", "", "", "busbw GB/s", "busbw GB/s", "busbw GB/s", "GB/s")
local bytes = 1024
while bytes <= max_mib * 2^20 do
  local numel = bytes / 4
  local iters = iters_for(bytes)
  local full = loom.ones({ numel })                    -- all_reduce, reduce_scatter input
  local shard = loom.ones({ math.max(1, numel / n) })  -- all_gather input
  local t_ar = time_it(iters, function() dist.all_reduce(full, "sum"):free() end)
  local t_ag = time_it(iters, function() dist.all_gather(shard, 1):free() end)
  local t_rs = time_it(iters, function() dist.reduce_scatter(full, "sum", 1):free() end)
  local f = (n - 1) / n
  local row = {
    bytes = bytes, iters = iters,
    all_reduce = bytes / t_ar / 1e9 * 2 * f,
    all_gather = shard:numel() * 4 * n / t_ag / 1e9 * f,
    reduce_scatter = bytes / t_rs / 1e9 * f,
    memcpy = memcpy_gbs(bytes),
    t_all_reduce_us = t_ar * 1e6, t_all_gather_us = t_ag * 1e6, t_reduce_scatter_us = t_rs * 1e6,
  }
  rows[#rows + 1] = row
  say("%10d %9d | %12.3f %12.3f %12.3f | %12.2f", bytes, iters, row.all_reduce, row.all_gather,
      row.reduce_scatter, row.memcpy)
  full:free()
  shard:free()
  bytes = bytes * 4
end

if json_path and me == 0 then
  bench.write_json(json_path, { ranks = n, latency_us = lat * 1e6, barrier_us = barrier_lat * 1e6, rows = rows })
  say("wrote %s", json_path)
end
