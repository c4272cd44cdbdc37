-- union.lua: state_dicts whose paths differ between ranks. Pipeline stages
-- each hold only their own layers (under the whole model's names), so save
-- takes the union of every rank's paths: each tensor is written by the
-- ranks that hold it (plan.writers checks that their blocks cover it), and
-- the manifest's values are every rank's merged (the lower rank's value
-- where two ranks give one path different values).
local state = require("loom.distributed.checkpoint.state")
local ranks = require("loom.distributed.checkpoint.ranks")

local M = {}

-- encode(v, out): v (strings, numbers, booleans, 64-bit integers, tables
-- of them) as a Lua expression, appended to out
local function encode(v, out)
  local t = type(v)
  if t == "table" then
    out[#out + 1] = "{"
    for k, x in pairs(v) do
      out[#out + 1] = "["
      encode(k, out)
      out[#out + 1] = "]="
      encode(x, out)
      out[#out + 1] = ","
    end
    out[#out + 1] = "}"
  elseif t == "string" then out[#out + 1] = string.format("%q", v)
  elseif t == "number" then
    if v ~= v then out[#out + 1] = "0/0"
    elseif v == math.huge then out[#out + 1] = "1/0"
    elseif v == -math.huge then out[#out + 1] = "-1/0"
    else out[#out + 1] = string.format("%.17g", v) end
  elseif t == "boolean" then out[#out + 1] = tostring(v)
  elseif t == "cdata" then out[#out + 1] = tostring(v)   -- 123LL, 123ULL: LuaJIT literals
  else error("union: cannot pass a " .. t .. " between ranks", 0) end
end

-- exchange(v) -> every rank's v, in rank order (a collective)
function M.exchange(v)
  local out = {}
  encode(v, out)
  local all = {}
  for r, s in ipairs(ranks.gather_strings(table.concat(out))) do
    local f = assert(loadstring("return " .. s))
    all[r] = setfenv(f, {})()
  end
  return all
end

-- merge(dst, src): src's leaves that dst lacks, into dst
local function merge(dst, src)
  for k, v in pairs(src) do
    if dst[k] == nil then dst[k] = v
    elseif type(dst[k]) == "table" and type(v) == "table" then merge(dst[k], v) end
  end
end

-- union(entries, values, world) -> entries, values: the entries of every
-- rank's state_dict (those this rank lacks marked absent, in the order of
-- first appearance by rank) and every rank's values merged. A collective;
-- in one process it returns its arguments.
function M.union(entries, values, world)
  if world == 1 then return entries, values end
  local paths = {}
  for i, e in ipairs(entries) do paths[i] = e.keys end
  local all = M.exchange({ paths = paths, values = values })
  local mine, seen, out = {}, {}, {}
  for _, e in ipairs(entries) do mine[e.key] = e end
  for _, a in ipairs(all) do
    for _, keys in ipairs(a.paths) do
      local key = state.path_key(keys)
      if not seen[key] then
        seen[key] = true
        out[#out + 1] = mine[key] or { keys = keys, name = state.path_name(keys), key = key, absent = true }
      end
    end
  end
  local merged = all[1].values
  for r = 2, #all do merge(merged, all[r].values) end
  return out, merged
end

-- describe_absent(entries): fills the placements, mesh shape and dtype of
-- the entries this rank lacks from the lowest rank that holds each (for
-- the manifest). Collective; call after plan.writers.
function M.describe_absent(entries, world)
  if world == 1 then return end
  local meta = {}
  for i, e in ipairs(entries) do
    if not e.absent then meta[i] = { e.placements, e.mesh_shape, e.dtype } end
  end
  local all = M.exchange(meta)
  for i, e in ipairs(entries) do
    if e.absent then
      for _, m in ipairs(all) do
        if m[i] then e.placements, e.mesh_shape, e.dtype = m[i][1], m[i][2], m[i][3] break end
      end
    end
  end
end

return M
