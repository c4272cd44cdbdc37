-- amp_mixed_spec.lua: bf16 never silently becomes f32 in a GEMM (issue 22,
-- "what to build" item 3). Under autocast a bf16 x f32 matmul casts the f32
-- side to bf16, as PyTorch's autocast does, and its gradient reaches the
-- f32 side in f32; outside autocast mixing bf16 with f32 in matmul or
-- attention is an error that says what to do. Values are compared with
-- the same product of bf16-rounded operands in f64 (rel. tol 1e-2: one
-- bf16 rounding of the output).
local loom = require("loom")
local F = loom.F

local function rel(a, b)
  local d = (a:to("f64") - b:to("f64")):abs():max():item()
  return d / math.max(b:to("f64"):abs():max():item(), 1e-30)
end

describe("a bf16 x f32 GEMM", function()
  before_each(function() loom.manual_seed(5) end)

  it("under autocast runs in bf16 on the f32 side's bf16 cast, with an f32 gradient", function()
    local a = loom.randn({ 4, 6 }):to("bf16")
    local w = loom.randn({ 6, 3 }):requires_grad_()
    local y = loom.autocast("bf16", function() return a:matmul(w) end)
    assert.are.equal("bf16", y.dtype)
    local want = a:to("f64"):matmul(w:detach():to("bf16"):to("f64"))
    assert.is_true(rel(y, want) < 1e-2)
    y:to("f32"):sum():backward()
    assert.are.equal("f32", w.grad.dtype)
    local gwant = a:to("f64"):t():matmul(loom.ones({ 4, 3 }, { dtype = "f64" }))
    assert.is_true(rel(w.grad, gwant) < 1e-2)
  end)

  it("under autocast in f16 casts a bf16 operand to f16 too", function()
    local y = loom.autocast("f16", function()
      return loom.randn({ 2, 3 }):to("bf16"):matmul(loom.randn({ 3, 2 }))
    end)
    assert.are.equal("f16", y.dtype)
  end)

  it("under autocast gives F.linear's f32 bias the GEMM's dtype", function()
    local x, w, b = loom.randn({ 2, 4 }), loom.randn({ 3, 4 }), loom.randn({ 3 }):requires_grad_()
    local y = loom.autocast("bf16", function() return F.linear(x, w, b) end)
    assert.are.equal("bf16", y.dtype)
    y:to("f32"):sum():backward()
    assert.are.equal("f32", b.grad.dtype)
  end)

  it("outside autocast is an error naming the dtypes and the remedy", function()
    local a, w = loom.randn({ 4, 6 }):to("bf16"), loom.randn({ 6, 3 })
    local ok, err = pcall(function() return a:matmul(w) end)
    assert.is_false(ok)
    assert.matches("matmul: argument #1 (input) is bf16 but argument #2 (other) is f32", err, 1, true)
    assert.matches('loom.autocast("bf16", ...)', err, 1, true)
    local q = loom.randn({ 1, 2, 4, 8 })
    ok, err = pcall(F.scaled_dot_product_attention, q:to("bf16"), q, q)
    assert.is_false(ok)
    assert.matches("argument #1 (query) is bf16 but argument #2 (key) is f32", err, 1, true)
  end)

  it("keeps f32 x f64 promoting, as before (no low-precision side)", function()
    assert.are.equal("f64", loom.randn({ 2, 3 }):matmul(loom.randn({ 3, 2 }):to("f64")).dtype)
  end)
end)
