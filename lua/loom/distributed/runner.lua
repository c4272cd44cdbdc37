-- runner.lua: what scripts/loomrun starts on every rank: `luajit runner.lua
-- script.lua args...` (or `--repl`). It sets the rank's thread count, runs
-- the script, and on an uncaught error prints it once with the rank and
-- aborts the whole job (MPI_Abort) so no other rank waits forever.
local ffi = require("ffi")

local SC_NPROCESSORS_ONLN = 84 -- glibc's value

-- The checkout's (or the install's) lua/ dir, from where this file lives.
local here = debug.getinfo(1, "S").source:match("^@(.*)loom/distributed/runner%.lua$")
if here then
  package.path = here .. "?.lua;" .. here .. "?/init.lua;" .. package.path
end
require("loom.posix")   -- loom_setenv, loom_sysconf, loom_sched_getaffinity

local rank = os.getenv("OMPI_COMM_WORLD_RANK") or os.getenv("PMI_RANK") or "0"

-- the logical CPUs this process may run on (its affinity mask: all of the
-- machine's, a taskset's or a cgroup's, or its own under loomrun --bind)
local function cpus()
  local mask = ffi.new("uint8_t[128]")   -- 1024 CPUs
  if ffi.C.loom_sched_getaffinity(0, 128, mask) ~= 0 then return tonumber(ffi.C.loom_sysconf(SC_NPROCESSORS_ONLN)) or 1 end
  local n = 0
  for i = 0, 127 do
    local b = mask[i]
    while b > 0 do n, b = n + b % 2, math.floor(b / 2) end
  end
  return math.max(1, n)
end

-- threads per rank: its CPUs / local ranks (all of its CPUs when bound to
-- its own), so that ranks x threads never exceed the cores; at least 1.
-- LOOM_NUM_THREADS overrides it (with a warning when it oversubscribes).
-- Set before libloom (and OpenBLAS, libgomp) load, as they read it then.
local function set_threads()
  local n = cpus()
  local local_size = tonumber(os.getenv("OMPI_COMM_WORLD_LOCAL_SIZE") or os.getenv("MPI_LOCALNRANKS") or "1") or 1
  local bound = os.getenv("LOOM_BIND") == "1"
  local per_rank = bound and n or math.max(1, math.floor(n / math.max(1, local_size)))
  local threads = tonumber(os.getenv("LOOM_NUM_THREADS") or "") or per_rank
  local sharing = bound and 1 or local_size   -- ranks on these CPUs
  if threads > per_rank and threads * sharing > n and (os.getenv("OMPI_COMM_WORLD_LOCAL_RANK") or "0") == "0" then
    io.stderr:write(string.format("loomrun: LOOM_NUM_THREADS=%d x %d ranks oversubscribes the %d CPUs here\n",
                                  threads, sharing, n))
  end
  threads = tostring(threads)
  ffi.C.loom_setenv("LOOM_NUM_THREADS", threads, 1)
  ffi.C.loom_setenv("OPENBLAS_NUM_THREADS", threads, 0)
  ffi.C.loom_setenv("OMP_NUM_THREADS", threads, 0)
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

local function main(...)
  set_threads()
  io.stdout:setvbuf("line") -- whole lines, so ranks interleave by line
  local script = ...
  if script == "--repl" then return require("loom.distributed.repl").run() end
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
