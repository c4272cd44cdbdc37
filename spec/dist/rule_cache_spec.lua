-- rule_cache_spec.lua: sharding decisions are cached by (op, input specs,
-- attrs): the same op on the same specs hits, other specs miss, and a hit
-- gives the same result as the first call.
local ffi = require("ffi")
local loom = require("loom")
local dist = require("loom.distributed")
local C = loom.C

local function stats()
  local h, m = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  C.lm_dtensor_rule_stats(h, m)
  return tonumber(h[0]), tonumber(m[0])
end

describe("the sharding-decision cache", function()
  local mesh = dist.init_device_mesh("cpu", { dist.world_size() })
  it("hits on repeated specs, misses on new ones, and a hit computes the same result", function()
    C.lm_dtensor_rule_cache_clear()
    loom.manual_seed(3)
    local a, b = loom.randn(4, 8), loom.randn(4, 8)
    local da = dist.distribute_tensor(a, mesh, { dist.Shard(2) })
    local db = dist.distribute_tensor(b, mesh, { dist.Shard(2) })
    local _, m0 = stats()
    local first = (da * db):full_tensor()
    local h1, m1 = stats()
    local again = (da * db):full_tensor()
    local h2, m2 = stats()
    assert.is_true(m1 > m0)                -- the first call ran the rule
    assert.are.equal(m1, m2)               -- the second did not
    assert.is_true(h2 > h1)
    assert.are.equal(0, (first - again):abs():max():item())
    assert.are.equal(0, (first - a * b):abs():max():item())
    local dr = dist.distribute_tensor(b, mesh, { dist.Replicate() })
    local _ = (da * dr)
    local _, m3 = stats()
    assert.is_true(m3 > m2)                -- other placements: another decision
  end)
end)
