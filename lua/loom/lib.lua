-- lib.lua: loads libloom and declares its API to the FFI from core/loom.h,
-- the one C header (read here, never copied by hand).
local ffi = require("ffi")

local here = debug.getinfo(1, "S").source:match("^@(.*)lib%.lua$") or "./"
local root = here .. "../../"   -- lua/loom/ -> the checkout's root

local function readable(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
end

-- The header sits next to this file once installed, in core/ in a checkout.
local function header_dir()
  for _, d in ipairs { here, root .. "core/" } do
    if readable(d .. "loom.h") then return d end
  end
  error("loom: cannot find loom.h next to " .. here .. " or in " .. root .. "core/")
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- A field of lm_tensor made read-only for Lua (`T *const f;`, `const T f;`):
-- the core owns the layout, and a write from Lua would corrupt it.
local function readonly(line)
  local code, rest = line:match("^(.-;)(.*)$")
  if not code or code:find("/%*") then return line end
  local star = code:match("^.*()%*")
  if star then return code:sub(1, star) .. "const " .. code:sub(star + 1) .. rest end
  return (code:gsub("^(%s*)", "%1const ", 1)) .. rest
end

-- ffi.cdef takes no preprocessor lines: drop them and the C++ guards. The
-- one include the header has, the op list, becomes the enum's entries:
-- each LM_OP(ID, ...) line gives LM_OP_ID. The tensor's fields are read-only.
local function cdef_of(dir)
  local out, skip, tensor = {}, false, false
  for line in (read(dir .. "loom.h") .. "\n"):gmatch("(.-)\n") do
    local inc = line:match('^#include "(op_list%.h)"')
    if line:match("^typedef struct lm_tensor {") then tensor = true
    elseif tensor and line:match("^} lm_tensor;") then tensor = false
    elseif tensor then line = readonly(line) end
    if inc then
      for id in read(dir .. inc):gmatch("\nLM_OP%(([%w_]+),") do out[#out + 1] = "LM_OP_" .. id .. "," end
    elseif line:match("^#ifdef __cplusplus") then skip = true
    elseif skip and line:match("^#endif") then skip = false
    elseif not skip and not line:match("^%s*#") then out[#out + 1] = line end
  end
  return table.concat(out, "\n")
end

local function library_path()
  local env = os.getenv("LOOM_LIBRARY")
  if env then return env end
  for _, p in ipairs { root .. "build/libloom.so" } do
    if readable(p) then return p end
  end
  local found = package.searchpath("libloom", package.cpath)
  if found then return found end
  error("loom: cannot find libloom.so: build it (cmake -S . -B build && cmake --build build) "
        .. "or install the rock (luarocks make), or set LOOM_LIBRARY")
end

require("loom.posix")   -- loom_setenv
-- OpenMP workers that spin starve the other thread on small machines;
-- this must be set before libgomp loads (it loads with libloom).
ffi.C.loom_setenv("OMP_WAIT_POLICY", "PASSIVE", 0)
-- OpenBLAS's own workers (the pthread build) spin on sched_yield for 2^28
-- cycles (~0.1 s) after each GEMM, which in training is always: on a 2-vCPU
-- EPYC a quarter of a step's CPU samples were that spin, competing with
-- loom's kernels for the cores. 2^4 cycles makes them sleep at once, as
-- PASSIVE does for OpenMP (bench_train: 20% less CPU time per run, measured
-- with perf stat). Read when OpenBLAS loads; a user's value wins.
ffi.C.loom_setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0)

-- OpenBLAS (DYNAMIC_ARCH) picks its kernels when it loads, from a table of
-- CPU models: one it does not know can get generic kernels (0.3.21 runs
-- Prescott kernels on some Xeons, 3.5x slower). Name the core from the CPU's
-- features instead, in the order OpenBLAS's own fallback uses (where it knows
-- the CPU it picks the same); a user's OPENBLAS_CORETYPE wins. 0.3.21 cannot
-- force "Cooperlake" by name: it then falls back to those features, which
-- give Cooperlake on a CPU with AVX512-BF16. blas_coretype takes the text of
-- /proc/cpuinfo and answers the core type, or nil.
local function blas_coretype(cpuinfo)
  local vendor = cpuinfo:match("\nvendor_id%s*:%s*(%S+)") or cpuinfo:match("^vendor_id%s*:%s*(%S+)")
  local flags = cpuinfo:match("\nflags%s*:([^\n]*)") or cpuinfo:match("^flags%s*:([^\n]*)")
  if not flags then return nil end
  local has = {}
  for w in flags:gmatch("%S+") do has[w] = true end
  if has.avx512f and has.avx512vl and has.avx512bw and has.avx512dq and has.avx512cd then
    return has.avx512_bf16 and "Cooperlake" or "SkylakeX"
  end
  if has.avx2 and has.fma then
    return (vendor == "AuthenticAMD" or vendor == "HygonGenuine") and "Zen" or "Haswell"
  end
  return nil   -- an older CPU: OpenBLAS's own choice
end
if not os.getenv("OPENBLAS_CORETYPE") then
  local f = io.open("/proc/cpuinfo", "rb")
  local core = f and blas_coretype(f:read(65536) or "")
  if f then f:close() end
  if core then ffi.C.loom_setenv("OPENBLAS_CORETYPE", core, 0) end
end

ffi.cdef(cdef_of(header_dir()))
local C = ffi.load(library_path(), true)

return { C = C, root = root, blas_coretype = blas_coretype }
