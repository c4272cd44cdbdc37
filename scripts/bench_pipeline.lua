-- bench_pipeline.lua: the pipeline bubble per schedule, measured, next to
-- its theoretical fraction (S - 1) / (n + S - 1), and one process running
-- the whole model on the same batch in the same run (the baseline).
--   scripts/loomrun -n 2 scripts/bench_pipeline.lua [--dim 128 --layers 4 --seq 64 --batch 16 --iters 5]
-- bubble = 1 - (this rank's compute seconds) / (step seconds), the mean over
-- the pipeline's ranks; compute is the stage's forward and backward, so
-- time spent waiting for a neighbour (and p2p copies) counts as bubble.
local loom = require("loom")
local dist = require("loom.distributed")
local pp = require("loom.distributed.pipelining")
local bench = require("loom.train.bench")
local Tr = require("loom.models.transformer")
local F = loom.F

local o = bench.args(arg, { dim = 128, layers = 4, seq = 64, batch = 16, iters = 5, vocab = 256, json = "" },
                     "bench_pipeline.lua")
local S, me = dist.world_size(), dist.rank()
local function say(...) if me == 0 then print(string.format(...)) end end
local cfg = { vocab_size = o.vocab, dim = o.dim, n_layers = o.layers, n_heads = 4, max_seq_len = o.seq }
local function loss_fn(out, y) return F.cross_entropy(out:reshape(-1, o.vocab), y:reshape(-1)) end
loom.manual_seed(1)
local x, y = loom.randint(1, o.vocab + 1, { o.batch, o.seq }), loom.randint(1, o.vocab + 1, { o.batch, o.seq })

-- baseline: the whole model in this process (rank 0; the others wait)
local base
if me == 0 then
  loom.manual_seed(2)
  local m = Tr.new(cfg)
  base = bench.time(function() m:zero_grad() loss_fn(m(x), y):backward() end, o.iters)
end
dist.barrier()

say("loom bench_pipeline: pp %d, %d threads per rank; Llama dim %d, %d layers, seq %d, batch %d",
    S, loom.num_threads(), o.dim, o.layers, o.seq, o.batch)
say("one process, whole model, same batch: %.1f ms per step (forward + backward)", (base or 0) * 1e3)
local rows = {}
for _, kind in ipairs { "ScheduleGPipe", "Schedule1F1B" } do
  for _, n in ipairs { 1, 2, 4, 8 } do
    if o.batch % n == 0 then
      loom.manual_seed(2)
      local st = pp.pipeline(Tr.new(cfg), { num_stages = S }):build_stage(me)
      local sched = pp[kind](st, n, loss_fn)
      local steps, bubbles = {}, {}
      for i = 1, o.iters + 1 do
        st.submod:zero_grad()
        dist.barrier()
        sched:step(x, { target = y })
        local c, t = sched:timing()
        if i > 1 then steps[#steps + 1], bubbles[#bubbles + 1] = t, 1 - c / t end   -- the first warms up
      end
      local t = dist.all_reduce(loom.tensor({ bench.median(steps) }, { dtype = "f64" }), "max"):item()
      local b = dist.all_reduce(loom.tensor({ bench.median(bubbles) }, { dtype = "f64" }), "avg"):item()
      rows[#rows + 1] = { kind:gsub("Schedule", ""), n, t * 1e3, b, pp.bubble_fraction(S, n), base and base / t or 0 }
    end
  end
end
-- interleaved: two stages per rank, theory (S-1)/(v n + S-1)
for _, n in ipairs { 2, 4, 8 } do
  if o.batch % n == 0 and n % S == 0 and o.layers >= 2 * S then
    loom.manual_seed(2)
    local pipe = pp.pipeline(Tr.new(cfg), { num_stages = 2 * S })
    local sts = { pipe:build_stage(me), pipe:build_stage(me + S) }
    local sched = pp.ScheduleInterleaved1F1B(sts, n, loss_fn)
    local steps, bubbles = {}, {}
    for i = 1, o.iters + 1 do
      for _, st in ipairs(sts) do st.submod:zero_grad() end
      dist.barrier()
      sched:step(x, { target = y })
      local c, t = sched:timing()
      if i > 1 then steps[#steps + 1], bubbles[#bubbles + 1] = t, 1 - c / t end
    end
    local t = dist.all_reduce(loom.tensor({ bench.median(steps) }, { dtype = "f64" }), "max"):item()
    local b = dist.all_reduce(loom.tensor({ bench.median(bubbles) }, { dtype = "f64" }), "avg"):item()
    rows[#rows + 1] = { "Interleaved1F1B (v=2)", n, t * 1e3, b, (S - 1) / (2 * n + S - 1), base and base / t or 0 }
  end
end
if me == 0 then
  bench.table({ "schedule", "microbatches", "step ms", "bubble measured", "bubble theory", "speed vs 1 process" }, rows)
  if o.json ~= "" then bench.write_json(o.json, { rows = rows, baseline_ms = base * 1e3 }) end
end
