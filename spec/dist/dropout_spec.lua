-- dropout_spec.lua: dropout on a DTensor draws its mask by global index, so
-- the sharded result equals the slice of dropout on the full tensor.
local loom = require("loom")
local dist = require("loom.distributed")

describe("F.dropout on DTensors", function()
  local mesh = dist.init_device_mesh("cpu", { dist.world_size() })
  for _, case in ipairs { { "Shard(1)", dist.Shard(1) }, { "Shard(2)", dist.Shard(2) },
                          { "Replicate()", dist.Replicate() } } do
    it("with " .. case[1] .. " equals the slice of the full tensor's dropout", function()
      loom.manual_seed(1)
      local x = loom.randn(6, 10)
      loom.manual_seed(7)
      local ref = loom.F.dropout(x, 0.4, true)
      local d = dist.distribute_tensor(x, mesh, { case[2] })
      loom.manual_seed(7)
      local y = loom.F.dropout(d, 0.4, true)
      assert.is_true(dist.is_dtensor(y))
      assert.are.equal(0, (y:full_tensor() - ref):abs():max():item())
      local zeros = ref:eq(0):to("f32"):sum():item()
      assert.is_true(zeros > 5 and zeros < 55)   -- a real mask, not all or nothing
    end)
  end
end)
