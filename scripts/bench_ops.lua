-- bench_ops.lua: the tensor core's speed next to what the machine gives:
-- matmul GFLOP/s next to cblas_sgemm called directly on the same buffers,
-- the per-op overhead of a tiny add from Lua, and the bandwidth of a large
-- add next to memcpy of the same bytes, and a table of the elementwise,
-- reduction, norm, softmax, cast and transpose kernels in bytes moved per
-- second next to a one-thread memcpy of as many bytes, all in the same run.
-- Usage:
--   luajit scripts/bench_ops.lua [--json FILE] [--sizes 256,512,1024,2048]
--                                [--numel 16777216] [--calls 200000]
--                                [--knumel 4194304,16777216] [--kernels all|exp,silu,...]
--                                [--sections matmul,overhead,bandwidth,kernels]
local root = debug.getinfo(1, "S").source:match("^@(.*)scripts/bench_ops%.lua$") or "./"
package.path = root .. "lua/?.lua;" .. root .. "lua/?/init.lua;" .. package.path
local ffi = require("ffi")
local loom = require("loom")
local bench = require("loom.train.bench")

local o = bench.args(arg, { json = "", sizes = "256,512,1024,2048", numel = 16 * 2^20, calls = 200000,
                            knumel = "4194304,16777216", kernels = "all",
                            sections = "matmul,overhead,bandwidth,kernels" }, "bench_ops.lua")
local function listed(list, name) return list == "all" or ("," .. list .. ","):find("," .. name .. ",", 1, true) end

-- OpenBLAS is already loaded (globally, with libloom): call it through ffi.C.
ffi.cdef [[
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
]]
local CblasRowMajor, CblasNoTrans = 101, 111

print(string.format("loom bench_ops: %d threads (loom and OpenBLAS)", loom.num_threads()))
local report = { threads = loom.num_threads() }
-- lm_blas_info names the BLAS and the kernel core it runs (absent in old builds)
local ok, info = pcall(function() return ffi.string(loom.C.lm_blas_info()) end)
report.blas = ok and info or "unknown"
print("BLAS: " .. report.blas)

---------------------------------------------------------------------------
-- matmul: loom's op (output allocated per call, as a user sees it) against
-- cblas_sgemm into a preallocated C, alternating so both see the same
-- machine state; the best of several rounds of each.

local function gflops(n, s) return 2 * n ^ 3 / s / 1e9 end

local mm_rows = {}
report.matmul = {}
for size in (listed(o.sections, "matmul") and o.sizes or ""):gmatch("%d+") do
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
if #mm_rows > 0 then
  print("\nmatmul, square f32 (best of 5 rounds; medians at the right)")
  bench.table({ "n", "reps", "loom GFLOP/s", "cblas GFLOP/s", "ratio", "loom med", "cblas med" }, mm_rows)
end

---------------------------------------------------------------------------
-- per-op overhead: a 4x4 + 4x4 from Lua, through operator and method,
-- with the result dropped (the GC frees it) or freed at once.

local function overhead()
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
end
if listed(o.sections, "overhead") then overhead() end

---------------------------------------------------------------------------
-- memcpy of half the bytes reads and writes them all: the machine's figure
-- for a kernel that moves `bytes`, on one thread, in buffers from malloc.

pcall(ffi.cdef, [[ void *malloc(size_t n); void free(void *p); ]])
local function time_min(fn, reps)
  fn()
  return bench.best(fn, reps)
end
local memcpy_cache = {}
local function memcpy_seconds(bytes, reps)
  if memcpy_cache[bytes] then return memcpy_cache[bytes] end
  local half = math.floor(bytes / 2)
  local src, dst = ffi.C.malloc(half), ffi.C.malloc(half)
  ffi.fill(src, half, 1) ffi.fill(dst, half, 2)
  local t = time_min(function() ffi.copy(dst, src, half) end, reps)
  ffi.C.free(src) ffi.C.free(dst)
  memcpy_cache[bytes] = t
  return t
end

---------------------------------------------------------------------------
-- bandwidth: c = a + b over n floats moves 3n*4 bytes, first into a fresh
-- output (the heap has never held one that large: page faults), then at
-- its best, next to memcpy of the same bytes.

local function bandwidth()
  local n = o.numel
  local a, b = loom.rand(n), loom.rand(n)
  local bytes, reps = 3 * n * 4, 10
  local t0 = bench.now()
  a:add(b):free()
  local t_first = bench.now() - t0
  local t_add = time_min(function() a:add(b):free() end, reps)
  local t_copy = memcpy_seconds(bytes, reps)
  local bw_rows = {
    { string.format("add, %d f32, first call (fresh output)", n), t_first * 1e3, bytes / t_first / 1e9 },
    { string.format("add, %d f32 (+ output alloc)", n), t_add * 1e3, bytes / t_add / 1e9 },
    { string.format("memcpy, %d MiB", bytes / 2 / 2^20), t_copy * 1e3, bytes / t_copy / 1e9 },
  }
  report.add_first_gbs = bytes / t_first / 1e9
  report.add_gbs = bytes / t_add / 1e9
  report.add_vs_memcpy = t_copy / t_add
  report.memcpy_gbs = bytes / t_copy / 1e9
  print(string.format("\nbandwidth, %d MiB of traffic (best of %d)", bytes / 2^20, reps))
  bench.table({ "what", "ms", "GB/s" }, bw_rows)
  a:free() b:free()
end
if listed(o.sections, "bandwidth") then bandwidth() end

---------------------------------------------------------------------------
-- kernels: each call makes its output and frees it, as a training step
-- does. `bytes` is what the kernel must read and write per element; rows
-- are 1024 wide for the row kernels (softmax, norms, sums).

local T = require("loom.tensor")
local F = loom.F
local W = 1024
local function kernels_table(n)
  local x = loom.randn(n)
  local y = loom.randn(n)
  local x2 = x:view(n / W, W)
  local xt = x:view(2048, n / 2048):t()
  local w, bias = loom.randn(W), loom.randn(W)
  local xb, xh = x:to("bf16"), x:to("f16")
  local xg = x:clone():requires_grad_(true)
  -- forward, then backward (the fused g * f'(x)): 8 + 12 bytes per element
  local function fwd_bwd(f)
    return function() local out = f(xg) out:backward(y) out:free() xg.grad:free() xg.grad = nil end
  end
  return {
    { "add", 12, function() x:add(y):free() end },
    { "mul", 12, function() x:mul(y):free() end },
    { "relu", 8, function() x:relu():free() end },
    { "exp", 8, function() x:exp():free() end },
    { "tanh", 8, function() x:tanh():free() end },
    { "sigmoid", 8, function() x:sigmoid():free() end },
    { "silu", 8, function() x:silu():free() end },
    { "silu'", 8, function() T.op1(loom.C.LM_OP_SILU_D, x):free() end },
    { "gelu", 8, function() x:gelu():free() end },
    { "gelu'", 8, function() T.op1(loom.C.LM_OP_GELU_D, x):free() end },
    { "gelu_tanh", 8, function() x:gelu({ approximate = "tanh" }):free() end },
    { "silu fwd+bwd", 20, fwd_bwd(function(t) return t:silu() end) },
    { "gelu fwd+bwd", 20, fwd_bwd(function(t) return t:gelu() end) },
    { "gelu_tanh fwd+bwd", 20, fwd_bwd(function(t) return t:gelu { approximate = "tanh" } end) },
    { "sum last", 4, function() x2:sum(2):free() end },
    { "sum inner", 4, function() x2:sum(1):free() end },
    { "softmax", 8, function() x2:softmax(2):free() end },
    { "log_softmax", 8, function() x2:log_softmax(2):free() end },
    { "layer_norm", 8, function() F.layer_norm(x2, { W }, w, bias):free() end },
    { "rms_norm", 8, function() F.rms_norm(x2, { W }, w):free() end },
    { "f32->bf16", 6, function() x:to("bf16"):free() end },
    { "bf16->f32", 6, function() xb:to("f32"):free() end },
    { "f32->f16", 6, function() x:to("f16"):free() end },
    { "f16->f32", 6, function() xh:to("f32"):free() end },
    { "transpose", 8, function() xt:contiguous():free() end },
    { "copy", 8, function() x:clone():free() end },
  }, function() for _, t in ipairs { x, y, x2, xt, w, bias, xb, xh, xg } do t:free() end end
end

local function kernels()
  local all = loom.num_threads()
  local threads = all > 1 and { 1, all } or { 1 }
  local rows, by = {}, {}
  report.kernels = {}
  for size in o.knumel:gmatch("%d+") do
    local n = tonumber(size)
    local list, release = kernels_table(n)
    for _, k in ipairs(list) do
      if listed(o.kernels, k[1]) then
        local bytes = k[2] * n
        local reps = math.max(3, math.min(20, math.floor(2e9 / bytes)))
        local row = { k[1], string.format("%dM", n / 2^20) }
        local t_copy = memcpy_seconds(bytes, reps)
        for _, nt in ipairs(threads) do
          loom.set_num_threads(nt)
          local t = time_min(k[3], reps)
          row[#row + 1] = bytes / t / 1e9
          row[#row + 1] = t_copy / t
          -- (size as text too: bench.json prints numbers with 6 digits)
          report.kernels[#report.kernels + 1] = { kernel = k[1], numel = n, size = row[2], threads = nt,
                                                  gbs = bytes / t / 1e9, vs_memcpy = t_copy / t }
        end
        loom.set_num_threads(all)
        rows[#rows + 1] = row
        by[#by + 1] = bytes / t_copy / 1e9
      end
    end
    release()
  end
  local header = { "kernel", "numel" }
  for _, nt in ipairs(threads) do
    header[#header + 1] = string.format("GB/s %dt", nt)
    header[#header + 1] = string.format("x memcpy %dt", nt)
  end
  print(string.format("\nkernels, f32 (output made and freed per call; best of 3-20; memcpy: one thread, %.1f-%.1f GB/s)",
                      bench.min(by), -bench.min((function() local t = {} for i, v in ipairs(by) do t[i] = -v end return t end)())))
  bench.table(header, rows)
end
if listed(o.sections, "kernels") then kernels() end

if o.json ~= "" then
  bench.write_json(o.json, report)
  print("wrote " .. o.json)
end
