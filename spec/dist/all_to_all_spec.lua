-- all_to_all_spec.lua: dist.all_to_all_single and its functional form (rows
-- exchanged by split sizes, expert parallelism's token dispatch) on the 1-D
-- world mesh and, on 4 ranks, along each dim of a 2x2 mesh: even and uneven
-- splits (zeros included), rows of several dims, f32/bf16/i64, against
-- plain-Lua references from rank-determined inputs; the gradient against
-- the same exchange computed in one process; splits the ranks disagree on,
-- wrong sizes and mismatched collectives refused on every rank with the
-- ranks named. Runs on every rank:
--   scripts/loomrun -n 2 scripts/run_specs.lua spec/dist/all_to_all_spec.lua   (and -n 4)
-- Each `it` runs all its collectives before asserting, so a failure on one
-- rank never leaves the others waiting in a collective.
local loom = require("loom")
local dist = require("loom.distributed")
local S = require("support.dist")

dist.set_debug_collectives(true) -- the splits are checked with the fingerprints (the default)
local groups = S.groups()
local val = S.val
local W = 6 -- elements of a row: rows are (2, 3)

-- rows group member a sends to member b: 0, 1 or 2 (zeros included)
local function n(a, b) return (a + 2 * b + 1) % 3 end

-- member a's splits (Lua lists, 1-based by member) and its input's rows
local function splits(k, a)
  local sends, gets, rows = {}, {}, 0
  for b = 0, k - 1 do
    sends[b + 1], gets[b + 1] = n(a, b), n(b, a)
    rows = rows + n(a, b)
  end
  return sends, gets, rows
end

-- world rank q's (rows, 2, 3) input of dtype
local function input(q, rows, dtype)
  return S.input(q, rows, W, dtype):view(rows, 2, 3)
end

-- what member b receives, as a (rows, W) table: from each member a in
-- order, the n(a, b) rows of a's input after those a sends to members < b
local function received(g, b, split)
  local want, k = {}, #g.members
  for a = 0, k - 1 do
    local off = 0
    for c = 0, b - 1 do off = off + split(a, c) end
    for t = 0, split(a, b) - 1 do
      local row = {}
      for j = 0, W - 1 do row[j + 1] = val(g.members[a + 1], off + t, j) end
      want[#want + 1] = row
    end
  end
  return want
end

local function flat(t) return t:reshape(t:size(1), W) end

for _, g in ipairs(groups) do
  local k, me, idx = #g.members, dist.rank(), g.index

  describe("all_to_all_single on the " .. g.name, function()
    for _, dt in ipairs { "f32", "bf16", "i64" } do
      it("exchanges rows of " .. dt .. " by uneven splits (zeros included), rows of (2, 3)", function()
        local sends, gets, rows = splits(k, idx)
        local x = input(me, rows, dt)
        local y = dist.functional.all_to_all_single(x, gets, sends, g.mesh, g.dim)
        local out = loom.zeros({ #received(g, idx, n), 2, 3 }, { dtype = dt })
        local r = dist.all_to_all_single(out, x, loom.tensor(gets, { dtype = "i64" }), sends, g.mesh, g.dim)
        local bad = S.diff(flat(y), received(g, idx, n), "functional")
        S.diff(flat(out), received(g, idx, n), "in place", bad)
        assert.same({}, bad)
        assert.equal(out, r)
        assert.equal(dt, y.dtype)
        assert.same({ #received(g, idx, n), 2, 3 }, y:size():totable())
      end)

      it("exchanges even shares of " .. dt .. " when the splits are nil", function()
        local x = input(me, 2 * k, dt)
        local y = dist.functional.all_to_all_single(x, nil, nil, g.mesh, g.dim)
        local out = dist.all_to_all_single(loom.empty({ 2 * k, 2, 3 }, { dtype = dt }), x, nil, nil, g.mesh, g.dim)
        local even = function() return 2 end
        local bad = S.diff(flat(y), received(g, idx, even), "functional")
        S.diff(flat(out), received(g, idx, even), "in place", bad)
        assert.same({}, bad)
      end)
    end

    it("sends nothing and receives nothing when every split is 0", function()
      local zeros = {}
      for q = 1, k do zeros[q] = 0 end
      local y = dist.functional.all_to_all_single(loom.zeros({ 0, 2, 3 }), zeros, zeros, g.mesh, g.dim)
      assert.same({ 0, 2, 3 }, y:size():totable())
    end)

    it("has the reverse exchange as its gradient, as one process computes it (f64)", function()
      -- every member's input and output weights, built alike on every rank
      local xs, ws = {}, {}
      for a = 0, k - 1 do
        local _, gets, rows = splits(k, a)
        local out_rows = 0
        for _, v in ipairs(gets) do out_rows = out_rows + v end
        xs[a + 1] = input(g.members[a + 1], rows, "f64")
        ws[a + 1] = S.input(g.members[a + 1], out_rows, W, "f64", function(q, i, j) return (q + 1) * 0.5 - i * 0.25 + j end)
                      :view(out_rows, 2, 3)
      end
      -- distributed: this member's input, its output times its weights
      local sends, gets = splits(k, idx)
      local x = xs[idx + 1]:clone():requires_grad_()
      local y = dist.functional.all_to_all_single(x, gets, sends, g.mesh, g.dim)
      local loss = (y * ws[idx + 1]):sum()
      loss:backward()
      -- the gradient's exchange by hand: each member's weights sent back
      local back = dist.functional.all_to_all_single(ws[idx + 1], sends, gets, g.mesh, g.dim)
      -- one process: every member's exchange by narrow and cat, the losses summed
      local ref = {}
      for a = 1, k do ref[a] = xs[a]:clone():requires_grad_() end
      local total
      for b = 0, k - 1 do
        local parts = {}
        for a = 0, k - 1 do
          local off = 0
          for c = 0, b - 1 do off = off + n(a, c) end
          if n(a, b) > 0 then parts[#parts + 1] = ref[a + 1]:narrow(1, off + 1, n(a, b)) end
        end
        local yb = loom.cat(parts, 1)
        local lb = (yb * ws[b + 1]):sum()
        total = total and total + lb or lb
        if b == idx then S.check({}, "forward", y, yb) end
      end
      total:backward()
      local bad = S.check({}, "x.grad against one process", x.grad, ref[idx + 1].grad)
      S.check(bad, "x.grad against the reverse exchange", x.grad, back)
      assert.same({}, bad)
      assert.is_true(x.grad:abs():sum():item() > 0)
    end)

    it("is counted as an all_to_all by comm_mode, with its bytes", function()
      local sends, gets, rows = splits(k, idx)
      local cm = dist.comm_mode(dist.functional.all_to_all_single, input(me, rows, "f32"), gets, sends, g.mesh, g.dim)
      assert.equal(1, cm.counts.all_to_all)
      assert.equal(rows * W * 4, cm.bytes.all_to_all)
    end)
  end)
end

describe("all_to_all_single refuses, on every rank", function()
  local g = groups[1]
  local k, me = #g.members, dist.rank()
  local f = dist.functional.all_to_all_single
  local function even() local t = {} for q = 1, k do t[q] = 1 end return t end

  it("splits a sender and its receiver disagree on, naming both", function()
    local sends, gets = even(), even()
    if me == 0 then sends[2] = 2 end -- rank 0 sends 2 rows to rank 1, which expects 1
    local e = S.err_of(f, loom.zeros({ me == 0 and k + 1 or k, 3 }), gets, sends, g.mesh)
    assert.is_true(S.has(e, "all_to_all_single: splits disagree in a group of " .. k .. " ranks: rank 0 sends 2 rows "
                         .. "to rank 1 (its input_splits[2]), but rank 1 expects 1 from rank 0 (its output_splits[1])"), e)
  end)

  it("input_splits that do not add up to the input's rows", function()
    local e = S.err_of(f, loom.zeros({ me == 1 and k + 2 or k, 3 }), even(), even(), g.mesh)
    assert.is_true(S.has(e, "rank 1's input_splits sum to " .. k .. " rows, but its input has " .. k + 2
                         .. " rows on dim 1"), e)
  end)

  it("a negative split", function()
    local sends, gets = even(), even()
    if me == 0 then sends[1], sends[2] = 2, -1 end
    local e = S.err_of(f, loom.zeros({ k, 3 }), gets, sends, g.mesh)
    assert.is_true(S.has(e, "rank 0's input_splits[2] is -1, expected a row count >= 0"), e)
  end)

  it("another collective on another rank, and another dtype or row size", function()
    local x = loom.zeros({ k, 3 })
    local e1 = me == 0 and S.err_of(f, x, even(), even(), g.mesh) or S.err_of(dist.all_reduce, x, "sum", g.mesh)
    local e2 = S.err_of(f, loom.zeros({ k, 3 }, { dtype = me == 0 and "f32" or "f64" }), even(), even(), g.mesh)
    local e3 = S.err_of(f, loom.zeros({ k, me == 0 and 3 or 4 }), even(), even(), g.mesh)
    assert.is_true(S.has(e1, "collective mismatch", "all_to_all_single(rows by splits) of f32 [*, 3]",
                         "all_reduce(sum) of f32 [" .. k .. ", 3]"), e1)
    assert.is_true(S.has(e2, "collective mismatch", "of f32 [*, 3]", "of f64 [*, 3]"), e2)
    assert.is_true(S.has(e3, "collective mismatch", "of f32 [*, 3]", "of f32 [*, 4]"), e3)
  end)

  it("splits of the wrong kind or length, and a wrong output", function()
    local x = loom.zeros({ k, 3 })
    local short = even()
    short[k] = nil
    assert.is_true(S.has(S.err_of(f, x, short, even(), g.mesh),
                         "functional.all_to_all_single: output_splits expected a list of " .. k .. " row counts"))
    assert.is_true(S.has(S.err_of(f, x, even(), { 1.5, unpack(even(), 2) }, g.mesh),
                         "input_splits[1] expected an integer row count, got 1.5"))
    assert.is_true(S.has(S.err_of(f, x, even(), loom.tensor(even(), { dtype = "i32" }), g.mesh),
                         "input_splits expected an i64 tensor of " .. k .. " row counts"))
    assert.is_true(S.has(S.err_of(f, x, even(), nil, g.mesh),
                         "output_splits and input_splits are given together or both nil"))
    assert.is_true(S.has(S.err_of(f, loom.zeros({ k + 1, 3 }), nil, nil, g.mesh),
                         "do not divide by the group's " .. k .. " ranks"))
    local e = S.err_of(dist.all_to_all_single, loom.zeros({ k + 1, 3 }), x, even(), even(), g.mesh)
    assert.is_true(S.has(e, "all_to_all_single: output expected a tensor of size loom.Size{" .. k .. ", 3}"), e)
    -- and the ranks still agree: a good call after the refusals
    local y = f(x + me, even(), even(), g.mesh)
    assert.same(loom.arange(k):to("f32"):totable(), y:select(2, 1):totable())
  end)

  if #groups > 1 then
    it("names group and world ranks on a sub-mesh", function()
      local h = groups[3] -- along tp: members {0, 1} and {2, 3}
      local kk = #h.members
      local sends, gets = {}, {}
      for q = 1, kk do sends[q], gets[q] = 1, 1 end
      if h.index == 0 then sends[2] = 2 end
      local e = S.err_of(f, loom.zeros({ h.index == 0 and kk + 1 or kk, 3 }), gets, sends, h.mesh, h.dim)
      local function name(q) -- group rank q, with its world rank where they differ
        local w = h.members[q + 1]
        return w == q and "rank " .. q or "rank " .. q .. " (world rank " .. w .. ")"
      end
      local name0, name1 = name(0), name(1)
      assert.is_true(S.has(e, name0 .. " sends 2 rows to rank 1", "but " .. name1 .. " expects 1"), e)
    end)
  end
end)

-- NCCL (grouped sends and receives) where every rank has a GPU (the
-- emulated device under scripts/test_emu.sh's build); else said and skipped
local ngpu = loom.cuda.device_count()
describe("all_to_all_single on a cuda mesh", function()
  if ngpu < S.ws then
    it("is skipped: " .. ngpu .. " GPUs for " .. S.ws .. " ranks", function() assert.is_true(ngpu < S.ws) end)
    return
  end
  it("exchanges uneven rows and sends the gradient back", function()
    local mesh = dist.init_device_mesh("cuda", { S.ws })
    local g = { members = groups[1].members }
    local sends, gets, rows = splits(S.ws, dist.rank())
    local x = input(dist.rank(), rows, "f32"):to("cuda"):requires_grad_()
    local y = dist.functional.all_to_all_single(x, gets, sends, mesh)
    y:sum():backward()
    local bad = S.diff(flat(y:to("cpu")), received(g, dist.rank(), n), "cuda")
    S.check(bad, "gradient", x.grad:to("cpu"), loom.ones({ rows, 2, 3 }))
    assert.same({}, bad)
  end)
end)
