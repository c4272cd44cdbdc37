-- bench_dtensor.lua: per-op dispatch overhead of DTensor ops (sharding rule,
-- placements, the shard-local op) next to the same op on plain tensors of
-- the shard's size, for a cache hit and for a first call (cache cleared).
-- Usage: scripts/loomrun -n 4 --quiet-others scripts/bench_dtensor.lua
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_dtensor%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require("loom")
local dist = require("loom.distributed")
local bench = require("loom.train.bench")
local C = loom.C
bench.args(arg, {}, "bench_dtensor.lua")   -- (no flags: --help says so)

local Shard, Replicate = dist.Shard, dist.Replicate
local mesh = dist.init_device_mesh("cpu", { dist.world_size() })
local ws = dist.world_size()

local function time(fn, n, clear)
  local ts = {}
  for i = 1, n do
    if clear then C.lm_dtensor_rule_cache_clear() end
    local t0 = bench.now()
    fn()
    ts[i] = bench.now() - t0
  end
  return bench.median(ts) * 1e6
end

local rows = {}
for _, n in ipairs { 4, 512 } do
  local a, b = loom.randn(n, n * ws), loom.randn(n, n * ws)
  local da = dist.distribute_tensor(a, mesh, { Shard(2) })
  local db = dist.distribute_tensor(b, mesh, { Shard(2) })
  local la, lb = da:to_local(), db:to_local()
  local reps = n == 4 and 20000 or 200
  for _, case in ipairs {
    { "add", function() return la + lb end, function() return da + db end },
    { "matmul R x S(2)", function() return a:narrow(2, 1, n):matmul(lb) end,
      function() return da:full_tensor():narrow(2, 1, n) end },
  } do
    if case[1] == "matmul R x S(2)" then -- x (n, n) replicated times the column shard of w
      local x = loom.randn(n, n)
      local dx = dist.distribute_tensor(x, mesh, { Replicate() })
      local w = dist.distribute_tensor(loom.randn(n, n * ws), mesh, { Shard(2) })
      local lw = w:to_local()
      case[2] = function() return x:matmul(lw) end
      case[3] = function() return dx:matmul(w) end
    end
    for _ = 1, 3 do case[2]() case[3]() end
    local plain = time(case[2], reps)
    local hit = time(case[3], reps)
    local miss = time(case[3], math.max(50, reps / 20), true)
    rows[#rows + 1] = { string.format("%s %dx%d", case[1], n, n * ws), plain, hit, hit - plain, miss, miss - plain }
  end
end
local h, m = require("ffi").new("int64_t[1]"), require("ffi").new("int64_t[1]")
C.lm_dtensor_rule_stats(h, m)
if dist.rank() == 0 then
  print(string.format("DTensor dispatch on %d ranks (median us per call; the plain op runs on the shard)", ws))
  bench.table({ "op (global size)", "plain", "DTensor hit", "overhead", "first call", "overhead" }, rows)
  print(string.format("rule cache: %d hits, %d misses", tonumber(h[0]), tonumber(m[0])))
end
