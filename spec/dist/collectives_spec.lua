-- collectives_spec.lua: every collective x dtype x even/uneven, on the 1-D
-- world mesh and (4 ranks) along each dim of a 2x2 mesh, sync and async,
-- against references from rank-determined inputs. Runs on every rank:
--   scripts/loomrun -n 2 scripts/run_specs.lua spec/dist
-- Each `it` runs all its collectives before asserting, so a failure on one
-- rank never leaves the others waiting in a collective.
local dist = require("loom.distributed")
local S = require("support.dist")

local groups = S.groups()
local val = S.val

local function reduce_ref(op, members, row0, col0)
  return function(i, j)
    local acc
    for _, q in ipairs(members) do
      local v = val(q, i + row0, j + col0)
      if acc == nil then acc = v
      elseif op == "max" then acc = math.max(acc, v)
      elseif op == "min" then acc = math.min(acc, v)
      else acc = acc + v end
    end
    return op == "avg" and acc / #members or acc
  end
end

-- which member holds global row g of a torch.chunk split of full, and where
local function owner(g, full, members)
  for idx, q in ipairs(members) do
    local s, o = S.chunk(full, #members, idx - 1)
    if g >= o and g < o + s then return q, g - o end
  end
end

-- check(bad, dim, n) along dims 1 and 2 for sizes 2k (even), 5 and 1 (uneven
-- for most k); then asserts that none of them added a mismatch to bad
local function along_dims_and_sizes(k, check)
  local bad = {}
  for _, dim in ipairs { 1, 2 } do
    for _, n in ipairs { 2 * k, 5, 1 } do check(bad, dim, n) end
  end
  assert.same({}, bad)
end

-- the 2-D shape with n along dim (1 or 2) and 3 along the other
local function shape_along(dim, n)
  if dim == 1 then return n, 3 end
  return 3, n
end

for _, g in ipairs(groups) do
  local k, me, idx = #g.members, dist.rank(), g.index

  describe("collectives on the " .. g.name, function()
    for _, dt in ipairs(S.dtypes) do
      it("all_reduce sum/avg/max/min of " .. dt, function()
        local bad = {}
        for _, op in ipairs { "sum", "avg", "max", "min" } do
          if op ~= "avg" or dt:match("^f") or dt == "bf16" then
            local y = dist.all_reduce(S.input(me, 5, 3, dt), op, g.mesh, g.dim)
            S.diff(y, S.round(S.table(5, 3, reduce_ref(op, g.members, 0, 0)), dt), op, bad)
          end
        end
        assert.same({}, bad)
      end)

      it("all_gather of " .. dt .. " on dims 1 and 2, even and uneven", function()
        along_dims_and_sizes(k, function(bad, dim, full)
          local r, c = shape_along(dim, (S.chunk(full, k, idx)))   -- my chunk of a full size `full`
          local uneven = full % k ~= 0
          local y = dist.all_gather(S.input(me, r, c, dt), dim, g.mesh, g.dim, uneven and { full_size = full } or nil)
          local want = dim == 1 and S.table(full, 3, function(i, j)
            local q, l = owner(i, full, g.members)
            return val(q, l, j)
          end) or S.table(3, full, function(i, j)
            local q, l = owner(j, full, g.members)
            return val(q, i, l)
          end)
          S.diff(y, want, string.format("dim %d full %d", dim, full), bad)
        end)
      end)

      it("reduce_scatter sum of " .. dt .. " on dims 1 and 2, even and uneven", function()
        along_dims_and_sizes(k, function(bad, dim, n)
          local r, c = shape_along(dim, n)
          local y = dist.reduce_scatter(S.input(me, r, c, dt), "sum", dim, g.mesh, g.dim)
          local s, o = S.chunk(n, k, idx)
          local want = dim == 1 and S.table(s, 3, reduce_ref("sum", g.members, o, 0))
                       or S.table(3, s, reduce_ref("sum", g.members, 0, o))
          S.diff(y, S.round(want, dt), string.format("dim %d n %d", dim, n), bad)
        end)
      end)

      it("all_to_all of " .. dt .. ", even and uneven, and back", function()
        local bad = {}
        for _, case in ipairs { { 2 * k, 2 * k }, { 5, 3 } } do
          local full, n1 = case[1], case[2]
          local mine = S.chunk(full, k, idx)
          local x = S.input(me, mine, n1, dt)
          -- rows sharded -> columns sharded (Shard(1) -> Shard(2) in loom's dims)
          local y = dist.all_to_all(x, 2, 1, g.mesh, g.dim, { full_size = full })
          local cs, co = S.chunk(n1, k, idx)
          S.diff(y, S.table(full, cs, function(i, j)
            local q, l = owner(i, full, g.members)
            return val(q, l, j + co)
          end), "rows to columns, full " .. full, bad)
          local z = dist.all_to_all(y, 1, 2, g.mesh, g.dim, { full_size = n1 })
          S.diff(z, x:totable(), "and back, full " .. full, bad)
        end
        -- split and cat on the same dim (all_to_all_single)
        local x = S.input(me, 2 * k, 3, dt)
        local y = dist.all_to_all(x, 1, 1, g.mesh, g.dim)
        S.diff(y, S.table(2 * k, 3, function(i, j)
          local q = g.members[math.floor(i / 2) + 1]
          return val(q, idx * 2 + i % 2, j)
        end), "split and cat on dim 1", bad)
        assert.same({}, bad)
      end)

      it("broadcast of " .. dt .. " from the last rank of the group", function()
        local y = dist.broadcast(S.input(me, 4, 3, dt), k - 1, g.mesh, g.dim)
        assert.same({}, S.diff(y, S.table(4, 3, function(i, j) return val(g.members[k], i, j) end), "broadcast"))
      end)
    end

    it("reads non-contiguous inputs (a transposed view)", function()
      local x = S.input(me, 3, 5, "f32"):t()
      assert.is_false(x:is_contiguous())
      local y = dist.all_reduce(x, "sum", g.mesh, g.dim)
      local ag = dist.all_gather(x, 2, g.mesh, g.dim)
      local rs = dist.reduce_scatter(x, "sum", 1, g.mesh, g.dim)
      local bad = S.diff(y, S.table(5, 3, function(i, j) return reduce_ref("sum", g.members, 0, 0)(j, i) end), "all_reduce")
      S.diff(ag, S.table(5, 3 * k, function(i, j) return val(g.members[math.floor(j / 3) + 1], j % 3, i) end), "all_gather", bad)
      local s, o = S.chunk(5, k, idx)
      S.diff(rs, S.table(s, 3, function(i, j) return reduce_ref("sum", g.members, 0, 0)(j, i + o) end), "reduce_scatter", bad)
      assert.same({}, bad)
    end)

    it("leaves its input untouched and returns a new tensor", function()
      local x = S.input(me, 2, 3, "f32")
      local before = x:totable()
      local y = dist.all_reduce(x, "sum", g.mesh, g.dim)
      assert.same(before, x:totable())
      assert.are_not.equal(x:data_ptr(), y:data_ptr())
    end)

    it("runs async forms: handles that wait and return the result", function()
      local x = S.input(me, 4, 3, "f32")
      local w1 = dist.all_reduce(x, "sum", g.mesh, g.dim, { async_op = true })
      local w2 = dist.all_gather(x, 1, g.mesh, g.dim, { async_op = true })
      local w3 = dist.reduce_scatter(S.input(me, 2 * k, 3, "bf16"), "avg", 1, g.mesh, g.dim, { async_op = true })
      local w4 = dist.all_to_all(S.input(me, 2 * k, 3, "i64"), 1, 1, g.mesh, g.dim, { async_op = true })
      local w5 = dist.broadcast(x, 0, g.mesh, g.dim, { async_op = true })
      local w6 = dist.barrier(g.mesh, g.dim, { async_op = true })
      local y1, y2, y3, y4, y5 = w1:wait(), w2:wait(), w3:wait(), w4:wait(), w5:wait()
      assert.is_nil(w6:wait())
      local bad = S.diff(y1, S.table(4, 3, reduce_ref("sum", g.members, 0, 0)), "all_reduce")
      S.diff(y2, S.table(4 * k, 3, function(i, j) return val(g.members[math.floor(i / 4) + 1], i % 4, j) end), "all_gather", bad)
      S.diff(y3, S.round(S.table(2, 3, reduce_ref("avg", g.members, 2 * idx, 0)), "bf16"), "reduce_scatter avg", bad)
      S.diff(y4, S.table(2 * k, 3, function(i, j) return val(g.members[math.floor(i / 2) + 1], idx * 2 + i % 2, j) end), "all_to_all", bad)
      S.diff(y5, S.table(4, 3, function(i, j) return val(g.members[1], i, j) end), "broadcast", bad)
      assert.same({}, bad)
      assert.is_true(w1:is_completed())
      assert.equal(y1, w1:wait()) -- the same tensor again
    end)
  end)
end

describe("collectives: errors detectable locally", function()
  local g = groups[1]
  it("rejects a bad op, dtype, dim, src and mesh dim", function()
    local x = S.input(dist.rank(), 2, 3, "i32")
    assert.has_error(function() dist.all_reduce(x, "prod", g.mesh) end,
      'all_reduce: op expected "sum", "avg", "max" or "min", got "prod"')
    for _, c in ipairs {   -- a collective and its arguments, a pattern its error must match
      { dist.all_reduce, { x, "avg", g.mesh }, "avg needs a floating dtype, got i32" },
      { dist.all_gather, { x, 3, g.mesh }, "dim" },
      { dist.broadcast, { x, dist.world_size(), g.mesh }, "root rank in %[0, " .. dist.world_size() },
      { dist.all_reduce, { x, "sum", g.mesh, "nope" }, 'mesh has no dim named "nope"' },
      { dist.all_reduce, { x, "sum", g.mesh, 2 }, "mesh dim expected" },
      { dist.all_reduce, { x, "sum", "world" }, "mesh expected a DeviceMesh" },
      { dist.all_gather, { x, 1, g.mesh, nil, { full_size = 1000 } }, "torch.chunk" },
    } do
      assert.matches(c[3], S.err_of(c[1], unpack(c[2], 1, 5)))
    end
  end)
end)

describe("comm_mode", function()
  it("counts collectives by kind with their bytes", function()
    local g = groups[#groups]
    local x = S.input(dist.rank(), 4, 3, "f32")
    local cm, a, b = dist.comm_mode(function(u)
      local y = dist.all_reduce(u, "sum", g.mesh, g.dim)
      dist.all_reduce(u, "max", g.mesh, g.dim)
      local z = dist.all_gather(u:to("bf16"), 1, g.mesh, g.dim)
      dist.barrier()
      return y, z
    end, x)
    assert.equal(2, cm.counts.all_reduce)
    assert.equal(1, cm.counts.all_gather)
    assert.equal(0, cm.counts.reduce_scatter)
    assert.equal(1, cm.counts.barrier)
    assert.equal(2 * 48, cm.bytes.all_reduce)
    assert.equal(24, cm.bytes.all_gather)
    assert.same({ all_reduce = 2, all_gather = 1, barrier = 1 }, cm:get_comm_counts())
    assert.equal(4, cm:get_total_counts())
    assert.same({ 4, 3 }, a:size())
    assert.equal("bf16", b.dtype)
    assert.matches("all_reduce: 2", tostring(cm))
  end)
end)
