-- state.lua: a state_dict seen as paths: its tensors (in a deterministic
-- order, each with its path of keys), the table without them, and back.
local ffi = require("ffi")
local T = require("loom.tensor")

local M = {}

local function key_less(a, b)
  if type(a) == type(b) then return a < b end
  return type(a) == "number"
end

-- "model.layers.1.wq.weight", "optim.state[3].exp_avg"
function M.path_name(keys)
  local s = ""
  for i, k in ipairs(keys) do
    if type(k) == "number" then s = s .. "[" .. string.format("%.17g", k) .. "]"
    else s = s .. (i > 1 and "." or "") .. k end
  end
  return s
end

-- a string that tells ["1"] from [1]
function M.path_key(keys)
  local parts = {}
  for i, k in ipairs(keys) do
    parts[i] = type(k) == "number" and "#" .. string.format("%.17g", k) or "$" .. k
  end
  return table.concat(parts, "\0")
end

local function is_value(v)
  local t = type(v)
  return t == "number" or t == "string" or t == "boolean"
      or (t == "cdata" and (ffi.istype("int64_t", v) or ffi.istype("uint64_t", v)))
end

-- the values of table t (at keys) without its tensors, which go to
-- acc.tensors. (acc carries the state: a closure over it would be kept by
-- a compiled trace, docs/architecture.md.)
local function walk(acc, t, keys)
  local fname = acc.fname
  if acc.seen[t] then error(fname .. ": " .. (#keys > 0 and M.path_name(keys) or "state_dict") .. " is a cycle", 0) end
  acc.seen[t] = true
  local ks = {}
  for k in pairs(t) do
    if type(k) ~= "string" and type(k) ~= "number" then
      error(string.format("%s: %s: keys must be strings or numbers, got a %s", fname,
                          #keys > 0 and M.path_name(keys) or "state_dict", type(k)), 0)
    end
    ks[#ks + 1] = k
  end
  table.sort(ks, key_less)
  local vals = {}
  for _, k in ipairs(ks) do
    local v, p = t[k], {}
    for i, kk in ipairs(keys) do p[i] = kk end
    p[#p + 1] = k
    if T.is_tensor(v) then
      acc.tensors[#acc.tensors + 1] = { keys = p, name = M.path_name(p), key = M.path_key(p), t = v }
    elseif type(v) == "table" then vals[k] = walk(acc, v, p)
    elseif is_value(v) then vals[k] = v
    else error(string.format("%s: %s: cannot checkpoint a %s", fname, M.path_name(p), type(v)), 0) end
  end
  acc.seen[t] = nil
  return vals
end

-- flatten(sd, fname) -> tensors, values: the tensors as {keys, name, key, t}
-- in sorted key order, and a copy of sd without them. Errors name fname.
function M.flatten(sd, fname)
  local acc = { tensors = {}, seen = {}, fname = fname }
  local values = walk(acc, sd, {})
  return acc.tensors, values
end

-- merge_values(vals, sd): copies saved values (non-tensor leaves) into sd,
-- making tables as needed; tensors of sd are left alone
function M.merge_values(vals, sd)
  for k, v in pairs(vals) do
    if type(v) == "table" then
      if sd[k] == nil then sd[k] = {} end
      if type(sd[k]) == "table" then M.merge_values(v, sd[k]) end
    elseif not T.is_tensor(sd[k]) then
      sd[k] = v
    end
  end
end

-- set_path(t, keys, v): t[k1][k2]...[kn] = v, making tables as needed
function M.set_path(t, keys, v)
  for i = 1, #keys - 1 do
    local k = keys[i]
    if type(t[k]) ~= "table" then t[k] = {} end
    t = t[k]
  end
  t[keys[#keys]] = v
end

return M
