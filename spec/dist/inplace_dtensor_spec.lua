-- inplace_dtensor_spec.lua: Torch habits on DTensors (1, 2 or 4 ranks):
-- in-place arithmetic gives the values of the same op on the full tensor
-- and keeps the DTensor's placements (a result laid out otherwise is moved
-- back first); t[i] reads rows of the global tensor; what cannot be right
-- is refused (t[i] = v on a DTensor, filling a Partial with non-zero,
-- mixing plain tensors and DTensors). References are full tensors made on
-- every rank alike; data only moves or is added, so comparisons are exact.
local loom = require("loom")
local dist = require("loom.distributed")
local H = require("support.dist")

local Shard, Replicate, Partial = dist.Shard, dist.Replicate, dist.Partial
local mesh = dist.init_device_mesh("cpu", { H.ws })

local function err(fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

local function full() return loom.arange(20):reshape(5, 4) end

describe("in-place arithmetic on a DTensor", function()
  it("gives the full tensor's values and keeps the placements", function()
    for _, pl in ipairs { Shard(1), Shard(2), Replicate() } do
      local d = dist.distribute_tensor(full(), mesh, { pl })
      local other = dist.distribute_tensor(loom.tensor({ 1, 2, 3, 4 }), mesh, { Replicate() })
      d:add_(1):mul_(other):clamp_(0, 50):sub_(0.5)
      assert.equal(tostring(pl), tostring(d.placements[1]))
      local want = full():add(1):mul(loom.tensor({ 1, 2, 3, 4 })):clamp(0, 50):sub(0.5)
      assert.same(want:totable(), d:full_tensor():totable())
    end
  end)

  it("moves a result laid out otherwise back to the tensor's placements", function()
    local r = dist.distribute_tensor(full(), mesh, { Replicate() })
    local s = dist.distribute_tensor(full(), mesh, { Shard(1) })
    r:add_(s)   -- Replicate + Shard(1) is Shard(1): written back replicated
    assert.equal("Replicate()", tostring(r.placements[1]))
    assert.same(full():mul(2):totable(), r:to_local():totable())
  end)

  it("adds a number once to a Partial sum, and fills a Partial only with zero", function()
    local p = dist.DTensor.from_local(loom.ones(3), mesh, { Partial() })
    p:add_(1)
    assert.same({ H.ws + 1, H.ws + 1, H.ws + 1 }, p:full_tensor():totable())
    assert.truthy(err(function() p:fill_(2) end):find("fill_: a Partial DTensor holds terms of a sum", 1, true))
    p:zero_()
    assert.same({ 0, 0, 0 }, p:full_tensor():totable())
  end)

  it("refuses a plain tensor mixed with a DTensor", function()
    local d = dist.distribute_tensor(full(), mesh, { Shard(1) })
    assert.truthy(err(function() d:add_(loom.ones(4)) end):find("plain tensor", 1, true))
  end)
end)

describe("copy_ with a DTensor", function()
  it("lays a DTensor source out as the destination", function()
    local r = dist.distribute_tensor(loom.zeros(5, 4), mesh, { Replicate() })
    r:copy_(dist.distribute_tensor(full(), mesh, { Shard(1) }))
    assert.same(full():totable(), r:to_local():totable())
  end)

  it("takes a plain source of the global size as the whole tensor, each rank its part", function()
    for _, pl in ipairs { Shard(1), Shard(2), Replicate() } do
      local d = dist.distribute_tensor(loom.zeros(5, 4), mesh, { pl })
      d:copy_(full())
      assert.same(full():totable(), d:full_tensor():totable())
      assert.equal(tostring(pl), tostring(d.placements[1]))
    end
    local z = loom.zeros(5, 4)
    z:copy_(dist.distribute_tensor(full(), mesh, { Shard(2) }))   -- a plain destination: the whole values
    assert.same(full():totable(), z:totable())
  end)

  it("refuses sizes that are neither, and a Partial destination of plain values", function()
    local d = dist.distribute_tensor(loom.zeros(8, 4), mesh, { Shard(1) })
    local e = err(function() d:copy_(loom.zeros(3, 4)) end)
    assert.truthy(e:find("copy_: a DTensor of size {8, 4} and a plain tensor of size {3, 4}", 1, true), e)
    local p = dist.DTensor.from_local(loom.ones(3), mesh, { Partial() })
    assert.truthy(err(function() p:copy_(loom.ones(3)) end):find("copy_: a Partial DTensor cannot take", 1, true))
  end)
end)

describe("t[i] on a DTensor", function()
  it("reads rows and elements of the global tensor", function()
    for _, pl in ipairs { Shard(1), Shard(2), Replicate() } do
      local d = dist.distribute_tensor(full(), mesh, { pl })
      assert.same({ 16, 17, 18, 19 }, d[5]:full_tensor():totable())
      assert.equal(9, d[3][2])
      assert.equal(19, d[-1][-1])
    end
  end)

  it("refuses writes, saying what to do instead", function()
    local d = dist.distribute_tensor(full(), mesh, { Shard(1) })
    assert.truthy(err(function() d[1] = 0 end):find("t[i] = v: not on a DTensor", 1, true))
  end)
end)
