-- rng_sync_spec.lua: random ops on DTensors use rank 0's RNG state, as
-- PyTorch's do (issue 26): ranks seeded differently still draw one
-- replicated tensor and one dropout mask, equal to a one-process draw
-- from rank 0's seed. Meaningful on 2 or more ranks (spec/dist runs 2).
local loom, dist = require("loom"), require("loom.distributed")
local F = require("loom.functional")

local ws, rank = dist.world_size(), dist.rank()
local mesh = dist.init_device_mesh("cpu", { ws })

-- every rank's copy of a tensor, gathered (rank-major)
local function all_copies(t)
  return dist.all_gather(t:contiguous(), 1, dist.world_group())
end

describe("random DTensor ops with ranks seeded differently", function()
  it("randn on Replicate: every rank holds rank 0's draw, as one process seeded like rank 0 draws it", function()
    loom.manual_seed(1000 + rank)
    local x = dist.randn({ 16 }, mesh, { dist.Replicate() }):to_local()
    local all = all_copies(x):reshape(ws, 16):totable()
    for r = 2, ws do assert.same(all[1], all[r]) end
    loom.manual_seed(1000)
    assert.equal(0, (loom.randn(16) - x):abs():max():item())
  end)

  it("dropout on a Replicate DTensor: one mask on every rank", function()
    loom.manual_seed(7 * (rank + 1))
    local y = F.dropout(dist.ones({ 64 }, mesh, { dist.Replicate() }), 0.5, true):to_local()
    local all = all_copies(y):reshape(ws, 64):totable()
    for r = 2, ws do assert.same(all[1], all[r]) end
    local kept = y:gt(0):sum():item()
    assert.is_true(kept > 8 and kept < 56, "kept " .. kept .. " of 64 at p = 0.5")
  end)

  it("Shard(1) draws are slices of rank 0's one draw", function()
    loom.manual_seed(50 + rank)
    local x = dist.randn({ 4 * ws }, mesh, { dist.Shard(1) })
    loom.manual_seed(50)
    local full = loom.randn(4 * ws)
    assert.equal(0, (x:full_tensor() - full):abs():max():item())
  end)
end)
