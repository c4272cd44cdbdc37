-- async_tp_spec.lua: async TP (ColwiseParallel / RowwiseParallel with
-- async_tp = true on sequence shards) against the plain sequence-parallel
-- plan and against one process: an MLP Linear(16,32)-ReLU-Linear(32,16)
-- whose input and output are sequence shards (Shard(2)). Compared: the
-- output, the input's and every parameter's gradient, after an SGD step.
-- Tolerance: output and input gradient equal the plain plan within f32
-- rtol 1e-6 / atol 1e-7; weight gradients (sums over chunks instead of one
-- GEMM) and the unsharded MLP within rtol 1e-5 / atol 1e-6.
--   scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist/async_tp_spec.lua
local loom = require "loom"
local dist = require "loom.distributed"
local tp = require "loom.parallel"
local H = require "support.tp"
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

  it("refuses async_tp on layouts it does not overlap, naming the style", function()
    local ok, err = pcall(tp.ColwiseParallel, { async_tp = true })
    assert.is_false(ok)
    assert.matches("ColwiseParallel: async_tp needs input_layouts=Shard(2)", err, 1, true)
    ok, err = pcall(tp.RowwiseParallel, { async_tp = true })
    assert.matches("RowwiseParallel: async_tp needs output_layouts=Shard(2)", err, 1, true)
  end)
end)
