-- debug_spec.lua: LOOM_DEBUG_COLLECTIVES. Mismatched collectives raise an
-- error naming both ranks' calls on every rank, instead of hanging.
local loom = require("loom")
local dist = require("loom.distributed")

local k, me = dist.world_size(), dist.rank()

describe("debug mode (LOOM_DEBUG_COLLECTIVES)", function()
  local was
  before_each(function()
    was = dist.debug_collectives()
    dist.set_debug_collectives(true)
  end)
  after_each(function() dist.set_debug_collectives(was) end)

  it("lets matching collectives through, uneven shards included", function()
    local m = dist.init_device_mesh("cpu", { k })
    local y = dist.all_reduce(loom.ones({ 2, 3 }), "sum", m)
    assert.same({ 2, 3 }, y:size())
    local n = 2 * k - 1 -- chunks of 2, the last rank 1
    local mine = math.max(0, math.min(2, n - me * 2))
    local g = dist.all_gather(loom.ones({ mine, 3 }), 1, m, nil, { full_size = n })
    assert.same({ n, 3 }, g:size())
  end)

  if k > 1 then
    it("names both calls when ranks issue different collectives", function()
      local m = dist.init_device_mesh("cpu", { k }) -- fresh: call numbers start at 1
      local x = loom.ones({ 2, 3 })
      local ok, err
      if me == 0 then ok, err = pcall(dist.all_reduce, x, "sum", m)
      else ok, err = pcall(dist.all_gather, x, 2, m) end
      assert.is_false(ok)
      assert.matches("collective mismatch", err)
      local reduce = "call #1 all_reduce%(sum%) of f32 %[2, 3%]"
      local gather = "call #1 all_gather%(dim 2%) of f32 %[2, 3%]"
      if me == 0 then
        assert.matches("rank 0 issued " .. reduce .. ", but rank 1 issued " .. gather, err)
      else
        assert.matches("rank " .. me .. " issued " .. gather .. ", but rank 0 issued " .. reduce, err)
      end
    end)

    it("names both shapes when ranks pass different shapes", function()
      local m = dist.init_device_mesh("cpu", { k })
      local x = loom.ones({ me == 0 and 4 or 3 })
      local ok, err = pcall(dist.all_reduce, x, "max", m)
      assert.is_false(ok)
      local other = me == 0 and "rank 1 issued call #1 all_reduce%(max%) of f32 %[3%]"
                    or "rank 0 issued call #1 all_reduce%(max%) of f32 %[4%]"
      assert.matches(other, err)
    end)

    it("catches a dtype mismatch", function()
      local m = dist.init_device_mesh("cpu", { k })
      local x = loom.ones({ 2 }, { dtype = me == 0 and "f32" or "bf16" })
      local ok, err = pcall(dist.broadcast, x, 0, m)
      assert.is_false(ok)
      assert.matches("broadcast%(root 0%) of " .. (me == 0 and "bf16" or "f32"), err)
    end)
  end
end)
