-- pointwise_spec.lua: every unary and binary op of core/ops_pointwise.c,
-- Lua operators, broadcasting and type promotion, against plain-Lua f64.
local loom = require("loom")
local R = require("support.ref")

-- tolerance of a result of dtype dt against an f64 reference
local TOL = {
  f64 = { 1e-12, 1e-14 }, f32 = { 2e-6, 1e-6 }, bf16 = { 2 ^ -7, 1e-6 }, f16 = { 2 ^ -10, 1e-6 },
}

-- Runs f on x in each float dtype and compares with ref applied to the values
-- x actually holds in that dtype.
local function check_unary(f, ref, data, dtypes)
  for _, dt in ipairs(dtypes or { "f32", "f64", "bf16", "f16" }) do
    local x = loom.tensor(data, { dtype = dt })
    local y = f(x)
    assert.equal(dt, y.dtype)
    assert.same(x:size(), y:size())
    local expected = R.map(ref, x:totable())
    local ok, err = pcall(R.assert_close, y:totable(), expected, TOL[dt][1], TOL[dt][2])
    assert(ok, dt .. ": " .. tostring(err))
  end
end

local function check_binary(f, ref, a, b, dtypes)
  for _, dt in ipairs(dtypes or { "f32", "f64", "bf16", "f16" }) do
    local x, y = loom.tensor(a, { dtype = dt }), loom.tensor(b, { dtype = dt })
    local z = f(x, y)
    assert.equal(dt, z.dtype)
    local expected = R.map(ref, x:totable(), y:totable())
    local ok, err = pcall(R.assert_close, z:totable(), expected, TOL[dt][1], TOL[dt][2])
    assert(ok, dt .. ": " .. tostring(err))
  end
end

R.seed(7)
local A = R.rand({ 3, 4 }, -3, 3)
local B = R.rand_away({ 3, 4 }, -2, 2, 0.25)
local POS = R.rand({ 3, 4 }, 0.1, 4)

describe("unary ops", function()
  local cases = {
    { "neg", function(x) return -x end, A },
    { "abs", math.abs, A },
    { "sqrt", math.sqrt, POS },
    { "rsqrt", function(x) return 1 / math.sqrt(x) end, POS },
    { "exp", math.exp, A },
    { "log", math.log, POS },
    { "tanh", math.tanh, A },
    { "sigmoid", R.sigmoid, A },
    { "relu", function(x) return x > 0 and x or 0 end, A },
    { "silu", R.silu, A },
    { "sin", math.sin, A },
    { "cos", math.cos, A },
    { "sign", R.sign, { { -2, 0, 3.5 }, { -0.1, 1e-3, 0 } } },
  }
  for _, c in ipairs(cases) do
    local name, ref, data = c[1], c[2], c[3]
    it(name .. " as a method and as loom." .. name, function()
      check_unary(function(x) return x[name](x) end, ref, data)
      check_unary(function(x) return loom[name](x) end, ref, data, { "f64" })
    end)
  end

  it("gelu exact and tanh approximation", function()
    local data = { -4, -2.5, -1, -0.3, 0, 0.2, 1, 2.7, 4 }
    check_unary(function(x) return x:gelu() end, R.gelu, data)
    check_unary(function(x) return x:gelu({ approximate = "none" }) end, R.gelu, data)
    check_unary(function(x) return x:gelu({ approximate = "tanh" }) end, R.gelu_tanh, data)
    -- the two differ: a check that each is the one it claims to be
    local d = loom.tensor({ 1.5 }, { dtype = "f64" })
    assert.is_true(math.abs(d:gelu():item() - d:gelu({ approximate = "tanh" }):item()) > 1e-5)
    assert.near(0.8413447460685429, loom.tensor({ 1 }, { dtype = "f64" }):gelu():item(), 1e-14)
  end)

  it("pow with a number", function()
    for _, p in ipairs { 2, 3, 0.5, -1, 1.5, 0 } do
      check_unary(function(x) return x:pow(p) end, function(v) return v ^ p end, POS)
    end
    check_unary(function(x) return x ^ 2 end, function(v) return v * v end, A)
    check_unary(function(x) return x:pow(3) end, function(v) return v ^ 3 end, A)
  end)

  it("clamp with both bounds, one bound, and on integers", function()
    check_unary(function(x) return x:clamp(-1, 0.5) end,
                function(v) return math.max(-1, math.min(0.5, v)) end, A)
    check_unary(function(x) return x:clamp(0) end, function(v) return math.max(0, v) end, A)
    check_unary(function(x) return x:clamp(nil, 1) end, function(v) return math.min(1, v) end, A)
    local i = loom.tensor({ -5, -1, 0, 3, 9 }, { dtype = "i32" })
    local c = i:clamp(-2, 4)
    assert.equal("i32", c.dtype)
    assert.same({ -2, -1, 0, 3, 4 }, c:totable())
  end)

  it("integer tensors: neg, abs, relu, sign keep their dtype", function()
    for _, dt in ipairs { "i32", "i64" } do
      local x = loom.tensor({ -3, 0, 5 }, { dtype = dt })
      assert.same({ 3, 0, -5 }, x:neg():totable())
      assert.same({ 3, 0, 5 }, x:abs():totable())
      assert.same({ 0, 0, 5 }, x:relu():totable())
      assert.same({ -1, 0, 1 }, x:sign():totable())
      assert.equal(dt, x:abs().dtype)
      assert.equal(dt, (-x).dtype)
    end
  end)

  it("logical_not on bool and on numbers", function()
    local b = loom.tensor({ true, false, true })
    assert.same({ false, true, false }, b:logical_not():totable())
    local x = loom.tensor({ 0, 2, -1 })
    local n = x:logical_not()
    assert.equal("bool", n.dtype)
    assert.same({ true, false, false }, n:totable())
  end)

  it("special values follow IEEE", function()
    local inf = math.huge
    local x = loom.tensor({ 0, -1, inf, -inf }, { dtype = "f64" })
    local s = x:sqrt():totable()
    assert.equal(0, s[1]) assert.is_true(s[2] ~= s[2]) assert.equal(inf, s[3])
    local l = x:log():totable()
    assert.equal(-inf, l[1]) assert.is_true(l[2] ~= l[2]) assert.equal(inf, l[3])
    assert.same({ 1, math.exp(-1), inf, 0 }, x:exp():totable())
    assert.same({ 0, math.tanh(-1), 1, -1 }, x:tanh():totable())
    local sg = loom.tensor({ -800, 800 }):sigmoid():totable()
    assert.same({ 0, 1 }, sg)
    local sl = loom.tensor({ -800, 800 }, { dtype = "f64" }):silu():totable()
    assert.equal(800, sl[2])
    assert.is_true(sl[1] == 0)
  end)

  it("works on non-contiguous and expanded inputs", function()
    local x = loom.tensor(A, { dtype = "f64" })
    local t = x:t()
    R.assert_close(t:exp():totable(), R.map(math.exp, R.transpose(A)), 1e-14, 0)
    local col = loom.tensor({ { 1 }, { 2 } }, { dtype = "f64" }):expand(2, 3)
    assert.same({ { 1, 1, 1 }, { 4, 4, 4 } }, (col:pow(2)):totable())
    local n = x:narrow(2, 2, 2)
    R.assert_close(n:sin():totable(), R.map(math.sin, { { A[1][2], A[1][3] }, { A[2][2], A[2][3] }, { A[3][2], A[3][3] } }), 1e-14, 0)
  end)
end)

describe("binary ops", function()
  local cases = {
    { "add", function(x, y) return x + y end, A, B },
    { "sub", function(x, y) return x - y end, A, B },
    { "mul", function(x, y) return x * y end, A, B },
    { "div", function(x, y) return x / y end, A, B },
    { "pow", function(x, y) return x ^ y end, POS, A },
    { "maximum", math.max, A, B },
    { "minimum", math.min, A, B },
  }
  for _, c in ipairs(cases) do
    local name, ref, a, b = c[1], c[2], c[3], c[4]
    it(name .. " as a method and as loom." .. name, function()
      check_binary(function(x, y) return x[name](x, y) end, ref, a, b)
      check_binary(function(x, y) return loom[name](x, y) end, ref, a, b, { "f64" })
    end)
  end

  it("Lua operators on tensors", function()
    check_binary(function(x, y) return x + y end, function(x, y) return x + y end, A, B)
    check_binary(function(x, y) return x - y end, function(x, y) return x - y end, A, B)
    check_binary(function(x, y) return x * y end, function(x, y) return x * y end, A, B)
    check_binary(function(x, y) return x / y end, function(x, y) return x / y end, A, B)
    check_binary(function(x, y) return x ^ y end, function(x, y) return x ^ y end, POS, A)
    check_unary(function(x) return -x end, function(x) return -x end, A)
  end)

  it("Lua operators with numbers on either side", function()
    local ops = {
      { function(x) return x + 2.5 end, function(v) return v + 2.5 end },
      { function(x) return 2.5 + x end, function(v) return 2.5 + v end },
      { function(x) return x - 1.5 end, function(v) return v - 1.5 end },
      { function(x) return 1.5 - x end, function(v) return 1.5 - v end },
      { function(x) return x * 3 end, function(v) return v * 3 end },
      { function(x) return 3 * x end, function(v) return 3 * v end },
      { function(x) return x / 4 end, function(v) return v / 4 end },
      { function(x) return 4 / x end, function(v) return 4 / v end },
      { function(x) return 2 ^ x end, function(v) return 2 ^ v end },
      { function(x) return x:add(1) end, function(v) return v + 1 end },
      { function(x) return x:maximum(0.5) end, function(v) return math.max(v, 0.5) end },
      { function(x) return x:minimum(0.5) end, function(v) return math.min(v, 0.5) end },
    }
    for k, o in ipairs(ops) do
      local ok, err = pcall(check_unary, o[1], o[2], B)
      assert(ok, "case " .. k .. ": " .. tostring(err))
    end
  end)

  it("comparisons give bool tensors", function()
    local a = { { 1, 2, 3 }, { 4, 5, 6 } }
    local b = { { 3, 2, 1 }, { 4, 0, 7 } }
    local refs = {
      eq = function(x, y) return x == y end, ne = function(x, y) return x ~= y end,
      lt = function(x, y) return x < y end, le = function(x, y) return x <= y end,
      gt = function(x, y) return x > y end, ge = function(x, y) return x >= y end,
    }
    for name, ref in pairs(refs) do
      for _, dt in ipairs { "f32", "f64", "bf16", "f16", "i32", "i64" } do
        local x, y = loom.tensor(a, { dtype = dt }), loom.tensor(b, { dtype = dt })
        local z = x[name](x, y)
        assert.equal("bool", z.dtype)
        assert.same(R.map(ref, a, b), z:totable(), name .. " " .. dt)
        assert.same(R.map(function(v) return ref(v, 2) end, a), x[name](x, 2):totable())
      end
    end
    -- mixed dtypes compare by value
    assert.same({ true, false }, loom.tensor({ 1, 2 }, { dtype = "i32" }):eq(loom.tensor({ 1, 2.5 }, { dtype = "f64" })):totable())
  end)

  it("NaN compares unequal and propagates through maximum/minimum", function()
    local nan = 0 / 0
    local x = loom.tensor({ nan, 1 }, { dtype = "f64" })
    local y = loom.tensor({ 1, nan }, { dtype = "f64" })
    assert.same({ false, true }, x:eq(x):totable())
    assert.same({ false, false }, x:eq(y):totable())
    assert.same({ true, true }, x:ne(y):totable())
    local mx, mn = x:maximum(y):totable(), x:minimum(y):totable()
    assert.is_true(mx[1] ~= mx[1] and mx[2] ~= mx[2])
    assert.is_true(mn[1] ~= mn[1] and mn[2] ~= mn[2])
  end)

  it("logical_and and logical_or", function()
    local p = loom.tensor({ true, true, false, false })
    local q = loom.tensor({ true, false, true, false })
    assert.same({ true, false, false, false }, p:logical_and(q):totable())
    assert.same({ true, true, true, false }, p:logical_or(q):totable())
    local x = loom.tensor({ 0, 2, 0, -1 })
    local y = loom.tensor({ 3, 0, 0, 1 }, { dtype = "i64" })
    local o = x:logical_or(y)
    assert.equal("bool", o.dtype)
    assert.same({ true, true, false, true }, o:totable())
    assert.same({ false, false, false, true }, x:logical_and(y):totable())
  end)

  it("integer arithmetic stays integer; division gives float", function()
    for _, dt in ipairs { "i32", "i64" } do
      local x = loom.tensor({ 7, -7, 6, 100000 }, { dtype = dt })
      local y = loom.tensor({ 2, 2, -3, 30000 }, { dtype = dt })
      assert.equal(dt, (x + y).dtype)
      assert.same({ 9, -5, 3, 130000 }, (x + y):totable())
      assert.same({ 5, -9, 9, 70000 }, (x - y):totable())
      assert.same({ 14, -14, -18, 3000000000 }, (x:to("i64") * y:to("i64")):totable())
      assert.same({ 7, 2, 6, 100000 }, x:maximum(y):totable())
      local q = x / y
      assert.equal("f32", q.dtype)
      R.assert_close(q:totable(), { 3.5, -3.5, -2, 100000 / 30000 }, 1e-7, 0)
    end
  end)

  it("float division by zero gives infinities and NaN", function()
    local z = loom.tensor({ 1, -1, 0 }) / loom.tensor({ 0, 0, 0 })
    local t = z:totable()
    assert.equal(math.huge, t[1])
    assert.equal(-math.huge, t[2])
    assert.is_true(t[3] ~= t[3])
    local iz = loom.tensor({ 1 }, { dtype = "i64" }) / 0
    assert.equal(math.huge, iz:item())
  end)
end)

describe("broadcasting", function()
  local function check(sa, sb, f, ref)
    local a, b = R.rand(sa, -2, 2), R.rand(sb, 0.5, 2)
    local x, y = loom.tensor(a, { dtype = "f64" }), loom.tensor(b, { dtype = "f64" })
    local z = f(x, y)
    assert.same(R.broadcast_shape(sa, sb), z:size())
    R.assert_close(z:totable(), R.map(ref, a, b), 1e-14, 1e-15)
  end
  local add = function(x, y) return x + y end
  local div = function(x, y) return x / y end

  it("column against row", function() check({ 3, 1 }, { 1, 4 }, add, add) end)
  it("trailing vector against a 3-D tensor", function() check({ 2, 3, 4 }, { 4 }, div, div) end)
  it("leading dims added on both sides", function() check({ 4 }, { 2, 1, 4 }, add, add) end)
  it("size-1 dims in the middle", function() check({ 2, 1, 3 }, { 2, 5, 1 }, div, div) end)
  it("a 0-dim tensor against anything", function() check({}, { 2, 3 }, add, add) check({ 2, 3 }, {}, div, div) end)
  it("empty dims", function()
    local z = loom.zeros(0, 3) + loom.ones(1, 3)
    assert.same({ 0, 3 }, z:size())
  end)

  it("non-contiguous and 0-stride inputs", function()
    local a = R.rand({ 4, 3 }, -2, 2)
    local x = loom.tensor(a, { dtype = "f64" }):t()              -- (3, 4), strides (1, 3)
    local c = loom.tensor({ 10, 20, 30 }, { dtype = "f64" }):view(3, 1):expand(3, 4) -- stride 0
    local z = x * c
    local at = R.transpose(a)
    local expected = R.map(function(v, w) return v * w end, at, { { 10 }, { 20 }, { 30 } })
    R.assert_close(z:totable(), expected, 1e-14, 0)
    -- a narrowed (offset) view against a transposed one
    local big = loom.tensor(R.rand({ 5, 6 }, -1, 1), { dtype = "f64" })
    local n = big:narrow(1, 2, 3):narrow(2, 3, 4)
    local bt = big:totable()
    local ns = {}
    for i = 1, 3 do ns[i] = {} for j = 1, 4 do ns[i][j] = bt[i + 1][j + 2] end end
    R.assert_close((n - x):totable(), R.map(function(p, q) return p - q end, ns, at), 1e-14, 0)
  end)

  it("where and masked_fill broadcast", function()
    local cond = loom.tensor({ { true }, { false } })
    local a = loom.tensor({ 1, 2, 3 })
    local w = loom.where(cond, a, -1)
    assert.same({ { 1, 2, 3 }, { -1, -1, -1 } }, w:totable())
    local w2 = loom.where(cond, 5, a)
    assert.same({ { 5, 5, 5 }, { 1, 2, 3 } }, w2:totable())
    local x = loom.tensor({ { 1, 2 }, { 3, 4 } })
    local m = x:masked_fill(loom.tensor({ true, false }), -9)
    assert.same({ { -9, 2 }, { -9, 4 } }, m:totable())
    assert.same({ { 1, 2 }, { -9, -9 } }, x:masked_fill(x:gt(2), -9):totable())
    local y = loom.tensor({ { 10, 20 }, { 30, 40 } }, { dtype = "f64" })
    local z = loom.where(x:lt(3), x, y)
    assert.equal("f64", z.dtype)
    assert.same({ { 1, 2 }, { 30, 40 } }, z:totable())
    -- non-contiguous condition
    local tc = loom.tensor({ { true, false }, { true, true } }):t()
    assert.same({ { 1, 2 }, { 0, 4 } }, loom.where(tc, x, 0):totable())
  end)
end)

describe("type promotion", function()
  local function dt_of(a, b) return (a + b).dtype end
  local function t(dt) return loom.tensor({ 1, 2 }, { dtype = dt }) end

  it("follows category then width between tensors", function()
    assert.equal("f64", dt_of(t("f32"), t("f64")))
    assert.equal("f32", dt_of(t("bf16"), t("f32")))
    assert.equal("f32", dt_of(t("bf16"), t("f16")))
    assert.equal("i64", dt_of(t("i32"), t("i64")))
    assert.equal("f16", dt_of(t("i64"), t("f16")))
    assert.equal("bf16", dt_of(t("bf16"), t("i32")))
    assert.equal("i32", dt_of(t("bool"), t("i32")))
    assert.equal("f32", (t("i32") / t("i32")).dtype)
    assert.equal("f64", (t("f64") / t("i32")).dtype)
  end)

  it("Lua numbers do not widen a tensor of their category", function()
    assert.equal("f32", (t("f32") + 1.5).dtype)
    assert.equal("f64", (t("f64") + 1.5).dtype)
    assert.equal("bf16", (t("bf16") * 3).dtype)
    assert.equal("f16", (2 - t("f16")).dtype)
    assert.equal("i32", (t("i32") + 3).dtype)
    assert.equal("i64", (3 * t("i64")).dtype)
    assert.same({ 4, 5 }, (t("i32") + 3):totable())
  end)

  it("a fractional number makes an integer tensor float (f32)", function()
    local z = t("i32") + 0.5
    assert.equal("f32", z.dtype)
    assert.same({ 1.5, 2.5 }, z:totable())
    assert.equal("f32", (t("i64") * 0.25).dtype)
  end)

  it("0-dim tensors do not widen n-dim tensors of their category", function()
    local s = loom.tensor(2, { dtype = "f64" })
    assert.equal("f32", (t("f32") * s).dtype)
    assert.equal("f64", (s * loom.tensor(3, { dtype = "f32" })).dtype) -- both 0-dim: widest
    assert.equal("f32", (t("i32") + loom.tensor(1.5, { dtype = "f64" })).dtype)
  end)

  it("bf16 and f16 compute in f32 and round once", function()
    -- 1 + 2^-9 + 2^-9: computed in f32 the sum is 1 + 2^-8, a tie that rounds
    -- to even (1); the single product x*3 = 3 * (1 + 2^-7) rounds exactly.
    local x = loom.tensor({ 1 + 2 ^ -7 }, { dtype = "bf16" })
    assert.equal(R.bf16(3 * (1 + 2 ^ -7)), (x * 3):item())
    -- gelu in bf16 equals the f64 value rounded once to bf16 (within one
    -- rounding of the f32 intermediate)
    local data = R.rand({ 64 }, -3, 3)
    local b = loom.tensor(data, { dtype = "bf16" })
    local vals = b:totable()
    local g = b:gelu():totable()
    local exact = 0
    for i, v in ipairs(vals) do
      local want = R.bf16(R.gelu(v))
      if g[i] == want then exact = exact + 1 end
      assert.is_true(math.abs(g[i] - want) <= 2 ^ -7 * math.abs(want) + 1e-30)
    end
    assert.is_true(exact >= 60, "only " .. exact .. " of 64 correctly rounded")
    local h = loom.tensor(data, { dtype = "f16" })
    local hv, hs = h:totable(), h:sigmoid():totable()
    for i, v in ipairs(hv) do assert.is_true(math.abs(hs[i] - R.f16(R.sigmoid(v))) <= 2 ^ -11) end
  end)

  it("bool tensors with integer numbers give i64", function()
    local b = loom.tensor({ true, false, true })
    local s = b + 1
    assert.equal("i64", s.dtype)
    assert.same({ 2, 1, 2 }, s:totable())
  end)
end)
