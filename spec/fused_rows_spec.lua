-- fused_rows_spec.lua: the fused row backward passes and rope against their
-- composed forms written in Lua from basic ops: softmax and log_softmax
-- backward (softmax_bwd) over the last and another dim; layer_norm and
-- rms_norm backward (norm_bwd: dx, dw, db from the stats the forward keeps)
-- with and without weight and bias, over one and two normalized dims; rope
-- forward and backward (the rope kernel, sign -1 for backward). f64 and f32,
-- strided inputs, odd sizes and sizes big enough to thread; f64 gradient
-- checks against central differences. With LOOM_CPU_FUSED=0 the same
-- checks hold for the composed forms.
-- Tolerance: f64 1e-10, f32 2e-5 (relative to max(1, |want|)).
local loom, X = require("loom"), require("support.fused")
local R = require("support.ref")
local F = loom.F

local CASES = { { "f64", { 6, 5, 13 }, X.TOL64 }, { "f32", { 4, 80, 257 }, X.TOL32 } }

describe("softmax and log_softmax backward (softmax_bwd)", function()
  for _, case in ipairs(CASES) do
    local dtype, shape, tol = case[1], case[2], case[3]
    for _, d in ipairs { -1, 2 } do
      for _, lg in ipairs { false, true } do
        local name = lg and "log_softmax" or "softmax"
        it(string.format("%s %s %s dim %d", name, dtype, table.concat(shape, "x"), d), function()
          local x = X.leaf(1, shape, dtype, 3)
          local g = X.rand(2, shape, dtype)
          local y = x[name](x, d)
          X.one_pass({ "mul", "sub" }, function() y:backward(g) end, name .. " backward")
          local want = loom.no_grad(function()
            local y64, g64 = x:detach():to("f64")[name](x:detach():to("f64"), d), g:to("f64")
            if lg then return g64 - y64:exp() * g64:sum(d, true) end
            return y64 * (g64 - (g64 * y64):sum(d, true))
          end)
          X.close(X.grad_of(x), want, tol, name .. " gradient")
        end)
      end
    end
  end

  it("takes a strided input and passes f64 gradient checks", function()
    local base = X.leaf(3, { 9, 4 })
    local g = X.rand(4, { 4, 9 })
    base:t():softmax(-1):backward(g)
    local want = loom.no_grad(function()
      local y = base:detach():t():softmax(-1)
      return (y * (g - (g * y):sum(-1, true))):t()
    end)
    X.close(X.grad_of(base), want, X.TOL64, "strided softmax gradient")
    for _, name in ipairs { "softmax", "log_softmax" } do
      R.gradcheck(function(t) return t[name](t, 2) end, { X.leaf(5, { 3, 4, 5 }) })
    end
  end)
end)

-- layer/rms norm over the last k dims from basic ops (autograd through them)
local function norm_ref(x, k, w, b, eps, rms)
  local lead = x:dim() - k
  local shape = x:size()
  local rows = 1
  for d = 1, lead do rows = rows * shape[d] end
  local x2 = x:reshape(rows, -1)
  local c = rms and x2 or x2 - x2:mean(2, true)
  local y = c * ((c * c):mean(2, true) + eps):rsqrt()
  y = y:reshape(shape)
  if w then y = y * w end
  if b then y = y + b end
  return y
end

describe("layer_norm and rms_norm backward (norm_bwd)", function()
  for _, case in ipairs(CASES) do
    local dtype, shape, tol = case[1], case[2], case[3]
    for _, rms in ipairs { false, true } do
      local name = rms and "rms_norm" or "layer_norm"
      for _, wb in ipairs { { true, true }, { true, false }, { false, true }, { false, false } } do
        local has_w, has_b = wb[1], rms and false or wb[2]
        if not (rms and wb[2]) then
          it(string.format("%s %s %s weight %s bias %s", name, dtype, table.concat(shape, "x"),
                           tostring(has_w), tostring(has_b)), function()
            local n = shape[#shape]
            local x = X.leaf(1, shape, dtype, 2, 0.5)
            local w = has_w and X.leaf(2, { n }, dtype, 0.5, 1) or nil
            local b = has_b and X.leaf(3, { n }, dtype) or nil
            local g = X.rand(4, shape, dtype)
            local eps = 1e-5
            local y = rms and F.rms_norm(x, { n }, w, eps) or F.layer_norm(x, { n }, w, b, eps)
            X.one_pass({ "mul", "mean" }, function() y:backward(g) end, name .. " backward")
            local gx, gw, gb = X.grad_of(x), w and X.grad_of(w), b and X.grad_of(b)
            local xr = x:detach():to("f64"):requires_grad_(true)
            local wr = w and w:detach():to("f64"):requires_grad_(true)
            local br = b and b:detach():to("f64"):requires_grad_(true)
            local yr = norm_ref(xr, 1, wr, br, eps, rms)
            X.close(y, yr:detach(), tol, name)
            yr:backward(g:to("f64"))
            X.close(gx, xr.grad, tol, name .. " dx")
            if w then X.close(gw, wr.grad, tol * 10, name .. " dw") end
            if b then X.close(gb, br.grad, tol * 10, name .. " db") end
          end)
        end
      end
    end
  end

  it("normalizes two trailing dims of a strided input; f64 gradient checks", function()
    for _, rms in ipairs { false, true } do
      local base = X.leaf(5, { 4, 3, 5 })
      local w = X.leaf(6, { 3, 4 }, "f64", 0.5, 1)
      local b = not rms and X.leaf(7, { 3, 4 }) or nil
      local x = base:permute(3, 2, 1)   -- (5, 3, 4), strided
      local g = X.rand(8, { 5, 3, 4 })
      local y = rms and F.rms_norm(x, { 3, 4 }, w, 1e-6) or F.layer_norm(x, { 3, 4 }, w, b, 1e-6)
      y:backward(g)
      local gx, gw, gb = X.grad_of(base), X.grad_of(w), b and X.grad_of(b)
      local yr = norm_ref(x, 2, w, b, 1e-6, rms)
      yr:backward(g)
      X.close(gx, X.grad_of(base), X.TOL64, "dx")
      X.close(gw, X.grad_of(w), X.TOL64, "dw")
      if b then X.close(gb, X.grad_of(b), X.TOL64, "db") end
      local f = rms and function(t, ww) return F.rms_norm(t, { 4 }, ww, 1e-6) end
                    or function(t, ww, bb) return F.layer_norm(t, { 4 }, ww, bb, 1e-6) end
      R.gradcheck(f, { X.leaf(9, { 2, 3, 4 }), X.leaf(10, { 4 }, "f64", 0.5, 1), not rms and X.leaf(11, { 4 }) or nil })
    end
  end)

  it("returns the output only from loom.F; the op's second output holds mean and rstd", function()
    local x = X.rand(12, { 2, 3, 5 })
    assert.are.equal(1, select("#", F.layer_norm(x, { 5 })))
    local y, st = loom.op("layer_norm", { x }, { 1, 0, 0 }, { 1e-5 })
    assert.are.same({ 2, 2, 3 }, st:size())
    local mean = x:mean(3)
    local var = ((x - x:mean(3, true)) ^ 2):mean(3)
    X.close(st:narrow(1, 1, 1):squeeze(1), mean, X.TOL64, "mean")
    X.close(st:narrow(1, 2, 1):squeeze(1), (var + 1e-5):rsqrt(), X.TOL64, "rstd")
    X.close(y, (x - x:mean(3, true)) * (var:unsqueeze(3) + 1e-5):rsqrt(), X.TOL64, "layer_norm")
  end)
end)

describe("rope (the rope kernel, forward and backward)", function()
  -- Llama's rotation of interleaved pairs from basic ops: x (..., T, H, D)
  local function rope_ref(x, cos, sin)
    local s = x:size()
    local T, D = s[#s - 2], s[#s]
    local pairs_ = x:reshape(-1, T, s[#s - 1], D / 2, 2)
    local a, b = pairs_:narrow(5, 1, 1):squeeze(5), pairs_:narrow(5, 2, 1):squeeze(5)
    local c, sn = cos:view(1, T, 1, D / 2), sin:view(1, T, 1, D / 2)
    local o = loom.cat({ (a * c - b * sn):unsqueeze(5), (a * sn + b * c):unsqueeze(5) }, 5)
    return o:reshape(s)
  end

  for _, case in ipairs { { "f64", { 2, 5, 3, 6 }, X.TOL64 }, { "f32", { 3, 2, 40, 16, 34 }, X.TOL32 } } do
    local dtype, shape, tol = case[1], case[2], case[3]
    it(dtype .. " " .. table.concat(shape, "x") .. ": forward and backward in one pass", function()
      local nd = #shape
      local cos, sin = F.rope_tables(shape[nd - 2], shape[nd], { dtype = dtype })
      local x = X.leaf(1, shape, dtype)
      local g = X.rand(2, shape, dtype)
      local y
      X.one_pass({ "mul", "cat" }, function() y = F.apply_rotary_emb(x, cos, sin) end, "rope forward")
      X.one_pass({ "mul", "cat" }, function() y:backward(g) end, "rope backward")
      local xr = x:detach():to("f64"):requires_grad_(true)
      local yr = rope_ref(xr, cos:to("f64"), sin:to("f64"))
      yr:backward(g:to("f64"))
      X.close(y, yr:detach(), tol, "rope")
      X.close(X.grad_of(x), xr.grad, tol, "rope gradient")
    end)
  end

  -- bf16 and f16 x are rotated as they are (f32 tables, f32 arithmetic,
  -- one rounding): the bits of the f32 path on the widened x, rounded
  for _, dtype in ipairs { "bf16", "f16" } do
    it(dtype .. " x read as it is: the widened path's bits (forward, gradient)", function()
      local shape = { 3, 2, 40, 16, 34 }
      local cos, sin = F.rope_tables(40, 34, { dtype = "f32" })
      local x = X.rand(6, shape, "f32"):to(dtype):requires_grad_(true)
      local g = X.rand(7, shape, "f32"):to(dtype)
      local y = F.apply_rotary_emb(x, cos, sin)
      y:backward(g)
      local xf = x:detach():to("f32"):requires_grad_(true)
      local yf = F.apply_rotary_emb(xf, cos, sin)
      yf:backward(g:to("f32"))
      assert.are.equal(dtype, y.dtype)
      assert.are.equal(dtype, x.grad.dtype)
      local function max_diff(a, b) return (a:detach():to("f32") - b:detach():to("f32")):abs():max():item() end
      assert.are.equal(0, max_diff(y, yf:to(dtype)), "forward")
      assert.are.equal(0, max_diff(x.grad, xf.grad:to(dtype)), "gradient")
    end)
  end

  it("takes a strided input (heads transposed) and passes an f64 gradient check", function()
    local cos, sin = F.rope_tables(5, 4, { dtype = "f64" })
    local base = X.leaf(3, { 2, 3, 5, 4 })
    local x = base:transpose(2, 3)   -- (2, 5, 3, 4)
    local g = X.rand(4, { 2, 5, 3, 4 })
    F.apply_rotary_emb(x, cos, sin):backward(g)
    local gx = X.grad_of(base)
    rope_ref(x, cos, sin):backward(g)
    X.close(gx, X.grad_of(base), X.TOL64, "strided rope gradient")
    R.gradcheck(function(t) return F.apply_rotary_emb(t, cos, sin) end, { X.leaf(5, { 5, 3, 4 }) })
  end)
end)
