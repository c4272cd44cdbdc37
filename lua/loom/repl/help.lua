-- help.lua: help(obj) and ?name in the REPL, from lua/loom/docstrings.lua.
-- A name may be written as the user would (zeros, loom.zeros, loom.nn.Linear,
-- nn.Linear, x:size, Tensor.size, m:parameters); an object is found by
-- identity in the loaded parts of the public API (api.lua). help() lists
-- the topics, ?nn (a table's topic) the names under it, wrapped to the
-- terminal's width.
local docs = require("loom.docstrings")
local api = require("loom.repl.api")

local M = {}

-- the terminal's columns: $COLUMNS, else the width of the terminal on
-- stdout, else 80
local function columns()
  local n = tonumber(os.getenv("COLUMNS") or "")
  if n and n >= 20 then return n end
  local ok, w = pcall(function()
    local ffi = require("ffi")
    require("loom.posix")   -- loom_ioctl_winsize
    local ws = ffi.new("struct loom_winsize")
    if ffi.C.loom_ioctl_winsize(1, 0x5413, ws) == 0 and ws.col >= 20 then return ws.col end   -- TIOCGWINSZ
    return nil
  end)
  return ok and w or 80
end

-- wrap(words, indent, width): the words in lines of at most width columns
function M.wrap(words, indent, width)
  width = width or columns()
  local lines, line = {}, indent
  for _, w in ipairs(words) do
    if #line > #indent and #line + 1 + #w > width then
      lines[#lines + 1] = line
      line = indent .. w
    else
      line = line .. (#line > #indent and " " or "") .. w
    end
  end
  if #line > #indent then lines[#lines + 1] = line end
  return table.concat(lines, "\n")
end

-- candidates(name): the keys name may mean, best first
local function candidates(name)
  local out = { name }
  local function add(k) out[#out + 1] = k end
  for long, short in pairs(api.ALIASES) do
    if name:sub(1, #long) == long then add(short .. name:sub(#long + 1)) end
  end
  local base, sep, last = name:match("^(.-)([:%.])([%w_]+)$")
  if base and not name:find("^loom%.") then   -- x:size, model:parameters: a method of any class
    for _, p in ipairs(api.METHODS) do add(p .. last) end
  end
  if name:match("^loom%.[%w_]+$") then add(name:sub(6)) end
  if sep == "." and base == "loom" then add("Tensor:" .. last) end
  if not name:find("[%.:]") then
    for _, place in ipairs(api.PLACES) do add(place[1] .. name) end
  end
  return out
end

-- the topics: the tables of the API, then the REPL's own
local function topics()
  local out, seen = {}, {}
  for _, place in ipairs(api.PLACES) do
    if not seen[place[4]] then out[#out + 1], seen[place[4]] = place[4], true end
  end
  out[#out + 1], out[#out + 2] = "help", "quit"
  return out
end

-- the names under a topic ("nn" -> nn.Linear, nn.Module, ...), from the docstrings' keys
local function names_under(topic)
  local out = {}
  for _, place in ipairs(api.PLACES) do
    if place[4] == topic then
      local p = place[1]
      for k in pairs(docs) do
        if k:sub(1, #p) == p and not k:find("[%.:]", #p + 1) then out[#out + 1] = k end
      end
    end
  end
  table.sort(out)
  return out
end

-- text(name): the docstring of name, or what to try instead
function M.text(name)
  if name == nil or name == "" then
    return docs.loom .. "\n  topics (?name for one, e.g. ?nn or ?loom.zeros):\n" .. M.wrap(topics(), "    ")
  end
  for _, k in ipairs(candidates(name)) do
    if docs[k] then
      local under = names_under(k)
      if #under == 0 then return docs[k] end
      return docs[k] .. "\n  names:\n" .. M.wrap(under, "    ")
    end
  end
  -- names whose last part starts with what was asked for
  local near, last = {}, name:match("([%w_]+)$") or name
  for k in pairs(docs) do
    local tail = k:match("([%w_]+)$") or k
    if #last > 0 and tail:sub(1, #last) == last then near[#near + 1] = k end
  end
  table.sort(near)
  if #near > 12 then near = { unpack(near, 1, 12) } near[13] = "..." end
  return "no help for " .. name .. (#near > 0 and "; see " .. table.concat(near, ", ") or "; help() lists the topics")
end

-- name_of(obj): the public name obj is known by, or nil
function M.name_of(obj)
  local T = package.loaded["loom.tensor"]
  if T and T.is_tensor(obj) then return "Tensor" end
  for _, place in ipairs(api.PLACES) do
    local t = api.table_of(place)
    if rawequal(t, obj) and docs[place[4]] then return place[4] end
  end
  for _, place in ipairs(api.PLACES) do
    local t = api.table_of(place)
    if t then
      for k, v in pairs(t) do
        if type(k) == "string" and rawequal(v, obj) and docs[place[1] .. k] then return place[1] .. k end
      end
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
