-- inplace_spec.lua: in-place changes and autograd (version counters, as
-- PyTorch's), tensors freed early, and the tensor struct read-only from Lua.
local loom = require("loom")

local function err(fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

describe("version counters", function()
  it("count every in-place change of a storage, views included", function()
    local x = loom.zeros(4)
    local v0 = x:_version()
    x:fill_(1)
    x:narrow(1, 1, 2):copy_(loom.ones(2))
    assert.are.equal(v0 + 2, x:_version())
    assert.are.equal(x:_version(), x:narrow(1, 3, 2):_version())
  end)

  it("make backward fail, naming the op and the versions, when a saved tensor changed", function()
    local p = loom.tensor({ 1, 2, 3 }, { requires_grad = true })
    local h = p * 2
    local y = (h * h):sum()
    loom.no_grad(function() h:fill_(1) end)
    local e = err(function() y:backward() end)
    assert.truthy(e:find("modified in place", 1, true), e)
    assert.truthy(e:find("of mul", 1, true), e)
    assert.truthy(e:find("at version 1 but mul saved it at version 0", 1, true), e)
    assert.is_nil(p.grad)
  end)

  it("catch a saved input that does not require grad", function()
    local w = loom.tensor({ 1, 2 }, { requires_grad = true })
    local x = loom.tensor { 3, 4 }
    local y = (w * x):sum()
    x:fill_(0)
    assert.truthy(err(function() y:backward() end):find("argument #2 of mul", 1, true))
  end)

  it("let changes pass that the backward does not read (add keeps no values)", function()
    local w = loom.tensor({ 1, 2 }, { requires_grad = true })
    local x = loom.tensor { 3, 4 }
    local y = (w + x):sum()
    x:fill_(0)
    y:backward()
    assert.are.same({ 1, 1 }, w.grad:totable())
  end)

  it("see optimizer updates (in-place ops) as changes", function()
    local p = loom.tensor({ 1, 2 }, { requires_grad = true })
    local y = (p * p):sum()
    local opt = loom.optim.AdamW({ p }, { lr = 0.1 })
    p.grad = loom.ones(2)
    opt:step()
    assert.truthy(err(function() y:backward() end):find("modified in place", 1, true))
  end)
end)

describe("in-place changes of tensors that require grad", function()
  it("are errors while autograd records", function()
    local p = loom.tensor({ 1, 2 }, { requires_grad = true })
    for _, f in ipairs { function() p:fill_(0) end, function() p:zero_() end,
                         function() p:copy_(loom.zeros(2)) end, function() (p * 2):fill_(1) end } do
      assert.truthy(err(f):find("cannot be changed in place", 1, true))
    end
  end)

  it("are allowed under no_grad and on detach()", function()
    local p = loom.tensor({ 1, 2 }, { requires_grad = true })
    loom.no_grad(function() p:fill_(3) end)
    p:detach():add(0)
    assert.are.same({ 3, 3 }, p:totable())
  end)
end)

describe("a freed tensor", function()
  it("errors on any use, from Lua and in ops", function()
    local x = loom.ones(3)
    local y = x + 0
    x:free()
    assert.truthy(err(function() return x:size() end):find("was freed", 1, true))
    assert.truthy(err(function() return tostring(x) end):find("was freed", 1, true))
    assert.truthy(err(function() return y + x end):find("argument #2 was freed", 1, true))
    assert.truthy(err(function() return x.grad end):find("was freed", 1, true))
    assert.truthy(err(function() return loom.cat({ y, x }, 1) end):find("was freed", 1, true))
    x:free() -- twice is harmless
  end)

  it("keeps the storage for its views", function()
    local a = loom.arange(6):reshape(2, 3)
    local v = a:narrow(1, 2, 1)
    a:free()
    assert.are.same({ { 3, 4, 5 } }, v:totable())
  end)
end)

describe("the tensor struct from Lua", function()
  it("is read-only", function()
    local t = loom.zeros(2, 3)
    for _, f in ipairs { function() t.offset = 5 end, function() t.numel_ = 100 end,
                         function() t.ndim = 1 end, function() t.stride_[0] = 1 end,
                         function() t.shape_[0] = 9 end } do
      assert.truthy(err(f):find("constant", 1, true))
    end
    assert.are.same({ 2, 3 }, t:size())
  end)

  it("gives x.shape as a table", function()
    local t = loom.zeros(2, 3)
    assert.are.same({ 2, 3 }, t.shape)
    assert.are.same({}, loom.tensor(1).shape)
  end)

  it("takes no more attrs than lm_attrs holds", function()
    local x = loom.zeros(2)
    local many = {}
    for i = 1, 30 do many[i] = 1 end
    assert.truthy(err(function() loom.op("reshape", { x }, many) end):find("at most 24 integer", 1, true))
    assert.truthy(err(function() x:view(1, 1, 1, 1, 1, 1, 1, 1, 2) end):find("at most 8 sizes", 1, true))
  end)
end)
