-- nn_ops_loss_spec.lua: embedding and cross_entropy, the registry ops of
-- core/ops_nn.c called by name with C conventions (0-based ids), against
-- plain-Lua references in f64 and their gradients against central
-- differences.
local loom, S = require("loom"), require("support.nn_ops")
local T, flat, rand_flat, close, same_shape = S.T, S.flat, S.rand_flat, S.close, S.same_shape
local gradcheck, errors_with = S.gradcheck, S.errors_with
local ref_softmax = S.softmax

-- PyTorch's cross_entropy, written as its source does it: nll_loss plus
-- the smoothing term, ids 0-based.
local function ref_cross_entropy(x, N, C, target, o)
  local w, ignore, red, eps = o.weight, o.ignore_index or -100, o.reduction or "mean", o.ls or 0
  local logp = ref_softmax(x, { N, C }, 2, true)
  local nll, smooth, wsum, count = {}, {}, 0, 0
  for n = 0, N - 1 do
    local t = target[n + 1]
    if t == ignore then
      nll[n + 1], smooth[n + 1] = 0, 0
    else
      local wt = w and w[t + 1] or 1
      nll[n + 1] = -wt * logp[n * C + t + 1]
      wsum, count = wsum + wt, count + 1
      local s = 0
      for c = 0, C - 1 do s = s - (w and w[c + 1] or 1) * logp[n * C + c + 1] end
      smooth[n + 1] = s
    end
  end
  if red == "none" then
    local out = {}
    for n = 1, N do out[n] = (1 - eps) * nll[n] + eps / C * smooth[n] end
    return out
  end
  local sn, ss = 0, 0
  for n = 1, N do sn, ss = sn + nll[n], ss + smooth[n] end
  if red == "sum" then return { (1 - eps) * sn + eps / C * ss } end
  local denom = w and wsum or count
  return { (1 - eps) * sn / denom + eps / C * ss / denom }
end

local function ref_cross_entropy_probs(x, N, C, p, o)
  local w, red, eps = o.weight, o.reduction or "mean", o.ls or 0
  local logp = ref_softmax(x, { N, C }, 2, true)
  local rows, total = {}, 0
  for n = 0, N - 1 do
    local s = 0
    for c = 0, C - 1 do
      local q = p[n * C + c + 1] * (1 - eps) + eps / C
      s = s - logp[n * C + c + 1] * q * (w and w[c + 1] or 1)
    end
    rows[n + 1], total = s, total + s
  end
  if red == "none" then return rows end
  if red == "sum" then return { total } end
  return { total / N }
end

local function red_id(r) return ({ none = 0, mean = 1, sum = 2 })[r or "mean"] end

describe("embedding", function()
  it("gathers rows for ids of any shape (0-based in C)", function()
    local wf = rand_flat({ 5, 3 })
    local w = T(wf, { 5, 3 })
    local idx = loom.tensor({ { 0, 4, 2 }, { 2, 2, 1 } }, { dtype = "i64" })
    local y = loom.op("embedding", { w, idx })
    same_shape(y, { 2, 3, 3 })
    local want = {}
    for _, id in ipairs { 0, 4, 2, 2, 2, 1 } do
      for j = 1, 3 do want[#want + 1] = wf[id * 3 + j] end
    end
    close(flat(y), want, 0, "rows")
    assert.are.equal("f32", loom.op("embedding", { T(wf, { 5, 3 }, "f32"), idx }).dtype)
  end)

  it("sums the gradient of repeated ids into the weight", function()
    local idx = loom.tensor({ { 0, 4, 2 }, { 2, 2, 1 } }, { dtype = "i64" })
    gradcheck(function(t) return loom.op("embedding", { t[1], idx }) end, { T(rand_flat({ 5, 3 }), { 5, 3 }) }, { 1 })
  end)

  it("names an id outside the vocabulary (1-based, as Lua wrote it)", function()
    local w = T(rand_flat({ 5, 3 }), { 5, 3 })
    errors_with("holds id 6, outside [1, 5]", function()
      loom.op("embedding", { w, loom.tensor({ 1, 5 }, { dtype = "i64" }) })
    end)
    errors_with("holds id 0, outside [1, 5]", function()
      loom.op("embedding", { w, loom.tensor({ -1 }, { dtype = "i64" }) })
    end)
    errors_with("expected an integer tensor", function() loom.op("embedding", { w, T({ 1 }, { 1 }) }) end)
  end)
end)

describe("cross_entropy", function()
  local N, C = 4, 5
  local xf = rand_flat({ N, C }, 3)
  local target = { 1, 0, 4, 1 }
  local wf = { 0.5, 1.5, 1, 2, 0.25 }
  local function ids(t) return loom.tensor(t, { dtype = "i64" }) end

  local cases = {
    {}, { reduction = "sum" }, { reduction = "none" }, { weight = wf }, { weight = wf, reduction = "none" },
    { ignore_index = 1 }, { ignore_index = 1, weight = wf }, { ls = 0.1 }, { ls = 0.2, weight = wf },
    { ls = 0.3, weight = wf, ignore_index = 4, reduction = "sum" }, { ls = 0.1, ignore_index = 0, reduction = "none" },
    { ls = 1 },
  }

  local function call(x, t, o)
    local inputs = { x, t }
    if o.weight then inputs[3] = T(o.weight, { C }) end
    return loom.op("cross_entropy", inputs, { o.ignore_index or -100, red_id(o.reduction) }, { o.ls or 0 })
  end

  it("matches PyTorch's formulas for class ids (weights, ignore_index, smoothing, reductions)", function()
    for k, o in ipairs(cases) do
      local y = call(T(xf, { N, C }), ids(target), o)
      same_shape(y, o.reduction == "none" and { N } or {})
      close(flat(y), ref_cross_entropy(xf, N, C, target, o), 1e-12, "case " .. k)
    end
  end)

  it("mean over all-ignored targets is nan, as in PyTorch", function()
    local v = call(T(xf, { N, C }), ids { 2, 2, 2, 2 }, { ignore_index = 2 }):item()
    assert.is_true(v ~= v)
  end)

  it("has the right gradient for class ids", function()
    for k, o in ipairs(cases) do
      gradcheck(function(t) return call(t[1], ids(target), o) end, { T(xf, { N, C }) }, { 1 })
      local _ = k
    end
  end)

  it("takes probabilities as targets, with gradients for logits and target", function()
    local pf = rand_flat({ N, C })
    for i = 1, #pf do pf[i] = math.abs(pf[i]) end
    for _, o in ipairs { {}, { reduction = "sum" }, { reduction = "none", weight = wf }, { ls = 0.2, weight = wf } } do
      local y = call(T(xf, { N, C }), T(pf, { N, C }), o)
      close(flat(y), ref_cross_entropy_probs(xf, N, C, pf, o), 1e-12, "probs")
      gradcheck(function(t) return call(t[1], t[2], o) end, { T(xf, { N, C }), T(pf, { N, C }) }, { 1, 2 })
    end
  end)

  it("takes unbatched logits (C) with a 0-dim target", function()
    local x1 = { xf[1], xf[2], xf[3], xf[4], xf[5] }
    local y = call(T(x1, { C }), loom.tensor(3, { dtype = "i64" }), { reduction = "none" })
    same_shape(y, {})
    close(flat(y), ref_cross_entropy(x1, 1, C, { 3 }, { reduction = "none" }), 1e-12, "unbatched")
    gradcheck(function(t) return call(t[1], loom.tensor(3, { dtype = "i64" }), { ls = 0.1 }) end, { T(x1, { C }) }, { 1 })
  end)

  it("works in f32 and bf16 and returns the logits' dtype", function()
    local y = call(T(xf, { N, C }, "f32"), ids(target), { weight = wf, ls = 0.1 })
    assert.are.equal("f32", y.dtype)
    close(flat(y), ref_cross_entropy(xf, N, C, target, { weight = wf, ls = 0.1 }), 1e-5, "f32")
    local xb = T(xf, { N, C }, "bf16")
    local yb = call(xb, ids(target), {})
    assert.are.equal("bf16", yb.dtype)
    close(flat(yb), ref_cross_entropy(flat(xb), N, C, target, {}), 2e-2, "bf16")
  end)

  it("checks targets and shapes", function()
    local x = T(xf, { N, C })
    errors_with("holds class 6, outside [1, 5]", function() call(x, ids { 1, 5, 0, 0 }, {}) end)
    errors_with("holds class 0, outside [1, 5]", function() call(x, ids { 1, -1, 0, 0 }, { ignore_index = -100 }) end)
    errors_with("expected class ids of shape", function() call(x, ids { 1, 2 }, {}) end)
    errors_with("expected the input's shape", function() call(x, T(rand_flat({ N, 3 }), { N, 3 }), {}) end)
    errors_with("one weight per class", function()
      loom.op("cross_entropy", { x, ids(target), T({ 1, 2 }, { 2 }) }, { -100, 1 }, { 0 })
    end)
    errors_with("reshape (B, T, C) to (B*T, C)", function()
      call(T(rand_flat({ 2, 2, C }), { 2, 2, C }), ids { 1, 2 }, {})
    end)
    errors_with("label_smoothing expected a number in [0, 1]", function() call(x, ids(target), { ls = 1.5 }) end)
  end)
end)
