-- bench_alloc.lua: a fresh large output in a loop, as a training script
-- makes them: `y = x:silu()` on 16M floats, after the script has made many
-- small temporaries, next to a one-thread memcpy of the same bytes measured
-- in the same run (interleaved rounds, best of each). Also prints the CPU
-- allocator's counters (loom.memory_stats("cpu")).
-- Usage:
--   luajit scripts/bench_alloc.lua [--numel 16777216] [--temps 200000] [--iters 20] [--rounds 5]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_alloc%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local ffi = require("ffi")
local loom = require("loom")
local bench = require("loom.train.bench")

local o = bench.args(arg, { numel = 16 * 2^20, temps = 200000, iters = 20, rounds = 5 },
                     "bench_alloc.lua")
pcall(ffi.cdef, [[ void *malloc(size_t n); void free(void *p); ]])

local n = o.numel
local bytes = 2 * n * 4            -- silu reads n floats and writes n
loom.manual_seed(0)
local x = loom.randn(n)

local half = n * 4
local src, dst = ffi.C.malloc(half), ffi.C.malloc(half)
ffi.fill(src, half, 1) ffi.fill(dst, half, 2)
local function memcpy_round() return bench.best(function() ffi.copy(dst, src, half) end, o.iters) end

local y
local function silu_round()
  local sum = 0
  for _ = 1, o.iters do
    local t = bench.now()
    y = x:silu()
    sum = sum + bench.now() - t
  end
  return sum / o.iters
end
-- the op's own cost: the last output freed at once, its block reused with no collection
local function silu_freed_round()
  local sum = 0
  for _ = 1, o.iters do
    local t = bench.now()
    if y then y:free() end
    y = x:silu()
    sum = sum + bench.now() - t
  end
  return sum / o.iters
end

-- the script's small temporaries: dropped on the floor (dead), then kept
-- alive in a table (as a model's parameters and saved activations are)
local s = loom.randn(4)
local kept = {}
local function temporaries(keep)
  for _ = 1, o.temps do
    local t = s + s
    if keep then kept[#kept + 1] = t end
  end
end

local rows = {}
for _, keep in ipairs({ false, true }) do
  temporaries(keep)
  local t0 = bench.now()
  y = x:silu()
  local first = bench.now() - t0
  local best_c, mean_s, mean_f = math.huge, math.huge, math.huge
  for _ = 1, o.rounds do       -- interleaved: all see the same neighbours
    mean_s = math.min(mean_s, silu_round())
    mean_f = math.min(mean_f, silu_freed_round())
    best_c = math.min(best_c, memcpy_round())
  end
  local what = string.format("after %d small temporaries %s", o.temps, keep and "kept alive" or "dropped")
  rows[#rows + 1] = { "y = x:silu(), first call, " .. what, first * 1e3, bytes / first / 1e9, best_c / first }
  rows[#rows + 1] = { "y = x:silu(), loop of " .. o.iters .. ", " .. what, mean_s * 1e3, bytes / mean_s / 1e9, best_c / mean_s }
  rows[#rows + 1] = { "y:free(); y = x:silu() (the op alone, block reused at once)", mean_f * 1e3, bytes / mean_f / 1e9, best_c / mean_f }
  rows[#rows + 1] = { "memcpy, same bytes, 1 thread", best_c * 1e3, bytes / best_c / 1e9, 1 }
end
ffi.C.free(src) ffi.C.free(dst)

print(string.format("loom bench_alloc: %d f32 (%d MiB out), %d threads; loop: mean of a round, best of %d rounds",
                    n, half / 2^20, loom.num_threads(), o.rounds))
bench.table({ "what", "ms", "GB/s", "x memcpy" }, rows)
local ok, st = pcall(loom.memory_stats, "cpu")
if ok and st then
  local keys = {}
  for k in pairs(st) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. "=" .. tostring(st[k]) end
  print("cpu memory_stats: " .. table.concat(parts, " "))
end
