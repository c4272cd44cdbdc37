-- device_check_spec.lua: every op checks that its tensor arguments share
-- one device (core/entry/entry.c, check_devices): mixing devices is a Lua
-- error naming the op, the argument and both devices, on every backend
-- (meta with the CPU everywhere; a GPU, or the emulated one, with the CPU
-- where there is one) and before anything runs: on a GPU a kernel given
-- the CPU's memory faults, and the fault is sticky.
local loom = require("loom")
local F = loom.F

-- op(...) fails naming op, argument #k on device `here` and #1 on `there`
local function refuses(name, k, here, there, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, name .. " ran with mixed devices")
  local want = ("%s: argument #%d is on %s, argument #1 on %s: an op never copies across devices"):format(name, k, here, there)
  assert.truthy(tostring(err):find(want, 1, true), "expected \"" .. want .. "\", got: " .. tostring(err))
end

-- the devices to mix with the CPU in this build
local others = { "meta" }
if loom.device_available("cuda") then others[#others + 1] = "cuda" end

describe("an op given tensors on two devices", function()
  for _, dev in ipairs(others) do
    local name = dev == "cuda" and "cuda:0" or dev
    local on = { device = dev }

    it("is an error naming the op, the argument and both devices (cpu and " .. dev .. ")", function()
      refuses("add", 2, "cpu", name, function() return loom.ones({ 2, 3 }, on) + loom.ones({ 2, 3 }) end)
      refuses("matmul", 2, name, "cpu", function() return loom.ones({ 2, 3 }):matmul(loom.ones({ 3, 2 }, on)) end)
      -- generation's ids built on the CPU for a model on the GPU (issue 35)
      refuses("embedding", 2, "cpu", name, F.embedding, loom.tensor({ 1, 2 }, { dtype = "i64" }), loom.randn({ 5, 4 }, on))
      refuses("cross_entropy", 2, "cpu", name, F.cross_entropy, loom.randn({ 3, 5 }, on),
              loom.tensor({ 1, 2, 3 }, { dtype = "i64" }))
      refuses("layer_norm", 2, name, "cpu", F.layer_norm, loom.randn({ 3, 5 }), { 5 }, loom.ones({ 5 }, on))
    end)

    it("is an error for attention's mask on another device (cpu and " .. dev .. ")", function()
      local q = loom.randn({ 1, 1, 4, 8 })
      refuses("scaled_dot_product_attention", 4, name, "cpu", F.scaled_dot_product_attention, q, q, q,
              { attn_mask = loom.ones({ 4, 4 }, on):lt(2) })
    end)
  end
end)
