-- dtensor_redistribute_spec.lua: every placement pair converts, forward and
-- backward, on a 1-D mesh and (4 ranks) a 2x2 mesh along each dim and both,
-- with even and uneven shards, against full references; communication
-- counts through dist.comm_mode. Tolerance 1e-5 (Partial sources sum up to
-- 4 f32 terms in another order than the reference); data moves are exact.
local loom = require("loom")
local dist = require("loom.distributed")
local H = require("support.dist")

local ws = H.ws
local meshes = H.meshes()
local TOL = 1e-5

local sizes = { ws * 3, ws * 3 + 1, ws * 3 + 2 }
if ws > 2 then sizes[#sizes + 1] = ws - 1 end
if ws > 1 then sizes[#sizes + 1] = 1 end

-- A source DTensor with placements src for the global tensor X of size
-- {n, n + 1}: the term of each Partial coordinate is its own random tensor
-- and X their sum. Returns the leaf (this rank's shard) the DTensor is
-- made from, the DTensor and X.
local function source(mesh, src, n, seed)
  local coord, pdims = mesh:get_coordinate(), {}
  for k, p in ipairs(src) do if p:is_partial() then pdims[#pdims + 1] = k end end
  local function term(c) -- c: coordinates on the Partial dims
    local s = seed
    for i, k in ipairs(pdims) do s = s * 7 + c[i] + 1 end
    return H.randn(s, n, n + 1)
  end
  -- X: sum over every combination of the Partial dims' coordinates
  local X, combos = nil, { {} }
  for _, k in ipairs(pdims) do
    local nxt = {}
    for _, c in ipairs(combos) do
      for v = 0, mesh.shape[k] - 1 do
        local e = { unpack(c) }
        e[#e + 1] = v
        nxt[#nxt + 1] = e
      end
    end
    combos = nxt
  end
  for _, c in ipairs(combos) do X = X and X + term(c) or term(c) end
  local mine = {}
  for i, k in ipairs(pdims) do mine[i] = coord[k] end
  local loc = H.slice(term(mine), mesh, src):requires_grad_(true)
  local x = dist.DTensor.from_local(loc, mesh, src, { shape = { n, n + 1 } })
  return loc, x, X
end

-- expected collectives of one mesh dim's move a -> b
local function move_counts(a, b, counts)
  if a == b then return end
  local function add(k) counts[k] = (counts[k] or 0) + 1 end
  if a:is_shard() and b:is_replicate() then add("all_gather")
  elseif a:is_partial() and b:is_replicate() then add("all_reduce")
  elseif a:is_partial() and b:is_shard() then add("reduce_scatter")
  elseif a:is_shard() and b:is_shard() then add("all_to_all")
  elseif a:is_shard() and b:is_partial() then add("all_gather") end
  -- R -> S (a local slice) and R -> P (zeros off the first rank): none
end

-- Per-dim moves are independent unless a target Shard's tensor dim is split
-- by other earlier mesh dims before than after (then, as in PyTorch, that
-- mesh dim goes through Replicate first; those pairs are counted below).
local function dependent(src, dst)
  for k = 2, #dst do
    if dst[k]:is_shard() then
      for e = 1, k - 1 do
        if src[e]:is_shard(dst[k].dim) ~= dst[e]:is_shard(dst[k].dim) then return true end
      end
    end
  end
  return false
end

-- one conversion src -> dst, forward and backward, appending to bad
local function convert(bad, mesh, src, dst, n, check_counts)
  local what = string.format("%s -> %s, size %dx%d", H.pl_string(src), H.pl_string(dst), n, n + 1)
  local loc, x, X = source(mesh, src, n, 100 + n)
  local cm, y = dist.comm_mode(function() return x:redistribute(mesh, dst) end)
  H.check_dt(bad, what, y, X, TOL, dst)
  if check_counts and not dependent(src, dst) then
    local want = {}
    for k = 1, #src do move_counts(src[k], dst[k], want) end
    H.check_counts(bad, what, cm, want, true)
  end
  -- backward: the loss of the full result, weighted; the leaf's gradient is
  -- the weight's slice (a Partial term's gradient is the whole weight)
  local w = H.randn(9, n, n + 1)
  ;(y:full_tensor() * w):sum():backward()
  H.check(bad, what .. ": gradient", loc.grad, H.slice(w, mesh, src), TOL)
end

local placements_1d = { "S1", "S2", "R", "P" }
local placements_2d = { "S1 S2", "S2 S1", "S1 S1", "R S1", "S2 R", "P R", "R P", "P P", "S1 P", "P S2", "R R" }

for _, m in ipairs(meshes) do
  local list = m.mesh.ndim == 1 and placements_1d or placements_2d
  describe("redistribute on the " .. m.name, function()
    for _, n in ipairs(sizes) do
      it("every pair of " .. table.concat(list, ", ") .. " forward and backward, size " .. n .. "x" .. n + 1,
         function()
        local bad = {}
        for _, a in ipairs(list) do
          for _, b in ipairs(list) do convert(bad, m.mesh, H.pl(a), H.pl(b), n, true) end
        end
        assert.same({}, bad)
      end)
    end

    it("counts S->R as one all_gather, P->R one all_reduce, P->S one reduce_scatter, R->S and R->P none",
       function()
      local bad = {}
      local last = m.mesh.ndim
      local function rest(p) -- p on the last mesh dim, Replicate elsewhere
        local t = {}
        for k = 1, last do t[k] = k == last and p or "R" end
        return table.concat(t, " ")
      end
      local want = {
        { "S1", "R", { all_gather = 1 } }, { "P", "R", { all_reduce = 1 } }, { "P", "S2", { reduce_scatter = 1 } },
        { "R", "S1", {} }, { "R", "P", {} }, { "S1", "S2", { all_to_all = 1 } },
      }
      for _, c in ipairs(want) do
        local src, dst = H.pl(rest(c[1])), H.pl(rest(c[2]))
        local _, x = source(m.mesh, src, ws * 2, 5)
        local cm = dist.comm_mode(function() return x:redistribute(m.mesh, dst) end)
        local got = cm:get_comm_counts()
        local ok = cm:get_total_counts() == (next(c[3]) and 1 or 0)
        for k, v in pairs(c[3]) do ok = ok and got[k] == v end
        if not ok then bad[#bad + 1] = c[1] .. " -> " .. c[2] .. ": " .. tostring(cm) end
      end
      assert.same({}, bad)
    end)
  end)

  if m.mesh.ndim == 2 then
    it("counts moves that change the order of nested shards as PyTorch does", function()
      local bad = {}
      local want = {
        { "S1 S2", "S2 S1", { all_gather = 1, all_to_all = 1 } }, -- gather the inner, swap the outer, slice
        { "S1 S1", "R S1", { all_gather = 2 } },
        { "S1 S1", "S1 R", { all_gather = 1 } },
        { "R S1", "S1 S1", { all_gather = 1 } },                  -- the inner shard is re-cut under the outer
        { "S1 P", "S2 S1", { all_reduce = 1, all_to_all = 1 } },
        { "P P", "S1 S1", { all_reduce = 1, reduce_scatter = 1 } },
      }
      for _, c in ipairs(want) do
        local _, x, X = source(m.mesh, H.pl(c[1]), 5, 11)
        local cm, y = dist.comm_mode(function() return x:redistribute(m.mesh, H.pl(c[2])) end)
        H.check_dt(bad, c[1] .. " -> " .. c[2], y, X, TOL, H.pl(c[2]))
        H.check_counts(bad, c[1] .. " -> " .. c[2], cm, c[3], true)
      end
      assert.same({}, bad)
    end)
  end
end

describe("redistribute of other Partials on the 1-D mesh", function()
  local mesh = meshes[1].mesh
  it("Partial(avg) -> Replicate and -> Shard average the terms; the gradient is divided by the size", function()
    local bad = {}
    for _, n in ipairs { ws * 2, ws * 2 + 1 } do
      local terms, total = {}, nil
      for q = 0, ws - 1 do
        terms[q] = H.randn(50 + q, n, 3)
        total = total and total + terms[q] or terms[q]:clone()
      end
      for _, dst in ipairs { "R", "S1" } do
        local loc = terms[H.rank]:clone():requires_grad_(true)
        local x = dist.DTensor.from_local(loc, mesh, { dist.Partial("avg") })
        local ok, y = pcall(x.redistribute, x, mesh, H.pl(dst))
        if not ok then
          bad[#bad + 1] = "avg -> " .. dst .. ": " .. tostring(y)
        else
          H.check_dt(bad, "avg -> " .. dst, y, total / ws, TOL, H.pl(dst))
          local w = H.randn(3, n, 3)
          local ok2, err = pcall(function() (y:full_tensor() * w):sum():backward() end)
          if not ok2 then bad[#bad + 1] = "avg -> " .. dst .. " backward: " .. tostring(err)
          else H.check(bad, "avg -> " .. dst .. ": gradient", loc.grad, w / ws, TOL) end
        end
      end
    end
    assert.same({}, bad)
  end)

  it("Partial(max) and Partial(min) -> Replicate reduce by max and min", function()
    local bad = {}
    local terms = {}
    for q = 0, ws - 1 do terms[q] = H.randn(60 + q, 5, 3) end
    for _, op in ipairs { "max", "min" } do
      local want = terms[0]:clone()
      for q = 1, ws - 1 do
        want = loom.where(op == "max" and terms[q]:gt(want) or terms[q]:lt(want), terms[q], want)
      end
      local x = dist.DTensor.from_local(terms[H.rank]:clone(), mesh, { dist.Partial(op) })
      H.check_dt(bad, op, x:redistribute(mesh, { dist.Replicate() }), want, 0, { dist.Replicate() })
    end
    assert.same({}, bad)
  end)
end)
