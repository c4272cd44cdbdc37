-- bf16_attention_spec.lua: the CPU's fused attention with bf16 q, k, v on
-- both of its paths for the tile products: bf16 dot products (vdpbf16ps,
-- f32 sums; the probabilities and their gradients rounded to bf16 for the
-- products that take them), where the build targets AVX512_BF16 and the
-- bf16 GEMM switch is on, and f32 FMAs on widened tiles (the switch off:
-- lm_cpu_set_bf16_gemm(0), LOOM_BF16_GEMM=plain). Each against attention
-- in f64 of the same bf16 inputs, forward and the three gradients, causal
-- or not, with odd lengths, head dims of 16, 64 and 72 and a different
-- value dim (even head dims take fused_attn_bf16.c, which packs the
-- products' operands from the bf16 tensors; an odd one, 33, the tiles
-- widened to f32 and packed per product). Tolerance: the largest error within 1.6e-2 of the largest
-- value (about 4 bf16 roundings of it: the output and the gradients are
-- rounded to bf16 once, the probabilities once more on the fast path;
-- measured 6.5e-3 at worst on the fast path, 4.1e-3 on the widened one).
local loom = require("loom")
local ffi = require("ffi")
local C, F = loom.C, loom.F

local info = ffi.string(C.lm_blas_info()):match("bf16 attention: (.*)$") or "?"
local built = info:find("dot products", 1, true) ~= nil or info:find("set off", 1, true) ~= nil
local TOL = 1.6e-2

-- attention of bf16 q, k, v (B, H, L, E) against f64: the worst error over
-- the largest value, for the output and each gradient; and whether the
-- call ran on bf16 dot products
local function worst(shape, ev, causal, seed)
  loom.manual_seed(seed)
  local B, H, L, E = shape[1], shape[2], shape[3], shape[4]
  local q, k = loom.randn(B, H, L, E):to("bf16"), loom.randn(B, H, L + 3, E):to("bf16")
  local v, g = loom.randn(B, H, L + 3, ev):to("bf16"), loom.randn(B, H, L, ev):to("bf16")
  if causal then k, v = k:narrow(3, 1, L):contiguous(), v:narrow(3, 1, L):contiguous() end
  local function run(dt)
    local function leaf(t) return t:to(dt):detach():requires_grad_() end
    local qq, kk, vv = leaf(q), leaf(k), leaf(v)
    local o = F.scaled_dot_product_attention(qq, kk, vv, { is_causal = causal })
    o:backward(g:to(dt))
    return { o, qq.grad, kk.grad, vv.grad }
  end
  local before = C.lm_cpu_bf16_attention_runs()
  local got = run("bf16")
  local ran = C.lm_cpu_bf16_attention_runs() - before
  local want = run("f64")
  local out = {}
  for i = 1, 4 do
    out[i] = (got[i]:to("f64") - want[i]):abs():max():item() / want[i]:abs():max():item()
  end
  return out, tonumber(ran)
end

local CASES = { { { 2, 3, 37, 64 }, 64 }, { { 1, 2, 130, 72 }, 72 }, { { 2, 2, 64, 16 }, 24 }, { { 1, 2, 45, 33 }, 36 } }
local NAMES = { "output", "dq", "dk", "dv" }

local function all_within(on, want_fast)
  local old = C.lm_cpu_set_bf16_gemm(on)
  for _, causal in ipairs { false, true } do
    for i, case in ipairs(CASES) do
      local errs, ran = worst(case[1], case[2], causal, i)
      local what = table.concat(case[1], "x") .. " ev " .. case[2] .. (causal and " causal" or "")
      assert.are.equal(want_fast and 2 or 0, ran, what .. ": calls on bf16 dot products (forward and backward)")
      for k = 1, 4 do
        assert.is_true(errs[k] <= TOL, string.format("%s %s: %.3g over the largest value (tolerance %g)", what,
                                                      NAMES[k], errs[k], TOL))
      end
    end
  end
  C.lm_cpu_set_bf16_gemm(old)
end

describe("bf16 attention on the CPU", function()
  it("widened tiles (f32 FMAs, the bf16 switch off): within " .. TOL .. " of f64", function()
    all_within(0, false)
  end)

  it("bf16 dot products (" .. info .. "): within " .. TOL .. " of f64", function()
    all_within(1, built)
  end)

  -- Causal with fewer queries than keys: the last query tile ends at key
  -- 33, an odd count, so its last pair of value rows would hold key 33,
  -- which no query attends. A NaN there (and in key 40's k) stays out of
  -- the output on both paths.
  it("keeps a NaN in a key or value no query attends out of the output", function()
    for _, on in ipairs { 0, 1 } do
      local old = C.lm_cpu_set_bf16_gemm(on)
      loom.manual_seed(3)
      local q, k, v = loom.randn(1, 2, 33, 64), loom.randn(1, 2, 64, 64), loom.randn(1, 2, 64, 64)
      v:narrow(3, 34, 1):fill_(0 / 0)
      k:narrow(3, 41, 1):fill_(0 / 0)
      local o = F.scaled_dot_product_attention(q:to("bf16"), k:to("bf16"), v:to("bf16"), { is_causal = true })
      local want = F.scaled_dot_product_attention(q:narrow(3, 1, 33):to("f64"), k:narrow(3, 1, 33):to("f64"),
                                                  v:narrow(3, 1, 33):to("f64"), { is_causal = true })
      local err = (o:to("f64") - want):abs():max():item()
      C.lm_cpu_set_bf16_gemm(old)
      assert.is_true(err == err and err <= TOL * want:abs():max():item(),
                     ("bf16 switch %d: %s from the attention of the first 33 keys"):format(on, tostring(err)))
    end
  end)
end)
