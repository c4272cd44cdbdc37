-- cuda_grouped_mm_spec.lua: loom.grouped_mm on CUDA (the MoE experts'
-- GEMMs: one cublasGemmGroupedBatchedEx call for all groups, or one GEMM
-- per group where cuBLAS lacks it, kernels/cuda/grouped_gemm.cu) against the
-- same op on the CPU: forward, dx (dgrad) and dw (wgrad, through backward)
-- on uneven groups with empty ones, f32, bf16 and f16, a transposed weight.
-- Tolerance |cuda - cpu| / |cpu| (2-norms) by dtype, support/cuda.lua's:
-- f32 2e-5 (summation order), bf16 1e-2, f16 2e-3 (one rounding apart).
-- On the emulated device (scripts/test_emu.sh) it also checks which path
-- ran (the emulator's grouped_gemms and gemms counters; with
-- LOOM_EMU_NO_GROUPED_GEMM=1 the emulated cuBLAS plays one older than
-- 12.5, and the per-group loop must run) and that the emulated entry
-- checks its arguments as cuBLAS documents them.
local loom = require("loom")
local G = require("support.cuda")
local sys = require("support.sys")
local ffi = require("ffi")

if G.skip(describe, it, "grouped_mm on CUDA") then return end

local counters = loom.cuda.emu_counters() -- nil on a GPU
local OLDER = os.getenv("LOOM_EMU_NO_GROUPED_GEMM") == "1"
local SIZES = { 7, 0, 19, 0, 11, 1, 0 } -- uneven, empty groups, the last one too

local function sum(t) local s = 0 for _, v in ipairs(t) do s = s + v end return s end

-- f()'s result and, on the emulated device, the grouped calls and GEMMs it queued
local function ran(f)
  if not counters then return f() end
  loom.cuda.emu_counters({ reset = true })
  local r = f()
  local c = loom.cuda.emu_counters()
  return r, c.grouped_gemms, c.gemms
end

-- the calls `ops` grouped GEMMs must make: one grouped call each, or one
-- GEMM per group with rows (wgrad zeroes an empty group's dw by a memset)
local function expect(what, ops, grouped, gemms, nonempty)
  if not counters then return end
  if OLDER then
    assert.equal(0, grouped, what .. ": no grouped call with the older cuBLAS")
    assert.equal(ops * nonempty, gemms, what .. ": one GEMM per group with rows")
  else
    assert.equal(ops, grouped, what .. ": one cublasGemmGroupedBatchedEx call per op")
    assert.equal(0, gemms, what .. ": no per-group GEMM")
  end
end

describe("grouped_mm on CUDA", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, trans_w in ipairs { false, true } do
      it(("equals the CPU in %s, forward, dgrad and wgrad, uneven and empty groups%s")
         :format(dt, trans_w and ", transposed weight" or ""), function()
        local E, K, M = #SIZES, 24, 10
        loom.manual_seed(11)
        local x = loom.randn(sum(SIZES), K):to(dt)
        local w = (trans_w and loom.randn(E, M, K) or loom.randn(E, K, M)):to(dt)
        local g = loom.randn(sum(SIZES), M):to(dt)
        local opts = { trans_w = trans_w }
        local function run(dev)
          local xd, wd = x:to(dev):detach():requires_grad_(), w:to(dev):detach():requires_grad_()
          local y = loom.grouped_mm(xd, wd, SIZES, opts)
          return y, xd, wd
        end
        local yc, xc, wc = run("cpu")
        yc:backward(g)
        local nonempty = 0
        for _, n in ipairs(SIZES) do nonempty = nonempty + (n > 0 and 1 or 0) end
        local y, grouped, gemms = ran(function() return (run("cuda")) end)
        expect("forward", 1, grouped, gemms, nonempty)
        G.close(yc, y, nil, "forward")
        -- backward: dx (a grouped forward-mode GEMM) and dw (wgrad)
        local yg, xg, wg = run("cuda")
        local _, bgrouped, bgemms = ran(function() yg:backward(g:to("cuda")) end)
        expect("backward (dgrad and wgrad)", 2, bgrouped, bgemms, nonempty)
        G.close(xc.grad, xg.grad, nil, "dx")
        G.close(wc.grad, wg.grad, nil, "dw")
        for e, n in ipairs(SIZES) do -- an empty group's weight gets zeros, not the poison of a fresh block
          if n == 0 then assert.equal(0, wg.grad:select(1, e):to("f32"):abs():sum():item(), "dw of group " .. e) end
        end
      end)
    end
  end

  it("runs in TF32 when the float32 matmul precision is high (f32 operands rounded to 10 bits)", function()
    loom.manual_seed(12)
    local x, w = loom.randn(20, 16), loom.randn(2, 16, 8)
    local exact = loom.grouped_mm(x, w, { 12, 8 })
    local was = loom.get_float32_matmul_precision()
    loom.set_float32_matmul_precision("high")
    local ok, y = pcall(loom.grouped_mm, x:to("cuda"), w:to("cuda"), { 12, 8 })
    loom.set_float32_matmul_precision(was)
    assert.is_true(ok, tostring(y))
    local err = G.rel_err(G.values(exact), G.values(y))
    assert.is_true(err > 0 and err <= 2e-3, "TF32 relative error " .. err) -- rounded, as a plain TF32 GEMM is
  end)

  it("gives zeros for every group's dw when no group has rows", function()
    local w = loom.randn(3, 4, 5):to("cuda"):requires_grad_()
    local y = loom.grouped_mm(loom.zeros(0, 4):to("cuda"):requires_grad_(), w, { 0, 0, 0 })
    y:sum():backward()
    assert.equal(0, w.grad:abs():sum():item())
  end)
end)

if not counters then return end

-- the emulated entry, called as loom calls it (names of this spec's own)
ffi.cdef [[
  int lm_gg_create(void **h) asm("cublasCreate_v2");
  int lm_gg_destroy(void *h) asm("cublasDestroy_v2");
  int lm_gg_call(void *h, const int *ta, const int *tb, const int *m, const int *n, const int *k,
                 const float *alpha, void **A, int at, const int *lda, void **B, int bt, const int *ldb,
                 const float *beta, void **C, int ct, const int *ldc, int groups, const int *size,
                 int compute) asm("cublasGemmGroupedBatchedEx");
]]
local R_32F, R_16F, R_16BF, R_64F = 0, 2, 14, 1
local C32F, C32F_TF32, C64F = 68, 77, 70
local SUCCESS, INVALID, NOT_SUPPORTED = 0, 7, 15

describe("the emulated cublasGemmGroupedBatchedEx", function()
  local h = ffi.new("void *[1]")
  local one, zero = ffi.new("float[1]", 1), ffi.new("float[1]", 0)
  local N = ffi.new("int[1]", 0)
  local function ints(v) return ffi.new("int[1]", v) end
  -- one 2x2 problem with the given ld / types / group size; pointers on the device
  local function call(o)
    o = o or {}
    local p = loom.zeros(3):to("cuda") -- three device words, as the pointer arrays (never read: refused first)
    local arr = ffi.cast("void **", p:data_ptr())
    return loom.C.lm_gg_call(h[0], N, N, ints(2), ints(2), ints(2), one, arr, o.at or R_32F, ints(o.lda or 2), arr,
                             o.bt or R_32F, ints(2), zero, arr, o.ct or R_32F, ints(2), o.groups or 1,
                             ints(o.size or 0), o.compute or C32F)
  end
  setup(function() assert.equal(0, loom.C.lm_gg_create(h)) end)
  teardown(function() loom.C.lm_gg_destroy(h[0]) end)

  it("refuses what cuBLAS refuses, with its status", function()
    assert.equal(SUCCESS, call())                     -- groups of no problems: nothing to do
    assert.equal(INVALID, call { groups = -1 })
    assert.equal(INVALID, call { size = -1 })
    assert.equal(INVALID, call { lda = 1 })           -- lda below the rows of column-major A
    assert.equal(NOT_SUPPORTED, call { at = R_16BF, bt = R_16BF, ct = R_32F }) -- not in cuBLAS's table
    assert.equal(NOT_SUPPORTED, call { at = R_16F, bt = R_16F, ct = R_16F, compute = C32F_TF32 })
    assert.equal(NOT_SUPPORTED, call { at = R_64F, bt = R_64F, ct = R_64F, compute = C64F })
    assert.equal(SUCCESS, call { at = R_16F, bt = R_16F, ct = R_16F })
  end)

  it("faults, as a GPU does, when the pointer arrays are host memory", function()
    local script = [=[
      local loom, ffi = require("loom"), require("ffi")
      ffi.cdef[[int lm_gg_create(void **h) asm("cublasCreate_v2");
        int lm_gg_call(void *h, const int *ta, const int *tb, const int *m, const int *n, const int *k,
          const float *alpha, void **A, int at, const int *lda, void **B, int bt, const int *ldb,
          const float *beta, void **C, int ct, const int *ldc, int groups, const int *size, int compute)
          asm("cublasGemmGroupedBatchedEx");]]
      local a = loom.ones(2, 2):to("cuda")
      local h = ffi.new("void *[1]")
      assert(loom.C.lm_gg_create(h) == 0)
      local host = ffi.new("void *[3]", a:data_ptr(), a:data_ptr(), a:data_ptr())
      local i0, i2 = ffi.new("int[1]", 0), ffi.new("int[1]", 2)
      local st = loom.C.lm_gg_call(h[0], i0, i0, i2, i2, i2, ffi.new("float[1]", 1), host, 0, i2, host + 1, 0,
        i2, ffi.new("float[1]", 0), host + 2, 0, i2, 1, ffi.new("int[1]", 1), 68)
      io.write("status=", st, "\n")
      local ok, err = pcall(function() return a:sum():item() end)
      io.write("after=", ok and "ok" or tostring(err), "\n")
    ]=]
    local rc, out = sys.sh("luajit -e " .. sys.shq("package.path='lua/?.lua;lua/?/init.lua;'..package.path "
                           .. script) .. " 2>&1")
    assert.equal(0, rc, out)
    assert.truthy(out:find("status=0", 1, true), out) -- cuBLAS queues it: the fault comes when it runs
    assert.truthy(out:find("pointer array", 1, true), out)
    assert.truthy(out:find("after=[^\n]*illegal memory access"), out) -- sticky: the next call fails
  end)
end)
