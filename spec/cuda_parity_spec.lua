-- cuda_parity_spec.lua: every op of the op table (loom.ops()) that has a
-- CUDA kernel in this build runs on the CPU (the ground truth) and on CUDA
-- with the same inputs, in each dtype it supports, forward and, where it is
-- differentiable, backward. The table `cases` below gives each op its
-- inputs and attrs (C conventions: 0-based dims and ids); an activation (a
-- function of loom.F of the op's name, support/activations.lua) needs no
-- entry: it runs through F with its defaults on a 4x5 input. Any other op
-- without an entry fails the completeness spec, which runs without a GPU
-- too, so a new op gets one. Tolerances: |cuda - cpu| / |cpu| by dtype (support/cuda.lua:
-- f64 1e-10, f32 2e-5, bf16 1e-2, f16 2e-3), exact for integers and bools.
local loom = require("loom")
local G = require("support.cuda")
local A = require("support.activations")
local C = loom.C

-- inputs, from a seed so both devices get the same numbers
local function rnd(shape, dt, lo)
  local t = loom.randn(shape)
  if lo then t = t:abs() + lo end -- positive, at least lo
  return t:to(dt or "f32")
end
local function ids(shape, n) return loom.randint(0, n, shape, { dtype = "i64" }) end
local function bools(shape) return loom.randn(shape):gt(0) end

local FLOATS = { "f32", "f64", "bf16" }
local function unary(lo, floats) return { inputs = function(dt) return { rnd({ 4, 5 }, dt, lo) } end, floats = floats } end
local function binary(lo) return { inputs = function(dt) return { rnd({ 4, 5 }, dt, lo), rnd({ 1, 5 }, dt, lo) } end } end
local function compare() return { inputs = function(dt) return { rnd({ 4, 5 }, dt), rnd({ 4, 5 }, dt) } end } end
local function logical() return { dtypes = { "bool" }, inputs = function() return { bools({ 4, 5 }), bools({ 4, 5 }) } end } end
local COLLECTIVE = "a collective on a device mesh: spec/dist runs it on 2 and 4 ranks (NCCL on GPUs)"

-- name -> { inputs = function(dtype) -> {tensors}, ints, floats, dtypes
-- (default FLOATS), grad = {indices} (default: every float input of a
-- differentiable op), tol = {dtype = tol} } or { none = "why no case" }
local cases = {
  view = { inputs = function(dt) return { rnd({ 4, 6 }, dt) } end, ints = { 6, 4 } },
  reshape = { inputs = function(dt) return { rnd({ 4, 6 }, dt):t() } end, ints = { 24 } }, -- a copy
  transpose = { inputs = function(dt) return { rnd({ 3, 4, 5 }, dt) } end, ints = { 0, 2 } },
  permute = { inputs = function(dt) return { rnd({ 2, 3, 4 }, dt) } end, ints = { 2, 0, 1 } },
  narrow = { inputs = function(dt) return { rnd({ 5, 6 }, dt) } end, ints = { 1, 2, 3 } },
  expand = { inputs = function(dt) return { rnd({ 3, 1 }, dt) } end, ints = { 2, 3, 4 } },
  contiguous = { inputs = function(dt) return { rnd({ 4, 6 }, dt):t() } end },
  clone = { inputs = function(dt) return { rnd({ 4, 6 }, dt) } end },
  to = { inputs = function(dt) return { rnd({ 4, 6 }, dt) } end,
         ints = function(dt) return { dt == "f32" and C.LM_BF16 or C.LM_F32 } end },
  swiglu = { inputs = function(dt) return { rnd({ 4, 6 }, dt), rnd({ 4, 6 }, dt) } end },
  to_device = { none = "it moves a tensor between devices, the parity spec's own means; spec/cuda_spec.lua checks it" },
  unsqueeze = { inputs = function(dt) return { rnd({ 3, 4 }, dt) } end, ints = { 1 } },
  squeeze = { inputs = function(dt) return { rnd({ 3, 1, 4 }, dt) } end, ints = { 1 } },
  cat = { inputs = function(dt) return { rnd({ 2, 3 }, dt), rnd({ 4, 3 }, dt) } end, ints = { 0 } },
  add = binary(), sub = binary(), mul = binary(), div = binary(0.5), pow = binary(0.5),
  maximum = binary(), minimum = binary(),
  eq = compare(), ne = compare(), lt = compare(), le = compare(), gt = compare(), ge = compare(),
  logical_and = logical(), logical_or = logical(),
  neg = unary(), abs = unary(), sqrt = unary(0.1), rsqrt = unary(0.1), exp = unary(), log = unary(0.1),
  gelu_tanh = unary(),
  sin = unary(), cos = unary(), pow_scalar = unary(0.1, { 2.5 }), clamp = unary(nil, { -0.5, 0.7 }),
  add_scalar = unary(nil, { 1.5 }), mul_scalar = unary(nil, { -0.75 }), div_scalar = unary(nil, { 3 }),
  rsub_scalar = unary(nil, { 2 }),
  logical_not = { dtypes = { "bool" }, inputs = function() return { bools({ 4, 5 }) } end },
  sign = unary(), _gelu_d = unary(), _gelu_tanh_d = unary(), _silu_d = unary(),
  where = { inputs = function(dt) return { bools({ 4, 5 }), rnd({ 4, 5 }, dt), rnd({ 1, 5 }, dt) } end },
  sum = { inputs = function(dt) return { rnd({ 3, 4, 5 }, dt) } end, ints = { 1 } },
  mean = { inputs = function(dt) return { rnd({ 3, 4, 5 }, dt) } end, ints = { 2, 1 } },
  max = { inputs = function(dt) return { rnd({ 3, 4, 5 }, dt) } end, ints = { 1 } },
  min = { inputs = function(dt) return { rnd({ 3, 4, 5 }, dt) } end, ints = { 0 } },
  argmax = { inputs = function(dt) return { rnd({ 3, 4, 5 }, dt) } end, ints = { 2 } },
  argmin = { inputs = function(dt) return { rnd({ 3, 4, 5 }, dt) } end, ints = { 1 } },
  matmul = { inputs = function(dt) return { rnd({ 2, 3, 8 }, dt), rnd({ 2, 8, 5 }, dt) } end },
  grouped_mm = { -- an empty group, the groups' sizes on the device as the inputs are
    inputs = function(dt) return { rnd({ 7, 5 }, dt), rnd({ 3, 5, 4 }, dt), loom.tensor({ 2, 0, 5 }, { dtype = "i64" }) } end },
  softmax = { inputs = function(dt) return { rnd({ 3, 7 }, dt) } end, ints = { -1 } },
  log_softmax = { inputs = function(dt) return { rnd({ 3, 7 }, dt) } end, ints = { -1 } },
  layer_norm = { inputs = function(dt) return { rnd({ 3, 8 }, dt), rnd({ 8 }, dt), rnd({ 8 }, dt) } end,
                 ints = { 1, 1, 1 }, floats = { 1e-5 } },
  rms_norm = { inputs = function(dt) return { rnd({ 3, 8 }, dt), rnd({ 8 }, dt) } end,
               ints = { 1, 1 }, floats = { 1e-6 } },
  embedding = { inputs = function(dt) return { rnd({ 10, 4 }, dt), ids({ 2, 3 }, 10) } end },
  cross_entropy = {
    inputs = function(dt)
      local t = ids({ 6 }, 11)
      t = t:where(loom.tensor({ true, true, false, true, true, true }), -100) -- one row ignored
      return { rnd({ 6, 11 }, dt), t, rnd({ 11 }, dt, 0.5) }
    end,
    ints = { -100, 1 }, floats = { 0.1 }, grad = { 1 } }, -- class weights get no gradient
  triu = { inputs = function(dt) return { rnd({ 4, 5 }, dt) } end, ints = { 1 } },
  tril = { inputs = function(dt) return { rnd({ 4, 5 }, dt) } end, ints = { -1 } },
  scaled_dot_product_attention = { -- head dim 64, L != S, causal: the flash kernel's case
    inputs = function(dt) return { rnd({ 2, 3, 20, 64 }, dt), rnd({ 2, 3, 24, 64 }, dt), rnd({ 2, 3, 24, 64 }, dt) } end,
    ints = { 1 }, floats = { 0 }, tol = { bf16 = 2e-2 } },
  rope = { inputs = function(dt) return { rnd({ 2, 5, 3, 8 }, dt), rnd({ 5, 4 }), rnd({ 5, 4 }) } end, grad = { 1 } },
  _adamw_ = { dtypes = { "f32", "f64" }, inplace = true,
              inputs = function(dt) return { rnd({ 4, 5 }, dt), rnd({ 4, 5 }, dt), rnd({ 4, 5 }, dt), rnd({ 4, 5 }, dt, 0) } end,
              floats = { 1e-2, 0.9, 0.999, 1e-8, 0.01, 0.1, 0.001 } },
  _adamw_multi_ = { dtypes = { "f32", "f64" }, inplace = true,
                    inputs = function(dt)
                      return { rnd({ 4, 5 }, dt), rnd({ 4, 5 }, dt), rnd({ 4, 5 }, dt), rnd({ 4, 5 }, dt, 0),
                               rnd({ 3 }, dt), rnd({ 3 }, dt), rnd({ 3 }, dt), rnd({ 3 }, dt, 0) }
                    end,
                    floats = { 1e-2, 0.9, 0.999, 1e-8, 0.01, 0.1, 0.001 } },
  _dist_all_gather = { none = COLLECTIVE }, _dist_slice = { none = COLLECTIVE },
  _dist_all_reduce = { none = COLLECTIVE }, _dist_reduce_scatter = { none = COLLECTIVE },
  _dist_all_to_all = { none = COLLECTIVE }, _dist_to_partial = { none = COLLECTIVE },
  _dist_grad_reduce = { none = COLLECTIVE }, _dist_alias = { none = COLLECTIVE }, _dist_pad = { none = COLLECTIVE },
  _dist_all_to_all_single = { none = COLLECTIVE },
}

-- fn: the outputs from the inputs, through F for an activation
for name in pairs(A.ops()) do
  assert(not cases[name], "cuda_parity_spec: " .. name .. " runs through loom.F: its case goes")
  cases[name] = { inputs = unary().inputs, fn = loom.F[name] }
end

local function value(v, dt) if type(v) == "function" then return v(dt) end return v end
local function is_float(t) return t.dtype == "f32" or t.dtype == "f64" or t.dtype == "bf16" or t.dtype == "f16" end

-- the op's outputs on dev, from copies of the CPU inputs
local function run(o, c, dt, inputs, dev)
  local on = {}
  -- a copy on the CPU too: t:to("cpu") is t, and an in-place op run there
  -- first would hand the CUDA run its outputs as inputs
  for i, t in ipairs(inputs) do on[i] = dev == "cpu" and t:clone() or t:to(dev) end
  if c.fn then return { c.fn(unpack(on)) } end
  local a, b = loom.op(o.name, on, value(c.ints, dt), value(c.floats, dt))
  if c.inplace then return on end -- an in-place op: its inputs after it
  return { a, b }
end

local function parity(o, c, dt)
  local seed = 1000 + o.id
  loom.manual_seed(seed)
  local inputs = c.inputs(dt)
  local tol = (c.tol and c.tol[dt]) or G.tol[dt] or 0
  local want, got = run(o, c, dt, inputs, "cpu"), run(o, c, dt, inputs, "cuda")
  for k = 1, #want do
    G.close(want[k], got[k], is_float(want[k]) and tol or 0, ("%s %s output %d"):format(o.name, dt, k))
  end
  if not o.differentiable or c.inplace then return end
  local listed, which = {}, {}
  for _, i in ipairs(c.grad or {}) do listed[i] = true end
  for i, t in ipairs(inputs) do
    if is_float(t) and (not c.grad or listed[i]) then which[i] = true end
  end
  local f = c.fn or function(...) return (loom.op(o.name, { ... }, value(c.ints, dt), value(c.floats, dt))) end
  local w = function(out) loom.manual_seed(seed + 1) return loom.randn(out:size()) end
  local _, gc = G.grads("cpu", f, inputs, which, w)
  local _, gg = G.grads("cuda", f, inputs, which, w)
  for i in pairs(which) do
    local what = ("%s %s gradient of input %d"):format(o.name, dt, i)
    assert(gc[i] and gg[i], what .. ": missing on " .. (gc[i] and "cuda" or "the cpu"))
    G.close(gc[i], gg[i], tol, what)
  end
end

describe("cuda parity: the op table", function()
  it("has a case (or a reason for none) for every op of loom.ops(), and no case for an op it lacks", function()
    local names = {}
    for _, o in ipairs(loom.ops()) do
      names[o.name] = true
      local c = cases[o.name]
      assert(c, "cuda_parity_spec: no case for op " .. o.name .. ": add one to `cases`")
      assert(c.none or type(c.inputs) == "function", o.name .. ": a case needs inputs or a reason (none)")
    end
    for name in pairs(cases) do assert(names[name], "cuda_parity_spec: a case for " .. name .. ", which is no op") end
  end)
end)

if G.skip(describe, it, "cuda parity") then return end

describe("cuda parity", function()
  for _, o in ipairs(loom.ops()) do
    local c = cases[o.name]
    if o.kernels.cuda and c and not c.none then
      for _, dt in ipairs(c.dtypes or FLOATS) do
        it(("%s (%s)%s"):format(o.name, dt, o.differentiable and not c.inplace and ", forward and backward" or ""),
           function() parity(o, c, dt) end)
      end
    end
  end
end)
