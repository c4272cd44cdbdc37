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

-- what a run's own config.json says of where that run wrote: not taken
-- by a new run that reads it with --config
local RUN_OWN = { log = true, save = true, resume = true, ["run-dir"] = true, config = true, version = true,
                  ["stop-after"] = true }

-- the table a config file returns: a Lua chunk run with no globals and a
-- bounded budget, or JSON (a run's config.json, whose flags are taken
-- less the paths of that run)
local function config_table(prog, path, src)
  if src:match("^%s*{") then
    local t, _, err = require("dkjson").decode(src, 1, nil)
    if type(t) ~= "table" then error(prog .. ": --config: " .. path .. " is not valid JSON: " .. tostring(err), 0) end
    if type(t.flags) ~= "table" then return t end
    local flags = {}
    for k, v in pairs(t.flags) do if not RUN_OWN[k] then flags[k] = v end end
    return flags
  end
  local chunk, perr = loadstring(src, "@" .. path)
  if not chunk then error(prog .. ": --config: " .. perr, 0) end
  setfenv(chunk, {})
  jit.off(chunk, true)   -- compiled loops call no hooks: the budget would not hold
  debug.sethook(function() error("runs too long (a config is a table of values)", 0) end, "", 1e7)
  local ok, t = pcall(chunk)
  debug.sethook()
  if not ok then error(prog .. ": --config: " .. path .. ": " .. tostring(t), 0) end
  if type(t) ~= "table" then error(prog .. ": --config: " .. path .. " must return a table of flag values", 0) end
  return t
end

-- apply_config(prog, flags, o, given, path): the values of a config file
-- into o, except the flags given on the command line, which override it:
-- a Lua table (`return { steps = 1000, dim = 256, ["weight-decay"] = 0.1 }`,
-- names with - or _), or the JSON config.json a run writes (its flags).
-- One flag given twice in two spellings is an error.
function M.apply_config(prog, flags, o, given, path)
  local f, err = io.open(path, "rb")
  if not f then error(prog .. ": --config: cannot read " .. tostring(err), 0) end
  local src = f:read(1048577) or ""
  f:close()
  if #src > 1048576 then error(prog .. ": --config: " .. path .. " is over 1 MB", 0) end
  local t = config_table(prog, path, src)
  local kind = {}
  for _, fl in ipairs(flags) do kind[fl[1]] = type(fl[2]) end
  local seen = {}
  for k, v in pairs(t) do
    local name = type(k) == "string" and k:gsub("_", "-") or tostring(k)
    if not kind[name] then error(prog .. ": --config: " .. path .. ": no flag --" .. name .. " (see --help)", 0) end
    if seen[name] then
      error(string.format("%s: --config: %s: %s is given twice (as %s and %s)", prog, path, name, seen[name], k), 0)
    end
    seen[name] = k
    if type(v) ~= kind[name] then
      error(string.format("%s: --config: %s: %s expects a %s, got %s", prog, path, name, kind[name], type(v)), 0)
    end
    if not given[name] then o[name] = v end
  end
end

-- user(prog, what, fn, ...) -> fn(...), its error (bad input found by
-- the library: a missing file, a config, a layout a model does not fit)
-- raised again as the user's: "prog: what: message", the message without
-- its source position (LOOM_DEBUG=1 keeps the traceback)
local function with_trace(e)
  if os.getenv("LOOM_DEBUG") == "1" then io.stderr:write(debug.traceback(tostring(e), 2), "\n") end
  return e
end
function M.user(prog, what, fn, ...)
  local res = { xpcall(fn, with_trace, ...) }
  if res[1] then return unpack(res, 2) end
  local e = res[2]
  if type(e) ~= "string" then error(e, 0) end
  if e:sub(1, #prog + 2) == prog .. ": " then error(e, 0) end
  e = e:gsub("^[%w_./-]+%.lua:%d+: ", "")
  error(prog .. ": " .. (what and what .. ": " or "") .. e, 0)
end

-- run(prog, main, ...): main(...), with the errors of its user (errors
-- raised as "prog: ...", with level 0) as one line "prog: error: ..." on
-- stderr and exit status 2, no traceback (LOOM_DEBUG=1 adds it). Under loomrun each rank marks
-- the line (@@loom-user-error) and loomrun prints it once, with the ranks
-- that raised it. Other errors (bugs) go on with their traceback.
function M.run(prog, main, ...)
  local args = { n = select("#", ...), ... }
  local debug_on = os.getenv("LOOM_DEBUG") == "1"
  local ok, err = xpcall(function() return main(unpack(args, 1, args.n)) end, function(e)
    if type(e) == "string" and e:sub(1, #prog + 2) == prog .. ": " then
      return { user = e:sub(#prog + 3), trace = debug_on and debug.traceback("", 2) or nil }
    end
    return debug.traceback(tostring(e), 2)
  end)
  if ok then return end
  if type(err) ~= "table" then error(err, 0) end
  local line = prog .. ": error: " .. err.user:gsub("^error: ", "")
  if err.trace then io.stderr:write(err.trace, "\n") end   -- LOOM_DEBUG=1: where it was raised
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
