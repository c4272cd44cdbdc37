-- nn_ops_spec.lua: the neural-network registry ops (core/ops_nn.c) called
-- by name with C conventions (0-based dims and ids), checked against plain
-- Lua references in f64 and their gradients against central differences.
local loom = require "loom"
local ffi = require "ffi"

-- deterministic numbers in (-1, 1), independent of loom's RNG
local seed = 12345
local function rnd()
  seed = (seed * 1103515245 + 12345) % 2147483648
  return seed / 2147483648 * 2 - 1
end

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

local function nest(flat, shape)
  local i = 0
  local function build(d)
    if d > #shape then i = i + 1 return flat[i] end
    local t = {}
    for k = 1, shape[d] do t[k] = build(d + 1) end
    return t
  end
  return build(1)
end

local function rand_flat(shape, scale)
  local t = {}
  for i = 1, numel(shape) do t[i] = rnd() * (scale or 1) end
  return t
end

local function T(flat, shape, dtype) return loom.tensor(nest(flat, shape), { dtype = dtype or "f64" }) end

local function flat(x)
  local out = {}
  local function walk(v)
    if type(v) == "table" then for _, e in ipairs(v) do walk(e) end else out[#out + 1] = v end
  end
  walk(x:totable())
  return out
end

local function close(got, want, tol, what)
  assert.are.equal(#want, #got, (what or "") .. ": element count")
  for i = 1, #want do
    local g, w = got[i], want[i]
    local ok = (g ~= g and w ~= w) or g == w or math.abs(g - w) <= tol * math.max(1, math.abs(w))
    if not ok then
      error(string.format("%s: element %d is %.17g, expected %.17g", what or "values", i, g, w), 2)
    end
  end
end

local function same_shape(x, shape)
  assert.are.same(shape, x:size())
end

-- Gradients of sum(f(inputs) * R) for the inputs listed in `which` (f64
-- leaves), against central differences.
local function gradcheck(f, inputs, which, tol)
  tol = tol or 1e-6
  for _, k in ipairs(which) do inputs[k].requires_grad = true end
  local out = f(inputs)
  local r = T(rand_flat(out:size()), out:size())
  local function value() return f(inputs):mul(r):sum():item() end
  out:mul(r):sum():backward()
  local h = 1e-6
  for _, k in ipairs(which) do
    local x = inputs[k]
    assert.is_truthy(x.grad, "input " .. k .. " got no gradient")
    local g = flat(x.grad)
    local p = ffi.cast("double*", loom.C.lm_data(x))
    local num = {}
    for i = 0, x:numel() - 1 do
      local old = p[i]
      p[i] = old + h
      local fp = loom.no_grad(value)
      p[i] = old - h
      local fm = loom.no_grad(value)
      p[i] = old
      num[i + 1] = (fp - fm) / (2 * h)
    end
    close(g, num, tol, "gradient of input " .. k)
  end
end

local function errors_with(pattern, fn)
  local ok, msg = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.is_truthy(tostring(msg):find(pattern, 1, true), "message: " .. tostring(msg))
end

-- references ------------------------------------------------------------
local function strides_of(shape, d)
  local outer, inner = 1, 1
  for k = 1, d - 1 do outer = outer * shape[k] end
  for k = d + 1, #shape do inner = inner * shape[k] end
  return outer, shape[d], inner
end

local function ref_softmax(x, shape, d, log)
  local outer, n, inner = strides_of(shape, d)
  local y = {}
  for o = 0, outer - 1 do
    for i = 0, inner - 1 do
      local m = -math.huge
      for j = 0, n - 1 do m = math.max(m, x[o * n * inner + j * inner + i + 1]) end
      local s = 0
      for j = 0, n - 1 do s = s + math.exp(x[o * n * inner + j * inner + i + 1] - m) end
      for j = 0, n - 1 do
        local at = o * n * inner + j * inner + i + 1
        y[at] = log and x[at] - m - math.log(s) or math.exp(x[at] - m) / s
      end
    end
  end
  return y
end

local function ref_norm(x, rows, n, w, b, eps, rms)
  local y = {}
  for r = 0, rows - 1 do
    local mu, var = 0, 0
    if not rms then
      for j = 1, n do mu = mu + x[r * n + j] end
      mu = mu / n
    end
    for j = 1, n do var = var + (x[r * n + j] - mu) ^ 2 end
    var = var / n
    for j = 1, n do
      local v = (x[r * n + j] - mu) / math.sqrt(var + eps)
      if w then v = v * w[j] end
      if b then v = v + b[j] end
      y[r * n + j] = v
    end
  end
  return y
end

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

describe("softmax and log_softmax", function()
  for _, log in ipairs { false, true } do
    local name = log and "log_softmax" or "softmax"
    it(name .. " matches the reference along every dim (negative dims too)", function()
      local shape = { 2, 3, 4 }
      local xf = rand_flat(shape, 3)
      local x = T(xf, shape)
      for d = 1, 3 do
        for _, cd in ipairs { d - 1, d - 4 } do
          local y = loom.op(name, { x }, { cd })
          same_shape(y, shape)
          close(flat(y), ref_softmax(xf, shape, d, log), 1e-12, name .. " dim " .. d)
        end
      end
    end)

    it(name .. " is stable for large logits and works in f32 and bf16", function()
      local xf = { 1000, 1001, 1002, -1000 }
      close(flat(loom.op(name, { T(xf, { 4 }) }, { 0 })), ref_softmax(xf, { 4 }, 1, log), 1e-12, "f64")
      local shape = { 3, 5 }
      local yf = rand_flat(shape, 4)
      close(flat(loom.op(name, { T(yf, shape, "f32") }, { 1 })), ref_softmax(yf, shape, 2, log), 1e-5, "f32")
      local y = loom.op(name, { T(yf, shape, "bf16") }, { -1 })
      assert.are.equal("bf16", y.dtype)
      close(flat(y), ref_softmax(flat(T(yf, shape, "bf16")), shape, 2, log), 2e-2, "bf16")
    end)

    it(name .. " has the right gradient", function()
      local shape = { 2, 3, 4 }
      for _, d in ipairs { 0, 1, -1 } do
        gradcheck(function(t) return loom.op(name, { t[1] }, { d }) end, { T(rand_flat(shape), shape) }, { 1 })
      end
    end)
  end

  it("rejects integer tensors and bad dims", function()
    errors_with("expected a floating point tensor", function()
      loom.op("softmax", { loom.tensor({ 1, 2 }, { dtype = "i64" }) }, { 0 })
    end)
    errors_with("dim", function() loom.op("softmax", { T({ 1, 2 }, { 2 }) }, { 3 }) end)
  end)
end)

describe("layer_norm and rms_norm", function()
  local shape, eps = { 2, 3, 4 }, 1e-5

  it("layer_norm over the last dim and the last two dims, with and without weight and bias", function()
    local xf = rand_flat(shape, 2)
    local x = T(xf, shape)
    local w1, b1 = rand_flat({ 4 }), rand_flat({ 4 })
    local y = loom.op("layer_norm", { x, T(w1, { 4 }), T(b1, { 4 }) }, { 1, 1, 1 }, { eps })
    same_shape(y, shape)
    close(flat(y), ref_norm(xf, 6, 4, w1, b1, eps), 1e-12, "w, b")
    close(flat(loom.op("layer_norm", { x }, { 1, 0, 0 }, { eps })), ref_norm(xf, 6, 4, nil, nil, eps), 1e-12, "none")
    close(flat(loom.op("layer_norm", { x, T(b1, { 4 }) }, { 1, 0, 1 }, { eps })),
          ref_norm(xf, 6, 4, nil, b1, eps), 1e-12, "bias only")
    local w2 = rand_flat({ 3, 4 })
    close(flat(loom.op("layer_norm", { x, T(w2, { 3, 4 }) }, { 2, 1, 0 }, { 0.1 })),
          ref_norm(xf, 2, 12, w2, nil, 0.1), 1e-12, "two dims")
  end)

  it("rms_norm with and without weight; f32 and bf16 keep their dtype", function()
    local xf = rand_flat(shape, 2)
    local w = rand_flat({ 4 })
    close(flat(loom.op("rms_norm", { T(xf, shape), T(w, { 4 }) }, { 1, 1 }, { eps })),
          ref_norm(xf, 6, 4, w, nil, eps, true), 1e-12, "rms w")
    close(flat(loom.op("rms_norm", { T(xf, shape) }, { 1, 0 }, { eps })),
          ref_norm(xf, 6, 4, nil, nil, eps, true), 1e-12, "rms")
    local y = loom.op("rms_norm", { T(xf, shape, "f32"), T(w, { 4 }, "f32") }, { 1, 1 }, { eps })
    assert.are.equal("f32", y.dtype)
    close(flat(y), ref_norm(xf, 6, 4, w, nil, eps, true), 1e-5, "rms f32")
    local xb = T(xf, shape, "bf16")
    local yb = loom.op("layer_norm", { xb }, { 1 }, { eps })
    assert.are.equal("bf16", yb.dtype)
    close(flat(yb), ref_norm(flat(xb), 6, 4, nil, nil, eps), 2e-2, "layer bf16")
  end)

  it("has the right gradients for x, weight and bias", function()
    local mk = function() return T(rand_flat(shape, 2), shape) end
    gradcheck(function(t) return loom.op("layer_norm", t, { 1, 1, 1 }, { eps }) end,
              { mk(), T(rand_flat({ 4 }), { 4 }), T(rand_flat({ 4 }), { 4 }) }, { 1, 2, 3 })
    gradcheck(function(t) return loom.op("layer_norm", t, { 2, 1, 0 }, { eps }) end,
              { mk(), T(rand_flat({ 3, 4 }), { 3, 4 }) }, { 1, 2 })
    gradcheck(function(t) return loom.op("layer_norm", t, { 1, 0, 0 }, { eps }) end, { mk() }, { 1 })
    gradcheck(function(t) return loom.op("rms_norm", t, { 1, 1 }, { eps }) end,
              { mk(), T(rand_flat({ 4 }), { 4 }) }, { 1, 2 })
    gradcheck(function(t) return loom.op("rms_norm", t, { 2, 0 }, { eps }) end, { mk() }, { 1 })
  end)

  it("checks its arguments", function()
    local x = T(rand_flat(shape), shape)
    errors_with("argument #2 (weight) expected the shape of the input's last 1 dim",
                function() loom.op("layer_norm", { x, T({ 1, 2, 3 }, { 3 }) }, { 1, 1, 0 }, { eps }) end)
    errors_with("normalized shape expected 1 to 3 dims", function() loom.op("rms_norm", { x }, { 4, 0 }, { eps }) end)
    errors_with("attrs announce 2 tensor arguments", function() loom.op("layer_norm", { x }, { 1, 1, 0 }, { eps }) end)
  end)
end)

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

describe("triu and tril", function()
  local shape = { 2, 3, 4 }
  local function ref(xf, k, upper)
    local y = {}
    for b = 0, 1 do
      for i = 0, 2 do
        for j = 0, 3 do
          local at = b * 12 + i * 4 + j + 1
          local keep = upper and j - i >= k or (not upper and j - i <= k)
          y[at] = keep and xf[at] or 0
        end
      end
    end
    return y
  end
  for _, upper in ipairs { true, false } do
    local name = upper and "triu" or "tril"
    it(name .. " keeps the right diagonals, forward and backward", function()
      local xf = rand_flat(shape)
      for _, k in ipairs { -2, -1, 0, 1, 3 } do
        close(flat(loom.op(name, { T(xf, shape) }, { k })), ref(xf, k, upper), 0, name .. " k=" .. k)
        gradcheck(function(t) return loom.op(name, { t[1] }, { k }) end, { T(xf, shape) }, { 1 })
      end
      local b = loom.op(name, { loom.tensor({ { true, true }, { true, true } }) }, { 0 })
      assert.are.same(upper and { { true, true }, { false, true } } or { { true, false }, { true, true } }, b:totable())
    end)
  end
  it("needs 2 dims", function()
    errors_with("expected at least 2 dims", function() loom.op("triu", { T({ 1, 2 }, { 2 }) }, { 0 }) end)
  end)
end)

describe("scaled_dot_product_attention", function()
  -- q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev); mask(i, j) -> true/false or a number
  local function ref(q, k, v, B, H, L, S, E, Ev, o)
    local scale = o.scale or 1 / math.sqrt(E)
    local out = {}
    for bh = 0, B * H - 1 do
      for i = 0, L - 1 do
        local sc, m = {}, -math.huge
        for j = 0, S - 1 do
          local s = 0
          for e = 0, E - 1 do s = s + q[(bh * L + i) * E + e + 1] * k[(bh * S + j) * E + e + 1] end
          s = s * scale
          if o.causal and j > i then s = -math.huge end
          if o.mask then
            local mv = o.mask(i, j)
            if mv == false then s = -math.huge elseif type(mv) == "number" then s = s + mv end
          end
          sc[j] = s
          m = math.max(m, s)
        end
        local z = 0
        for j = 0, S - 1 do sc[j] = math.exp(sc[j] - m) z = z + sc[j] end
        for e = 0, Ev - 1 do
          local acc = 0
          for j = 0, S - 1 do acc = acc + sc[j] / z * v[(bh * S + j) * Ev + e + 1] end
          out[(bh * L + i) * Ev + e + 1] = acc
        end
      end
    end
    return out
  end

  local B, H, L, S, E, Ev = 2, 2, 3, 4, 3, 2
  local qs, ks, vs = { B, H, L, E }, { B, H, S, E }, { B, H, S, Ev }
  local qf, kf, vf = rand_flat(qs), rand_flat(ks), rand_flat(vs)

  it("matches the reference (plain, scaled, causal, bool and float masks)", function()
    local function run(o, mask)
      local inputs = { T(qf, qs), T(kf, ks), T(vf, vs), mask }
      local y = loom.op("scaled_dot_product_attention", inputs, { o.causal and 1 or 0 }, { o.scale or 0 })
      same_shape(y, { B, H, L, Ev })
      close(flat(y), ref(qf, kf, vf, B, H, L, S, E, Ev, o), 1e-12, "sdpa")
    end
    run({})
    run({ scale = 0.3 })
    run({ causal = true })
    local mb = { { true, false, true, true }, { false, true, true, false }, { true, true, false, true } }
    run({ mask = function(i, j) return mb[i + 1][j + 1] end }, loom.tensor(mb))
    local mf = rand_flat({ L, S })
    run({ mask = function(i, j) return mf[i * S + j + 1] end }, T(mf, { L, S }))
  end)

  it("has the right gradients for q, k, v and a float mask", function()
    local function f(o) return function(t) return loom.op("scaled_dot_product_attention", t, { o.causal and 1 or 0 }, { o.scale or 0 }) end end
    gradcheck(f {}, { T(qf, qs), T(kf, ks), T(vf, vs) }, { 1, 2, 3 })
    gradcheck(f { causal = true, scale = 0.7 }, { T(qf, qs), T(kf, ks), T(vf, vs) }, { 1, 2, 3 })
    gradcheck(f {}, { T(qf, qs), T(kf, ks), T(vf, vs), T(rand_flat({ L, S }), { L, S }) }, { 1, 2, 3, 4 })
    local mb = loom.tensor { { true, false, true, true }, { false, true, true, false }, { true, true, false, true } }
    gradcheck(f {}, { T(qf, qs), T(kf, ks), T(vf, vs), mb }, { 1, 2, 3 })
  end)

  it("checks shapes", function()
    errors_with("argument #2 (key) expected the query's last dim", function()
      loom.op("scaled_dot_product_attention", { T(qf, qs), T(rand_flat({ B, H, S, 2 }), { B, H, S, 2 }), T(vf, vs) }, { 0 }, { 0 })
    end)
    errors_with("argument #3 (value) expected the key's length", function()
      loom.op("scaled_dot_product_attention", { T(qf, qs), T(kf, ks), T(rand_flat({ B, H, 2, Ev }), { B, H, 2, Ev }) }, { 0 }, { 0 })
    end)
    errors_with("attn_mask and is_causal", function()
      loom.op("scaled_dot_product_attention", { T(qf, qs), T(kf, ks), T(vf, vs), T(rand_flat({ L, S }), { L, S }) }, { 1 }, { 0 })
    end)
  end)
end)

describe("rope", function()
  -- x (B, T, H, D); angle(t, i) = t * theta^(-2i/D), pairs (2i, 2i+1) as complex numbers
  local B, Tn, H, D = 2, 3, 2, 4
  local shape = { B, Tn, H, D }
  local function tables(theta)
    local c, s = {}, {}
    for t = 0, Tn - 1 do
      for i = 0, D / 2 - 1 do
        local a = t * theta ^ (-2 * i / D)
        c[t * D / 2 + i + 1], s[t * D / 2 + i + 1] = math.cos(a), math.sin(a)
      end
    end
    return c, s
  end
  local function ref(xf, c, s)
    local y = {}
    for b = 0, B - 1 do
      for t = 0, Tn - 1 do
        for h = 0, H - 1 do
          for i = 0, D / 2 - 1 do
            local at = ((b * Tn + t) * H + h) * D + 2 * i + 1
            local re, im = xf[at], xf[at + 1]
            local cr, ci = c[t * D / 2 + i + 1], s[t * D / 2 + i + 1]
            y[at], y[at + 1] = re * cr - im * ci, re * ci + im * cr
          end
        end
      end
    end
    return y
  end
  local cf, sf = tables(10000)

  it("rotates interleaved pairs as Llama's apply_rotary_emb", function()
    local xf = rand_flat(shape)
    local y = loom.op("rope", { T(xf, shape), T(cf, { Tn, D / 2 }), T(sf, { Tn, D / 2 }) })
    same_shape(y, shape)
    close(flat(y), ref(xf, cf, sf), 1e-12, "rope")
    local yb = loom.op("rope", { T(xf, shape, "f32"), T(cf, { Tn, D / 2 }, "f32"), T(sf, { Tn, D / 2 }, "f32") })
    assert.are.equal("f32", yb.dtype)
    close(flat(yb), ref(xf, cf, sf), 1e-6, "rope f32")
  end)

  it("has the right gradient (rotation by the opposite angle)", function()
    local c, s = T(cf, { Tn, D / 2 }), T(sf, { Tn, D / 2 })
    gradcheck(function(t) return loom.op("rope", { t[1], c, s }) end, { T(rand_flat(shape), shape) }, { 1 })
  end)

  it("checks shapes", function()
    errors_with("expected shape (3, 2)", function()
      loom.op("rope", { T(rand_flat(shape), shape), T(rand_flat({ 2, 2 }), { 2, 2 }), T(sf, { Tn, D / 2 }) })
    end)
    errors_with("even head_dim", function()
      local x = T(rand_flat({ 1, Tn, 1, 3 }), { 1, Tn, 1, 3 })
      loom.op("rope", { x, T(cf, { Tn, D / 2 }), T(sf, { Tn, D / 2 }) })
    end)
  end)
end)

describe("nn_functional_ops helpers", function()
  local nfo = require "loom.nn_functional_ops"
  it("rope_tables builds Llama's angles t * theta^(-2i/D)", function()
    local c, s = nfo.rope_tables(5, 6, { theta = 500, dtype = "f64" })
    same_shape(c, { 5, 3 })
    local wc, ws = {}, {}
    for t = 0, 4 do
      for i = 0, 2 do
        local a = t * 500 ^ (-2 * i / 6)
        wc[#wc + 1], ws[#ws + 1] = math.cos(a), math.sin(a)
      end
    end
    close(flat(c), wc, 1e-12, "cos")
    close(flat(s), ws, 1e-12, "sin")
    assert.are.equal("f32", (nfo.rope_tables(2, 4)).dtype)
  end)
  it("apply_rotary_emb keeps norms of pairs and inverts with the opposite angle", function()
    local c, s = nfo.rope_tables(3, 4, { dtype = "f64" })
    local xf = rand_flat({ 1, 3, 2, 4 })
    local y = nfo.apply_rotary_emb(T(xf, { 1, 3, 2, 4 }), c, s)
    local back = nfo.apply_rotary_emb(y, c, s:neg())
    close(flat(back), xf, 1e-12, "inverse")
  end)
end)

describe("nn ops on strided inputs and in f32", function()
  it("softmax, layer_norm and rope accept transposed views", function()
    local xf = rand_flat({ 4, 3 })
    local xt = T(xf, { 4, 3 }):transpose(1, 2) -- (3, 4), not contiguous
    local want = ref_softmax(flat(xt), { 3, 4 }, 2, false)
    close(flat(loom.op("softmax", { xt }, { 1 })), want, 1e-12, "softmax")
    close(flat(loom.op("layer_norm", { xt }, { 1 }, { 1e-5 })), ref_norm(flat(xt), 3, 4, nil, nil, 1e-5), 1e-12, "ln")
    local nfo = require "loom.nn_functional_ops"
    local c, s = nfo.rope_tables(3, 4, { dtype = "f64" })
    local x4 = T(rand_flat({ 2, 3, 1, 4 }), { 2, 3, 1, 4 })
    local xv = x4:transpose(1, 3):transpose(1, 3) -- same values, through views
    close(flat(nfo.apply_rotary_emb(xv, c, s)), flat(nfo.apply_rotary_emb(x4, c, s)), 0, "rope")
  end)

  it("attention in f32 keeps f32", function()
    local q, k, v = rand_flat({ 2, 3, 4 }), rand_flat({ 2, 5, 4 }), rand_flat({ 2, 5, 4 })
    local y64 = loom.op("scaled_dot_product_attention", { T(q, { 2, 3, 4 }), T(k, { 2, 5, 4 }), T(v, { 2, 5, 4 }) }, { 1 }, { 0 })
    local y32 = loom.op("scaled_dot_product_attention",
                        { T(q, { 2, 3, 4 }, "f32"), T(k, { 2, 5, 4 }, "f32"), T(v, { 2, 5, 4 }, "f32") }, { 1 }, { 0 })
    assert.are.equal("f32", y32.dtype)
    close(flat(y32), flat(y64), 1e-5, "f32")
  end)
end)

describe("nn ops leak nothing", function()
  it("forward and backward of every op leave no storages behind", function()
    local function round()
      local x = T(rand_flat({ 4, 5 }), { 4, 5 })
      x.requires_grad = true
      local w = T(rand_flat({ 5 }), { 5 })
      w.requires_grad = true
      local e = T(rand_flat({ 6, 5 }), { 6, 5 })
      e.requires_grad = true
      local ids = loom.tensor({ 0, 2, 5, 1 }, { dtype = "i64" })
      local h = loom.op("embedding", { e, ids }):add(x)
      h = loom.op("layer_norm", { h, w }, { 1, 1, 0 }, { 1e-5 })
      h = loom.op("rms_norm", { h, w }, { 1, 1 }, { 1e-5 })
      h = loom.op("softmax", { h }, { 0 }):add(loom.op("log_softmax", { h }, { 1 }))
      h = loom.op("triu", { h }, { 0 }):add(loom.op("tril", { h }, { 1 }))
      local q = h:reshape(1, 4, 5)
      h = loom.op("scaled_dot_product_attention", { q, q, q }, { 1 }, { 0 }):reshape(4, 5)
      local c, s = T(rand_flat({ 2, 1 }), { 2, 1 }), T(rand_flat({ 2, 1 }), { 2, 1 })
      h = loom.op("rope", { h:reshape(2, 2, 1, 5):narrow(4, 1, 2), c, s }):reshape(4, 2)
      local l = loom.op("cross_entropy", { h, loom.tensor({ 1, 0, -100, 1 }, { dtype = "i64" }) }, { -100, 1 }, { 0.1 })
      l:backward()
      assert.is_truthy(x.grad and w.grad and e.grad)
    end
    round()
    collectgarbage() collectgarbage()
    local before = tonumber(loom.C.lm_storage_count())
    for _ = 1, 3 do round() end
    collectgarbage() collectgarbage()
    assert.are.equal(before, tonumber(loom.C.lm_storage_count()))
  end)
end)
