-- fsdp_errors_spec.lua: bad input to fully_shard is a Lua error naming
-- the argument or the parameter, raised on every rank before any
-- collective (so no rank is left waiting): a mesh that is not 1-D or
-- missing, a mesh of dp x tp that is not the world, options of the wrong
-- kind, a module sharded twice or from the outside in, replicate() and
-- fully_shard together, parameters parallelised on an unrelated mesh or on
-- the dp dim itself, on a 2-D mesh holding the dp dim, Partial or scalar parameters, and
-- parameters replaced after fully_shard. Runs on 1, 2 and 4 ranks.
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local fsdp = require("loom.distributed.fsdp")
local H = require("support.tp")
local X = require("support.misuse")
local nn = loom.nn

local ws = H.ws
local mesh = dist.init_device_mesh("cpu", { ws, 1 }, { mesh_dim_names = { "dp", "tp" } })
local other = dist.init_device_mesh("cpu", { 1, ws }, { mesh_dim_names = { "dp", "tp" } })
local err_of, has = X.error_of, X.has

local MLP = nn.Module:extend("ErrMLP")
function MLP:__init() self.net1 = nn.Linear(4, 6) self.net2 = nn.Linear(6, 4) end
function MLP:forward(x) return self.net2(self.net1(x)) end

describe("fully_shard rejects", function()
  it("a mesh that is not 1-D, or none", function()
    has(err_of(fsdp.fully_shard, MLP(), { mesh = mesh }), "fully_shard: mesh expected a 1-D DeviceMesh",
        "got 2-D DeviceMesh")
    has(err_of(fsdp.fully_shard, MLP(), {}), "fully_shard: mesh expected a 1-D DeviceMesh", "got nil")
    has(err_of(fsdp.fully_shard, MLP(), { mesh = "dp" }), "mesh expected", "got \"dp\"")
  end)

  it("a mesh whose dp x tp does not make the world (at init_device_mesh)", function()
    has(err_of(dist.init_device_mesh, "cpu", { ws + 1, 2 }, { mesh_dim_names = { "dp", "tp" } }),
        string.format("mesh_shape {%d, 2} holds %d ranks, but the world has %d", ws + 1, 2 * ws + 2, ws))
  end)

  it("a module that is not one, options of the wrong kind", function()
    has(err_of(fsdp.fully_shard, {}, { mesh = mesh["dp"] }), "fully_shard: module expected an nn.Module")
    has(err_of(fsdp.fully_shard, MLP(), { mesh = mesh["dp"], reshard = true }), "unknown option reshard")
    has(err_of(fsdp.fully_shard, MLP(), { mesh = mesh["dp"], reshard_after_forward = 1 }),
        "reshard_after_forward expected a boolean")
    has(err_of(fsdp.fully_shard, MLP(), 3), "fully_shard: options expected a table")
  end)

  it("a module sharded twice, or its submodule after it", function()
    local m = MLP()
    fsdp.fully_shard(m, { mesh = mesh["dp"] })
    has(err_of(fsdp.fully_shard, m, { mesh = mesh["dp"] }), "the ErrMLP is already sharded by fully_shard")
    has(err_of(fsdp.fully_shard, m.net1, { mesh = mesh["dp"] }), "parameter weight is managed by fully_shard on an "
        .. "enclosing module already", "blocks first, then to the root")
  end)

  it("replicate() and fully_shard on one model", function()
    local m = MLP()
    tp.replicate(m, mesh["dp"])
    has(err_of(fsdp.fully_shard, m, { mesh = mesh["dp"] }), "data-parallel by replicate() already")
  end)

  it("parameters parallelised on a mesh that is not the other dim of fully_shard's", function()
    local m = MLP()
    tp.parallelize_module(m, other["tp"], { net1 = tp.ColwiseParallel{}, net2 = tp.RowwiseParallel{} })
    has(err_of(fsdp.fully_shard, m, { mesh = mesh["dp"] }), "parameter net1.weight is a DTensor on DeviceMesh",
        "must be a slice of the same device mesh")
    local n = MLP()
    tp.parallelize_module(n, mesh["dp"], { net1 = tp.ColwiseParallel{}, net2 = tp.RowwiseParallel{} })
    has(err_of(fsdp.fully_shard, n, { mesh = mesh["dp"] }), "parameter net1.weight", "on other dims")
    -- nothing was changed by the failed calls
    assert.is_nil(rawget(m, "_fsdp"))
    assert.equal(1, #m.net1.weight.placements)
  end)

  it("parameters on a 2-D mesh holding the dp dim, Partial ones and scalars", function()
    local m = nn.Linear(4, 4)
    m.weight = dist.distribute_tensor(loom.randn(4, 4), mesh, { dist.Replicate(), dist.Replicate() }):requires_grad_(true)
    has(err_of(fsdp.fully_shard, m, { mesh = mesh["dp"] }), "parameter weight is a DTensor on", "on other dims")
    local p = nn.Linear(4, 4)
    p.weight = dist.from_local(loom.randn(4, 4), mesh["tp"], { dist.Partial() }):requires_grad_(true)
    has(err_of(fsdp.fully_shard, p, { mesh = mesh["dp"] }), "parameter weight is a Partial DTensor")
    local s = nn.Module:extend("Scalar")()
    s.scale = loom.tensor(2, { requires_grad = true })
    has(err_of(fsdp.fully_shard, s, { mesh = mesh["dp"] }), "parameter scale is a scalar")
  end)

  it("parallelize_module after fully_shard, and parameters replaced after it", function()
    local m = MLP()
    fsdp.fully_shard(m, { mesh = mesh["dp"] })
    has(err_of(tp.parallelize_module, m, mesh["tp"], { net1 = tp.ColwiseParallel{} }), "already a DTensor")
    m.net2.weight = loom.randn(4, 6, { requires_grad = true })
    has(err_of(m, loom.randn(2, 4)), "parameter net2.weight was replaced after fully_shard",
        "parallelise the model first, then apply fully_shard")
  end)
end)
