-- cpu_kernels_spec.lua: the CPU backend's vectorised kernels (kernels/cpu) on
-- the inputs their fast paths see: large dense tensors (split over threads),
-- lengths that are not a multiple of the vector width, strided and
-- transposed views, NaN and inf; f32 within a few ulp of plain-Lua f64
-- references (spec/support/ref.lua), f64 at libm accuracy, casts bit-exact
-- against the scalar conversions of core/dtype.c.
package.path = "spec/support/?.lua;" .. package.path
local loom = require("loom")
local ffi = require("ffi")
local R = require("ref")

local INF, NAN = math.huge, 0 / 0

-- a 1-D tensor of n values f(i), i = 0..n-1
local function filled(n, f, dtype)
  dtype = dtype or "f32"
  local t = loom.empty({ n }, { dtype = dtype })
  local p = ffi.cast(dtype == "f64" and "double*" or "float*", t:data_ptr())
  for i = 0, n - 1 do p[i] = f(i) end
  return t
end

local function values(t)
  local p = ffi.cast(t.dtype == "f64" and "double*" or "float*", t:contiguous():data_ptr())
  local out = {}
  for i = 0, t:numel() - 1 do out[i + 1] = p[i] end
  return out
end

local function bits16(t)
  local c = t:contiguous()
  local p = ffi.cast("uint16_t*", c:data_ptr())
  local out = {}
  for i = 0, c:numel() - 1 do out[i + 1] = p[i] end
  return out
end

-- the f32 ulp at r (the spacing of floats next to |r|)
local function ulp32(r)
  r = math.abs(r)
  if r < 2 ^ -126 then return 2 ^ -149 end
  local _, e = math.frexp(r)
  return 2 ^ (e - 24)
end

-- largest error of got against ref(x) over xs, in f32 ulps of
-- max(|ref|, floor) (floor: for results that cross zero)
local function max_ulp(got, xs, ref, floor)
  local worst, at = 0, nil
  for i = 1, #xs do
    local r = ref(xs[i])
    local e = math.abs(got[i] - r) / ulp32(math.max(math.abs(r), floor or 0))
    if e > worst or e ~= e then worst, at = e, xs[i] end
  end
  return worst, at
end

-- erfc for the references with a 1000-term continued fraction (the
-- default 4000 terms are slow for 10^5 points; they agree to the last bit
-- on [0.5, 2])
local function erfc(x) return R.erfc(x, 1000) end
local function gelu(x)
  if x < 0 then return 0.5 * x * erfc(-x / math.sqrt(2)) end
  return 0.5 * x * (2 - erfc(x / math.sqrt(2)))
end
local function sigmoid(x) return 1 / (1 + math.exp(-x)) end
local function silu_d(x) local s = sigmoid(x) return s * (1 + x * (1 - s)) end
local function gelu_d(x)
  return 0.5 * erfc(-x / math.sqrt(2)) + x * math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
end
local function gelu_tanh(x) -- x sigmoid(2z): no cancellation where tanh z is near -1
  return x / (1 + math.exp(-2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)))
end
local function gelu_tanh_d(x)
  local k, c = math.sqrt(2 / math.pi), 0.044715
  local t = math.tanh(k * (x + c * x ^ 3))
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x)
end

-- kernel name, how to call it, reference, range, ulp bound, floor of the ulp
local UNARY = {
  { "exp", function(x) return x:exp() end, math.exp, -80, 80, 2 },
  { "tanh", function(x) return x:tanh() end, math.tanh, -10, 10, 2 },
  { "sigmoid", function(x) return x:sigmoid() end, sigmoid, -80, 80, 3 },
  { "silu", function(x) return x:silu() end, R.silu, -80, 80, 3 },
  { "silu'", function(x) return loom.op("_silu_d", { x }) end, silu_d, -30, 30, 3, 1 },
  { "gelu", function(x) return x:gelu() end, gelu, -5, 5, 8 },
  { "gelu'", function(x) return loom.op("_gelu_d", { x }) end, gelu_d, -8, 8, 3, 1 },
  { "gelu_tanh", function(x) return x:gelu({ approximate = "tanh" }) end, gelu_tanh, -2.5, 2.5, 12 },
  { "gelu_tanh'", function(x) return loom.op("_gelu_tanh_d", { x }) end, gelu_tanh_d, -8, 8, 3, 1 },
}

describe("f32 activations on large dense tensors", function()
  -- 70001 points: above the threading threshold, not a multiple of 16
  local n = 70001
  for _, c in ipairs(UNARY) do
    local name, f, ref, lo, hi, bound, floor = c[1], c[2], c[3], c[4], c[5], c[6], c[7]
    it(name .. " is within " .. bound .. " ulp of the f64 reference", function()
      local x = filled(n, function(i) return lo + (hi - lo) * i / (n - 1) end)
      local xs = values(x)
      local worst, at = max_ulp(values(f(x)), xs, ref, floor)
      assert(worst <= bound, string.format("%s: %.2f ulp at x = %.9g", name, worst, at or 0))
    end)
  end

  it("gelu keeps its digits in the negative tail (where 1 + erf cancels)", function()
    local n2 = 2001
    local x = filled(n2, function(i) return -12 + 7 * i / (n2 - 1) end) -- [-12, -5]
    local xs, got = values(x), values(x:gelu())
    for i = 1, n2 do
      local r = gelu(xs[i])
      assert(math.abs(got[i] - r) <= 1e-4 * math.abs(r) + 1e-44,
             string.format("gelu(%.9g) = %.9g, expected %.9g", xs[i], got[i], r))
    end
  end)

  it("gives the same bits on one thread as on all", function()
    local x = filled(n, function(i) return -20 + 40 * i / (n - 1) end)
    local all = loom.num_threads()
    for _, c in ipairs(UNARY) do
      loom.set_num_threads(1)
      local one = values(c[2](x))
      loom.set_num_threads(all)
      assert.same(one, values(c[2](x)), c[1])
    end
  end)
end)

describe("f32 activations on short, strided and transposed inputs", function()
  it("every length from 1 to 40 matches the reference (vector tails)", function()
    for n = 1, 40 do
      local x = filled(n, function(i) return -3 + 0.37 * i end)
      local xs = values(x)
      for _, c in ipairs(UNARY) do
        local worst, at = max_ulp(values(c[2](x)), xs, c[3], c[7])
        assert(worst <= c[6], string.format("%s, n = %d: %.2f ulp at %.9g", c[1], n, worst, at or 0))
      end
    end
  end)

  it("a transposed or strided view gives the bits of its contiguous copy", function()
    local rows, cols = 300, 517
    local x = filled(rows * cols, function(i) return math.sin(i * 0.013) * 9 end):view(rows, cols)
    local xt = x:t()                                   -- strided along the rows
    local xs = x:narrow(2, 3, 200)                     -- rows with gaps
    for _, c in ipairs(UNARY) do
      assert.same(values(c[2](xt:contiguous())), values(c[2](xt)), c[1] .. " (transposed)")
      assert.same(values(c[2](xs:contiguous())), values(c[2](xs)), c[1] .. " (narrowed)")
    end
  end)
end)

describe("f32 activations at NaN and infinities", function()
  local x = loom.tensor({ -INF, INF, NAN, 0, -0.0, 89, -89, -104 })
  local function at(t) return values(t) end
  it("exp", function()
    local y = at(x:exp())
    assert.same({ 0, INF }, { y[1], y[2] })
    assert(y[3] ~= y[3], "exp(nan) is nan")
    assert.same({ 1, 1, INF, 0, 0 }, { y[4], y[5], y[6], y[7], y[8] })
  end)
  it("tanh, sigmoid, silu", function()
    local t, s, si = at(x:tanh()), at(x:sigmoid()), at(x:silu())
    assert.same({ -1, 1 }, { t[1], t[2] })
    assert.same({ 0, 1 }, { s[1], s[2] })
    assert.equal(INF, si[2])
    assert(t[3] ~= t[3] and s[3] ~= s[3] and si[3] ~= si[3], "nan stays nan")
    assert(si[1] ~= si[1], "silu(-inf) = -inf / inf is nan, as before")
  end)
  it("gelu, gelu_tanh and the derivatives", function()
    local g, gt = at(x:gelu()), at(x:gelu({ approximate = "tanh" }))
    assert.equal(INF, g[2])
    assert.equal(INF, gt[2])
    assert(g[3] ~= g[3] and gt[3] ~= gt[3], "nan stays nan")
    assert.equal(89, g[6])
    assert.equal(0, g[7])
    for _, name in ipairs { "_gelu_d", "_silu_d", "_gelu_tanh_d" } do
      local d = at(loom.op(name, { x }))
      assert(d[3] ~= d[3], name .. "(nan) is nan")
      assert.equal(1, d[6], name .. "(89)")
      assert.equal(0, d[7], name .. "(-89)")
    end
  end)
end)

describe("f64 activations keep libm accuracy", function()
  local n = 20001
  local cases = {
    { "exp", function(x) return x:exp() end, math.exp, -50, 50 },
    { "tanh", function(x) return x:tanh() end, math.tanh, -10, 10 },
    { "sigmoid", function(x) return x:sigmoid() end, sigmoid, -30, 30 },
    { "silu", function(x) return x:silu() end, R.silu, -30, 30 },
    { "gelu", function(x) return x:gelu() end, gelu, -6, 6 },
    { "gelu_tanh", function(x) return x:gelu({ approximate = "tanh" }) end, gelu_tanh, -4, 4 },
  }
  for _, c in ipairs(cases) do
    it(c[1], function()
      local x = filled(n, function(i) return c[4] + (c[5] - c[4]) * i / (n - 1) end, "f64")
      local xs, got = values(x), values(c[2](x))
      for i = 1, n do
        local r = c[3](xs[i])
        assert(math.abs(got[i] - r) <= 1e-13 * math.abs(r) + 1e-300,
               string.format("%s(%.17g) = %.17g, expected %.17g", c[1], xs[i], got[i], r))
      end
    end)
  end
end)

describe("casts", function()
  -- f32 bit patterns: random, ties of bf16 rounding, NaNs, infinities, subnormals
  local n = 50017 -- 11 * 4547
  local src = loom.empty({ n }, { dtype = "f32" })
  local u = ffi.cast("uint32_t*", src:data_ptr())
  R.seed(3)
  local specials = { 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffffffff, 0x00000001,
                     0x80000000, 0x3f808000, 0x3f818000, 0x3f80ffff, 0x7f7fffff, 0x477fe000, 0x477ff000 }
  for i = 0, n - 1 do
    u[i] = specials[i % 97 + 1] or math.floor(R.uniform01() * 4294967296)
  end
  -- the scalar reference: an f64 tensor converts to bf16/f16 element by
  -- element through core/dtype.c (lm_store). The bits travel through C
  -- only: LuaJIT reads some NaN patterns as other values.
  local function reference(dtype, from)
    local ref = loom.empty({ from:numel() }, { dtype = dtype })
    local p = ffi.cast("uint16_t*", ref:data_ptr())
    local one = loom.empty({ 1 }, { dtype = "f32" })
    local v = ffi.cast("uint32_t*", from:data_ptr())
    local o = ffi.cast("uint32_t*", one:data_ptr())
    for i = 0, from:numel() - 1 do
      o[0] = v[i]
      p[i] = ffi.cast("uint16_t*", one:to("f64"):to(dtype):data_ptr())[0]
    end
    return ref
  end

  for _, dt in ipairs { "bf16", "f16" } do
    it("f32 -> " .. dt .. " matches the scalar conversion bit for bit", function()
      local m = 4099 -- every special, a slice of the random bits
      local part = src:narrow(1, 1, m):contiguous()
      assert.same(bits16(reference(dt, part)), bits16(part:to(dt)))
    end)
    it("f32 -> " .. dt .. " is the same dense, strided and on one thread", function()
      local dense = bits16(src:to(dt))
      local strided = src:view(n / 11, 11):t()          -- the same values, transposed
      assert.same(bits16(strided:contiguous():to(dt)), bits16(strided:to(dt)))
      loom.set_num_threads(1)
      local one = bits16(src:to(dt))
      loom.set_num_threads(loom.num_threads())
      assert.same(dense, one)
    end)
    it(dt .. " -> f32 is exact and round-trips", function()
      local h = src:to(dt)
      local back = h:to("f32")
      local hb, v = bits16(h), ffi.cast("uint32_t*", back:data_ptr())
      if dt == "bf16" then
        for i = 1, n do
          local want = hb[i] * 65536
          assert(v[i - 1] == want, string.format("bf16 0x%04x -> 0x%08x", hb[i], tonumber(v[i - 1])))
        end
      end
      assert.same(hb, bits16(back:to(dt)))
    end)
  end

  it("f32 <-> f64 dense and strided", function()
    local x = filled(10007, function(i) return math.sin(i) * 1e3 end)
    local d = x:to("f64")
    assert.same(values(x), values(d))
    assert.same(values(x), values(d:to("f32")))
    local xt = x:narrow(1, 1, 10000):view(100, 100):t()
    assert.same(values(xt:contiguous():to("f64")), values(xt:to("f64")))
  end)
end)

describe("transpose + contiguous (the tiled copy)", function()
  for _, dt in ipairs { "f32", "f64", "bf16", "i64" } do
    it(dt .. " with sizes that are not multiples of the tile", function()
      local rows, cols = 301, 517
      local x = loom.arange(rows * cols):to(dt):view(rows, cols)
      local y = x:t():contiguous()
      assert.same({ cols, rows }, y:size())
      local f = y:to("f64")
      local p = ffi.cast("double*", f:data_ptr())
      for j = 0, cols - 1 do
        for i = 0, rows - 1 do
          local want = i * cols + j
          if dt == "bf16" then want = R.bf16(want) end
          assert(p[j * rows + i] == want, string.format("%s: y[%d][%d] = %s", dt, j, i, p[j * rows + i]))
        end
      end
    end)
  end

  it("permutes a 3-D tensor and casts while transposing", function()
    local x = loom.arange(40 * 70 * 33):view(40, 70, 33)
    local y = x:permute(3, 1, 2):contiguous()   -- (33, 40, 70)
    local b = x:permute(3, 1, 2):to("f64")
    local p, q = ffi.cast("float*", y:data_ptr()), ffi.cast("double*", b:data_ptr())
    for k = 0, 32 do
      for i = 0, 39 do
        for j = 0, 69 do
          local want = (i * 70 + j) * 33 + k
          local at = (k * 40 + i) * 70 + j
          assert(p[at] == want and q[at] == want, "permuted element " .. at)
        end
      end
    end
  end)

  it("writes into a transposed destination (sizes not multiples of 4)", function()
    local x = loom.arange(301 * 203):view(301, 203)
    local y = loom.zeros(203, 301)
    y:t():copy_(x)
    assert.are.equal(0, (x:t():contiguous() - y):abs():max():item()) -- (a failing table diff would print 61k values)
  end)
end)

describe("sums", function()
  local rows, n = 97, 1031
  local x = filled(rows * n, function(i) return math.sin(i * 0.7) + 0.25 end):view(rows, n)
  local xs = values(x)
  it("over the last dim (f32 and f64)", function()
    for _, dt in ipairs { "f32", "f64" } do
      local got = values(x:to(dt):sum(2))
      for r = 0, rows - 1 do
        local s = 0
        for j = 1, n do s = s + xs[r * n + j] end
        assert(math.abs(got[r + 1] - s) <= 1e-6 * math.abs(s) + 1e-9, dt .. " row " .. r)
      end
    end
  end)
  -- y (nr, nc) summed over dim 1 in f32 and f64 against Lua sums of its values ys
  local function check_column_sums(y, ys, nr, nc)
    for _, dt in ipairs { "f32", "f64" } do
      local got = values(y:to(dt):sum(1))
      for j = 1, nc do
        local s = 0
        for r = 0, nr - 1 do s = s + ys[r * nc + j] end
        assert(math.abs(got[j] - s) <= 1e-6 * math.abs(s) + 1e-9, dt .. " column " .. j)
      end
    end
  end
  it("over an inner dim (columns spread over threads)", function()
    check_column_sums(x, xs, rows, n)
  end)
  it("over an inner dim of many rows and few columns (the rows split over threads)", function()
    local r2, c2 = 4001, 300
    local y = filled(r2 * c2, function(i) return (i % 13) * 0.5 - 3 end):view(r2, c2)
    check_column_sums(y, values(y), r2, c2)
  end)
  it("over the middle dim of a 3-D tensor", function()
    local a, b, c = 5, 211, 37
    local y = filled(a * b * c, function(i) return math.cos(i) end):view(a, b, c)
    local ys, got = values(y), values(y:sum(2))
    for i = 0, a - 1 do
      for k = 0, c - 1 do
        local s = 0
        for j = 0, b - 1 do s = s + ys[(i * b + j) * c + k + 1] end
        assert(math.abs(got[i * c + k + 1] - s) <= 1e-6 * math.abs(s) + 1e-6, "element " .. i .. "," .. k)
      end
    end
  end)
  it("of empty tensors: no outputs, or zeros over an empty dim", function()
    local z = loom.zeros(3, 0, 4)
    assert.same({ 3, 4 }, z:sum(2):size())
    assert.same({ { 0, 0, 0, 0 }, { 0, 0, 0, 0 }, { 0, 0, 0, 0 } }, z:sum(2):totable())
    assert.equal(0, z:sum(1):numel())
    assert.equal(0, z:sum(3):numel())
    assert.same({ 0, 0, 0, 0, 0 }, loom.zeros(0, 5):sum(1):totable())
  end)
  it("carries NaN and inf", function()
    local y = loom.tensor({ { 1, INF, 2 }, { 1, NAN, 2 }, { INF, -INF, 0 } })
    local s = values(y:sum(2))
    assert.equal(INF, s[1])
    assert(s[2] ~= s[2] and s[3] ~= s[3], "nan and inf - inf give nan")
  end)
end)

describe("softmax, log_softmax and norms on long rows", function()
  local rows, n = 67, 1029
  local x = filled(rows * n, function(i) return math.sin(i * 0.37) * 6 end):view(rows, n)
  local xs = values(x)
  local function row(r) local t = {} for j = 1, n do t[j] = xs[r * n + j] end return t end

  it("softmax and log_softmax (f32 within 1e-6 relative)", function()
    local sm, lsm = values(x:softmax(2)), values(x:log_softmax(2))
    for r = 0, rows - 1 do
      local v, m, s = row(r), -INF, 0
      for j = 1, n do m = math.max(m, v[j]) end
      for j = 1, n do s = s + math.exp(v[j] - m) end
      for j = 1, n do
        local p = math.exp(v[j] - m) / s
        assert(math.abs(sm[r * n + j] - p) <= 1e-6 * p + 1e-12, "softmax")
        local lp = v[j] - m - math.log(s)
        assert(math.abs(lsm[r * n + j] - lp) <= 2e-6 * math.abs(lp) + 1e-6, "log_softmax")
      end
    end
  end)

  it("softmax of a row of -inf is NaN; -inf entries get 0", function()
    local y = values(loom.tensor({ { -INF, -INF, -INF }, { 0, -INF, 0 } }):softmax(2))
    for j = 1, 3 do assert(y[j] ~= y[j], "all -inf row") end
    assert.same({ 0.5, 0, 0.5 }, { y[4], y[5], y[6] })
  end)

  it("layer_norm and rms_norm with weight and bias (f32 and f64)", function()
    local w = filled(n, function(i) return 1 + 0.001 * i end)
    local b = filled(n, function(i) return 0.01 * (i % 7) end)
    for _, dt in ipairs { "f32", "f64" } do
      local xd, wd, bd = x:to(dt), w:to(dt), b:to(dt)
      local ln = values(loom.F.layer_norm(xd, { n }, wd, bd, 1e-5))
      local rn = values(loom.F.rms_norm(xd, { n }, wd, 1e-6))
      local wv, bv = values(w), values(b)
      local tol = dt == "f64" and 1e-12 or 2e-6
      for r = 0, rows - 1 do
        local v, mu, var, ms = row(r), 0, 0, 0
        for j = 1, n do mu = mu + v[j] ms = ms + v[j] * v[j] end
        mu, ms = mu / n, ms / n
        for j = 1, n do var = var + (v[j] - mu) ^ 2 end
        var = var / n
        for j = 1, n do
          local e1 = (v[j] - mu) / math.sqrt(var + 1e-5) * wv[j] + bv[j]
          local e2 = v[j] / math.sqrt(ms + 1e-6) * wv[j]
          assert(math.abs(ln[r * n + j] - e1) <= tol * (math.abs(e1) + 1), dt .. " layer_norm")
          assert(math.abs(rn[r * n + j] - e2) <= tol * (math.abs(e2) + 1), dt .. " rms_norm")
        end
      end
    end
  end)

  it("layer_norm of rows far from zero keeps the spread (f32)", function()
    local m = 4099
    local y = filled(m, function(i) return 1000 + 0.01 * math.sin(i) end)
    local got, v = values(loom.F.layer_norm(y:view(1, m), { m })), values(y)
    local mu, var = 0, 0
    for j = 1, m do mu = mu + v[j] end
    mu = mu / m
    for j = 1, m do var = var + (v[j] - mu) ^ 2 end
    var = var / m
    for j = 1, m do
      local e = (v[j] - mu) / math.sqrt(var + 1e-5)
      assert(math.abs(got[j] - e) <= 1e-5 * (math.abs(e) + 1), "element " .. j)
    end
  end)
end)
