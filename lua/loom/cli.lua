-- cli.lua: command-line flags for loom's scripts, through lua-argparse.
-- A flag is {name, default, help}: a number default takes a number, a
-- string default a string, a boolean default makes a flag without value.
-- Bad input raises a Lua error that names the flag; --help prints the
-- flags and exits.
local argparse = require "argparse"

local M = {}

local function number_of(name)
  return function(v)
    local n = tonumber(v)
    if n == nil then return nil, "--" .. name .. " expects a number, got '" .. v .. "'" end
    return n
  end
end

local function parser_for(prog, flags, description)
  local p = argparse(prog, description)
  p:help_max_width(100)
  for _, f in ipairs(flags) do
    local name, default, help = f[1], f[2], f[3] or ""
    local shown = (default == "" or type(default) == "boolean") and "" or " (default: " .. tostring(default) .. ")"
    if type(default) == "boolean" then
      p:flag("--" .. name, help):target(name)
    else
      local o = p:option("--" .. name, help .. shown):target(name):argname("<" .. type(default) .. ">")
      if type(default) == "number" then o:convert(number_of(name)) end
    end
  end
  return p
end

-- parse(prog, flags, argv, description) -> {name = value} with every flag
-- present (its default when absent). Errors read "prog: ... (see --help)".
function M.parse(prog, flags, argv, description)
  local ok, res = parser_for(prog, flags, description):pparse(argv or {})
  if not ok then
    local first, tip = res:gsub("^unknown option '([^']*)'", "unknown argument %1"):match("^([^\n]*)(.*)$")
    error(prog .. ": " .. first .. " (see --help)" .. tip, 0)
  end
  local out = {}
  for _, f in ipairs(flags) do
    local v = res[f[1]]
    if v == nil then v = f[2] end
    out[f[1]] = v
  end
  return out
end

-- flags_of(defaults): a table {name = default} as flags, sorted by name
function M.flags_of(defaults)
  local flags = {}
  for k, v in pairs(defaults) do flags[#flags + 1] = { k, v, "" } end
  table.sort(flags, function(a, b) return a[1] < b[1] end)
  return flags
end

return M
