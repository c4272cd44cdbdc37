-- cuda_smem_spec.lua: on a GPU with 99 KiB of shared memory per block
-- (sm_86, sm_89: what LOOM_EMU_ARCH=sm_86 makes the emulated device), the
-- attention calls whose tiles do not fit (f32 at head dim 128, 16-bit at
-- 256: the kernels' cudaFuncSetAttribute is refused) compose, forward and
-- backward, with the CPU's results; the calls whose tiles fit (bf16 at 64
-- and 192, f32 at 64) still run the fused kernels. scripts/test_emu.sh runs
-- it on such an emulated device; elsewhere it says why it does not apply.
local loom = require("loom")
local G = require("support.cuda")
local F = loom.F

local counters = loom.cuda.emu_counters and loom.cuda.emu_counters()
local config = loom.show_config()
local small = config:find("sm_86", 1, true) or config:find("sm_89", 1, true)
if not (counters and small) then
  local why = not counters and "not an emulated CUDA build" or "the emulated device is not sm_86/89 (LOOM_EMU_ARCH)"
  print("cuda_smem_spec: does not apply: " .. why)
  describe("attention on a GPU with 99 KiB of shared memory per block", function()
    it("does not apply: " .. why, function() assert.is_truthy(not counters or not small) end)
  end)
  return
end

local function fw_bw(tol, f, inputs)
  local w = function(out) loom.manual_seed(99) return loom.randn(out:size()) end
  local oc, gc = G.grads("cpu", f, inputs, { true, true, true }, w)
  local og, gg = G.grads("cuda", f, inputs, { true, true, true }, w)
  G.close(oc, og, tol, "forward")
  for i = 1, 3 do G.close(gc[i], gg[i], tol, "gradient of input " .. i) end
end

-- attention forward and backward, causal, against the CPU; the refusals
-- and GEMMs it made on the device
local function attention(dt, D)
  loom.manual_seed(7)
  local q, k, v = loom.randn({ 1, 2, 70, D }):to(dt), loom.randn({ 1, 2, 90, D }):to(dt), loom.randn({ 1, 2, 90, D }):to(dt)
  local c0 = loom.cuda.emu_counters()
  fw_bw(dt == "f32" and 2e-5 or 2e-2, function(a, b, c) return F.scaled_dot_product_attention(a, b, c, { is_causal = true }) end,
        { q, k, v })
  local c1 = loom.cuda.emu_counters()
  return c1.shared_memory_refusals - c0.shared_memory_refusals, c1.gemms - c0.gemms
end

describe("attention on a GPU with 99 KiB of shared memory per block", function()
  for _, case in ipairs({ { "f32", 128 }, { "bf16", 256 }, { "f16", 256 } }) do
    it(("composes where its tiles do not fit: %s, head dim %d"):format(case[1], case[2]), function()
      local refused, gemms = attention(case[1], case[2])
      assert.is_true(refused > 0, "the kernels asked for more than 99 KiB and were refused")
      assert.is_true(gemms > 0, "the composed form ran (its GEMMs)")
    end)
  end
  for _, case in ipairs({ { "f32", 64 }, { "bf16", 64 }, { "bf16", 192 } }) do
    it(("runs the fused kernels where its tiles fit: %s, head dim %d"):format(case[1], case[2]), function()
      local refused, gemms = attention(case[1], case[2])
      assert.equal(0, refused)
      assert.equal(0, gemms, "no GEMM on the device: the fused kernels")
    end)
  end
end)
