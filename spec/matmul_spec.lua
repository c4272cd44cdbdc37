-- matmul_spec.lua: matmul with torch.matmul's rules (1-D, 2-D, batched with
-- broadcasting, transposed operands) in f32, f64, bf16 and f16, against a
-- Lua triple loop.
local loom = require("loom")
local R = require("support.ref")

R.seed(3)

-- reference for any torch.matmul case on nested tables
local ref_matmul
function ref_matmul(a, b)
  local sa, sb = R.shape(a), R.shape(b)
  if #sa == 1 and #sb == 1 then
    local s = 0
    for i = 1, #a do s = s + a[i] * b[i] end
    return s
  end
  -- 1-D operands: lift to a matrix, multiply, drop the added dim
  local function drop(t, dim) -- removes a size-1 dim (counted from the end)
    local sh = R.shape(t)
    local keep = {}
    for d = 1, #sh do if d ~= #sh + 1 - dim then keep[#keep + 1] = sh[d] end end
    return R.build(R.flat(t), keep)
  end
  if #sa == 1 then return drop(ref_matmul({ a }, b), 2) end
  if #sb == 1 then
    local col = {}
    for i = 1, #b do col[i] = { b[i] } end
    return drop(ref_matmul(a, col), 1)
  end
  if #sa == 2 and #sb == 2 then return R.mm(a, b) end
  -- batched: broadcast the leading dims
  local ba, bb = {}, {}
  for d = 1, #sa - 2 do ba[d] = sa[d] end
  for d = 1, #sb - 2 do bb[d] = sb[d] end
  local bs = R.broadcast_shape(ba, bb)
  local out = {}
  local function pick(t, tshape, idx)
    local lead = #bs - (#tshape - 2)
    for d = 1, #tshape - 2 do
      local i = tshape[d] == 1 and 1 or idx[lead + d]
      t = t[i]
    end
    return t
  end
  for p = 0, R.numel(bs) - 1 do
    local idx = R.unravel(p, bs)
    out[p + 1] = R.mm(pick(a, sa, idx), pick(b, sb, idx))
  end
  return R.build(out, bs)
end

local function check(sa, sb, dt, rtol, atol, prep_a, prep_b)
  dt = dt or "f64"
  local a, b = R.rand(sa, -1, 1), R.rand(sb, -1, 1)
  local x, y = loom.tensor(a, { dtype = dt }), loom.tensor(b, { dtype = dt })
  if prep_a then x = prep_a(x) end
  if prep_b then y = prep_b(y) end
  local z = x:matmul(y)
  assert.equal(dt, z.dtype)
  local want = ref_matmul(x:totable(), y:totable())
  if type(want) == "number" then
    assert.equal(0, z:dim())
    assert.near(want, z:item(), atol + rtol * math.abs(want))
  else
    assert.same(R.shape(want), z:size())
    R.assert_close(z:totable(), want, rtol, atol)
  end
end

describe("matmul", function()
  it("2-D x 2-D in f64 and f32", function()
    check({ 3, 4 }, { 4, 5 }, "f64", 1e-13, 1e-14)
    check({ 7, 13 }, { 13, 2 }, "f32", 1e-5, 1e-5)
    check({ 1, 1 }, { 1, 1 }, "f64", 1e-13, 1e-14)
    check({ 64, 33 }, { 33, 17 }, "f32", 1e-5, 1e-5)
  end)

  it("an empty inner dim (K = 0) gives zeros, with gradients of the operands' shapes", function()
    for _, dt in ipairs({ "f32", "f64", "bf16", "f16" }) do
      local a = loom.randn({ 2, 3, 0 }):to(dt):requires_grad_()
      local b = loom.randn({ 2, 0, 4 }):to(dt):requires_grad_()
      local c = a:matmul(b)
      assert.are.same({ 2, 3, 4 }, c:size())
      assert.are.equal(0, c:to("f64"):abs():sum():item(), dt)
      c:sum():backward()
      assert.are.same({ 2, 3, 0 }, a.grad:size())
      assert.are.same({ 2, 0, 4 }, b.grad:size())
    end
  end)

  it("hand-computed", function()
    local a = loom.tensor({ { 1, 2 }, { 3, 4 } })
    local b = loom.tensor({ { 5, 6 }, { 7, 8 } })
    assert.same({ { 19, 22 }, { 43, 50 } }, a:matmul(b):totable())
    assert.same({ { 19, 22 }, { 43, 50 } }, loom.matmul(a, b):totable())
    assert.same({ 17, 39 }, a:matmul(loom.tensor({ 5, 6 })):totable())
    assert.same({ 23, 34 }, loom.tensor({ 5, 6 }):matmul(a):totable())
    assert.equal(61, loom.tensor({ 5, 6 }):matmul(loom.tensor({ 5, 6 })):item())
  end)

  it("1-D operands (dot, vector-matrix, matrix-vector)", function()
    check({ 6 }, { 6 }, "f64", 1e-13, 1e-14)
    check({ 4 }, { 4, 3 }, "f64", 1e-13, 1e-14)
    check({ 3, 4 }, { 4 }, "f64", 1e-13, 1e-14)
    check({ 2, 3, 4 }, { 4 }, "f64", 1e-13, 1e-14)
    check({ 4 }, { 2, 4, 3 }, "f64", 1e-13, 1e-14)
  end)

  it("batched, with broadcasting of the batch dims", function()
    check({ 2, 3, 4 }, { 2, 4, 5 }, "f64", 1e-13, 1e-14)
    check({ 2, 3, 4 }, { 4, 5 }, "f64", 1e-13, 1e-14)
    check({ 3, 4 }, { 2, 4, 5 }, "f64", 1e-13, 1e-14)
    check({ 2, 1, 3, 4 }, { 3, 4, 2 }, "f64", 1e-13, 1e-14)
    check({ 1, 2, 3, 4 }, { 2, 1, 4, 2 }, "f32", 1e-5, 1e-5)
  end)

  it("transposed and non-contiguous operands", function()
    local t = function(x) return x:t() end
    local tr = function(x) return x:transpose(-1, -2) end
    check({ 4, 3 }, { 4, 5 }, "f64", 1e-13, 1e-14, t)       -- A^T B
    check({ 3, 4 }, { 5, 4 }, "f64", 1e-13, 1e-14, nil, t)  -- A B^T
    check({ 4, 3 }, { 5, 4 }, "f32", 1e-5, 1e-5, t, t)      -- A^T B^T
    check({ 2, 4, 3 }, { 2, 5, 4 }, "f64", 1e-13, 1e-14, tr, tr)
    -- a narrowed operand (row stride larger than its width)
    check({ 3, 8 }, { 4, 5 }, "f64", 1e-13, 1e-14, function(x) return x:narrow(2, 3, 4) end)
    -- a permuted batch that needs a copy, and an expanded (stride 0) operand
    check({ 3, 2, 4 }, { 2, 4, 5 }, "f64", 1e-13, 1e-14, function(x) return x:permute(2, 1, 3) end)
    check({ 1, 3, 4 }, { 4, 4, 2 }, "f64", 1e-13, 1e-14, function(x) return x:expand(4, 3, 4) end)
    -- a strided vector
    check({ 3, 4 }, { 4, 2 }, "f64", 1e-13, 1e-14, nil, function(x) return x:select(2, 2) end)
    check({ 4, 2 }, { 4, 3 }, "f64", 1e-13, 1e-14, function(x) return x:select(2, 1) end)
  end)

  it("bf16 and f16 compute through f32", function()
    for _, dt in ipairs { "bf16", "f16" } do
      local a, b = R.rand({ 5, 32 }, -1, 1), R.rand({ 32, 3 }, -1, 1)
      local x, y = loom.tensor(a, { dtype = dt }), loom.tensor(b, { dtype = dt })
      local z = x:matmul(y)
      assert.equal(dt, z.dtype)
      local want = R.mm(x:totable(), y:totable())   -- exact products of the stored values
      local round = dt == "bf16" and R.bf16 or R.f16
      local ulp = dt == "bf16" and 2 ^ -8 or 2 ^ -11
      local zt = z:totable()
      for i = 1, 5 do for j = 1, 3 do
        -- one rounding of an f32-accurate sum: within one unit of the exact
        assert.is_true(math.abs(zt[i][j] - round(want[i][j])) <= 2 * ulp * math.abs(want[i][j]) + 1e-6,
                       string.format("%s [%d][%d]: %g vs %g", dt, i, j, zt[i][j], want[i][j]))
      end end
    end
  end)

  -- the widened panels (gemm_half.c): several panels of K (256 each),
  -- operands transposed or not, a batch; one rounding of an f32 sum
  it("bf16 and f16: transposed operands and K over one panel", function()
    local t = function(x) return x:transpose(-1, -2) end
    for _, dt in ipairs { "bf16", "f16" } do
      local round = dt == "bf16" and R.bf16 or R.f16
      local ulp = dt == "bf16" and 2 ^ -8 or 2 ^ -11
      for _, c in ipairs { { { 7, 600 }, { 600, 5 } }, { { 600, 7 }, { 600, 5 }, t },
                           { { 7, 600 }, { 5, 600 }, nil, t }, { { 2, 600, 7 }, { 2, 5, 600 }, t, t } } do
        local x = loom.tensor(R.rand(c[1], -1, 1), { dtype = dt })
        local y = loom.tensor(R.rand(c[2], -1, 1), { dtype = dt })
        if c[3] then x = c[3](x) end
        if c[4] then y = c[4](y) end
        local z = R.flat(x:matmul(y):totable())
        local want = R.flat(ref_matmul(x:totable(), y:totable()))
        local mag = R.flat(ref_matmul(x:abs():totable(), y:abs():totable()))
        for i = 1, #want do
          assert.is_true(math.abs(z[i] - round(want[i])) <= ulp * math.abs(want[i]) + 1e-6 * mag[i],
                         string.format("%s case %s, element %d: %g vs %g", dt, table.concat(c[1], "x"), i, z[i], want[i]))
        end
      end
    end
  end)

  it("mixed float dtypes promote", function()
    local a = loom.tensor({ { 1, 2 } }, { dtype = "f32" })
    local b = loom.tensor({ { 3 }, { 4 } }, { dtype = "f64" })
    local z = a:matmul(b)
    assert.equal("f64", z.dtype)
    assert.same({ { 11 } }, z:totable())
  end)

  it("zero-size dims give zeros or empty results", function()
    local z = loom.zeros(3, 0):matmul(loom.zeros(0, 4))
    assert.same({ 3, 4 }, z:size())
    assert.same({ 0, 0, 0, 0 }, z:totable()[1])
    assert.same({ 0, 4 }, loom.zeros(0, 2):matmul(loom.zeros(2, 4)):size())
  end)

  it("bmm and mm are matmul", function()
    local a, b = R.rand({ 2, 2, 3 }, -1, 1), R.rand({ 2, 3, 2 }, -1, 1)
    local z = loom.tensor(a, { dtype = "f64" }):bmm(loom.tensor(b, { dtype = "f64" }))
    R.assert_close(z:totable(), ref_matmul(a, b), 1e-13, 1e-14)
  end)

  -- PyTorch's layout contract: a weight used through :t() (as Linear does)
  -- gets a dense gradient, so the optimizer and clipping copy nothing
  it("the gradient of a transposed weight is dense, and is G^T A", function()
    for _, sa in ipairs { { 5, 3 }, { 2, 5, 3 } } do -- plain, and rows folded
      local a = loom.tensor(R.rand(sa, -1, 1), { dtype = "f64" }):requires_grad_(true)
      local w = loom.tensor(R.rand({ 4, 3 }, -1, 1), { dtype = "f64" }):requires_grad_(true)
      local sg = { unpack(sa) }
      sg[#sg] = 4 -- the output's shape
      local g = loom.tensor(R.rand(sg, -1, 1), { dtype = "f64" })
      a:matmul(w:t()):backward(g)
      assert.is_true(w.grad:is_contiguous(), "weight gradient strides " .. table.concat(w.grad:stride(), ","))
      local a2, g2 = a:detach():reshape(-1, 3), g:reshape(-1, 4)
      R.assert_close(w.grad:totable(), ref_matmul(g2:t():totable(), a2:totable()), 1e-13, 1e-14)
      R.assert_close(a.grad:totable(), ref_matmul(g:totable(), w:detach():totable()), 1e-13, 1e-14)
    end
  end)

  it("shape errors name the sizes", function()
    local ok, err = pcall(function() return loom.zeros(2, 3):matmul(loom.zeros(4, 5)) end)
    assert.is_false(ok)
    assert.truthy(err:find("matmul") and err:find("3") and err:find("4"), err)
    ok, err = pcall(function() return loom.zeros(2, 2, 3):matmul(loom.zeros(3, 3, 4)) end)
    assert.is_false(ok)
    assert.truthy(err:find("batch"), err)
    ok, err = pcall(function() return loom.zeros(3):matmul(loom.zeros(4)) end)
    assert.is_false(ok)
    assert.truthy(err:find("matmul"), err)
    ok, err = pcall(function() return loom.tensor(2):matmul(loom.zeros(4)) end)
    assert.is_false(ok)
    assert.truthy(err:find("at least 1 dim"), err)
    ok, err = pcall(function() return loom.zeros({ 2, 2 }, { dtype = "i64" }):matmul(loom.zeros({ 2, 2 }, { dtype = "i64" })) end)
    assert.is_false(ok)
    assert.truthy(err:find("floating point"), err)
  end)
end)
