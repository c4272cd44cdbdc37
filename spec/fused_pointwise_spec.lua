-- fused_pointwise_spec.lua: the fused elementwise paths against their
-- composed forms written in Lua from forward ops: every differentiable unary
-- op's backward (the unary_grad kernel, g * f'(x) in one pass) and
-- swiglu(a, b) = silu(a) * b, forward and both gradients, with broadcasting,
-- strided inputs, odd sizes and sizes big enough to thread; f64 gradient
-- checks against central differences; bf16 and f16 SwiGLU read as they
-- are, equal bit for bit to the widened f32 path rounded once. Run with LOOM_CPU_FUSED=0 (as
-- fused_fallback_spec does) the same checks hold for the composed forms.
-- Tolerance: f64 1e-10, f32 2e-5 (relative to max(1, |want|)).
local loom, X = require("loom"), require("support.fused")
local R = require("support.ref")
local F = loom.F

-- kind -> input range and f'(x) from forward ops (x a plain tensor)
local SQRT2PI = math.sqrt(2 * math.pi)
local UNARY = {
  { "neg", {}, function(x) return x * 0 - 1 end },
  { "abs", { away = true }, function(x) return x:sign() end },
  { "sqrt", { pos = true }, function(x) return x:sqrt():pow(-1) * 0.5 end },
  { "rsqrt", { pos = true }, function(x) return x:rsqrt():pow(3) * -0.5 end },
  { "exp", {}, function(x) return x:exp() end },
  { "log", { pos = true }, function(x) return x:pow(-1) end },
  { "tanh", {}, function(x) local t = x:tanh() return 1 - t * t end },
  { "sigmoid", {}, function(x) local s = x:sigmoid() return s * (1 - s) end },
  { "relu", { away = true }, function(x) return x:gt(0):to(x.dtype) end },
  -- gelu(x) = x * Phi(x): Phi = gelu / x (x away from 0), phi from exp
  { "gelu", { away = true }, function(x) return x:gelu() / x + x * (x * x * -0.5):exp() / SQRT2PI end },
  { "gelu_tanh", {}, function(x)
      local k, c = math.sqrt(2 / math.pi), 0.044715
      local t = ((x + x:pow(3) * c) * k):tanh()
      return (1 + t) * 0.5 + x * (1 - t * t) * (1 + x * x * (3 * c)) * (0.5 * k)
    end, function(x) return x:gelu { approximate = "tanh" } end },
  { "silu", {}, function(x) local s = x:sigmoid() return s * (1 + x * (1 - s)) end },
  { "sin", {}, function(x) return x:cos() end },
  { "cos", {}, function(x) return -x:sin() end },
  { "pow3", {}, function(x) return x * x * 3 end, function(x) return x:pow(3) end },
  { "pow2.5", { pos = true }, function(x) return x:pow(1.5) * 2.5 end, function(x) return x:pow(2.5) end },
  { "clamp", { away = true }, function(x) return x:gt(-0.5):logical_and(x:lt(0.7)):to(x.dtype) end,
    function(x) return x:clamp(-0.5, 0.7) end },
  { "clamp_min", { away = true }, function(x) return x:gt(-0.5):to(x.dtype) end,
    function(x) return x:clamp(-0.5, nil) end },
}

-- an input of shape for a kind: positive, or away from 0 (kinks)
local function input(k, spec, shape, dtype)
  loom.manual_seed(100 + k)
  local x = loom.randn(shape):to("f64")
  if spec.pos then x = x:abs() + 0.5
  elseif spec.away then x = x + x:sign() * 0.05 end
  return x:to(dtype)
end

describe("unary backward (unary_grad)", function()
  for k, u in ipairs(UNARY) do
    local name, spec, deriv = u[1], u[2], u[3]
    local f = u[4] or function(x) return x[name](x) end
    for _, case in ipairs { { "f64", { 7, 13 }, X.TOL64 }, { "f32", { 300, 257 }, X.TOL32 } } do
      local dtype, shape, tol = case[1], case[2], case[3]
      it(name .. " " .. dtype .. " " .. table.concat(shape, "x") .. ": g * f'(x), dense and strided", function()
        local x = input(k, spec, shape, dtype):requires_grad_(true)
        local g = X.rand(7, shape, dtype)
        X.one_pass({ "mul", "_silu_d", "_gelu_d" }, function() f(x):backward(g) end, name)
        local want = loom.no_grad(function() return (g:to("f64") * deriv(x:detach():to("f64"))):to(dtype) end)
        X.close(X.grad_of(x), want, tol, name .. " gradient")
        -- a strided view (transposed) of a contiguous leaf
        local base = input(k, spec, { shape[2], shape[1] }, dtype):requires_grad_(true)
        local xt = base:t()
        f(xt):backward(g)
        want = loom.no_grad(function() return (g:to("f64") * deriv(xt:detach():to("f64"))):t():to(dtype) end)
        X.close(X.grad_of(base), want, tol, name .. " gradient (strided)")
      end)
    end
  end

  it("every kind passes an f64 gradient check against central differences", function()
    for k, u in ipairs(UNARY) do
      local name, spec = u[1], u[2]
      local f = u[4] or function(x) return x[name](x) end
      local x = input(k, spec, { 3, 4 }, "f64"):requires_grad_(true)
      R.gradcheck(f, { x })
    end
  end)

  -- both paths call fastmath.h's derivative, so g * f'(x) has one rounding
  it("f32 gelu, gelu_tanh and silu gradients equal g * _<kind>_d(x) bit for bit", function()
    local x = X.rand(11, { 70001 }, "f32", 4) -- threaded, not a multiple of 64
    local g = X.rand(12, { 70001 }, "f32")
    for _, c in ipairs { { "_gelu_d", function(t) return t:gelu() end },
                         { "_gelu_tanh_d", function(t) return t:gelu { approximate = "tanh" } end },
                         { "_silu_d", function(t) return t:silu() end } } do
      local xl = x:clone():requires_grad_(true)
      c[2](xl):backward(g)
      local want = g * loom.op(c[1], { x })
      assert.are.equal(0, (xl.grad - want):abs():max():item(), c[1] .. ": fused and composed gradients differ")
    end
  end)

  it("bf16 inputs compute the gradient in f32 and round once", function()
    local x = input(1, {}, { 5, 9 }, "f32")
    local xb = x:to("bf16"):requires_grad_(true)
    local g = X.rand(2, { 5, 9 }, "f32")
    xb:silu():backward(g:to("bf16"))
    local want = loom.no_grad(function()
      local xf = xb:detach():to("f64")
      local s = xf:sigmoid()
      return (g:to("bf16"):to("f64") * s * (1 + xf * (1 - s))):to("bf16")
    end)
    assert.are.equal("bf16", xb.grad.dtype)
    X.close(X.grad_of(xb), want, 1e-2, "silu bf16 gradient")
  end)
end)

describe("swiglu", function()
  -- silu(a) * b and its gradients from forward ops
  local function ref(a, b, g)
    local s = a:sigmoid()
    return a * s * b, g * b * s * (1 + a * (1 - s)), g * a * s
  end

  for _, case in ipairs { { "f64", { 5, 11 }, X.TOL64 }, { "f32", { 260, 300 }, X.TOL32 } } do
    local dtype, shape, tol = case[1], case[2], case[3]
    it(dtype .. " " .. table.concat(shape, "x") .. ": forward and both gradients in one pass", function()
      local a, b = X.leaf(1, shape, dtype), X.leaf(2, shape, dtype)
      local g = X.rand(3, shape, dtype)
      local y
      local n = X.calls({ "silu", "mul" }, function() y = F.swiglu(a, b) end)
      if X.FUSED then assert.are.same({ silu = 0, mul = 0 }, n) end
      X.one_pass({ "mul", "silu", "_silu_d" }, function() y:backward(g) end, "swiglu backward")
      local wy, wa, wb = loom.no_grad(function() return ref(a:detach():to("f64"), b:detach():to("f64"), g:to("f64")) end)
      assert.are.equal(dtype, y.dtype)
      X.close(y, wy, tol, "swiglu")
      X.close(X.grad_of(a), wa, tol, "d gate")
      X.close(X.grad_of(b), wb, tol, "d up")
    end)
  end

  it("broadcasts (gate (4, 6) with up (6)) and takes strided inputs", function()
    local a, b = X.leaf(4, { 6, 4 }, "f64"), X.leaf(5, { 6 }, "f64")
    local at = a:t()
    local g = X.rand(6, { 4, 6 })
    local y = F.swiglu(at, b)
    y:backward(g)
    local wy, wa, wb = loom.no_grad(function() return ref(at:detach(), b:detach():view(1, 6), g) end)
    X.close(y, wy, X.TOL64, "swiglu")
    X.close(X.grad_of(a), wa:t(), X.TOL64, "d gate")
    X.close(X.grad_of(b), wb:sum(1), X.TOL64, "d up (summed over the broadcast dim)")
  end)

  it("agrees with silu(a) * b through autograd and passes gradient checks", function()
    local a, b = X.leaf(7, { 3, 5 }), X.leaf(8, { 3, 5 })
    local g = X.rand(9, { 3, 5 })
    F.swiglu(a, b):backward(g)
    local ga, gb = X.grad_of(a), X.grad_of(b)
    local composed = a:silu() * b
    composed:backward(g)
    X.close(ga, X.grad_of(a), X.TOL64, "d gate")
    X.close(gb, X.grad_of(b), X.TOL64, "d up")
    R.gradcheck(function(x, y) return F.swiglu(x, y) end, { a, b })
    R.gradcheck(function(x, y) return F.swiglu(x, y) end, { X.leaf(10, { 2, 3 }), X.leaf(11, { 3 }) })
  end)

  -- the bits of a 16-bit result: compared as f32 (exact), 0 when equal
  local function max_diff(x, y) return (x:detach():to("f32") - y:detach():to("f32")):abs():max():item() end

  for _, dtype in ipairs { "bf16", "f16" } do
    it(dtype .. " operands read as they are: the widened path's bits (forward, gradients)", function()
      local shape = { 3, 37, 129 }   -- odd sizes, big enough to thread
      local a = X.rand(20, shape, "f32"):to(dtype):requires_grad_(true)
      local b = X.rand(21, shape, "f32"):to(dtype):requires_grad_(true)
      local g = X.rand(22, shape, "f32"):to(dtype)
      local y = F.swiglu(a, b)
      y:backward(g)
      assert.are.equal(dtype, y.dtype)
      assert.are.equal(dtype, a.grad.dtype)
      -- the widened path: f32 copies through the f32 kernel, each result rounded once
      local af, bf = a:detach():to("f32"):requires_grad_(true), b:detach():to("f32"):requires_grad_(true)
      local yf = F.swiglu(af, bf)
      yf:backward(g:to("f32"))
      assert.are.equal(0, max_diff(y, yf:to(dtype)), "forward")
      assert.are.equal(0, max_diff(a.grad, af.grad:to(dtype)), "d gate")
      assert.are.equal(0, max_diff(b.grad, bf.grad:to(dtype)), "d up")
    end)
  end

  it("keeps bf16 (computed in f32) and rejects integers, naming the argument", function()
    local a, b = X.rand(12, { 4, 8 }, "f32"), X.rand(13, { 4, 8 }, "f32")
    local y = F.swiglu(a:to("bf16"), b:to("bf16"))
    assert.are.equal("bf16", y.dtype)
    local want = loom.no_grad(function()
      local af, bf = a:to("bf16"):to("f64"), b:to("bf16"):to("f64")
      return af * af:sigmoid() * bf
    end)
    X.close(y, want, 1e-2, "swiglu bf16")
    local msg = R.errmsg(function() F.swiglu(loom.ones(2):to("i64"), b) end)
    assert.is_truthy(msg:find("swiglu: argument #1 (gate) expected a floating point tensor, got i64", 1, true), msg)
    msg = R.errmsg(function() F.swiglu(a, 3) end)
    assert.is_truthy(msg:find("swiglu", 1, true) and msg:find("up", 1, true), msg)
  end)
end)
