-- bench_ops.lua: the tensor core's speed next to what the machine gives:
-- matmul GFLOP/s next to cblas_sgemm called directly on the same buffers,
-- the per-op overhead of a tiny add from Lua, and the bandwidth of a large
-- add next to memcpy of the same bytes, all in the same run. Usage:
--   luajit scripts/bench_ops.lua [--json FILE] [--sizes 256,512,1024,2048]
--                                [--numel 16777216] [--calls 200000]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_ops%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local ffi = require "ffi"
local loom = require "loom"
local bench = require "loom.bench"

local o = bench.args(arg, { json = "", sizes = "256,512,1024,2048", numel = 16 * 2^20, calls = 200000 },
                     "bench_ops.lua")

-- OpenBLAS is already loaded (globally, with libloom): call it through ffi.C.
ffi.cdef [[
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
]]
local CblasRowMajor, CblasNoTrans = 101, 111

print(string.format("loom bench_ops: %d threads (loom and OpenBLAS)", loom.num_threads()))
local report = { threads = loom.num_threads() }

---------------------------------------------------------------------------
-- matmul: loom's op (output allocated per call, as a user sees it) against
-- cblas_sgemm into a preallocated C, alternating so both see the same
-- machine state; the best of several rounds of each.

local function gflops(n, s) return 2 * n ^ 3 / s / 1e9 end

local mm_rows = {}
report.matmul = {}
for size in o.sizes:gmatch("%d+") do
  local n = tonumber(size)
  loom.manual_seed(0)
  local a, b = loom.randn(n, n), loom.randn(n, n)
  local c = loom.empty(n, n)
  local pa = ffi.cast("float*", a:data_ptr())
  local pb = ffi.cast("float*", b:data_ptr())
  local pc = ffi.cast("float*", c:data_ptr())
  local reps = math.max(3, math.min(200, math.floor(4e9 / (2 * n ^ 3))))
  local function blas()
    for _ = 1, reps do
      ffi.C.cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, pa, n, pb, n, 0, pc, n)
    end
  end
  local function mine()
    for _ = 1, reps do a:matmul(b):free() end
  end
  local tb, tl = {}, {}
  blas() mine()
  for r = 1, 5 do
    local t0 = bench.now() blas() tb[r] = (bench.now() - t0) / reps
    t0 = bench.now() mine() tl[r] = (bench.now() - t0) / reps
  end
  -- the two agree (same buffers, same BLAS)
  local d = (a:matmul(b) - c):abs():max():item()
  assert(d < 1e-3 * n, "matmul and cblas_sgemm disagree by " .. d)
  local gl, gb = gflops(n, bench.min(tl)), gflops(n, bench.min(tb))
  mm_rows[#mm_rows + 1] = { n, reps, gl, gb, gl / gb, gflops(n, bench.median(tl)), gflops(n, bench.median(tb)) }
  report.matmul[#report.matmul + 1] = { n = n, loom_gflops = gl, blas_gflops = gb, ratio = gl / gb,
                                        loom_median_gflops = gflops(n, bench.median(tl)),
                                        blas_median_gflops = gflops(n, bench.median(tb)) }
  a:free() b:free() c:free()
end
print("\nmatmul, square f32 (best of 5 rounds; medians at the right)")
bench.table({ "n", "reps", "loom GFLOP/s", "cblas GFLOP/s", "ratio", "loom med", "cblas med" }, mm_rows)

---------------------------------------------------------------------------
-- per-op overhead: a 4x4 + 4x4 from Lua, through operator and method,
-- with the result dropped (the GC frees it) or freed at once.

local x, y = loom.rand(4, 4), loom.rand(4, 4)
local calls = o.calls
local variants = {
  { "x + y (GC frees)", function() for _ = 1, calls do local _ = x + y end end },
  { "x:add(y) (GC frees)", function() for _ = 1, calls do local _ = x:add(y) end end },
  { "(x + y):free()", function() for _ = 1, calls do (x + y):free() end end },
  { "x + 1 (scalar)", function() for _ = 1, calls do local _ = x + 1 end end },
  { "x:relu()", function() for _ = 1, calls do local _ = x:relu() end end },
}
local ov_rows = {}
report.overhead_us = {}
for _, v in ipairs(variants) do
  local ts = {}
  -- the last variant's garbage would run its finalizers during this one's
  -- trace recording, and LuaJIT gives up compiling a loop that keeps aborting
  collectgarbage()
  v[2]()
  for r = 1, 7 do
    local t0 = bench.now()
    v[2]()
    ts[r] = (bench.now() - t0) / calls * 1e6
  end
  ov_rows[#ov_rows + 1] = { v[1], bench.median(ts), bench.min(ts) }
  report.overhead_us[v[1]] = bench.median(ts)
end
print(string.format("\nper-op overhead, 4x4 f32 (%d calls x 7 rounds)", calls))
bench.table({ "call", "median us", "min us" }, ov_rows)

---------------------------------------------------------------------------
-- bandwidth: c = a + b over n floats moves 3n*4 bytes; memcpy of the same
-- 3n*4 bytes (3n/2 floats read, 3n/2 written) for the machine's figure.

local n = o.numel
local a, b = loom.rand(n), loom.rand(n)
local bytes = 3 * n * 4
local reps = 10
local function time_min(fn)
  fn()
  local best = math.huge
  for _ = 1, reps do
    local t0 = bench.now()
    fn()
    best = math.min(best, bench.now() - t0)
  end
  return best
end
local t_add = time_min(function() a:add(b):free() end)
local half = 3 * n * 2   -- memcpy of half the bytes reads and writes them all
local src, dst = ffi.new("uint8_t[?]", half), ffi.new("uint8_t[?]", half)
ffi.fill(src, half, 1) ffi.fill(dst, half, 2)
local t_copy = time_min(function() ffi.copy(dst, src, half) end)
local bw_rows = {
  { string.format("add, %d f32 (+ output alloc)", n), t_add * 1e3, bytes / t_add / 1e9 },
  { string.format("memcpy, %d MiB", half / 2^20), t_copy * 1e3, bytes / t_copy / 1e9 },
}
report.add_gbs = bytes / t_add / 1e9
report.add_vs_memcpy = t_copy / t_add
report.memcpy_gbs = bytes / t_copy / 1e9
print(string.format("\nbandwidth, %d MiB of traffic (best of %d)", bytes / 2^20, reps))
bench.table({ "what", "ms", "GB/s" }, bw_rows)
a:free() b:free()

if o.json ~= "" then
  bench.write_json(o.json, report)
  print("wrote " .. o.json)
end
