-- session.lua: running REPL chunks. A session has its own globals (an env
-- over _G with `loom` preloaded); each chunk has its top-level locals made
-- globals (chunk.lua), expressions echo their values, errors come back as
-- a message with the user's frames only (loom's own files, the REPL and C
-- frames left out), and Ctrl-C during a chunk ends the chunk.
local chunk = require("loom.repl.chunk")
local help = require("loom.repl.help")

local M = {}
local Session = {}
Session.__index = Session

-- the directory of loom's Lua files (frames from there are loom's)
local LOOM_DIR = debug.getinfo(1, "S").source:match("^@(.*/)repl/session%.lua$") or "loom/"

-- compile(src) -> function, or nil and the error. An expression's values
-- go through the packer the function is called with (passed, not returned:
-- a returned call would be a tail call, which loses its error positions);
-- a chunk of statements returns what its `return` says. M.compiles counts
-- the calls (the REPL's input reading compiles a pending chunk only when
-- it may be whole: repl_input_spec).
M.compiles = 0
function M.compile(src)
  M.compiles = M.compiles + 1
  local f, err = loadstring("local pack_ = ... return pack_(" .. src .. "\n)", "=repl")
  if not f then f, err = loadstring(chunk.globalize(src), "=repl") end
  return f, err
end
local PACKED = {}   -- marks an expression's packed values
local function pack_(...) return setmetatable({ n = select("#", ...), ... }, PACKED) end
local function results(...) return { n = select("#", ...), ... } end

-- incomplete(src): true when more lines could complete it (`for i = 1, 2 do`)
function M.incomplete(src)
  local _, err = M.compile(src)
  return err ~= nil and err:match("near '<eof>'$") ~= nil   -- not "'<eof>' expected near 'end'"
end

local function internal(line)
  return line:find(LOOM_DIR, 1, true) or line:match("^\t%[C%]") or line:match("^\t%[builtin#")
      or line:match("^\trepl:%d+: in main chunk")
end

-- the message and the user's frames: loom's own files and the REPL's frames
-- are left out, and the whole traceback when only the chunk's body is left
function M.user_traceback(msg)
  if type(msg) ~= "string" then msg = tostring(msg) end
  msg = msg:gsub("^" .. LOOM_DIR:gsub("%p", "%%%0") .. "[^:]*:%d+: ", "")   -- raised inside loom: its message
  local tb = debug.traceback(msg, 2)
  local lines, frames = {}, 0
  local body = tb:match("^(.-)\nstack traceback:\n") or tb
  for line in (tb:match("\nstack traceback:\n(.*)$") or ""):gmatch("[^\n]+") do
    if line:find("in function 'xpcall'", 1, true) or line:find("loom/repl/", 1, true)
       or line:find("loom/distributed/repl.lua", 1, true) then break end
    if not internal(line) then
      lines[#lines + 1] = line
      frames = frames + 1
    end
  end
  if frames == 0 then return body end
  return body .. "\nstack traceback:\n" .. table.concat(lines, "\n")
end

---------------------------------------------------------------------------
-- showing values

-- show(v): a value as the REPL echoes it: tostring, plain tables inline
-- ({1, 2, x = 3}, nested to 2 levels, at most 20 entries)
function M.show(v, depth)
  depth = depth or 0
  if type(v) == "string" then return depth == 0 and v or string.format("%q", v) end
  if type(v) ~= "table" or getmetatable(v) then return tostring(v) end
  if depth >= 2 then return tostring(v) end
  local parts, n, len = {}, 0, #v
  for i = 1, len do   -- the list part, then the other keys in order
    n = n + 1
    if n > 20 then parts[#parts + 1] = "..." break end
    parts[#parts + 1] = M.show(v[i], depth + 1)
  end
  local keys = {}
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= len and k % 1 == 0) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    n = n + 1
    if n > 20 then parts[#parts + 1] = "..." break end
    local ks = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or "[" .. M.show(k, depth + 1) .. "]"
    parts[#parts + 1] = ks .. " = " .. M.show(v[k], depth + 1)
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

---------------------------------------------------------------------------
-- Ctrl-C: the C flag (core/tensor/interrupt.c), armed while a chunk runs,
-- fails the next op; a count hook checks it in interpreted Lua between
-- ops (the chunk runs with the JIT off: LuaJIT's compiled traces call no
-- hooks). On several ranks (opts.spmd) the ranks stop together at a
-- collective, or each on its own after a grace second without one.

local C
local function lib() C = C or require("loom.lib").C return C end

function M.install_interrupt()
  if lib().lm_interrupt_install() < 0 then return false end
  return true
end

-- (no position: the same words as an op's, so that ranks stopped in Lua
-- and in an op print one line; the traceback says where)
local function hook()
  if C.lm_interrupt_check() == 1 then error("interrupted (Ctrl-C)", 0) end
end

---------------------------------------------------------------------------

-- new(opts): a session; opts.env: extra globals, opts.spmd: one of several ranks
function M.new(opts)
  local loom = require("loom")
  local env = setmetatable({ loom = loom }, { __index = _G })
  env.help = help.help
  -- code the session loads runs interpreted too, where Ctrl-C reaches it
  local function off(f, ...)
    if type(f) == "function" then jit.off(f, true) end
    return f, ...
  end
  env.loadstring = function(...) return off(loadstring(...)) end
  env.load = function(...) return off(load(...)) end
  env.loadfile = function(...) return off(loadfile(...)) end
  env.dofile = function(path) return assert(env.loadfile(path))() end
  for k, v in pairs(opts and opts.env or {}) do env[k] = v end
  return setmetatable({ env = env, failed = 0, quit = false, spmd = opts and opts.spmd or false }, Session)
end

-- s:run(src, write): runs one chunk; what it echoes and its errors go to
-- write (io.write by default). Returns true, or false when it failed.
function Session:run(src, write)
  write = write or io.write
  local q = src:match("^%s*%?%s*([%w_%.:]*)%s*$")
  if q then write(help.text(q) .. "\n") return true end
  local env = self.env
  env.quit = function() self.quit = true end
  env.exit = env.quit
  local f, err = M.compile(src)
  if not f then
    write("error: " .. err .. "\n")
    self.failed = self.failed + 1
    return false
  end
  setfenv(f, env)
  -- the chunk and the functions it defines run interpreted, where the count
  -- hook sees Ctrl-C: a compiled loop (`while true do end`) calls no hook.
  -- loom's own functions stay compiled.
  jit.off(f, true)
  lib().lm_interrupt_clear()
  C.lm_interrupt_arm(self.spmd and C.LM_INTERRUPT_SPMD or C.LM_INTERRUPT_LOCAL)
  debug.sethook(hook, "", 1000)
  local r = results(xpcall(f, M.user_traceback, pack_))
  debug.sethook()
  C.lm_interrupt_arm(C.LM_INTERRUPT_OFF)
  C.lm_interrupt_clear()
  local ok, res = r[1], r[2]
  if not ok then
    write("error: " .. tostring(res) .. "\n")
    self.failed = self.failed + 1
    return false
  end
  -- an expression's values come packed; a chunk's `return a, b` as they are
  if not (r.n == 2 and getmetatable(res) == PACKED) then
    res = { n = r.n - 1, unpack(r, 2, r.n) }
  end
  if res.n > 0 then
    local parts = {}
    for i = 1, res.n do parts[i] = M.show(res[i]) end
    write(table.concat(parts, "\t") .. "\n")
  end
  return true
end

M.Session = Session
return M
