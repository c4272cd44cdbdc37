-- reduce_spec.lua: sum, mean, max, min, argmax, argmin over every dim
-- (negative too), keepdim, all elements, non-contiguous and integer inputs,
-- against plain-Lua f64 references.
local loom = require("loom")
local R = require("support.ref")

R.seed(11)
local X = R.rand({ 2, 3, 4 }, -5, 5)

local function f64(t) return loom.tensor(t, { dtype = "f64" }) end

describe("sum and mean", function()
  for _, d in ipairs { 1, 2, 3, -1, -2, -3 } do
    it("over dim " .. d .. " with and without keepdim", function()
      local x = f64(X)
      for _, keep in ipairs { false, true } do
        local s, m = x:sum(d, keep), x:mean(d, keep)
        assert.same(R.shape(R.sum(X, d, keep)), s:size())
        R.assert_close(s:totable(), R.sum(X, d, keep), 1e-13, 1e-13)
        R.assert_close(m:totable(), R.mean(X, d, keep), 1e-13, 1e-13)
        assert.equal("f64", s.dtype)
      end
    end)
  end

  it("over all elements gives a 0-dim tensor", function()
    local x = f64(X)
    local s, m = x:sum(), x:mean()
    assert.equal(0, s:dim())
    assert.near(R.sum(X), s:item(), 1e-12)
    assert.near(R.mean(X), m:item(), 1e-13)
    assert.equal(21, loom.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }):sum():item())
    assert.equal(3.5, loom.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }):mean():item())
  end)

  it("hand-computed cases", function()
    local x = loom.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.same({ 5, 7, 9 }, x:sum(1):totable())
    assert.same({ 6, 15 }, x:sum(2):totable())
    assert.same({ { 6 }, { 15 } }, x:sum(-1, true):totable())
    assert.same({ { 2.5, 3.5, 4.5 } }, x:mean(1, true):totable())
    assert.same({ 2, 5 }, x:mean(2):totable())
  end)

  it("on non-contiguous inputs", function()
    local x = f64(X)
    local p = x:permute(3, 1, 2)   -- (4, 2, 3)
    local pt = p:totable()
    for _, d in ipairs { 1, 2, 3 } do
      R.assert_close(p:sum(d):totable(), R.sum(pt, d), 1e-13, 1e-13)
      R.assert_close(p:mean(d, true):totable(), R.mean(pt, d, true), 1e-13, 1e-13)
    end
    local e = loom.tensor({ { 1 }, { 2 } }, { dtype = "f64" }):expand(2, 5)
    assert.same({ 5, 10 }, e:sum(2):totable())
    assert.same({ 3, 3, 3, 3, 3 }, e:sum(1):totable())
    local n = x:narrow(3, 2, 2)
    local nt = n:totable()
    R.assert_close(n:sum(3):totable(), R.sum(nt, 3), 1e-13, 1e-13)
    assert.near(R.sum(nt), n:sum():item(), 1e-12)
  end)

  it("in f32, bf16 and f16 with the input dtype", function()
    local data = R.rand({ 8, 16 }, 0, 1)
    for _, dt in ipairs { "f32", "bf16", "f16" } do
      local x = loom.tensor(data, { dtype = dt })
      local xs = x:totable()
      local s = x:sum(2)
      assert.equal(dt, s.dtype)
      local want = R.sum(xs, 2)
      local rt = dt == "f32" and 1e-6 or dt == "bf16" and 2 ^ -7 or 2 ^ -10
      R.assert_close(s:totable(), want, rt, 0)
      R.assert_close(x:mean():item(), R.mean(xs), rt, 0)
    end
    -- accumulation is wider than the storage: 4096 ones sum exactly in bf16
    -- (a bf16 accumulator would stop at 256)
    assert.equal(4096, loom.ones({ 4096 }, { dtype = "bf16" }):sum():item())
  end)

  it("integers and bools sum to i64; mean of integers is an error", function()
    local x = loom.tensor({ { 1, -2, 3 }, { 4, 5, 6 } }, { dtype = "i32" })
    local s = x:sum(2)
    assert.equal("i64", s.dtype)
    assert.same({ 2, 15 }, s:totable())
    assert.equal(17, x:sum():item())
    local b = loom.tensor({ true, false, true, true })
    assert.equal("i64", b:sum().dtype)
    assert.equal(3, b:sum():item())
    local big = loom.full({ 3 }, 2 ^ 40, { dtype = "i64" })
    assert.equal(3 * 2 ^ 40, big:sum():item())
    assert.has_error(function() x:mean() end)
  end)

  it("sums over an empty dim give zeros", function()
    local z = loom.zeros(0, 3)
    assert.same({ 0, 0, 0 }, z:sum(1):totable())
    assert.equal(0, z:sum():item())
  end)
end)

describe("max, min, argmax, argmin", function()
  for _, d in ipairs { 1, 2, 3, -1, -2, -3 } do
    it("values and 1-based indices over dim " .. d, function()
      local x = f64(X)
      for _, keep in ipairs { false, true } do
        local v, i = x:max(d, keep)
        local rv, ri = R.max(X, d, keep)
        assert.same(rv, v:totable())
        assert.same(ri, i:totable())
        assert.equal("i64", i.dtype)
        local v2, i2 = x:min(d, keep)
        local mv, mi = R.min(X, d, keep)
        assert.same(mv, v2:totable())
        assert.same(mi, i2:totable())
        assert.same(ri, x:argmax(d, keep):totable())
        assert.same(mi, x:argmin(d, keep):totable())
      end
    end)
  end

  it("hand-computed cases, ties pick the first", function()
    local x = loom.tensor({ { 3, 7, 7 }, { 9, 1, 9 } })
    local v, i = x:max(2)
    assert.same({ 7, 9 }, v:totable())
    assert.same({ 2, 1 }, i:totable())
    local v1, i1 = x:min(1)
    assert.same({ 3, 1, 7 }, v1:totable())
    assert.same({ 1, 2, 1 }, i1:totable())
    assert.same({ { 1 }, { 2 } }, x:argmin(2, true):totable())
  end)

  it("over all elements", function()
    local x = f64(X)
    local rv, ri = R.max(X)
    assert.equal(rv, x:max():item())
    assert.equal(ri, x:argmax():item())
    local mv, mi = R.min(X)
    assert.equal(mv, x:min():item())
    assert.equal(mi, x:argmin():item())
    assert.equal(0, x:max():dim())
  end)

  it("on non-contiguous inputs", function()
    local x = f64(X):transpose(1, 3)   -- (4, 3, 2)
    local xt = x:totable()
    for _, d in ipairs { 1, 2, 3 } do
      local v, i = x:max(d)
      local rv, ri = R.max(xt, d)
      assert.same(rv, v:totable())
      assert.same(ri, i:totable())
      assert.same(select(2, R.min(xt, d)), x:argmin(d):totable())
    end
    assert.equal(select(2, R.max(xt)), x:argmax():item())
  end)

  it("integer tensors keep their dtype", function()
    for _, dt in ipairs { "i32", "i64" } do
      local x = loom.tensor({ { -4, 8, 2 }, { 5, -9, 5 } }, { dtype = dt })
      local v, i = x:max(1)
      assert.equal(dt, v.dtype)
      assert.same({ 5, 8, 5 }, v:totable())
      assert.same({ 2, 1, 2 }, i:totable())
      local m = x:min()
      assert.equal(-9, m:item())
      assert.same({ 2, 1 }, x:argmax(2):totable())
      assert.same({ 1, 2 }, x:argmin(-1):totable())
    end
  end)

  it("NaN is the max and the min", function()
    local nan = 0 / 0
    local x = loom.tensor({ 1, nan, 3 }, { dtype = "f64" })
    local v = x:max():item()
    assert.is_true(v ~= v)
    assert.equal(2, x:argmax():item())
    assert.equal(2, x:argmin():item())
  end)

  it("bf16 max is exact", function()
    local x = loom.tensor({ 1.5, -2.25, 3.125, 3.0 }, { dtype = "bf16" })
    local v, i = x:max(1)
    assert.equal("bf16", v.dtype)
    assert.equal(3.125, v:item())
    assert.equal(3, i:item())
  end)
end)
