-- expert_tp_spec.lua: tp.ExpertTensorParallel, a mixture of experts with
-- each expert's hidden dimension cut over the tp ranks (w1, w3 column-wise,
-- w2 row-wise; the output a Partial DTensor the block's layout reduces),
-- against the whole nn.MoE built on every rank from the same seed:
-- forward, the gradients of the input and of every weight (the router's
-- through the partial outputs and through its load-balancing and z
-- losses), one AdamW step and a second forward. On 4 ranks also over a
-- 2-D (ep 2, tp 2) mesh: the experts sharded over ep as well, each ep
-- rank routing its own tokens. Runs on 1, 2 and 4 ranks:
--   scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua -o plainTerminal spec/dist/expert_tp_spec.lua
-- Tolerance: f32 rtol 1.3e-6 / atol 1e-5 (support/tp.lua).
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local H = require("support.tp")
local Replicate, Shard, Partial = dist.Replicate, dist.Shard, dist.Partial

local function moe(aux)
  return loom.nn.MoE { dim = 8, hidden = 12, experts = 4, top_k = 2,
                       aux_loss_coef = aux and 0.05 or 0, router_z_loss_coef = aux and 0.01 or 0 }
end

-- the block's input replicated over tp, its Partial output all-reduced
local function block_layout()
  return tp.PrepareModuleInputOutput { input_layouts = { Replicate() }, desired_input_layouts = { Replicate() },
                                       use_local_input = true, output_layouts = { Replicate() },
                                       desired_output_layouts = { Replicate() }, use_local_output = true }
end

-- a loss of the output with weights that differ by element, and the aux loss
local function loss_of(m, y, wt)
  local l = (y * wt):sum()
  return m.aux_loss and l + m.aux_loss or l
end

describe("ExpertTensorParallel", function()
  it("cuts each expert's hidden dim over tp and equals the whole MoE: forward, gradients, AdamW step", function()
    local mesh = H.world_mesh()
    local ref, m = H.twins(3, moe, true)
    tp.parallelize_module(m, mesh, { experts = tp.ExpertTensorParallel(), [""] = block_layout() })
    local bad = {}
    local want = { w1 = Shard(2), w3 = Shard(2), w2 = Shard(3) }
    for name, pl in pairs(want) do
      local p = m.experts[name]
      if not (dist.is_dtensor(p) and p.placements[1] == pl) then bad[#bad + 1] = "experts." .. name .. " not placed " .. tostring(pl) end
    end
    loom.manual_seed(7)
    local x, wt = loom.randn(2, 5, 8), loom.randn(2, 5, 8)
    local xp, xr = x:clone():requires_grad_(), x:clone():requires_grad_()
    local y, yr = m(xp), ref(xr)
    if dist.is_dtensor(y) then bad[#bad + 1] = "the block's output is a DTensor (its layout asks for a plain one)" end
    H.close(bad, "forward", y, yr)
    H.close(bad, "aux loss", m.aux_loss, ref.aux_loss)
    loss_of(m, y, wt):backward()
    loss_of(ref, yr, wt):backward()
    H.close(bad, "input grad", xp.grad, xr.grad)
    H.compare_params(bad, "backward", m, ref, true)
    H.step_both(bad, loom.optim.AdamW, { lr = 1e-2 }, m, ref)
    H.close(bad, "second forward", m(x), ref(x))
    assert.same({}, bad)
  end)

  it("without the block's layout hands on a Partial DTensor (not a silently partial plain tensor)", function()
    local mesh = H.world_mesh()
    local ref, m = H.twins(5, moe)
    tp.parallelize_module(m.experts, mesh, tp.ExpertTensorParallel())
    loom.manual_seed(1)
    local x = loom.randn(3, 8)
    local y = m(x)
    assert.is_true(dist.is_dtensor(y))
    assert.equal(Partial(), y.placements[1])
    H.assert_close("reduced", y:full_tensor(), ref(x))
  end)

  it("refuses what it cannot cut, naming the module and the sizes", function()
    local mesh = H.world_mesh()
    local ok, e = pcall(tp.parallelize_module, loom.nn.Linear(4, 4), mesh, tp.ExpertTensorParallel())
    assert.is_false(ok)
    assert.matches("ExpertTensorParallel: the module is a Linear; it shards loom.nn.MoEExperts", e, 1, true)
    if H.ws > 1 then
      local odd = loom.nn.MoE { dim = 4, hidden = 2 * H.ws + 1, experts = 2 }
      ok, e = pcall(tp.parallelize_module, odd.experts, mesh, tp.ExpertTensorParallel())
      assert.is_false(ok)
      assert.matches("the experts' hidden size " .. (2 * H.ws + 1) .. " does not divide over " .. H.ws .. " ranks", e, 1, true)
    end
  end)

  if H.ws ~= 4 then return end

  it("over a 2-D (ep 2, tp 2) mesh: each ep rank's tokens equal the whole MoE's rows for them", function()
    local mesh = dist.init_device_mesh("cpu", { 2, 2 }, { mesh_dim_names = { "ep", "tp" } })
    local ref, m = H.twins(9, moe)
    tp.parallelize_module(m.experts, mesh, tp.ExpertTensorParallel())
    tp.parallelize_module(m, mesh["tp"], block_layout())
    local bad = {}
    local p = m.experts.w2
    if not (p.placements[1] == Shard(1) and p.placements[2] == Shard(3)) then bad[#bad + 1] = "w2 not placed (Shard(1), Shard(3))" end
    loom.manual_seed(11)
    local x, wt = loom.randn(4, 3, 8), loom.randn(4, 3, 8)
    local e = mesh:get_local_rank("ep")
    local mine = function(t) return t:narrow(1, 2 * e + 1, 2) end
    local xp, xr = mine(x):clone():requires_grad_(), x:clone():requires_grad_()
    local y, yr = m(xp), ref(xr)
    H.close(bad, "forward", y, mine(yr))
    local l, lr = (y * mine(wt)):sum(), (yr * wt):sum()
    l:backward()
    lr:backward()
    H.close(bad, "input grad", xp.grad, mine(xr.grad))
    -- the router's gradient holds this ep rank's tokens: summed over ep as
    -- data parallelism does; the experts' hold every ep rank's already
    m.gate.weight.grad:copy_(dist.all_reduce(m.gate.weight.grad, "sum", mesh, "ep"))
    H.compare_params(bad, "backward", m, ref, true)
    H.step_both(bad, loom.optim.SGD, { lr = 0.5 }, m, ref)
    assert.same({}, bad)
  end)
end)
