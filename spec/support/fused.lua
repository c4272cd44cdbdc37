-- fused.lua: what the fused-kernel specs (spec/fused_*_spec.lua) share
-- (`local X = require("support.fused")`): whether this run has the CPU's
-- fused kernels (LOOM_CPU_FUSED=0 leaves them out, so the same specs check
-- the ops' composed forms), random inputs from loom's seeded RNG, tensor
-- comparison within a tolerance, and op-call counts (the profiler's) to
-- show a fused path ran as one kernel.
local loom = require("loom")
local R = require("support.ref")
local C = loom.C

local X = {}

X.FUSED = os.getenv("LOOM_CPU_FUSED") ~= "0"

-- tolerances: |got - want| <= tol * max(1, |want|) elementwise
X.TOL64, X.TOL32 = 1e-10, 2e-5

-- a leaf of `shape` (randn * scale + shift) in dtype, requiring grad
function X.leaf(seed, shape, dtype, scale, shift)
  loom.manual_seed(seed)
  local t = loom.randn(shape):to("f64") * (scale or 1) + (shift or 0)
  return t:to(dtype or "f64"):requires_grad_(true)
end

-- a plain tensor of `shape` (no grad)
function X.rand(seed, shape, dtype, scale, shift)
  return X.leaf(seed, shape, dtype, scale, shift):detach()
end

-- got and want (tensors of one shape) agree within tol; `what` names them
function X.close(got, want, tol, what)
  assert(got ~= nil, (what or "value") .. ": got nil")
  local gs, ws = got:size(), want:size()
  assert(#gs == #ws, string.format("%s: %d dims, expected %d", what or "value", #gs, #ws))
  for d = 1, #ws do
    assert(gs[d] == ws[d], string.format("%s: size %d in dim %d, expected %d", what or "value", gs[d], d, ws[d]))
  end
  local g, w = R.flat(got:to("f64"):totable()), R.flat(want:to("f64"):totable())
  for i = 1, #w do
    local a, b = g[i], w[i]
    local ok = (a ~= a and b ~= b) or a == b or math.abs(a - b) <= tol * math.max(1, math.abs(b))
    if not ok then
      error(string.format("%s: element %d is %.17g, expected %.17g (tol %g)", what or "value", i, a, b, tol), 2)
    end
  end
end

-- calls of each named op while fn runs: {name = count}
function X.calls(names, fn)
  C.lm_profile_reset()
  C.lm_profile_enable(1)
  local ok, err = pcall(fn)
  C.lm_profile_enable(0)
  if not ok then error(err, 0) end
  local n = {}
  for _, name in ipairs(names) do n[name] = tonumber(C.lm_profile_calls(C.lm_op_find(name))) end
  C.lm_profile_reset()
  return n
end

-- with the fused kernels, fn runs none of the composed form's ops `names`
-- (without them, it runs at least one: the check then shows the fallback ran)
function X.one_pass(names, fn, what)
  local n = X.calls(names, fn)
  local total = 0
  for _, name in ipairs(names) do total = total + n[name] end
  if X.FUSED then
    assert(total == 0, string.format("%s: the fused path ran %d calls of %s", what, total, table.concat(names, "/")))
  else
    assert(total > 0, string.format("%s: the composed path ran none of %s", what, table.concat(names, "/")))
  end
end

-- x's gradient after y:backward(g), then cleared
function X.grad_of(x)
  local g = x.grad
  x.grad = nil
  return g
end

return X
