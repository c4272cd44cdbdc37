-- nn_ops.lua: shared by the nn-op specs (nn_ops_*_spec.lua), which call the
-- registry ops of core/ops_nn.c by name with C conventions (0-based dims and
-- ids): inputs as flat f64 lists, the checks on them, and the plain-Lua
-- references (softmax, layer/RMS norm) more than one of those specs uses.
-- `local N = require("support.nn_ops")`.
local loom = require("loom")
local luassert = require("luassert")
local R = require("support.ref")

local N = {}

-- a flat list of numel(shape) numbers in (-scale, scale), from ref's LCG
function N.rand_flat(shape, scale)
  local t = {}
  for i = 1, R.numel(shape) do t[i] = (R.uniform01() * 2 - 1) * (scale or 1) end
  return t
end

-- a tensor of shape from a flat list (f64 unless dtype says)
function N.T(flat, shape, dtype) return loom.tensor(R.build(flat, shape), { dtype = dtype or "f64" }) end

-- a tensor's elements as a flat list
function N.flat(x) return R.flat(x:totable()) end

-- flat lists equal within |got - want| <= tol * max(1, |want|) (NaN equals NaN)
function N.close(got, want, tol, what)
  luassert.are.equal(#want, #got, (what or "") .. ": element count")
  for i = 1, #want do
    local g, w = got[i], want[i]
    local ok = (g ~= g and w ~= w) or g == w or math.abs(g - w) <= tol * math.max(1, math.abs(w))
    if not ok then
      error(string.format("%s: element %d is %.17g, expected %.17g", what or "values", i, g, w), 2)
    end
  end
end

function N.same_shape(x, shape) luassert.are.same(shape, x:size()) end

-- gradients of f(inputs) for the inputs listed in `which` (f64 leaves)
-- against central differences (ref's gradcheck, within tol, 1e-6)
function N.gradcheck(f, inputs, which, tol)
  for _, k in ipairs(which) do inputs[k].requires_grad = true end
  R.gradcheck(function(...) return f({ ... }) end, inputs, { tol = tol })
end

-- fn raises an error whose message holds pattern (plain text)
function N.errors_with(pattern, fn)
  local msg = R.errmsg(fn)
  luassert.is_truthy(msg:find(pattern, 1, true), "message: " .. msg)
end

---------------------------------------------------------------------------
-- references on flat lists, f64

-- sizes before, along and after dim d (1-based) of shape
local function strides_of(shape, d)
  local outer, inner = 1, 1
  for k = 1, d - 1 do outer = outer * shape[k] end
  for k = d + 1, #shape do inner = inner * shape[k] end
  return outer, shape[d], inner
end

-- softmax (log_softmax with log) of x (flat, shape) along dim d (1-based)
function N.softmax(x, shape, d, log)
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

-- layer_norm (rms_norm with rms) of `rows` rows of n, optional weight w and bias b
function N.norm(x, rows, n, w, b, eps, rms)
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

return N
