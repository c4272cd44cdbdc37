-- ref.lua: independent references for the specs (`local R = require
-- "support.ref"`). Plain-Lua f64 math on nested tables (the shape totable()
-- returns), comparison helpers, and a finite-difference gradient check; the
-- scalar functions of support/scalar.lua come with it. Nothing here calls
-- loom's math: loom is only used to move numbers in and out of tensors.
local ffi = require("ffi")

local R = {}

---------------------------------------------------------------------------
-- nested tables <-> (flat list, shape)

function R.shape(t)
  local s = {}
  while type(t) == "table" do
    s[#s + 1] = #t
    t = t[1]
  end
  return s
end

function R.flat(t, out)
  out = out or {}
  if type(t) ~= "table" then out[#out + 1] = t return out end
  for i = 1, #t do R.flat(t[i], out) end
  return out
end

local function numel(shape)
  local n = 1
  for _, v in ipairs(shape) do n = n * v end
  return n
end
R.numel = numel

-- nested table of `shape` from a flat list (a number when shape is {})
function R.build(flat, shape)
  local i = 0
  local function go(d)
    if d > #shape then i = i + 1 return flat[i] end
    local t = {}
    for k = 1, shape[d] do t[k] = go(d + 1) end
    return t
  end
  return go(1)
end

-- contiguous strides and index helpers on flat lists
local function strides(shape)
  local s, acc = {}, 1
  for d = #shape, 1, -1 do s[d] = acc acc = acc * shape[d] end
  return s
end
R.strides = strides

-- multi-index (1-based) of flat position p (0-based)
local function unravel(p, shape)
  local idx = {}
  for d = #shape, 1, -1 do
    idx[d] = p % shape[d] + 1
    p = math.floor(p / shape[d])
  end
  return idx
end
R.unravel = unravel

-- element of a nested table by 1-based multi-index
function R.at(t, idx)
  for _, i in ipairs(idx) do t = t[i] end
  return t
end

---------------------------------------------------------------------------
-- deterministic pseudo-random tables (an LCG: independent of loom's RNG)

local state = 12345
function R.seed(s) state = s end
local function lcg()
  state = (state * 1103515245 + 12345) % 2147483648
  return state / 2147483648
end
R.uniform01 = lcg

-- nested table of `shape` with values in [lo, hi)
function R.rand(shape, lo, hi)
  lo, hi = lo or -1, hi or 1
  local flat = {}
  for i = 1, numel(shape) do flat[i] = lo + (hi - lo) * lcg() end
  return R.build(flat, shape)
end

-- like R.rand but every |value| >= margin (for ops with kinks at 0)
function R.rand_away(shape, lo, hi, margin)
  local flat = {}
  for i = 1, numel(shape) do
    local v
    repeat v = lo + (hi - lo) * lcg() until math.abs(v) >= margin
    flat[i] = v
  end
  return R.build(flat, shape)
end

-- random integers in [lo, hi]
function R.randint(shape, lo, hi)
  local flat = {}
  for i = 1, numel(shape) do flat[i] = lo + math.floor((hi - lo + 1) * lcg()) end
  return R.build(flat, shape)
end

---------------------------------------------------------------------------
-- elementwise with NumPy/PyTorch broadcasting

function R.broadcast_shape(...)
  local shapes = { ... }
  local nd = 0
  for _, s in ipairs(shapes) do nd = math.max(nd, #s) end
  local out = {}
  for d = 1, nd do out[d] = 1 end
  for _, s in ipairs(shapes) do
    local lead = nd - #s
    for d = 1, #s do
      local v = s[d]
      if v ~= 1 then
        if out[lead + d] ~= 1 and out[lead + d] ~= v then error("ref: shapes do not broadcast") end
        out[lead + d] = v
      end
    end
  end
  return out
end

-- map(f, a, b, ...): a, b, ... are nested tables or numbers (0-dim)
function R.map(f, ...)
  local args = { ... }
  local n = select("#", ...)
  local shapes, flats = {}, {}
  for k = 1, n do
    shapes[k] = R.shape(args[k])
    flats[k] = R.flat(args[k])
  end
  local out_shape = R.broadcast_shape(unpack(shapes, 1, n))
  local total = numel(out_shape)
  local out = {}
  local vals = {}
  for p = 0, total - 1 do
    local idx = unravel(p, out_shape)
    for k = 1, n do
      local s, st = shapes[k], strides(shapes[k])
      local lead, off = #out_shape - #s, 0
      for d = 1, #s do
        local i = s[d] == 1 and 1 or idx[lead + d]
        off = off + (i - 1) * st[d]
      end
      vals[k] = flats[k][off + 1]
    end
    out[p + 1] = f(unpack(vals, 1, n))
  end
  return R.build(out, out_shape)
end

---------------------------------------------------------------------------
-- linear algebra and reductions

function R.transpose(a)
  local t = {}
  for j = 1, #a[1] do
    t[j] = {}
    for i = 1, #a do t[j][i] = a[i][j] end
  end
  return t
end

-- (m, k) x (k, n), the triple loop
function R.mm(a, b)
  local m, k, n = #a, #b, #b[1]
  assert(#a[1] == k, "ref.mm: inner sizes differ")
  local c = {}
  for i = 1, m do
    c[i] = {}
    for j = 1, n do
      local s = 0
      for p = 1, k do s = s + a[i][p] * b[p][j] end
      c[i][j] = s
    end
  end
  return c
end

-- reduce(t, dim, f, init[, keepdim]): f(acc, v, position) -> acc; dim
-- 1-based (negative from the end) or nil for all elements. Returns a
-- nested table (a number when everything is reduced).
function R.reduce(t, dim, step, init, keepdim, finish)
  local shape, flat = R.shape(t), R.flat(t)
  if dim == nil then
    local acc = init(flat[1])
    for p = 1, #flat do acc = step(acc, flat[p], p) end
    return finish and finish(acc, #flat) or acc
  end
  if dim < 0 then dim = #shape + dim + 1 end
  local out_shape = {}
  for d = 1, #shape do
    if d ~= dim then out_shape[#out_shape + 1] = shape[d]
    elseif keepdim then out_shape[#out_shape + 1] = 1 end
  end
  local st = strides(shape)
  local n = shape[dim]
  local out = {}
  local rest = {}
  for d = 1, #shape do rest[d] = d == dim and 1 or shape[d] end
  for p = 0, numel(rest) - 1 do
    local idx = unravel(p, rest)
    local base = 0
    for d = 1, #shape do base = base + (idx[d] - 1) * st[d] end
    local acc = init(flat[base + 1])
    for j = 1, n do acc = step(acc, flat[base + (j - 1) * st[dim] + 1], j) end
    out[#out + 1] = finish and finish(acc, n) or acc
  end
  return R.build(out, out_shape)
end

function R.sum(t, dim, keepdim)
  return R.reduce(t, dim, function(a, v) return a + v end, function() return 0 end, keepdim)
end

function R.mean(t, dim, keepdim)
  return R.reduce(t, dim, function(a, v) return a + v end, function() return 0 end, keepdim,
                  function(a, n) return a / n end)
end

-- max/min: values and 1-based indices of the first extreme (NaN wins)
local function extreme(better)
  return function(t, dim, keepdim)
    local shape, flat = R.shape(t), R.flat(t)
    local function scan(get, n)
      local bv, bi = get(1), 1
      for j = 2, n do
        local v = get(j)
        if bv == bv and (v ~= v or better(v, bv)) then bv, bi = v, j end
      end
      return bv, bi
    end
    if dim == nil then return scan(function(j) return flat[j] end, #flat) end
    if dim < 0 then dim = #shape + dim + 1 end
    local st = strides(shape)
    local rest, out_shape = {}, {}
    for d = 1, #shape do
      rest[d] = d == dim and 1 or shape[d]
      if d ~= dim or keepdim then out_shape[#out_shape + 1] = rest[d] end
    end
    local vals, idxs = {}, {}
    for p = 0, numel(rest) - 1 do
      local idx = unravel(p, rest)
      local base = 0
      for d = 1, #shape do base = base + (idx[d] - 1) * st[d] end
      local v, i = scan(function(j) return flat[base + (j - 1) * st[dim] + 1] end, shape[dim])
      vals[#vals + 1], idxs[#idxs + 1] = v, i
    end
    return R.build(vals, out_shape), R.build(idxs, out_shape)
  end
end
R.max = extreme(function(a, b) return a > b end)
R.min = extreme(function(a, b) return a < b end)

---------------------------------------------------------------------------
-- comparisons

local function close(a, e, rtol, atol)
  if type(e) == "boolean" or type(a) == "boolean" then return a == e end
  if type(a) ~= "number" or type(e) ~= "number" then return false end
  if e ~= e then return a ~= a end
  if e == math.huge or e == -math.huge then return a == e end
  return math.abs(a - e) <= atol + rtol * math.abs(e)
end

local function path_str(p) return "[" .. table.concat(p, "][") .. "]" end

-- compares nested tables (or numbers/booleans) elementwise; raises an
-- assertion error naming the first differing element
function R.assert_close(actual, expected, rtol, atol)
  rtol, atol = rtol or 1e-6, atol or 1e-6
  local function go(a, e, p)
    if type(e) == "table" then
      if type(a) ~= "table" then
        error(string.format("assert_close: at %s expected a table of %d, got %s", path_str(p), #e, tostring(a)), 0)
      end
      if #a ~= #e then
        error(string.format("assert_close: at %s expected %d elements, got %d", path_str(p), #e, #a), 0)
      end
      for i = 1, #e do
        p[#p + 1] = i
        go(a[i], e[i], p)
        p[#p] = nil
      end
    elseif not close(a, e, rtol, atol) then
      error(string.format("assert_close: at %s expected %s, got %s (rtol %g, atol %g)",
                          path_str(p), tostring(e), tostring(a), rtol, atol), 0)
    end
  end
  go(actual, expected, {})
  return true
end

-- same shape and exactly equal values
function R.assert_equal(actual, expected)
  return R.assert_close(actual, expected, 0, 0)
end

-- the message of the error fn(...) raises (asserting that it raises one)
R.errmsg = require("support.misuse").error_of

-- asserts that loom.ops() lists the op `name` with what each op brings (a
-- backward, a sharding rule, a CPU kernel); returns its entry
function R.assert_full_op(name)
  for _, o in ipairs(require("loom").ops()) do
    if o.name == name then
      assert(o.differentiable == true, name .. ": not differentiable")
      assert(o.sharded == true, name .. ": no sharding rule")
      assert(o.kernels.cpu == true, name .. ": no CPU kernel")
      return o
    end
  end
  error("loom.ops() does not list " .. name)
end

---------------------------------------------------------------------------
-- finite-difference gradient check (f64)

-- gradcheck(fn, inputs[, opts]): inputs are leaf tensors; those with
-- requires_grad (f64, contiguous) are checked. fn(inputs...) returns a
-- tensor y. With fixed weights w (from the LCG), L = sum(w * y) is computed
-- in Lua from y:totable(); loom's gradient comes from y:backward(w). Each
-- checked element is perturbed by +-h and dL/dx from central differences
-- must match within |a - n| / max(1, |n|) <= opts.tol (1e-6).
-- Returns the largest error seen.
function R.gradcheck(fn, inputs, opts)
  opts = opts or {}
  local loom = require("loom")
  local h, tol = opts.h or 1e-6, opts.tol or 1e-6
  for k, x in ipairs(inputs) do
    if x.requires_grad then
      assert(x.dtype == "f64", "gradcheck: input " .. k .. " must be f64")
      assert(x:is_contiguous(), "gradcheck: input " .. k .. " must be contiguous")
    end
  end
  local y = fn(unpack(inputs))
  assert(y.requires_grad, "gradcheck: the output does not require grad")
  local ysize = y:size()
  local wflat = {}
  for i = 1, numel(ysize) do wflat[i] = 0.5 + lcg() end
  local w = loom.tensor(#ysize == 0 and wflat[1] or R.build(wflat, ysize), { dtype = "f64" })
  local function L()
    local yy = loom.no_grad(fn, unpack(inputs))
    local f = R.flat(yy:totable())
    local s = 0
    for i = 1, #f do s = s + wflat[i] * f[i] end
    return s
  end
  for _, x in ipairs(inputs) do if x.requires_grad then x:zero_grad() end end
  y:backward(w)
  local worst = 0
  for k, x in ipairs(inputs) do
    if x.requires_grad then
      local g = x.grad
      assert(g ~= nil, "gradcheck: input " .. k .. " got no gradient")
      local gs, xs = g:size(), x:size()
      assert(#gs == #xs, "gradcheck: gradient of input " .. k .. " has the wrong rank")
      for d = 1, #xs do assert(gs[d] == xs[d], "gradcheck: gradient of input " .. k .. " has the wrong shape") end
      local ga = R.flat(g:totable())
      local p = ffi.cast("double*", x:data_ptr())
      for i = 0, x:numel() - 1 do
        local orig = p[i]
        p[i] = orig + h
        local lp = L()
        p[i] = orig - h
        local lm = L()
        p[i] = orig
        local num = (lp - lm) / (2 * h)
        local ana = ga[i + 1]
        local err = math.abs(ana - num) / math.max(1, math.abs(num))
        if err ~= err or err > tol then
          error(string.format("gradcheck: input %d element %d: backward %.10g, finite differences %.10g (error %.3g)",
                              k, i + 1, ana, num, err), 0)
        end
        worst = math.max(worst, err)
      end
    end
  end
  return worst
end



-- scalar functions (erf, gelu, silu ...) and rounding to bf16/f16/f32
for k, f in pairs(require("support.scalar")) do R[k] = f end

return R
