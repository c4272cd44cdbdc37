-- size_spec.lua: loom.Size, what x:size() returns: it prints as a size,
-- compares with ==, and is indexed and measured as a list.
local loom = require("loom")

describe("loom.Size", function()
  it("prints as loom.Size{...}", function()
    assert.equal("loom.Size{8, 6}", tostring(loom.ones(8, 6):size()))
    assert.equal("loom.Size{}", tostring(loom.tensor(3):size()))
    assert.equal("loom.Size{8, 6}", tostring(loom.Size{ 8, 6 }))
    assert.equal("loom.Size{2}", tostring(loom.Size(2)))
  end)

  it("compares with == and is indexed, measured and unpacked as a list", function()
    local s = loom.zeros(8, 6):size()
    assert.is_true(s == loom.Size{ 8, 6 })
    assert.is_false(s == loom.Size{ 6, 8 })
    assert.is_false(s == loom.Size{ 8, 6, 1 })
    assert.is_true(loom.zeros(2, 3):size() == loom.ones(2, 3):size())
    assert.equal(2, #s)
    assert.equal(8, s[1])
    assert.equal(6, s[2])
    assert.is_nil(s[3])
    assert.same({ 8, 6 }, { unpack(s) })
    assert.equal(48, s:numel())
    assert.equal("8x6", table.concat(s, "x"))
    assert.is_nil(getmetatable(s:totable()))
  end)

  it("compares equal across a reload of loom.size (one metatable per process)", function()
    local before = loom.ones(2, 3):size()
    local saved = package.loaded["loom.size"]
    package.loaded["loom.size"] = nil
    local again = require("loom.size")
    package.loaded["loom.size"] = saved
    assert.is_true(before == again.new({ 2, 3 }))
  end)

  it("goes back into the functions that take sizes", function()
    local x = loom.randn(4, 5)
    assert.is_true(loom.zeros(x:size()):size() == x:size())
    assert.is_true(x:view(x:size()):size() == x:size())
  end)

  it("refuses what is no size, naming the entry", function()
    local ok, err = pcall(loom.Size, { 2, -1 })
    assert.is_false(ok)
    assert.truthy(err:find("size #2 expected an integer >= 0, got -1", 1, true), err)
  end)
end)
