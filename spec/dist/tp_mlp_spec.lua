-- tp_mlp_spec.lua: PyTorch's MLP tensor-parallel test (test_tp_examples.py)
-- re-expressed: Linear(10,16)-ReLU-Linear(16,10), net1 Colwise and net2
-- Rowwise, against the unsharded MLP built on every rank from the same seed.
-- Runs on 1, 2 and 4 ranks:
--   luajit scripts/run_specs.lua spec/dist
--   scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist
-- Tolerance: f32 rtol 1.3e-6 / atol 1e-5 (support/tp.lua).
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local H = require("support.tp")
local nn, Shard, Replicate = loom.nn, dist.Shard, dist.Replicate
local mesh = H.world_mesh()

local function MLP() return H.MLP(10, 16) end

describe("TP MLP (PyTorch's test_mlp_training)", function()
  it("forward, gradients, one SGD step and a second forward equal the unsharded MLP", function()
    local ref, m = H.twins(5, MLP)
    tp.parallelize_module(m, mesh, { net1 = tp.ColwiseParallel{}, net2 = tp.RowwiseParallel{} })
    local bad = {}
    -- parameters are sharded as PyTorch shards them (Shard(0) there is Shard(1) here)
    local want_pl = { ["net1.weight"] = Shard(1), ["net1.bias"] = Shard(1), ["net2.weight"] = Shard(2),
                      ["net2.bias"] = Replicate() }
    for fqn, pl in pairs(want_pl) do
      local p = H.param(m, fqn)
      if not dist.is_dtensor(p) then bad[#bad + 1] = fqn .. " is not a DTensor"
      elseif not (p.placements[1] == pl) then
        bad[#bad + 1] = string.format("%s placed %s, want %s", fqn, tostring(p.placements[1]), tostring(pl))
      end
      if not p.requires_grad then bad[#bad + 1] = fqn .. " lost requires_grad" end
    end
    H.compare_params(bad, "initial", m, ref, false, 0, 0)
    loom.manual_seed(0)
    local x = loom.rand(8, 10)
    local y, yr = m(x), ref(x)
    if dist.is_dtensor(y) then bad[#bad + 1] = "output is a DTensor (use_local_output=true wants a plain tensor)" end
    H.close(bad, "forward", y, yr)
    y:sum():backward()
    yr:sum():backward()
    H.compare_params(bad, "backward", m, ref, true)
    -- gradients keep the parameters' placements
    for fqn, pl in pairs(want_pl) do
      local g = H.param(m, fqn).grad
      if g and not (dist.is_dtensor(g) and g.placements[1] == pl) then
        bad[#bad + 1] = fqn .. ".grad placed " .. (dist.is_dtensor(g) and tostring(g.placements[1]) or "plain")
      end
    end
    H.step_both(bad, loom.optim.SGD, { lr = 0.25 }, m, ref)
    H.close(bad, "second forward", m(x), ref(x))
    assert.same({}, bad)
  end)

  it("trains for several steps on fresh inputs like the unsharded MLP", function()
    local ref, m = H.twins(11, MLP)
    tp.parallelize_module(m, mesh, { net1 = tp.ColwiseParallel{}, net2 = tp.RowwiseParallel{} })
    local opt, opt_r = loom.optim.SGD(m:parameters(), { lr = 0.25 }), loom.optim.SGD(ref:parameters(), { lr = 0.25 })
    local bad = {}
    for step = 1, 3 do
      loom.manual_seed(40 + step)
      local x = loom.rand(8, 10)
      opt:zero_grad()
      opt_r:zero_grad()
      local l, lr = m(x):pow(2):mean(), ref(x):pow(2):mean()
      l:backward()
      lr:backward()
      H.close(bad, "loss at step " .. step, l, lr)
      opt:step()
      opt_r:step()
    end
    H.compare_params(bad, "after 3 steps", m, ref, false)
    assert.same({}, bad)
  end)

  it("the MLP forward issues exactly one all_reduce and nothing else", function()
    local _, m = H.twins(5, MLP)
    tp.parallelize_module(m, mesh, { net1 = tp.ColwiseParallel{}, net2 = tp.RowwiseParallel{} })
    local x = loom.rand(8, 10)
    local cm, y = dist.comm_mode(function() return m(x) end)
    assert.equal(1, cm.counts.all_reduce)
    assert.equal(1, cm:get_total_counts())
    -- backward: the Colwise input is replicated, so its gradient is Partial and
    -- is all-reduced once (the Rowwise input gradient stays sharded)
    local cmb = dist.comm_mode(function() y:sum():backward() end)
    assert.equal(0, cmb.counts.all_gather)
    assert.equal(0, cmb.counts.reduce_scatter)
  end)

  it("a Colwise Linear(16, 16) on a replicated input issues no collective in forward", function()
    local ref, lin = H.twins(7, nn.Linear, 16, 16)
    -- keep the output sharded: no gather either
    tp.parallelize_module(lin, mesh, tp.ColwiseParallel{})
    local x = loom.rand(4, 16)
    local cm, y = dist.comm_mode(function() return lin(x) end)
    assert.equal(0, cm:get_total_counts())
    assert.is_false(dist.is_dtensor(y))
    -- the plain output is this rank's column block of the full product
    local bad = {}
    H.close(bad, "local output", y, H.chunk_of(ref(x):detach(), 2, H.ws, H.rank))
    assert.same({}, bad)
  end)
end)
