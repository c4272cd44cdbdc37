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

-- The gradient of autocast's cast of an f32 tensor leaves the GEMM in f32:
-- the backward products write f32 (bf16 operands, f32 accumulation) and
-- the cast's backward has nothing left to do, so the gradient is the f32
-- product itself, not its bf16 rounding (and no cast pass runs). Compared
-- with the same products in f64 on the bf16-rounded operands: rel. tol
-- 1e-5 (f32 accumulation over 15 rows), where a bf16 rounding of the
-- gradient would be off by up to 2^-9.
describe("the gradient of a bf16 cast of an f32 tensor", function()
  before_each(function() loom.manual_seed(9) end)
  local function f64(t) return t:detach():to("f64") end
  local function bf(t) return t:detach():to("bf16"):to("f64") end

  it("comes out of F.linear's backward GEMMs in f32, unrounded", function()
    local x = loom.randn({ 3, 5, 16 }):requires_grad_()
    local w = loom.randn({ 8, 16 }):requires_grad_()
    local c = loom.randn({ 3, 5, 8 })
    local y = loom.autocast("bf16", function() return F.linear(x, w) end)
    assert.are.equal("bf16", y.dtype)
    local loss = (y:to("f32") * c):sum()
    loss:backward()
    local g = bf(c):reshape({ 15, 8 })        -- y's gradient, in y's dtype
    local gw = g:t():matmul(bf(x):reshape({ 15, 16 }))
    local gx = g:matmul(bf(w)):reshape({ 3, 5, 16 })
    assert.are.equal("f32", w.grad.dtype)
    assert.is_true(rel(w.grad, gw) < 1e-5, "weight gradient off by " .. rel(w.grad, gw))
    assert.is_true(rel(x.grad, gx) < 1e-5, "input gradient off by " .. rel(x.grad, gx))
    -- and it is not a bf16 value: the rounding would change it
    assert.is_true(rel(w.grad:to("bf16"), gw) > 1e-5)
  end)

  it("sums in f32 over two GEMMs sharing the cast, and a retained grad stays bf16", function()
    local w = loom.randn({ 6, 4 }):requires_grad_()
    local a1, a2 = loom.randn({ 5, 6 }):to("bf16"), loom.randn({ 7, 6 }):to("bf16")
    local w16 = w:to("bf16")
    w16:retain_grad()
    local c1, c2 = loom.randn({ 5, 4 }), loom.randn({ 7, 4 })
    local loss = (a1:matmul(w16):to("f32") * c1):sum() + (a2:matmul(w16):to("f32") * c2):sum()
    loss:backward()
    local want = f64(a1):t():matmul(bf(c1)) + f64(a2):t():matmul(bf(c2))
    assert.are.equal("f32", w.grad.dtype)
    assert.is_true(rel(w.grad, want) < 1e-5, "off by " .. rel(w.grad, want))
    assert.are.equal("bf16", w16.grad.dtype)
    assert.are.same(w.grad:to("bf16"):to("f32"):totable(), w16.grad:to("f32"):totable())
  end)

  it("comes from matmul's out_dtype attribute, which widens only bf16/f16 to f32", function()
    local op, lib = require("loom.tensor").op, require("loom.lib").C
    local a, b = loom.randn({ 3, 4 }), loom.randn({ 4, 2 })
    local y = op("matmul", { a:to("bf16"), b:to("bf16") }, { lib.LM_F32 })
    assert.are.equal("f32", y.dtype)
    assert.is_true(rel(y, bf(a):matmul(bf(b))) < 1e-6)
    local ok, err = pcall(op, "matmul", { a, b }, { lib.LM_BF16 })
    assert.is_false(ok)
    assert.matches("matmul: out_dtype must be the operands' dtype f32, or f32 for bf16/f16 operands, got bf16", err, 1, true)
  end)
end)
