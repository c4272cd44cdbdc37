-- bench_curves.lua: one point of loom's cost curves, appended as a JSON line
-- to --out: the step time (slowest rank's median) and tokens/s of a
-- Llama-style model at one size and one layout (--tp N: tensor parallel;
-- --fsdp: fully sharded data parallel over every rank; neither on one rank:
-- plain), the CPU allocator's live bytes after a step and peak bytes (the
-- unsharded model built first included) per rank, and the bytes each rank's
-- collectives took as input in one step, measured (dist.comm_mode) next to
-- the count predicted from the layout. With --dtype f32,bf16 one line per
-- dtype (bf16: mixed precision, autocast, as PyTorch's), each with PyTorch
-- eager in the same dtype beside it. scripts/bench_curves.sh runs the
-- sweep and draws the plots. Usage:
--   [scripts/loomrun -n N] luajit scripts/bench_curves.lua --size 10M [--tp N | --fsdp] [--dtype f32,bf16] --out FILE
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_curves%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local loom = require("loom")
local bench = require("loom.train.bench")

local o = bench.args(arg, { size = "0.8M", tp = 1, fsdp = false, steps = 3, warmup = 1, out = "", dtype = "f32" },
                     "bench_curves.lua")
-- the sizes of the curves: dim, layers, heads, vocab, seq, batch
local SIZES = {
  ["0.8M"] = { dim = 128, layers = 4, heads = 4, vocab = 65, seq = 64, batch = 12 },
  ["10M"] = { dim = 320, layers = 8, heads = 8, vocab = 2048, seq = 128, batch = 8 },
  ["97M"] = { dim = 768, layers = 12, heads = 12, vocab = 8192, seq = 256, batch = 4 },
  ["350M"] = { dim = 1024, layers = 26, heads = 16, vocab = 8192, seq = 256, batch = 4 },
}
local c = SIZES[o.size] or error("bench_curves.lua: --size expected one of 0.8M, 10M, 97M, 350M, got " .. o.size, 0)

local multi = os.getenv("OMPI_COMM_WORLD_SIZE") ~= nil
local dist = multi and require("loom.distributed") or nil
local world, rank = multi and dist.world_size() or 1, multi and dist.rank() or 0
local tr = loom.models.transformer
loom.manual_seed(0)
local model = tr.new { vocab_size = c.vocab, dim = c.dim, n_layers = c.layers, n_heads = c.heads, max_seq_len = c.seq }
local nparams = 0
for _, p in ipairs(model:parameters()) do nparams = nparams + p:numel() end
local layout, batch = "plain", c.batch
if multi and o.fsdp then
  layout = "fsdp"
  local fsdp = require("loom.distributed.fsdp")
  local mesh = dist.init_device_mesh("cpu", { world }, { mesh_dim_names = { "dp" } })
  for _, block in model.layers:ipairs() do fsdp.fully_shard(block, { mesh = mesh }) end
  fsdp.fully_shard(model, { mesh = mesh })
  batch = c.batch / world                    -- the global batch stays c.batch
elseif multi then
  layout = "tp"
  local tp = require("loom.parallel")
  local mesh = dist.init_device_mesh("cpu", { world }, { mesh_dim_names = { "tp" } })
  tp.parallelize_module(model, mesh, tr.tp_plan({ loss_parallel = true, tp = world }, model), { src_data_rank = false })
end
local opt = loom.optim.AdamW(model:parameters(), { lr = 1e-3 })
loom.manual_seed(1 + (layout == "fsdp" and rank or 0))
local x = loom.randint(1, c.vocab + 1, { batch, c.seq })
local y = loom.randint(1, c.vocab + 1, { batch, c.seq })
local function step(dtype)
  opt:zero_grad()
  local function fb() loom.F.cross_entropy(model(x), y):backward() end
  local function run() if dtype == "f32" then fb() else loom.autocast(dtype, fb) end end
  if layout == "tp" then require("loom.parallel").loss_parallel(run) else run() end
  opt:step()
end

-- the step's median seconds in dtype (the slowest rank's) and the bytes
-- each rank's collectives took in its first timed step
local function timed(dtype)
  for _ = 1, o.warmup do step(dtype) end
  local times, comm_bytes = {}, 0
  for i = 1, o.steps do
    if multi then dist.barrier() end
    local t0 = bench.now()
    if multi and i == 1 then
      local cm = dist.comm_mode(function() step(dtype) end)
      for _, b in pairs(cm.bytes) do comm_bytes = comm_bytes + b end
    else
      step(dtype)
    end
    times[i] = bench.now() - t0
  end
  local step_s = bench.median(times)
  if multi then   -- the slowest rank's median
    local t = loom.tensor({ step_s }, { dtype = "f64" })
    dist.all_reduce(t, "max")
    step_s = t:totable()[1]
  end
  return step_s, comm_bytes
end

-- bytes each rank's collectives take as input in a step, from the layout.
-- TP (loss parallel): an all-reduce of the (batch, seq, dim) activations
-- after each row-parallel linear forward (wo, w2), and in backward one per
-- block input (wq, wk, wv share one, w1 and w3 another: Megatron's 4 per
-- layer), plus the embedding's forward and the output head's input
-- gradient: (4 layers + 2) activations. FSDP: each block's shard all-gathered for
-- forward and again for backward, the full gradients reduce-scattered.
local act = c.batch * c.seq * c.dim * 4
local predicted = 0
if layout == "tp" then predicted = (4 * c.layers + 2) * act
elseif layout == "fsdp" then predicted = 2 * nparams * 4 / world + nparams * 4 end

-- PyTorch eager on the same config, steps and dtype, one rank
-- (scripts/bench_torch_train.py), where LOOM_BENCH_PYTHON (default python3)
-- imports torch
local function torch_ms(dtype)
  if layout ~= "plain" then return nil end
  local py = os.getenv("LOOM_BENCH_PYTHON") or "python3"
  if os.execute(py .. " -c 'import torch' >/dev/null 2>&1") ~= 0 then return nil end
  local f = io.popen(string.format("OMP_WAIT_POLICY=PASSIVE %s %sscripts/bench_torch_train.py --layers %d --dim %d " ..
                                   "--heads %d --seq %d --batch %d --steps %d --vocab %d --threads %d --dtype %s", py,
                                   root, c.layers, c.dim, c.heads, c.seq, c.batch, o.steps + o.warmup, c.vocab,
                                   loom.num_threads(), dtype))
  local out = f:read("*a")
  f:close()
  local ok, r = pcall(require("dkjson").decode, out:match("{.*}") or "")
  return ok and type(r) == "table" and r.step_ms or nil
end

local cpu = io.popen("lscpu | grep 'Model name' | sed 's/.*: *//'"):read("*l") or "?"
for dtype in o.dtype:gmatch("[^,]+") do
  if dtype ~= "f32" and dtype ~= "bf16" then
    error("bench_curves.lua: --dtype expected f32 or bf16 (comma-separated), got " .. dtype, 0)
  end
  local step_s, comm_bytes = timed(dtype)
  local pt = torch_ms(dtype)
  collectgarbage()
  local mem = loom.memory_stats("cpu")   -- live after a step: parameters, gradients, optimizer state
  local rec = { size = o.size, params = nparams, layout = layout, ranks = world, dtype = dtype, step_ms = step_s * 1e3,
                tokens_per_s = c.batch * c.seq / step_s, live_bytes = mem.allocated, peak_bytes = mem.peak,
                comm_bytes = comm_bytes, predicted_comm_bytes = predicted,
                torch_step_ms = pt, torch_tokens_per_s = pt and c.batch * c.seq / (pt / 1e3), cpu = cpu }
  if rank == 0 then
    local line = require("dkjson").encode(rec)
    print(line)
    if o.out ~= "" then
      local f = assert(io.open(o.out, "a"))
      f:write(line, "\n")
      f:close()
    end
  end
end
