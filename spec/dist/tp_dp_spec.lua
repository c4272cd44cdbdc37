-- tp_dp_spec.lua: tensor parallelism composed with data parallelism on a
-- 2-D {dp, tp} mesh: parallelize_module on mesh["tp"] and tp.replicate on
-- mesh["dp"] (in either order), 5 AdamW steps with clip_grad_norm_, equal
-- to one process fed the dp-times larger batch; clip_grad_norm_ on DTensor
-- gradients returns the global norm of the unsharded model.
-- The mesh is 2x2 on 4 ranks; on 2 ranks both 2x1 (pure DP) and 1x2 (pure
-- TP) run, on 1 rank 1x1: the same equality at every size.
-- Tolerance: f32 rtol 1.3e-6 / atol 1e-5 (norms: rtol 1e-5, they are sums
-- of squares taken in a different order).
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local H = require("support.tp")
local nn, tr, clip = loom.nn, loom.models.transformer, loom.nn.utils.clip_grad_norm_

local meshes = H.dp_tp_meshes()
local cfg = H.TINY_LLAMA
local close_num = H.close_num

describe("TP x DP", function()
  for _, mm in ipairs(meshes) do
    for _, order in ipairs { "parallelize then replicate", "replicate then parallelize" } do
      local name = string.format("%dx%d mesh, %s: 5 steps with clip_grad_norm_ equal one process on the %dx batch",
                                 mm.shape[1], mm.shape[2], order, mm.shape[1])
      it(name, function()
        local mesh = mm.mesh
        local ref, m = H.twins(3, tr.new, cfg)
        local plan = tr.tp_plan({ sequence_parallel = true, loss_parallel = true, tp = mesh:size("tp") }, m)
        if order:match("^parallelize") then
          tp.parallelize_module(m, mesh["tp"], plan)
          tp.replicate(m, mesh["dp"])
        else
          tp.replicate(m, mesh["dp"])
          tp.parallelize_module(m, mesh["tp"], plan)
        end
        local bad = {}
        H.train_vs_one(bad, mesh, ref, m, 5, H.llama_batch, H.llama_loss)
        H.compare_params(bad, "after 5 steps", m, ref, false)
        assert.same({}, bad)
      end)
    end
  end
end)

describe("clip_grad_norm_ on DTensor gradients", function()
  local mesh = H.world_mesh()
  local MLP = nn.Module:extend("ClipMLP")
  function MLP:__init() self.net1 = nn.Linear(10, 16) self.net2 = nn.Linear(16, 10) end
  function MLP:forward(x) return self.net2(loom.F.relu(self.net1(x))) end

  it("returns the global norm of the unsharded model on every rank and clips alike", function()
    local ref, m = H.twins(5, MLP)
    tp.parallelize_module(m, mesh, { net1 = tp.ColwiseParallel{}, net2 = tp.RowwiseParallel{} })
    loom.manual_seed(6)
    local x = loom.rand(8, 10)
    m(x):sum():backward()
    ref(x):sum():backward()
    local nr = clip(ref:parameters(), 0.1)
    local cm, n = dist.comm_mode(function() return clip(m:parameters(), 0.1) end)
    local bad = {}
    close_num(bad, "norm", n, nr, 1e-6)
    -- one all-reduce for the sharded gradients (net2.bias is replicated: counted once)
    if cm.counts.all_reduce ~= 1 then bad[#bad + 1] = "all_reduces: " .. cm.counts.all_reduce .. ", want 1" end
    H.compare_params(bad, "clipped", m, ref, true)
    -- every rank agrees on the norm
    local all = dist.all_gather(loom.tensor({ n }, { dtype = "f64" }), 1, mesh, 1)
    if (all - n):abs():max():item() ~= 0 then bad[#bad + 1] = "ranks disagree on the norm" end
    assert.same({}, bad)
  end)

  it("an uneven shard (7 output features) and a frozen parameter", function()
    local ref, m = H.twins(7, nn.Linear, 5, 7)
    ref.bias:requires_grad_(false)
    m.bias:requires_grad_(false)
    tp.parallelize_module(m, mesh, tp.ColwiseParallel{ output_layouts = dist.Replicate() })
    local x = loom.rand(3, 5)
    m(x):pow(2):sum():backward()
    ref(x):pow(2):sum():backward()
    local bad = {}
    close_num(bad, "norm", clip(m:parameters(), 1e9), clip(ref:parameters(), 1e9), 1e-6)
    assert.same({}, bad)
  end)
end)
