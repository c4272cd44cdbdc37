-- support.lua: shared by the multi-rank specs. Inputs are determined by the
-- world rank; references are plain-Lua math over what every rank's input
-- would be (never computed by the collectives under test).
local loom = require "loom"

local S = {}

S.dtypes = { "f32", "f64", "bf16", "f16", "i32", "i64" }

-- element [i][j] (0-based) of world rank q's input: small integers, so every
-- dtype holds them and their sums over 4 ranks exactly (bf16: up to 256)
function S.val(q, i, j) return (q + 1) * 3 + i * 4 + j end

function S.input(q, n0, n1, dtype, f)
  f = f or S.val
  local rows = {}
  for i = 1, n0 do
    rows[i] = {}
    for j = 1, n1 do rows[i][j] = f(q, i - 1, j - 1) end
  end
  if n0 == 0 then return loom.zeros({ 0, n1 }, { dtype = dtype }) end
  if n1 == 0 then return loom.zeros({ n0, 0 }, { dtype = dtype }) end
  return loom.tensor(rows, { dtype = dtype })
end

-- torch.chunk: size and offset of chunk q (0-based) of n in k
function S.chunk(n, k, q)
  local c = math.ceil(n / k)
  return math.max(0, math.min(c, n - q * c)), math.min(q * c, n)
end

-- a (n0 x n1) table from f(i, j), 0-based
function S.table(n0, n1, f)
  local t = {}
  for i = 1, n0 do
    t[i] = {}
    for j = 1, n1 do t[i][j] = f(i - 1, j - 1) end
  end
  return t
end

-- v rounded once to dtype (through a tensor; no collective involved)
function S.round(t, dtype)
  if #t == 0 or #t[1] == 0 then return t end
  return loom.tensor(t, { dtype = "f64" }):to(dtype):totable()
end

-- The groups of a world of k ranks: {name, mesh, dim, members (world ranks
-- in group order), index of this rank} for the 1-D world mesh and, when k
-- is even and > 2, each dim of a {2, k/2} mesh (row-major: rank = a*(k/2)+b).
function S.groups(dist)
  local k, me = dist.world_size(), dist.rank()
  local out = {}
  local world = dist.init_device_mesh("cpu", { k }, { mesh_dim_names = { "w" } })
  local all = {}
  for q = 0, k - 1 do all[q + 1] = q end
  out[1] = { name = "1-D mesh of " .. k, mesh = world, dim = 1, members = all, index = me }
  if k % 2 == 0 and k > 2 then
    local h = k / 2
    local m2 = dist.init_device_mesh("cpu", { 2, h }, { mesh_dim_names = { "dp", "tp" } })
    local a, b = math.floor(me / h), me % h
    local dp, tp = {}, {}
    for x = 0, 1 do dp[x + 1] = x * h + b end
    for y = 0, h - 1 do tp[y + 1] = a * h + y end
    out[2] = { name = "2x" .. h .. " mesh along dp", mesh = m2, dim = "dp", members = dp, index = a }
    out[3] = { name = "2x" .. h .. " mesh along tp", mesh = m2, dim = 2, members = tp, index = b }
  end
  return out
end

-- Mismatches between got (a tensor) and want (nested table) as a list of
-- strings, so a spec asserts after all its collectives ran on every rank.
function S.diff(got, want, what, out)
  out = out or {}
  local g = got:totable()
  local gs, ws = got:size(), { #want, want[1] and #want[1] or 0 }
  if gs[1] ~= ws[1] or (ws[1] > 0 and (gs[2] or 0) ~= ws[2]) then
    out[#out + 1] = string.format("%s: shape {%s}, want {%d, %d}", what, table.concat(gs, ", "),
                                  ws[1], ws[2])
    return out
  end
  for i = 1, #want do
    for j = 1, #want[i] do
      if g[i][j] ~= want[i][j] then
        out[#out + 1] = string.format("%s: [%d][%d] = %s, want %s", what, i, j, tostring(g[i][j]),
                                      tostring(want[i][j]))
        if #out > 5 then return out end
      end
    end
  end
  return out
end

return S
