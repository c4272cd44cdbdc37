-- bench_cp_memory.lua: attention memory per rank under context parallelism
-- at a long sequence: one causal attention forward + backward (B=1,
-- --heads heads of 64, --seq tokens, f32) through context_parallel on
-- every rank of the world (cp = world size). Prints this run's row: the
-- peak resident memory each rank added during attention (VmHWM after
-- minus VmRSS before, from /proc/self/status: the CPU allocator keeps no
-- counters, loom.cuda.memory_stats is CUDA's) and the time.
--   for n in 1 2 4; do scripts/loomrun -n $n --quiet-others scripts/bench_cp_memory.lua --seq 8192; done
-- --rotate alltoall: the p2p ring (context_parallel_ring.lua)
local loom = require("loom")
local dist = require("loom.distributed")
local cp = require("loom.distributed.context_parallel")
local bench = require("loom.train.bench")

local o = bench.args(arg, { seq = 8192, heads = 4, iters = 1, rotate = "allgather" }, "bench_cp_memory.lua")
cp.set_rotate_method(o.rotate)
local n, me = dist.world_size(), dist.rank()

local function status_kb(field)
  local f = io.open("/proc/self/status")
  local s = f:read("*a")
  f:close()
  return tonumber(s:match(field .. ":%s*(%d+)"))
end

local mesh = dist.init_device_mesh("cpu", { n }, { mesh_dim_names = { "cp" } })
loom.manual_seed(1)
local shape = { 1, o.heads, o.seq, 64 }
local q, k, v = loom.randn(shape), loom.randn(shape), loom.randn(shape)
local lq, lk, lv = cp.shard_seq(q, 3, n, me), cp.shard_seq(k, 3, n, me), cp.shard_seq(v, 3, n, me)
q, k, v = nil, nil, nil   -- luacheck: ignore 311 (let the collector free them)
collectgarbage()
collectgarbage()
for _, t in ipairs { lq, lk, lv } do t:requires_grad_(true) end
dist.barrier()
local before = status_kb("VmRSS")
local t0 = bench.now()
-- the attention context_parallel puts in place of scaled_dot_product_attention
local out = cp.attention(lq, lk, lv, { is_causal = true },
                         { group = mesh:get_group(1), comm = mesh:get_group(1).comm, size = n, rank = me })
out:sum():backward()
local dt = bench.now() - t0
local peak_mb = (status_kb("VmHWM") - before) / 1024
local worst = dist.all_reduce(loom.tensor({ peak_mb }, { dtype = "f64" }), "max"):item()
local secs = dist.all_reduce(loom.tensor({ dt }, { dtype = "f64" }), "max"):item()
if me == 0 then
  print(string.format("cp %d  %-9s  seq %d  heads %d: attention peak per rank %.0f MiB (scores of T/cp x T: %.0f MiB); %.2f s",
                      n, o.rotate, o.seq, o.heads, worst, o.heads * (o.seq / n) * o.seq * 4 / 2^20, secs))
end
