-- fused_ops_spec.lua: the fused ops on DTensors. swiglu (sharding rule:
-- pointwise) and scaled_dot_product_attention's fused path (batch or heads
-- sharded: the attention kernels run on the shards, no collective) against
-- the same ops on the full plain tensors, forward, placements and every
-- input's gradient; AdamW's one-call update of DTensor parameters against
-- the update of the full tensors, shard by shard. f64, tolerance 1e-10
-- absolute (values of order 1). Runs on 1, 2 and 4 ranks (a 2x2 mesh too).
local loom = require("loom")
local dist = require("loom.distributed")
local H = require("support.dist")
local X = require("support.fused")
local F = loom.F

local ws = H.ws
local n, e = ws * 2 + 1, ws * 2   -- an uneven and an even size
local TOL = 1e-10

local function randn(seed, ...) return H.randn(seed, ...):to("f64") end

local function run(m, cases)
  for _, c in ipairs(cases) do
    it(c[1], function()
      local args = {}
      for i, a in ipairs(c.args) do
        args[i] = { full = a[1], pl = H.pl(m.mesh.ndim == 2 and "R " .. a[2] or a[2]) }
      end
      local out_pl = c.out and H.pl(m.mesh.ndim == 2 and "R " .. c.out or c.out) or nil
      local bad = H.op_case({}, c[1], m.mesh, c[2], args, { tol = TOL, out_pl = out_pl, comm = c.comm })
      assert.same({}, bad)
    end)
  end
end

for _, m in ipairs(H.meshes()) do
  describe("fused ops on DTensors, " .. m.name, function()
    local function sdpa(causal)
      return function(q, k, v) return F.scaled_dot_product_attention(q, k, v, { is_causal = causal }) end
    end
    run(m, {
      { "swiglu of two Shard(1) tensors stays Shard(1)", F.swiglu,
        args = { { randn(1, n, 3), "S1" }, { randn(2, n, 3), "S1" } }, out = "S1", comm = { all_gather = 0 } },
      { "swiglu of column-parallel outputs (Shard(-1)) stays Shard(-1)", F.swiglu,
        args = { { randn(3, 2, 3, e), "S-1" }, { randn(4, 2, 3, e), "S-1" } }, out = "S3", comm = { all_gather = 0 } },
      { "swiglu with a replicated up projection follows the gate's shard", F.swiglu,
        args = { { randn(5, n, 4), "S1" }, { randn(6, n, 4), "R" } }, out = "S1", comm = { all_gather = 0 } },
      { "swiglu broadcasting a replicated vector", F.swiglu,
        args = { { randn(7, n, 4), "S1" }, { randn(8, 4), "R" } }, out = "S1", comm = { all_gather = 0 } },
      { "swiglu of a Partial gate reduces it first", F.swiglu,
        args = { { randn(9, n, 4), "P" }, { randn(10, n, 4), "R" } }, out = "R" },
      { "fused causal attention with heads sharded", sdpa(true),
        args = { { randn(11, 2, e, 37, 8), "S2" }, { randn(12, 2, e, 37, 8), "S2" }, { randn(13, 2, e, 37, 8), "S2" } },
        out = "S2", comm = { all_gather = 0, all_reduce = 0 } },
      { "fused attention with the batch sharded, L != S", sdpa(false),
        args = { { randn(14, n, 2, 33, 8), "S1" }, { randn(15, n, 2, 70, 8), "S1" }, { randn(16, n, 2, 70, 5), "S1" } },
        out = "S1", comm = { all_gather = 0, all_reduce = 0 } },
    })

    it("fused attention runs its kernels on the shards (no matmul, no softmax)", function()
      local pl = H.pl(m.mesh.ndim == 2 and "R S2" or "S2")
      local q = dist.distribute_tensor(randn(17, 2, e, 20, 4), m.mesh, pl):requires_grad_(true)
      local y
      X.one_pass({ "matmul", "softmax" }, function() y = F.scaled_dot_product_attention(q, q, q, { is_causal = true }) end,
                 "sharded attention forward")
      X.one_pass({ "matmul", "softmax" }, function() y:sum():backward() end, "sharded attention backward")
    end)
  end)
end

describe("AdamW on DTensor parameters, one call", function()
  it("updates each shard as the full update would (Shard and Replicate parameters)", function()
    local mesh = H.meshes()[1].mesh
    local fulls = { randn(20, n, 5), randn(21, 3, e), randn(22, 4) }
    local grads = { randn(23, n, 5), randn(24, 3, e), randn(25, 4) }
    local pls = { { dist.Shard(1) }, { dist.Shard(2) }, { dist.Replicate() } }
    local plain, dts = {}, {}
    for i = 1, 3 do
      plain[i] = fulls[i]:clone():requires_grad_(true)
      plain[i].grad = grads[i]:clone()
      dts[i] = dist.distribute_tensor(fulls[i]:clone(), mesh, pls[i]):requires_grad_(true)
      dts[i].grad = dist.distribute_tensor(grads[i]:clone(), mesh, pls[i])
    end
    local o1, o2 = loom.optim.AdamW(plain, { lr = 0.01 }), loom.optim.AdamW(dts, { lr = 0.01 })
    local bad = {}
    for _ = 1, 2 do
      o1:step()
      local k = X.calls({ "_adamw_multi_", "_adamw_" }, function() o2:step() end)
      if k._adamw_multi_ ~= 1 or k._adamw_ ~= 0 then bad[#bad + 1] = "expected one _adamw_multi_ call" end
    end
    for i = 1, 3 do H.check_dt(bad, "parameter " .. i, dts[i], plain[i]:detach(), TOL, pls[i]) end
    assert.same({}, bad)
  end)
end)
