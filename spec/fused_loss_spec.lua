-- fused_loss_spec.lua: cross_entropy with class ids on its fused path (the
-- cross_entropy kernels: log-softmax, the picked and smoothed terms and the
-- gradient, a pass or two per row; the op reduces the per-row losses)
-- against the composed form written in Lua from basic ops (log_softmax, a
-- one-hot pick, weights, smoothing, the ignored rows masked): every
-- reduction, with and without class weights, ignore_index (-100 and a class
-- id), label smoothing, 3-D and strided logits, f64, f32 (threaded) and
-- bf16; f64 gradient checks against central differences. With
-- LOOM_CPU_FUSED=0 the same checks hold for the composed form.
-- Tolerance: f64 1e-10, f32 2e-5, bf16 2e-2 (relative to max(1, |want|)).
local loom, X = require("loom"), require("support.fused")
local R = require("support.ref")
local F = loom.F

-- the composed form from basic ops, f64: logits (N, C), target (N) 1-based
local function ref(x, t, o)
  local N, C = x:size(1), x:size(2)
  local ignore = o.ignore_index or -100
  local logp = x:log_softmax(2)
  local cls = loom.arange(1, C + 1, 1, { dtype = "i64" }):view(1, C)
  local onehot = cls:eq(t:view(N, 1)):to("f64")
  local keep = t:ne(ignore):to("f64")
  local w = o.weight and o.weight:to("f64"):view(1, C) or nil
  local wt = w and (onehot * w):sum(2) or keep * 0 + 1
  local eps = o.label_smoothing or 0
  local loss = -(logp * onehot):sum(2) * wt * (1 - eps)
  if eps > 0 then loss = loss - (w and logp * w or logp):sum(2) * (eps / C) end
  loss = loss * keep
  local red = o.reduction or "mean"
  if red == "none" then return loss end
  if red == "sum" then return loss:sum() end
  return loss:sum() / (wt * keep):sum()
end

local C = 53

-- targets (N) in 1..C with a few ignored rows (ignore given)
local function targets(seed, N, ignore)
  loom.manual_seed(seed)
  local t = loom.randint(1, C + 1, { N })
  if ignore then
    t:narrow(1, 2, 1):fill_(ignore)
    if N > 6 then t:narrow(1, 6, 1):fill_(ignore) end
  end
  return t
end

local function check(what, x, t, opts, tol)
  local y
  X.one_pass({ "log_softmax", "softmax" }, function() y = F.cross_entropy(x, t, opts) end, what .. " forward")
  local g = X.rand(9, y:size(), y.dtype, 1, 1.5)
  X.one_pass({ "log_softmax", "softmax" }, function() y:backward(g) end, what .. " backward")
  local x64 = x:detach():to("f64"):requires_grad_(true)
  local want = ref(x64, t, opts)
  want:backward(g:to("f64"))
  assert.are.equal(x.dtype, y.dtype)
  X.close(y, want:detach(), tol, what .. " loss")
  X.close(X.grad_of(x), x64.grad, tol, what .. " gradient")
end

describe("cross_entropy, fused (cross_entropy, cross_entropy_bwd)", function()
  local w = X.rand(30, { C }, "f64", 0.3, 1)
  for _, dtype in ipairs { "f64", "f32" } do
    local N, tol = dtype == "f64" and 37 or 1300, dtype == "f64" and X.TOL64 or X.TOL32
    for _, red in ipairs { "none", "mean", "sum" } do
      it(string.format("%s N %d C %d reduction %s: plain, weight, ignore, smoothing", dtype, N, C, red), function()
        local cases = {
          { "plain", {} },
          { "weight", { weight = w:to(dtype) } },
          { "ignore -100", {}, -100 },
          { "ignore class 3", { ignore_index = 3 }, 3 },
          { "smoothing 0.1", { label_smoothing = 0.1 } },
          { "weight + ignore + smoothing 0.2", { weight = w:to(dtype), label_smoothing = 0.2 }, -100 },
          { "smoothing 1", { label_smoothing = 1 }, -100 },
        }
        for k, c in ipairs(cases) do
          local opts = { reduction = red }
          for key, val in pairs(c[2]) do opts[key] = val end
          check(dtype .. " " .. red .. " " .. c[1], X.leaf(k, { N, C }, dtype, 3), targets(k, N, c[3]), opts, tol)
        end
      end)
    end
  end

  it("3-D logits (B, T, C) and strided logits", function()
    local x = X.leaf(40, { 2, 5, C }, "f64", 2)
    local t = targets(41, 10, -100):view(2, 5)
    local y = F.cross_entropy(x, t, { reduction = "none" })
    assert.are.same({ 2, 5 }, y:size())
    local g = X.rand(42, { 2, 5 })
    y:backward(g)
    local x64 = x:detach():requires_grad_(true)
    local want = ref(x64:view(10, C), t:view(10), { reduction = "none" })
    want:backward(g:view(10))
    X.close(y:view(10), want:detach(), X.TOL64, "3-D loss")
    X.close(X.grad_of(x), x64.grad, X.TOL64, "3-D gradient")
    local base = X.leaf(43, { C, 9 }, "f64", 2)
    local tt = targets(44, 9)
    F.cross_entropy(base:t(), tt, { label_smoothing = 0.1 }):backward()
    local gx = X.grad_of(base)
    ref(base:t(), tt, { label_smoothing = 0.1 }):backward()
    X.close(gx, X.grad_of(base), X.TOL64, "strided gradient")
  end)

  it("1-D logits (C) with a scalar target", function()
    local x = X.leaf(45, { C }, "f64", 2)
    local t = loom.tensor(7, { dtype = "i64" })
    local y = F.cross_entropy(x, t)
    assert.are.same({}, y:size())
    y:backward()
    local x64 = x:detach():requires_grad_(true)
    local want = ref(x64:view(1, C), t:view(1), {})
    want:backward()
    X.close(y, want:detach(), X.TOL64, "loss")
    X.close(X.grad_of(x), x64.grad, X.TOL64, "gradient")
  end)

  it("bf16 logits: f32 inside, the loss in bf16", function()
    local x = X.leaf(46, { 30, C }, "bf16", 2)
    check("bf16", x, targets(47, 30, -100), { label_smoothing = 0.1 }, 2e-2)
  end)

  it("passes f64 gradient checks", function()
    local t = loom.tensor({ 2, -100, 1, 3 }, { dtype = "i64" })
    local wt = X.rand(48, { 3 }, "f64", 0.3, 1)
    for _, o in ipairs { {}, { weight = wt, label_smoothing = 0.3 }, { reduction = "none", label_smoothing = 0.1 } } do
      R.gradcheck(function(x) return F.cross_entropy(x, t, o) end, { X.leaf(49, { 4, 3 }) })
    end
  end)

  it("keeps each row's log-sum-exp as the op's second output; loom.F returns one value", function()
    local x, t = X.rand(50, { 6, C }), targets(51, 6)
    assert.are.equal(1, select("#", F.cross_entropy(x, t)))
    local _, lse = loom.op("cross_entropy", { x, t - 1 }, { -101, 1 }, { 0 })
    local m = x:max(2, true)
    X.close(lse, ((x - m):exp():sum(2, true):log() + m):view(6), X.TOL64, "lse")
  end)

  it("probabilities as targets still take the composed form", function()
    local x = X.leaf(52, { 5, 7 })
    local p = X.rand(53, { 5, 7 }):softmax(2)
    local n = X.calls({ "log_softmax" }, function() F.cross_entropy(x, p) end)
    assert.is_true(n.log_softmax > 0)
  end)
end)
