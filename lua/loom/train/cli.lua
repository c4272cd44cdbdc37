-- cli.lua: command-line flags for loom's scripts, through lua-argparse.
-- A flag is {name, default, help}: a number default takes a number, a
-- string default a string, a boolean default makes a flag without value.
-- Bad input raises a Lua error that names the flag; --help prints the
-- flags and exits.
local argparse = require("argparse")

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

-- "--steps -1" as "--steps=-1": argparse reads a word starting with "-" as
-- an option, so a negative number would be "unknown argument -1"
local function join_negatives(flags, argv)
  local numeric, out, i = {}, {}, 1
  for _, f in ipairs(flags) do if type(f[2]) == "number" then numeric["--" .. f[1]] = true end end
  while i <= #argv do
    local a, b = argv[i], argv[i + 1]
    if numeric[a] and b and tonumber(b) and b:match("^%-") then
      out[#out + 1], i = a .. "=" .. b, i + 2
    else
      out[#out + 1], i = a, i + 1
    end
  end
  return out
end

-- parse(prog, flags, argv, description) -> {name = value} with every flag
-- present (its default when absent). Errors read "prog: ... (see --help)".
function M.parse(prog, flags, argv, description)
  local ok, res = parser_for(prog, flags, description):pparse(join_negatives(flags, argv or {}))
  if not ok then
    local first, tip = res:gsub("^unknown option '([^']*)'", "unknown argument %1"):match("^([^\n]*)(.*)$")
    error(prog .. ": " .. first .. " (see --help)" .. tip, 0)
  end
  local out, given = {}, {}
  for _, f in ipairs(flags) do
    local v = res[f[1]]
    if v == nil then v = f[2] else given[f[1]] = true end
    out[f[1]] = v
  end
  return out, given
end

-- apply_config(prog, flags, o, given, path): the values of a config file
-- (a Lua table: `return { steps = 1000, dim = 256, ["weight-decay"] = 0.1 }`,
-- names with - or _) into o, except the flags given on the command line,
-- which override it. The file runs with no globals and a bounded budget.
function M.apply_config(prog, flags, o, given, path)
  local f, err = io.open(path, "rb")
  if not f then error(prog .. ": --config: cannot read " .. tostring(err), 0) end
  local src = f:read(1048577) or ""
  f:close()
  if #src > 1048576 then error(prog .. ": --config: " .. path .. " is over 1 MB", 0) end
  local chunk, perr = loadstring(src, "@" .. path)
  if not chunk then error(prog .. ": --config: " .. perr, 0) end
  setfenv(chunk, {})
  jit.off(chunk, true)   -- compiled loops call no hooks: the budget would not hold
  debug.sethook(function() error("runs too long (a config is a table of values)", 0) end, "", 1e7)
  local ok, t = pcall(chunk)
  debug.sethook()
  if not ok then error(prog .. ": --config: " .. path .. ": " .. tostring(t), 0) end
  if type(t) ~= "table" then error(prog .. ": --config: " .. path .. " must return a table of flag values", 0) end
  local kind = {}
  for _, fl in ipairs(flags) do kind[fl[1]] = type(fl[2]) end
  for k, v in pairs(t) do
    local name = type(k) == "string" and k:gsub("_", "-") or tostring(k)
    if not kind[name] then error(prog .. ": --config: " .. path .. ": no flag --" .. name .. " (see --help)", 0) end
    if type(v) ~= kind[name] then
      error(string.format("%s: --config: %s: %s expects a %s, got %s", prog, path, name, kind[name], type(v)), 0)
    end
    if not given[name] then o[name] = v end
  end
end

-- run(prog, main, ...): main(...), with the errors of its user (errors
-- raised as "prog: ...", with level 0) as one line "prog: error: ..." on
-- stderr and exit status 2, no traceback. Under loomrun each rank marks
-- the line (@@loom-user-error) and loomrun prints it once, with the ranks
-- that raised it. Other errors (bugs) go on with their traceback.
function M.run(prog, main, ...)
  local args = { n = select("#", ...), ... }
  local ok, err = xpcall(function() return main(unpack(args, 1, args.n)) end, function(e)
    if type(e) == "string" and e:sub(1, #prog + 2) == prog .. ": " then return { user = e:sub(#prog + 3) } end
    return debug.traceback(tostring(e), 2)
  end)
  if ok then return end
  if type(err) ~= "table" then error(err, 0) end
  local line = prog .. ": error: " .. err.user:gsub("^error: ", "")
  if os.getenv("LOOM_LOOMRUN") == "1" then line = "@@loom-user-error " .. line end
  io.stdout:flush()
  io.stderr:write(line .. "\n")   -- one write: mpirun tags each write
  io.stderr:flush()
  os.exit(2)
end

-- flags_of(defaults): a table {name = default} as flags, sorted by name
function M.flags_of(defaults)
  local flags = {}
  for k, v in pairs(defaults) do flags[#flags + 1] = { k, v, "" } end
  table.sort(flags, function(a, b) return a[1] < b[1] end)
  return flags
end

return M
