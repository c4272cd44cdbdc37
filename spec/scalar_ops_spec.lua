-- scalar_ops_spec.lua: a Lua number as an operand of a float tensor
-- (x + 1, 1 + x, x - 2, 2 - x, x * 0.5, x / 4) runs one *_scalar op with
-- the number as its attribute: values bit for bit those of the 0-dim
-- tensor path (op2n, still used for integer tensors, booleans and
-- DTensors) in every float dtype and on strided views; f64 values against
-- Lua's own arithmetic; gradients against their closed forms, fused and
-- composed (LOOM_CPU_FUSED=0); integer tensors keep exact integer math.
local loom = require("loom")
local T = require("loom.tensor")
local C = require("loom.lib").C
local sys = require("support.sys")

local VALUES = { 1, 0.5, -2, 4, 3, 0.1, 7.25, -0.0, 1 / 0, 0 / 0, 1e20 }
local CASES = {
  { "x + v", function(x, v) return x + v end, C.LM_OP_ADD, false },
  { "v + x", function(x, v) return v + x end, C.LM_OP_ADD, true },
  { "x - v", function(x, v) return x - v end, C.LM_OP_SUB, false },
  { "v - x", function(x, v) return v - x end, C.LM_OP_SUB, true },
  { "x * v", function(x, v) return x * v end, C.LM_OP_MUL, false },
  { "v * x", function(x, v) return v * x end, C.LM_OP_MUL, true },
  { "x / v", function(x, v) return x / v end, C.LM_OP_DIV, false },
}

-- elements that differ (NaN equals NaN)
local function differing(a, b)
  a, b = a:to("f64"), b:to("f64")
  return a:ne(b):logical_and(a:eq(a):logical_or(b:eq(b))):sum():item()
end

describe("a Lua number as an operand", function()
  it("gives the 0-dim tensor path's values and dtype, bit for bit, in every float dtype", function()
    loom.manual_seed(3)
    for _, dt in ipairs { "f32", "f64", "bf16", "f16" } do
      local x = (loom.randn(37, 5) * 3):to(dt)
      for _, inp in ipairs { x, x:t() } do
        for _, v in ipairs(VALUES) do
          for _, c in ipairs(CASES) do
            local new, old = c[2](inp, v), T.op2n(c[3], inp, v, c[4])
            assert.are.equal(old.dtype, new.dtype)
            assert.are.equal(0, differing(new, old), dt .. " " .. c[1] .. " with v = " .. v)
          end
        end
      end
    end
  end)

  it("computes f64 as Lua does", function()
    local xs = { -3.5, 0.1, 2 / 3, 1e300, -0.0 }
    local x = loom.tensor(xs, { dtype = "f64" })
    for _, v in ipairs { 1, 0.3, -7 } do
      local got = { (x + v):totable(), (v - x):totable(), (x * v):totable(), (x / v):totable() }
      for i, xi in ipairs(xs) do
        assert.are.equal(xi + v, got[1][i])
        assert.are.equal(v - xi, got[2][i])
        assert.are.equal(xi * v, got[3][i])
        assert.are.equal(xi / v, got[4][i])
      end
    end
  end)

  it("has the gradients of its closed form", function()
    local x = loom.randn(4, 3, { dtype = "f64" }):requires_grad_()
    local y = ((2 - x * 0.5) / 4 + 1 - 3) * x   -- y = (x - x^2/4)/2 - ... : dy/dx = 0.5 - x/4 - 2
    y:sum():backward()
    local want = (x:detach() * (-0.25)):add(0.5 - 2)
    assert.is_true(differing(x.grad, want) == 0 or (x.grad - want):abs():max():item() < 1e-15)
  end)

  it("has the same gradients from the composed backward (LOOM_CPU_FUSED=0)", function()
    local code = [[
      local loom = require("loom")
      local x = loom.tensor({ 1.5, -2, 0.25 }, { dtype = "f64" }):requires_grad_()
      local y = (((2 - x) * 0.5 + 1) / 4 - 3) * 8
      y:sum():backward()
      local g = x.grad:totable()
      io.write(string.format("%.17g %.17g %.17g", g[1], g[2], g[3]))
    ]]
    local rc, out = sys.luajit(code, "LOOM_CPU_FUSED=0")
    assert.equal(0, rc, out)
    assert.are.equal("-1 -1 -1", out)
  end)

  it("leaves integer tensors on exact integer math, and takes booleans", function()
    local big = 2 ^ 40
    local x = loom.tensor({ big, -5 }, { dtype = "i64" })
    local y = x + 1
    assert.are.equal("i64", y.dtype)
    assert.are.same({ big + 1, -4 }, y:totable())
    assert.are.equal("f32", (loom.tensor({ 1, 2 }, { dtype = "i32" }) * 0.5).dtype)
    assert.are.same({ 3 }, (loom.tensor({ 2.0 }) + true):totable())
  end)
end)
