-- complete.lua: what Tab offers in the REPL: globals (the session's, then
-- _G's, and Lua's keywords), fields after a dot (loom.nn.Lin -> Linear),
-- methods after a colon (x:si -> x:size, tensors included). Names are
-- looked up, never called; an __index that raises completes nothing.
local M = {}

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
                   "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while" }
-- loom's submodules that load on first use (lua/loom/init.lua's lazy table)
local LOOM_LAZY = { "F", "nn", "optim", "amp", "distributed", "data", "models" }

local function add_keys(set, t, depth)
  if type(t) ~= "table" or depth > 4 then return end
  for k in pairs(t) do
    if type(k) == "string" then set[k] = true end
  end
  local mt = getmetatable(t)
  if type(mt) == "table" and type(mt.__index) == "table" then add_keys(set, mt.__index, depth + 1) end
end

-- fields(v): the names v answers to, as a set
local function fields(v)
  local set = {}
  local T = package.loaded["loom.tensor"]
  if T and T.is_tensor(v) then
    add_keys(set, T.Tensor, 0)
    add_keys(set, T.props, 0)
  elseif type(v) == "string" then
    add_keys(set, string, 0)
  else
    add_keys(set, v, 0)
    if rawequal(v, package.loaded.loom) then
      for _, k in ipairs(LOOM_LAZY) do set[k] = true end
    end
  end
  return set
end

-- resolve(env, path): the value of a dotted path ("loom.nn"), or nil
local function resolve(env, path)
  local v = env
  for part in path:gmatch("[^%.:]+") do
    if not part:match("^[%a_][%w_]*$") then return nil end
    local ok, x = pcall(function() return v[part] end)
    if not ok or x == nil then return nil end
    v = x
  end
  return v
end

-- candidates(env, word): the completions of word, sorted
function M.candidates(env, word)
  local base, sep, part = word:match("^(.-)([%.:])([%w_]*)$")
  local set, prefix = {}, ""
  if base then
    local v = resolve(env, base)
    if v == nil then return {} end
    set, prefix = fields(v), base .. sep
    if sep == ":" then
      for k in pairs(set) do
        local ok, f = pcall(function() return v[k] end)
        if not (ok and type(f) == "function") then set[k] = nil end
      end
    end
  else
    part = word
    add_keys(set, env, 0)
    for _, k in ipairs(KEYWORDS) do set[k] = true end
  end
  local out = {}
  for k in pairs(set) do
    if k:sub(1, #part) == part and not (k:match("^_") and not part:match("^_")) then out[#out + 1] = prefix .. k end
  end
  table.sort(out)
  return out
end

return M
