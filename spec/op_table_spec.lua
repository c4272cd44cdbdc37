-- op_table_spec.lua: the op table made from core/op_list.h: ids, names and
-- what loom.ops() reports; ops called by id and by name agree.
local loom = require("loom")
local C = loom.C
local ffi = require("ffi")

describe("the op table", function()
  local ops = loom.ops()

  it("lists every op once, ids consecutive from 0, names unique", function()
    assert.are.equal(tonumber(C.LM_NOPS), #ops)
    local seen = {}
    for i, o in ipairs(ops) do
      assert.are.equal(i - 1, o.id)
      assert.is_nil(seen[o.name], o.name)
      seen[o.name] = true
      assert.are.equal(o.id, C.lm_op_find(o.name))
      assert.are.equal(o.name, ffi.string(C.lm_op_name(o.id)))
    end
    assert.is_true(C.lm_op_find("no_such_op") < 0)
  end)

  it("gives Lua the ids as constants from the one list", function()
    local ids = {}
    for line in io.lines("core/op_list.h") do
      local id, name = line:match("^LM_OP%(([%w_]+),%s*([%w_]+),")
      if id then ids[#ids + 1] = { id, name } end
    end
    assert.are.equal(#ops, #ids)
    for k, pair in ipairs(ids) do
      assert.are.equal(k - 1, C["LM_OP_" .. pair[1]])
      assert.are.equal(pair[2], ops[k].name)
    end
  end)

  it("reports what each op is", function()
    local by = {}
    for _, o in ipairs(ops) do by[o.name] = o end
    assert.are.same({ 2, 1, true, true, false }, { by.add.nin, by.add.nout, by.add.differentiable, by.add.sharded, by.add.inplace })
    assert.are.same({ 1, 2 }, { by.max.nin, by.max.nout })
    assert.is_false(by.eq.differentiable)
    assert.is_true(by._adamw_.inplace)
    assert.are.equal(-1, by.cat.nin)
    assert.is_false(by._dist_alias.sharded)
    for _, o in ipairs(ops) do assert.is_true(o.kernels.cpu, o.name .. " has a CPU kernel") end
  end)

  it("runs an op called by id as called by name", function()
    local x = loom.tensor { 1, -2, 3 }
    local a = loom.op(C.LM_OP_NEG, { x })
    local b = loom.op("neg", { x })
    assert.are.same({ -1, 2, -3 }, a:totable())
    assert.are.same(a:totable(), b:totable())
    assert.has_error(function() loom.op("no_such_op", { x }) end, "loom: no op named no_such_op")
    assert.has_error(function() loom.op(C.LM_NOPS, { x }) end)
  end)
end)
