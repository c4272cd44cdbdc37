-- bf16_gemm_spec.lua: the CPU backend's bf16 GEMM slot on both of its paths,
-- the fast one (oneDNN's bf16 matmul, where the CPU has bf16 dot products)
-- and the plain one (widened to f32, sgemm; forced with
-- lm_cpu_set_bf16_gemm(0) or LOOM_BF16_GEMM=plain), each against the f64
-- GEMM of the same bf16 operands: odd sizes, every transpose, batched
-- (strided and broadcast batches), narrowed and interleaved operands, alpha
-- and beta, f32 and bf16 results; beta = 0 over a NaN-filled result and
-- NaN/inf operands; a Linear under autocast on each path. Tolerance: an f32 sum of K exact
-- products is within (K + 4) 2^-24 sum|alpha a b| + |beta c| of the exact
-- value (the recursive-summation bound with the scale and sum roundings);
-- a bf16 result adds one rounding, 2^-8 of the value. On a CPU without
-- AVX512_BF16, or a build without oneDNN, the fast path is absent: the
-- test names say so and the plain path's checks still run.
local loom = require("loom")
local ffi = require("ffi")
local sys = require("support.sys")
local C = loom.C

-- the slot itself, as core/ops/linalg.c calls it (kernels/cpu/gemm.c)
pcall(ffi.cdef, "int lm_cpu_gemm(lm_tensor *c, const lm_tensor *a, const lm_tensor *b, double alpha, double beta);")

-- whether the fast path should run here: the CPU's flags, oneDNN's cap on
-- the instructions it uses (ONEDNN_MAX_CPU_ISA=AVX512_CORE plays a CPU
-- without bf16 dot products) and the build
local function cpu_has_bf16()
  local cap = (os.getenv("ONEDNN_MAX_CPU_ISA") or os.getenv("DNNL_MAX_CPU_ISA") or "ALL"):upper()
  if not (cap == "ALL" or cap:find("BF16", 1, true) or cap:find("AMX", 1, true)) then return false end
  local f = io.open("/proc/cpuinfo")
  local s = f and f:read("*a") or ""
  if f then f:close() end
  return s:find("avx512_bf16", 1, true) ~= nil or s:find("amx_bf16", 1, true) ~= nil
end
local info = ffi.string(C.lm_blas_info()):match("bf16 GEMM: (.-); bf16 attention") or "?"
local built = not info:find("built without oneDNN", 1, true)
local expect_fast = built and cpu_has_bf16()
local fast_state = expect_fast and "present: " .. info
                   or not built and "absent: built without oneDNN (libdnnl-dev)"
                   or "absent: this CPU has no AVX512_BF16 (or ONEDNN_MAX_CPU_ISA hides it)"

-- checks c = alpha a b + beta c0 (a, b bf16 3-D views) against f64;
-- returns the worst error over its bound
local function check(what, c, a, b, alpha, beta, c0)
  local before = C.lm_cpu_bf16_gemm_runs()
  assert.are.equal(0, C.lm_cpu_gemm(c, a, b, alpha, beta), what)
  local ran_fast = C.lm_cpu_bf16_gemm_runs() > before
  local A, B = a:to("f64"), b:to("f64")
  local want, mag = A:matmul(B) * alpha, A:abs():matmul(B:abs()) * math.abs(alpha)
  if beta ~= 0 then want, mag = want + c0:to("f64") * beta, mag + c0:to("f64"):abs() * math.abs(beta) end
  local K = a:size(3)
  local bound = mag * ((K + 4) * 2 ^ -24) + 1e-30
  if c.dtype == "bf16" then bound = bound + want:abs() * 2 ^ -8 end
  local over = ((c:to("f64") - want):abs() - bound):max():item()
  assert.is_true(over <= 0, string.format("%s: an element off by %g past its bound", what, over))
  return ran_fast
end

-- a (B, rows, cols) bf16 operand laid out as `how` says: "n" dense, "t"
-- transposed (column-major rows), "narrow" rows inside wider ones,
-- "interleave" the batch inside the rows, "expand" one matrix broadcast
-- over the batch (stride 0), "nounit" every other element of wider rows
-- (no unit stride)
local function operand(Bn, rows, cols, how)
  local function r(...) return loom.randn(...):to("bf16") end
  if how == "nounit" then return r(Bn, rows, cols, 2):select(4, 1) end
  if how == "t" then return r(Bn, cols, rows):transpose(2, 3) end
  if how == "narrow" then return r(Bn, rows, cols + 5):narrow(3, 3, cols) end
  if how == "interleave" then return r(rows, Bn, cols):transpose(1, 2) end
  if how == "expand" then return r(1, rows, cols):expand(Bn, rows, cols) end
  return r(Bn, rows, cols)
end

local SIZES = { 1, 3, 17, 33, 65, 129 }

-- every check on the path set by `on` (1 fast where present, 0 plain);
-- returns how many calls ran on the fast path, how many were made, and how
-- many of them had an operand with no unit stride (which no fast kernel
-- takes: the plain path runs those)
local function all_checks(on)
  local old = C.lm_cpu_set_bf16_gemm(on)
  local fast, calls, nounit = 0, 0, 0
  local function run(what, ...)
    calls = calls + 1
    if what:find("nounit", 1, true) then nounit = nounit + 1 end
    if check(what, ...) then fast = fast + 1 end
  end
  loom.manual_seed(7)
  -- odd sizes, each transpose of each operand, f32 results
  for _, M in ipairs(SIZES) do
    for _, K in ipairs(SIZES) do
      for _, N in ipairs(SIZES) do
        for _, ta in ipairs { "n", "t" } do
          for _, tb in ipairs { "n", "t" } do
            local a, b = operand(1, M, K, ta), operand(1, K, N, tb)
            run(string.format("%dx%dx%d %s%s", M, K, N, ta, tb), loom.empty(1, M, N), a, b, 1, 0)
          end
        end
      end
    end
  end
  -- bf16 results, K past the kernels' blocks
  for _, s in ipairs { { 3, 600, 17 }, { 129, 1000, 65 }, { 1, 257, 1 }, { 64, 64, 64 } } do
    for _, ta in ipairs { "n", "t" } do
      local a, b = operand(1, s[1], s[2], ta), operand(1, s[2], s[3], "t")
      run(string.format("bf16 out %s %s", table.concat(s, "x"), ta), loom.empty({ 1, s[1], s[3] }, { dtype = "bf16" }), a, b, 1, 0)
    end
  end
  -- batched: dense, transposed, interleaved and broadcast batches
  for _, lay in ipairs { { "n", "n" }, { "t", "t" }, { "interleave", "n" }, { "n", "expand" }, { "expand", "t" },
                         { "narrow", "narrow" }, { "nounit", "n" }, { "t", "nounit" } } do
    for _, dt in ipairs { "f32", "bf16" } do
      local a, b = operand(3, 17, 33, lay[1]), operand(3, 33, 65, lay[2])
      run("batch of 3 " .. lay[1] .. "/" .. lay[2] .. " " .. dt, loom.empty({ 3, 17, 65 }, { dtype = dt }), a, b, 1, 0)
    end
  end
  -- a result whose rows sit inside wider ones, alpha and beta (accumulate)
  for _, dt in ipairs { "f32", "bf16" } do
    for _, ab in ipairs { { 1, 0 }, { 0.5, 0 }, { 1, 1 }, { -2, 0.25 } } do
      local a, b = operand(2, 33, 65, "n"), operand(2, 65, 17, "t")
      local c = loom.randn(2, 33, 20):to(dt):narrow(3, 2, 17)
      local c0 = c:clone()
      run(string.format("alpha %g beta %g, strided %s result", ab[1], ab[2], dt), c, a, b, ab[1], ab[2], c0)
    end
  end
  C.lm_cpu_set_bf16_gemm(old)
  return fast, calls, nounit
end

describe("bf16 GEMM (the CPU backend's gemm slot)", function()
  it("plain path (widened to f32, sgemm): every shape class within the f32-sum bound", function()
    local fast, calls = all_checks(0)
    assert.are.equal(0, fast, "lm_cpu_set_bf16_gemm(0) forces the plain path")
    assert.is_true(calls > 800)
  end)

  it("fast path (" .. fast_state .. "): every shape class within the f32-sum bound", function()
    local fast, calls, nounit = all_checks(1)
    print(string.format("  bf16 GEMM fast path %s; %d of %d calls ran on it", fast_state, fast, calls))
    if expect_fast then
      -- all but those with no unit stride in an operand
      assert.are.equal(calls - nounit, fast, string.format("%d of %d calls on the fast path", fast, calls))
    else
      assert.are.equal(0, fast)
    end
  end)

  it("beta = 0 overwrites a NaN-filled result, and NaN and inf operands reach the result, on both paths", function()
    for _, on in ipairs { 1, 0 } do
      local old = C.lm_cpu_set_bf16_gemm(on)
      for _, dt in ipairs { "f32", "bf16" } do
        local a, b = loom.randn(1, 17, 33):to("bf16"), loom.randn(1, 33, 9):to("bf16")
        local c = loom.full({ 1, 17, 9 }, 0 / 0, { dtype = dt })
        assert.are.equal(0, C.lm_cpu_gemm(c, a, b, 1, 0))
        assert.is_true(c:to("f64"):abs():max():item() < math.huge, "path " .. on .. ", " .. dt .. ": NaN left by beta = 0")
        local an = a:clone()
        an:narrow(2, 3, 1):narrow(3, 5, 1):fill_(0 / 0)
        an:narrow(2, 6, 1):narrow(3, 1, 1):fill_(math.huge)
        assert.are.equal(0, C.lm_cpu_gemm(c, an, b, 1, 0))
        local rows = c:to("f64"):totable()[1]
        for j = 1, 9 do
          assert.is_true(rows[3][j] ~= rows[3][j], "path " .. on .. ": NaN in row 3 lost")
          assert.is_true(rows[6][j] ~= rows[6][j] or math.abs(rows[6][j]) == math.huge, "path " .. on .. ": inf in row 6 lost")
          assert.is_true(math.abs(rows[1][j]) < math.huge)
        end
      end
      C.lm_cpu_set_bf16_gemm(old)
    end
  end)

  it("the fast and plain paths agree on a Linear's forward and gradients under autocast", function()
    loom.manual_seed(3)
    local lin = loom.nn.Linear(96, 40)
    local x = loom.randn(2, 7, 96):requires_grad_()
    local function run(on)
      local old = C.lm_cpu_set_bf16_gemm(on)
      lin:zero_grad()
      x.grad = nil
      local y = loom.autocast("bf16", function() return lin(x) end)
      local y32 = y:to("f32"); (y32 * y32):sum():backward()
      C.lm_cpu_set_bf16_gemm(old)
      return y:to("f32"), x.grad:clone(), lin.weight.grad:clone()
    end
    local y1, gx1, gw1 = run(1)
    local y0, gx0, gw0 = run(0)
    -- both round to bf16 from f32 sums taken in different orders: one bf16
    -- unit of the value apart at most (two roundings of nearly equal sums)
    for _, p in ipairs { { y1, y0, "y" }, { gx1, gx0, "dx" }, { gw1, gw0, "dW" } } do
      local gap = ((p[1] - p[2]):abs() - p[2]:abs() * 2 ^ -7 - 1e-6):max():item()
      assert.is_true(gap <= 0, p[3] .. " differs by " .. gap .. " past one bf16 unit")
    end
  end)

  it("LOOM_BF16_GEMM=plain starts the plain path, and show_config names the path", function()
    local code = [[
      local loom = require("loom")
      local a = loom.randn(16, 16):to("bf16")
      local _ = a:matmul(a)
      print("runs=" .. tonumber(loom.C.lm_cpu_bf16_gemm_runs()) .. " set=" .. loom.C.lm_cpu_set_bf16_gemm(-1))
      loom.show_config()]]
    local rc, out = sys.luajit(code, "LOOM_BF16_GEMM=plain")
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("runs=0 set=0", 1, true), out)
    assert.truthy(out:find("bf16 GEMM: widened to f32, sgemm", 1, true), out)
    rc, out = sys.luajit(code)
    assert.are.equal(0, rc, out)
    if expect_fast then
      assert.truthy(out:find("runs=1 set=1", 1, true), out)
      assert.truthy(out:find("bf16 GEMM: oneDNN", 1, true), out)
    else
      assert.truthy(out:find("runs=0", 1, true), out)
    end
  end)
end)
