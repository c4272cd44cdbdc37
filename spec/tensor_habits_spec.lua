-- tensor_habits_spec.lua: what a Torch7 or PyTorch user types without
-- reading the docs: t[i] (row i along the first dim, a view; a number for
-- a 1-D tensor), t[i] = v, in-place arithmetic (add_, mul_, clamp_, ...)
-- with autograd's version counters, and t.shape / t:shape(). Values,
-- gradients and the errors of misuse. (DTensors: spec/dist/inplace_dtensor_spec.lua.)
local loom = require("loom")

local function err(fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

local function close(want, got, tol)
  tol = tol or 1e-6
  if type(want) == "table" then
    assert.equal(#want, #got)
    for i = 1, #want do close(want[i], got[i], tol) end
    return
  end
  assert.is_true(math.abs(want - got) <= tol * math.max(1, math.abs(want)), string.format("want %s, got %s", want, got))
end

describe("t[i]", function()
  local a
  before_each(function() a = loom.arange(6):reshape(2, 3) end)

  it("is row i along the first dim, a view, negative from the end", function()
    assert.same({ 3, 4, 5 }, a[2]:totable())
    assert.same({ 0, 1, 2 }, a[-2]:totable())
    assert.equal(loom.Size{ 3 }, a[1]:size())
    a[1]:fill_(7)   -- a view: writing it writes a
    assert.same({ { 7, 7, 7 }, { 3, 4, 5 } }, a:totable())
    local b = loom.arange(24):reshape(2, 3, 4)
    assert.same({ 20, 21, 22, 23 }, b[2][3]:totable())
  end)

  it("is a Lua number for a 1-D tensor: t[i][j] reads an element", function()
    assert.equal(4, a[2][2])
    assert.equal(5, a[-1][-1])
    assert.equal("number", type(a[1][1]))
    assert.equal(7, loom.tensor({ 5, 6, 7 }, { dtype = "i64" })[3])
    assert.equal(false, loom.tensor({ true, false })[2])
  end)

  it("names the index and the size when out of range", function()
    assert.truthy(err(function() return a[3] end):find("t[i]: index 3 is out of range for dim 1 of size 2", 1, true))
    assert.truthy(err(function() return a[-3] end):find("index -3 is out of range for dim 1 of size 2", 1, true))
    assert.truthy(err(function() return a[0] end):find("index 0 is out of range", 1, true))
    assert.truthy(err(function() return a[1][4] end):find("index 4 is out of range for dim 1 of size 3", 1, true))
    assert.truthy(err(function() return a[1.5] end):find("expected an integer", 1, true))
    assert.truthy(err(function() return loom.tensor(3)[1] end):find("0-dim tensor has no rows", 1, true))
    local e = err(function() return a[5] end)
    assert.truthy(e:find("tensor_habits_spec.lua:%d+: t%[i%]"), "the user's line: " .. e)
  end)

  it("leaves fields, methods and computed fields alone", function()
    assert.equal("f32", a.dtype)
    assert.equal("cpu", a.device)
    assert.is_nil(a.grad)
    assert.is_nil(a.no_such_field)
    assert.equal(2, a:dim())
    assert.equal(2, #a)
  end)

  it("carries the gradient of the row it reads", function()
    local w = loom.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, { requires_grad = true })
    local y = (w[2] * w[-1]):sum()   -- 3*5 + 4*6
    close(39, y:item())
    y:backward()
    assert.same({ { 0, 0 }, { 5, 6 }, { 3, 4 } }, w.grad:totable())
  end)
end)

describe("t[i] = v", function()
  it("writes a number or a tensor, broadcast to the row", function()
    local a = loom.zeros(3, 2)
    a[1] = 5
    a[2] = loom.tensor({ 1, 2 })
    a[-1] = loom.tensor({ 9 })
    assert.same({ { 5, 5 }, { 1, 2 }, { 9, 9 } }, a:totable())
    a[2] = loom.tensor({ { 7, 8 } })   -- leading dims of size 1, as PyTorch takes them
    a[2][1] = 4
    assert.same({ 4, 8 }, a[2]:totable())
    local m = loom.zeros(2, 2, 3)
    m[2] = loom.tensor({ 1, 2, 3 })
    assert.same({ { 1, 2, 3 }, { 1, 2, 3 } }, m[2]:totable())
    local i = loom.zeros(2, { dtype = "i32" })
    i[2] = 3
    assert.same({ 0, 3 }, i:totable())
  end)

  it("refuses what does not fit, naming the sizes or the index", function()
    local a = loom.zeros(3, 2)
    assert.truthy(err(function() a[1] = loom.ones(3) end):find("size {3} cannot be broadcast to the row's size {2}", 1, true))
    assert.truthy(err(function() a[4] = 1 end):find("t[i] = v: index 4 is out of range for dim 1 of size 3", 1, true))
    assert.truthy(err(function() a[1] = "x" end):find("expected a number or a tensor", 1, true))
    assert.truthy(err(function() loom.zeros(2, { dtype = "i32" })[1] = 2 ^ 40 end):find("value", 1, true))
    assert.truthy(err(function() a.foo = 1 end):find("cannot set field foo", 1, true))
  end)

  it("is an in-place change autograd's version counter sees", function()
    local w = loom.tensor({ 1, 2 }, { requires_grad = true })
    local x = loom.tensor({ { 3, 4 }, { 5, 6 } })
    local y = (w * x[1]):sum()
    x[1] = 0
    local e = err(function() y:backward() end)
    assert.truthy(e:find("modified in place", 1, true) and e:find("of mul", 1, true), e)
    -- a tensor that requires grad is refused while autograd records, as fill_ is
    local p = loom.zeros(2, 2, { requires_grad = true })
    assert.truthy(err(function() p[1] = 1 end):find("cannot be changed in place while autograd records", 1, true))
    loom.no_grad(function() p[1] = 1 end)
    assert.same({ { 1, 1 }, { 0, 0 } }, p:totable())
    -- a value that requires grad would lose its gradient
    assert.truthy(err(function() x[2] = w end):find("the value requires grad", 1, true))
  end)
end)

describe("in-place arithmetic", function()
  it("gives the values of the ops of the same name, and returns the tensor", function()
    local cases = {
      { "add_", { 2 } }, { "sub_", { 0.5 } }, { "mul_", { -3 } }, { "div_", { 4 } }, { "pow_", { 2 } },
      { "clamp_", { 0.5, 1.5 } }, { "neg_", {} }, { "abs_", {} }, { "exp_", {} }, { "tanh_", {} },
      { "sigmoid_", {} }, { "relu_", {} }, { "maximum_", { loom.tensor({ 1, 1, 1, 1 }) } },
    }
    local base = loom.tensor({ -1.5, 0.25, 1, 2 })
    for _, c in ipairs(cases) do
      local name = c[1]
      local x = base:clone()
      local want = base[name:sub(1, -2)](base, unpack(c[2])):totable()
      assert.equal(x, x[name](x, unpack(c[2])), name .. " returns self")
      close(want, x:totable())
    end
    local pos = loom.tensor({ 0.5, 4, 9 })
    close({ math.log(0.5), math.log(4), math.log(9) }, pos:clone():log_():totable())
    close({ math.sqrt(0.5), 2, 3 }, pos:clone():sqrt_():totable())
    local t = loom.ones(2, 3)
    t:add_(loom.tensor({ 1, 2, 3 })):mul_(2)   -- the other operand broadcasts to the tensor
    assert.same({ { 4, 6, 8 }, { 4, 6, 8 } }, t:totable())
    t:zero_():add_(1):fill_(2)
    assert.same({ 2, 2, 2 }, t[1]:totable())
    local i = loom.tensor({ 1, 2 }, { dtype = "i64" })
    i:mul_(3):add_(1)
    assert.same({ 4, 7 }, i:totable())
    assert.equal("i64", i.dtype)
  end)

  it("change a view's base", function()
    local a = loom.ones(2, 3)
    a[2]:mul_(5)
    a:narrow(2, 1, 1):add_(1)
    assert.same({ { 2, 1, 1 }, { 6, 5, 5 } }, a:totable())
  end)

  it("refuse results that do not fit the tensor", function()
    local x = loom.ones(3)
    assert.truthy(err(function() x:add_(loom.ones(2, 3)) end)
                  :find("add_: the result has size {2, 3}, but the tensor changed in place has size {3}", 1, true))
    local i = loom.tensor({ 1, 2 }, { dtype = "i32" })
    assert.truthy(err(function() i:div_(2) end):find("div_: the result is f32, which cannot be written into a i32", 1, true))
    assert.truthy(err(function() x:add_("a") end):find("add", 1, true))
  end)

  it("make a backward that read the old values fail (version counter)", function()
    local p = loom.tensor({ 1, 2, 3 }, { requires_grad = true })
    for _, change in ipairs { function(h) h:add_(1) end, function(h) h:mul_(2) end, function(h) h:exp_() end,
                              function(h) h:clamp_(0, 1) end, function(h) h:pow_(2) end } do
      local h = p * 2
      local y = (h * h):sum()
      loom.no_grad(function() change(h) end)
      local e = err(function() y:backward() end)
      assert.truthy(e:find("modified in place", 1, true) and e:find("at version 1 but mul saved it at version 0", 1, true), e)
    end
    -- a saved input that does not require grad
    local w = loom.tensor({ 1, 2 }, { requires_grad = true })
    local x = loom.tensor({ 3, 4 })
    local y = (w * x):sum()
    x:sub_(1)
    assert.truthy(err(function() y:backward() end):find("argument #2 of mul", 1, true))
  end)

  it("before the forward, give the gradient of the new values", function()
    local w = loom.tensor({ 1, 2 }, { requires_grad = true })
    local x = loom.tensor({ 3, 4 })
    x:mul_(2):add_(1)
    local y = (w * x):sum()
    y:backward()
    assert.same({ 7, 9 }, w.grad:totable())
  end)

  it("refuse a tensor that requires grad while autograd records, and a value that does", function()
    local p = loom.tensor({ 1, 2 }, { requires_grad = true })
    for _, name in ipairs { "add_", "mul_", "neg_", "clamp_" } do
      local e = err(function() p[name](p, 1, 2) end)
      assert.truthy(e:find(name .. ": a tensor that requires grad cannot be changed in place", 1, true), e)
    end
    loom.no_grad(function() p:add_(1) end)   -- allowed where autograd records nothing (an optimizer step)
    assert.same({ 2, 3 }, p:totable())
    assert.truthy(err(function() loom.zeros(2):add_(p) end):find("add_: the value requires grad", 1, true))
  end)
end)

describe("t.shape", function()
  it("is a loom.Size as a field, and t:shape() calls it", function()
    local t = loom.zeros(2, 3)
    assert.equal(loom.Size{ 2, 3 }, t.shape)
    assert.equal("loom.Size{2, 3}", tostring(t:shape()))
    assert.equal(t:size(), t:shape())
    assert.equal(3, t:shape(2))
    assert.equal(2, t:shape(-2))
    assert.equal(2, t.shape[1])
    assert.truthy(err(function() return t:shape(3) end):find("shape: dim expected an integer in [1, 2]", 1, true))
    assert.equal(loom.Size{}, loom.tensor(1):shape())
  end)
end)
