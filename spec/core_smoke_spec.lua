-- core_smoke_spec.lua: a few end-to-end checks of the tensor core against
-- hand-computed values (the detailed specs live beside it).
local loom = require("loom")

describe("core smoke", function()
  it("multiplies matrices like the hand computation", function()
    local a = loom.tensor { { 1, 2, 3 }, { 4, 5, 6 } }
    local c = a:matmul(a:t()):totable()
    assert.same({ { 14, 32 }, { 32, 77 } }, c)
  end)

  it("differentiates sum(x * x) as 2x", function()
    local x = loom.tensor({ 1, -2, 3 }, { requires_grad = true })
    ;(x * x):sum():backward()
    assert.same({ 2, -4, 6 }, x.grad:totable())
  end)

  it("raises a Lua error naming the problem on bad shapes", function()
    local ok, err = pcall(function() return loom.ones(2, 3):matmul(loom.ones(2, 3)) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("matmul", 1, true))
  end)
end)
