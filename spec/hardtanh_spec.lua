-- hardtanh_spec.lua: hardtanh (F.hardtanh, F.relu6, nn.Hardtanh, nn.ReLU6)
-- and clamp's gradient at its bounds. The expected values are PyTorch
-- 2.15's, written out by hand: F.hardtanh(x) and its gradient on
-- x = {-2, -1, -0.5, 0, 0.5, 1, 2} are {-1, -1, -0.5, 0, 0.5, 1, 1} and
-- {0, 0, 1, 1, 1, 0, 0}; clamp's gradient is 0 at a bound too (PyTorch's
-- minimum-norm subgradient, pytorch#184574). Exact comparisons: the values
-- are copies or 0/1 masks. spec/fused_fallback_spec.lua runs this file
-- again with LOOM_CPU_FUSED=0, for the composed backward.
local loom = require("loom")
local R = require("support.ref")
local F, nn = loom.F, loom.nn

local X = { -2, -1, -0.5, 0, 0.5, 1, 2 }

local function values_and_grad(f, dtype, xs)
  local x = loom.tensor(xs or X, { dtype = dtype, requires_grad = true })
  local y = f(x)
  y:sum():backward()
  return R.flat(y:to("f64"):totable()), R.flat(x.grad:to("f64"):totable())
end

describe("hardtanh", function()
  for _, dt in ipairs { "f64", "f32", "bf16" } do
    it("matches PyTorch's values and gradient, bounds included, in " .. dt, function()
      local y, g = values_and_grad(function(x) return F.hardtanh(x) end, dt)
      R.assert_equal(y, { -1, -1, -0.5, 0, 0.5, 1, 1 })
      R.assert_equal(g, { 0, 0, 1, 1, 1, 0, 0 })
    end)
  end

  it("takes its bounds; relu6 is hardtanh(0, 6)", function()
    local y, g = values_and_grad(function(x) return x:hardtanh(-0.5, 1) end, "f64")
    R.assert_equal(y, { -0.5, -0.5, -0.5, 0, 0.5, 1, 1 })
    R.assert_equal(g, { 0, 0, 0, 1, 1, 0, 0 })
    y, g = values_and_grad(F.relu6, "f64", { -1, 0, 3, 6, 7 })
    R.assert_equal(y, { 0, 0, 3, 6, 6 })
    R.assert_equal(g, { 0, 0, 1, 0, 0 })
  end)

  it("keeps NaN and takes integers, as PyTorch", function()
    local y = F.hardtanh(loom.tensor({ 0 / 0, 3 }))
    local v = y:totable()
    assert.is_true(v[1] ~= v[1])
    assert.equal(1, v[2])
    local i = F.hardtanh(loom.tensor({ -3, 0, 3 }, { dtype = "i64" }))
    assert.equal("i64", i.dtype)
    R.assert_equal(i:totable(), { -1, 0, 1 })
  end)

  it("has the finite-difference gradient away from its bounds (f64, < 1e-6)", function()
    local x = loom.tensor(R.rand_away({ 3, 4 }, -2, 2, 0.05), { dtype = "f64", requires_grad = true })
    local worst = R.gradcheck(function(a) return a:hardtanh(-1, 1) * a end, { x })
    assert.is_true(worst < 1e-6)
  end)

  it("names a bad argument", function()
    local x = loom.tensor({ 1, 2 })
    assert.matches("hardtanh: min_val expected a number, got \"a\"", R.errmsg(F.hardtanh, x, "a"))
    assert.matches("max_val expected a number >= min_val", R.errmsg(F.hardtanh, x, 2, 1))
    assert.matches("hardtanh.*input", R.errmsg(F.hardtanh, 3))
  end)

  it("is one entry of the op table, with the CPU's unary kernel and the pointwise sharding rule", function()
    R.assert_full_op("hardtanh")
  end)
end)

describe("nn.Hardtanh and nn.ReLU6", function()
  it("train like the composed form: forward, gradient and an SGD step (f64, exact)", function()
    loom.manual_seed(7)
    local lin = nn.Linear(4, 3):double()
    local ref = nn.Linear(4, 3):double()
    ref:load_state_dict(lin:state_dict())
    local x = loom.randn({ 5, 4 }, { dtype = "f64" }) * 2
    local act = nn.Hardtanh(-0.5, 0.5)
    local y = act(lin(x))
    -- composed: min(max(z, lo), hi), gradient 1 strictly inside
    local z = ref(x)
    local inside = z:gt(-0.5):logical_and(z:lt(0.5)):to("f64")
    local yr = z * inside + (z:ge(0.5):to("f64") * 0.5) - (z:le(-0.5):to("f64") * 0.5)
    R.assert_equal(y:totable(), yr:detach():totable())
    y:pow(2):sum():backward()
    ;(yr:detach() * inside * 2 * z):sum():backward()
    R.assert_close(lin.weight.grad:totable(), ref.weight.grad:totable(), 1e-12, 1e-12)
    R.assert_close(lin.bias.grad:totable(), ref.bias.grad:totable(), 1e-12, 1e-12)
    loom.optim.SGD(lin:parameters(), { lr = 0.1 }):step()
    loom.optim.SGD(ref:parameters(), { lr = 0.1 }):step()
    R.assert_close(lin.weight:totable(), ref.weight:totable(), 1e-12, 1e-12)
    assert.matches("Hardtanh%(min_val=%-0.5, max_val=0.5%)", tostring(act))
    R.assert_equal(nn.ReLU6()(loom.tensor({ -1, 2, 9 })):totable(), { 0, 2, 6 })
  end)
end)

describe("clamp at its bounds", function()
  it("has gradient 0 there, as PyTorch 2.15 (minimum-norm subgradient)", function()
    local _, g = values_and_grad(function(x) return x:clamp(-1, 1) end, "f64", { -2, -1, 0, 1, 2 })
    R.assert_equal(g, { 0, 0, 1, 0, 0 })
    _, g = values_and_grad(function(x) return x:clamp(-1) end, "f64", { -2, -1, 0, 1, 2 })
    R.assert_equal(g, { 0, 0, 1, 1, 1 })
  end)
end)
