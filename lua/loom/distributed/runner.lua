-- runner.lua: what scripts/loomrun starts on every rank: `luajit runner.lua
-- script.lua args...` (or `--repl`). It sets the rank's thread count, runs
-- the script, and on an uncaught error prints it once with the rank and
-- aborts the whole job (MPI_Abort) so no other rank waits forever.
local ffi = require "ffi"

ffi.cdef [[
int setenv(const char *name, const char *value, int overwrite);
long sysconf(int name);
int isatty(int fd);
]]
local SC_NPROCESSORS_ONLN = 84 -- glibc's value

-- The checkout's (or the install's) lua/ dir, from where this file lives.
local here = debug.getinfo(1, "S").source:match("^@(.*)loom/distributed/runner%.lua$")
if here then
  package.path = here .. "?.lua;" .. here .. "?/init.lua;" .. package.path
end

local rank = os.getenv("OMPI_COMM_WORLD_RANK") or os.getenv("PMI_RANK") or "0"

-- cores / local ranks threads each, unless LOOM_NUM_THREADS says otherwise;
-- set before libloom (and OpenBLAS, libgomp) load, as they read it then.
local function set_threads()
  local cores = tonumber(ffi.C.sysconf(SC_NPROCESSORS_ONLN)) or 1
  local local_size = tonumber(os.getenv("OMPI_COMM_WORLD_LOCAL_SIZE") or os.getenv("MPI_LOCALNRANKS") or "1") or 1
  local n = tostring(math.max(1, math.floor(cores / math.max(1, local_size))))
  local threads = os.getenv("LOOM_NUM_THREADS") or n
  ffi.C.setenv("LOOM_NUM_THREADS", threads, 0)
  ffi.C.setenv("OPENBLAS_NUM_THREADS", threads, 0)
  ffi.C.setenv("OMP_NUM_THREADS", threads, 0)
end

local function die(msg)
  io.stdout:flush()
  io.stderr:write(string.format("loomrun: rank %s: %s\n", rank, msg))
  io.stderr:flush()
  local ok, lib = pcall(require, "loom.lib")
  if ok then
    lib.C.lm_dist_init() -- MPI_Abort needs MPI up; harmless when it is
    lib.C.lm_abort(1)
  end
  os.exit(1)
end

-- SPMD REPL: rank 0 reads a chunk, every rank runs it.
local function repl()
  local loom = require "loom"
  local dist = require "loom.distributed"
  local me = dist.rank()
  local function share(s) -- s on rank 0 (nil: end), the same string everywhere
    local n = loom.tensor({ s and #s or -1 }, { dtype = "i64" })
    n = dist.broadcast(n, 0):item()
    if n < 0 then return nil end
    local buf = loom.empty({ math.max(n, 1) }, { dtype = "i32" })
    if me == 0 then
      local p = ffi.cast("int32_t*", buf:data_ptr())
      for i = 1, n do p[i - 1] = s:byte(i) end
    end
    buf = dist.broadcast(buf, 0)
    local p, chars = ffi.cast("int32_t*", buf:data_ptr()), {}
    for i = 1, n do chars[i] = string.char(p[i - 1]) end
    return table.concat(chars)
  end
  local prompt = ffi.C.isatty(0) == 1 -- no prompts when stdin is a pipe
  local env = setmetatable({ loom = loom, dist = dist }, { __index = _G })
  while true do
    local chunk
    if me == 0 then
      local lines = {}
      repeat
        if prompt then
          io.write(#lines == 0 and "loom> " or "loom>> ")
          io.stdout:flush()
        end
        local line = io.read("*l")
        if not line then break end
        lines[#lines + 1] = line
        local src = table.concat(lines, "\n")
        local f, err = loadstring("return " .. src)
        if not f then f, err = loadstring(src) end
        local incomplete = not f and err:match("<eof>") ~= nil
      until not incomplete
      chunk = #lines > 0 and table.concat(lines, "\n") or nil
    end
    chunk = share(chunk)
    if not chunk then break end
    local f, err = loadstring("return " .. chunk, "=repl")
    if not f then f, err = loadstring(chunk, "=repl") end
    if f then
      setfenv(f, env)
      local res = { n = 0 }
      local ok, e = xpcall(function() res = { n = 0 } res = { f() } end, debug.traceback)
      if not ok then print("error: " .. tostring(e))
      elseif #res > 0 then
        for i = 1, table.maxn(res) do res[i] = tostring(res[i]) end
        print(table.concat(res, "\t"))
      end
    else
      print("error: " .. err)
    end
  end
end

local function main(...)
  set_threads()
  io.stdout:setvbuf("line") -- whole lines, so ranks interleave by line
  local script = ...
  if script == "--repl" then return repl() end
  if not script then die("usage: runner.lua script.lua [args...] | --repl") end
  local chunk, err = loadfile(script)
  if not chunk then die(err) end
  local args = { select(2, ...) }
  _G.arg = { [0] = script }
  for i, v in ipairs(args) do _G.arg[i] = v end
  return chunk(unpack(args))
end

local ok, err = xpcall(main, debug.traceback, ...)
if not ok then die("uncaught error: " .. tostring(err)) end
