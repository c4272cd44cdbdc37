-- help.lua: help(obj) and ?name in the REPL, from lua/loom/docstrings.lua.
-- A name may be written as the user would (zeros, loom.zeros, loom.nn.Linear,
-- nn.Linear, x:size, Tensor.size); an object is found by identity in the
-- loaded parts of the public API.
local docs = require("loom.docstrings")

local M = {}

-- where names live: module name in package.loaded -> the prefix of its keys
local PLACES = {
  { "loom", "loom." }, { "loom.nn", "nn." }, { "loom.functional", "F." }, { "loom.optim", "optim." },
  { "loom.distributed", "dist." }, { "loom.parallel", "tp." },
}
local ALIASES = { ["loom.nn."] = "nn.", ["loom.F."] = "F.", ["loom.optim."] = "optim.",
                  ["loom.distributed."] = "dist.", ["loom.parallel."] = "tp.", ["distributed."] = "dist." }
local MODULE_KEYS = { ["loom.nn"] = "nn", ["loom.functional"] = "F", ["loom.optim"] = "optim",
                      ["loom.distributed"] = "dist", ["loom.parallel"] = "tp", loom = "loom" }

-- candidates(name): the keys name may mean, best first
local function candidates(name)
  local out = { name }
  for long, short in pairs(ALIASES) do
    if name:sub(1, #long) == long then out[#out + 1] = short .. name:sub(#long + 1) end
  end
  if name:match("^loom%.[%w_]+$") then out[#out + 1] = name:sub(6) end
  local method = name:match("^[%w_]+[:%.]([%w_]+)$")
  if method then out[#out + 1] = "Tensor:" .. method end
  if not name:find("[%.:]") then
    for _, p in ipairs { "loom.", "nn.", "F.", "optim.", "dist.", "tp.", "Tensor:" } do out[#out + 1] = p .. name end
  end
  return out
end

local function topics()
  local keys = {}
  for k in pairs(docs) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- text(name): the docstring of name, or what to try instead
function M.text(name)
  if name == nil or name == "" then
    return docs.loom .. "\n  topics: " .. table.concat(topics(), " ")
  end
  for _, k in ipairs(candidates(name)) do
    if docs[k] then return docs[k] end
  end
  local near = {}
  local last = name:match("([%w_]+)$") or name
  for _, k in ipairs(topics()) do
    if k:find(last, 1, true) then near[#near + 1] = k end
  end
  return "no help for " .. name .. (#near > 0 and "; see " .. table.concat(near, ", ") or "; help() lists the topics")
end

-- name_of(obj): the public name obj is known by, or nil
function M.name_of(obj)
  for mod, key in pairs(MODULE_KEYS) do
    if package.loaded[mod] == obj then return key end
  end
  local T = package.loaded["loom.tensor"]
  if T and T.is_tensor(obj) then return "Tensor" end
  if T and obj == T.Tensor then return "Tensor" end
  for _, place in ipairs(PLACES) do
    local t = package.loaded[place[1]]
    if type(t) == "table" then
      for k, v in pairs(t) do
        if rawequal(v, obj) and docs[place[2] .. k] then return place[2] .. k end
      end
    end
  end
  if T then
    for k, v in pairs(T.Tensor) do
      if rawequal(v, obj) then return "Tensor:" .. k end
    end
  end
  return nil
end

-- help(obj): prints the docstring of obj (a value or a name)
function M.help(obj, ...)
  if select("#", ...) > 0 then error("help: expected one object or name", 2) end
  local s
  if obj == nil then s = M.text("")
  elseif type(obj) == "string" then s = M.text(obj)
  else
    local name = M.name_of(obj)
    s = name and M.text(name) or ("no help for this " .. type(obj) .. "; help() lists the topics")
  end
  print(s)
end

return M
