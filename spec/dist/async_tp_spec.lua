-- async_tp_spec.lua: async TP (ColwiseParallel / RowwiseParallel with
-- async_tp = true on sequence shards) against the plain sequence-parallel
-- plan and against one process: an MLP Linear(16,32)-ReLU-Linear(32,16)
-- whose input and output are sequence shards (Shard(2)). Compared: the
-- output, the input's and every parameter's gradient, after an SGD step.
-- Tolerance: output and input gradient equal the plain plan within f32
-- rtol 1e-6 / atol 1e-7; weight gradients (sums over chunks instead of one
-- GEMM) and the unsharded MLP within rtol 1e-5 / atol 1e-6. A Llama block
-- (train.lua's --async-tp layout: wq/wk/wv and w1/w3 share one chunked
-- gather per module) against the plain plan: output rtol 1e-6 / atol 1e-7,
-- input and weight gradients rtol 1e-5 / atol 1e-6; bytes counted.
--   scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist/async_tp_spec.lua
local loom = require("loom")
local dist = require("loom.distributed")
local tp = require("loom.parallel")
local H = require("support.tp")
local Shard = dist.Shard

local ws, me = dist.world_size(), dist.rank()

local function MLP() return H.MLP(16, 32) end

local function plan(async)
  return { net1 = tp.ColwiseParallel { input_layouts = Shard(2), async_tp = async },
           net2 = tp.RowwiseParallel { output_layouts = Shard(2), async_tp = async } }
end

-- output shard, input grad shard, params after one SGD step of the MLP
local function run(m, x)
  local lx = x:chunk(ws, 2)[me + 1]:contiguous():requires_grad_(true)
  local y = m(lx)
  loom.manual_seed(4)
  local w = loom.randn(x:size(1), x:size(2), 16):chunk(ws, 2)[me + 1]
  ;(y * w):sum():backward()
  return y, lx.grad
end

describe("async TP", function()
  if ws < 2 then return end
  local mesh = H.world_mesh()

  it("forward, gradients and an SGD step equal the plain sequence-parallel plan and one process", function()
    loom.manual_seed(2)
    local x = loom.randn(2, 8 * ws, 16)
    local ref, plain = H.twins(5, MLP)
    local _, async = H.twins(5, MLP)
    tp.parallelize_module(plain, mesh, plan(false))
    tp.parallelize_module(async, mesh, plan(true))
    local yp, gp = run(plain, x)
    local ya, ga = run(async, x)
    -- one process: the same loss on the whole sequence
    local rx = x:clone():requires_grad_(true)
    loom.manual_seed(4)
    local yr = ref(rx)
    ;(yr * loom.randn(x:size(1), x:size(2), 16)):sum():backward()
    local bad = {}
    H.close(bad, "output vs plain", ya, yp, 1e-6, 1e-7)
    H.close(bad, "input grad vs plain", ga, gp, 1e-6, 1e-7)
    H.close(bad, "output vs one process", ya, yr:chunk(ws, 2)[me + 1], 1e-5, 1e-6)
    H.close(bad, "input grad vs one process", ga, rx.grad:chunk(ws, 2)[me + 1], 1e-5, 1e-6)
    for _, fqn in ipairs { "net1.weight", "net1.bias", "net2.weight", "net2.bias" } do
      H.close(bad, fqn .. ".grad vs plain", H.param(async, fqn).grad, H.full(H.param(plain, fqn).grad), 1e-5, 1e-6)
      H.close(bad, fqn .. ".grad vs one process", H.param(async, fqn).grad, H.param(ref, fqn).grad, 1e-5, 1e-6)
    end
    loom.optim.SGD(async:parameters(), { lr = 0.5 }):step()
    loom.optim.SGD(ref:parameters(), { lr = 0.5 }):step()
    H.compare_params(bad, "after step", async, ref, false, 1e-5, 1e-6)
    assert.same({}, bad)
  end)

  -- a Llama block (attention + SwiGLU feed-forward) on sequence shards: the
  -- plain sequence-parallel plan against the async_tp one (train.lua's
  -- --async-tp), whose column-wise side gathers the normed input once per
  -- module
  local Tr = require("loom.models.transformer")
  local function block_plan(async)
    local full = Tr.tp_plan { sequence_parallel = true, async_tp = async, tp = ws }
    local p = {}
    for k, v in pairs(full) do
      local sub = k:match("^layers%.%*%.(.+)$")
      if sub then p[sub] = v end
    end
    return p
  end
  local cfg = Tr.config { vocab_size = 8, dim = 32, n_layers = 1, n_heads = 4, max_seq_len = 16 }
  local function run_block(async)
    loom.manual_seed(7)
    local b = Tr.TransformerBlock(cfg)
    tp.parallelize_module(b, mesh, block_plan(async))
    loom.manual_seed(8)
    local x = loom.randn(2, 4 * ws, cfg.dim)
    local w = loom.randn(2, 4 * ws, cfg.dim):chunk(ws, 2)[me + 1]
    local cos, sin = loom.F.rope_tables(4 * ws, cfg.dim / cfg.n_heads)
    local lx = x:chunk(ws, 2)[me + 1]:contiguous():requires_grad_(true)
    local y
    local fw = dist.comm_mode(function() y = b(lx, cos, sin) end)
    local ly = dist.is_dtensor(y) and y:to_local() or y
    local bw = dist.comm_mode(function() (ly * w):sum():backward() end)
    return b, ly, lx.grad, fw, bw
  end

  it("a Llama block: output, input and weight gradients equal the plain plan; one gather per module", function()
    local bp, yp, gp, fwp, bwp = run_block(false)
    local ba, ya, ga, fwa, bwa = run_block(true)
    local bad = {}
    H.close(bad, "block output vs plain", ya, yp, 1e-6, 1e-7)
    H.close(bad, "block input grad vs plain", ga, gp, 1e-5, 1e-6)
    for _, kv in ipairs(bp:named_parameters()) do
      H.close(bad, kv[1] .. ".grad vs plain", H.param(ba, kv[1]).grad, H.full(kv[2].grad), 1e-5, 1e-6)
    end
    assert.same({}, bad)
    if me == 0 then
      io.stderr:write(string.format("[async_tp_spec] tp %d block fwd plain %s\n  fwd async %s\n  bwd plain %s\n  bwd async %s\n",
                                    ws, tostring(fwp), tostring(fwa), tostring(bwp), tostring(bwa)))
    end
    -- forward: no all-gather left; p2p moves what the plain plan's two
    -- all-gathers (attention, feed-forward) and two reduce-scatters (wo,
    -- w2) move per rank: (tp-1) shards each, not three (two) times that
    local shard = 2 * 4 * cfg.dim * 4   -- (B, T/tp, dim) f32 bytes
    assert.equal(2, fwp.counts.all_gather)
    assert.equal(2 * shard, fwp.bytes.all_gather)
    assert.equal(0, fwa.counts.all_gather)
    assert.equal(0, fwa.counts.reduce_scatter)
    assert.equal(4 * (ws - 1), fwa.counts.send)
    assert.equal((ws - 1) * (fwp.bytes.all_gather + fwp.bytes.reduce_scatter / ws), fwa.bytes.send)
    -- backward: the plain plan sums the gathered input's gradient over
    -- ranks once per module (its column-wise Linears share one guard:
    -- wq, wk, wv and w1, w3, 2 all-reduces of the gathered input; one per
    -- Linear, 5, before they shared it); the shared gather reduce-scatters
    -- it once per module (2). The 2 all-reduces left are the norms' weights
    -- (dim f32).
    assert.equal(4, bwp.counts.all_reduce)
    assert.equal(2 * ws * shard + 2 * cfg.dim * 4, bwp.bytes.all_reduce)
    assert.equal(2, bwa.counts.all_reduce)
    assert.equal(2 * cfg.dim * 4, bwa.bytes.all_reduce)
    assert.equal(2, bwa.counts.reduce_scatter)
    assert.equal(2 * ws * shard, bwa.bytes.reduce_scatter)
    assert.equal(bwp.bytes.all_gather, bwa.bytes.all_gather)
  end)

  it("refuses async_tp on layouts it does not overlap, naming the style", function()
    local ok, err = pcall(tp.ColwiseParallel, { async_tp = true })
    assert.is_false(ok)
    assert.matches("ColwiseParallel: async_tp needs input_layouts=Shard(2)", err, 1, true)
    ok, err = pcall(tp.RowwiseParallel, { async_tp = true })
    assert.is_false(ok)
    assert.matches("RowwiseParallel: async_tp needs output_layouts=Shard(2)", err, 1, true)
  end)

  it("AsyncTPInput refuses bad consumers, a consumer not parallelized async, and a consumer called twice", function()
    local ok, err = pcall(tp.AsyncTPInput, {})
    assert.is_false(ok)
    assert.matches("AsyncTPInput: consumers expected a list of child names, got nil", err, 1, true)
    ok, err = pcall(tp.AsyncTPInput, { consumers = { "w1", 3 } })
    assert.is_false(ok)
    assert.matches("AsyncTPInput: consumers[2] expected a child name (string), got number", err, 1, true)
    -- w3 left plain: the hook names it instead of gathering for it
    local ff = Tr.FeedForward(cfg)
    tp.parallelize_module(ff, mesh, { [""] = tp.AsyncTPInput { consumers = { "w1", "w3" } },
                                      w1 = tp.ColwiseParallel { input_layouts = Shard(2), async_tp = true },
                                      w3 = tp.ColwiseParallel {} })
    local x = loom.randn(2, 4, cfg.dim)
    ok, err = pcall(ff, x)
    assert.is_false(ok)
    assert.matches("AsyncTPInput: the module.w3 must be a Linear parallelized by ColwiseParallel", err, 1, true)
    -- a forward that calls a consumer twice gets an error, not the placeholder's zeros
    local twice = Tr.FeedForward(cfg)
    twice.forward = function(self, h) return self.w1(h) + self.w1(h) end
    tp.parallelize_module(twice, mesh, { [""] = tp.AsyncTPInput { consumers = { "w1" } },
                                         w1 = tp.ColwiseParallel { input_layouts = Shard(2), async_tp = true } })
    ok, err = pcall(twice, x)
    assert.is_false(ok)
    assert.matches("this Linear's product was already used", err, 1, true)
  end)
end)
