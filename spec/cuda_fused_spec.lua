-- cuda_fused_spec.lua: the ops that run on fused CUDA kernels (attention,
-- cross entropy, softmax and norm backward, rope, the unary derivatives),
-- forward and gradients, at the sizes where those kernels change path:
-- several tiles, rows longer than a block, head dims 64, 128, 192, 256, bf16
-- and f16.
-- The same op on the CPU is the ground truth; tolerances are |cuda - cpu| /
-- |cpu| (support/cuda.lua: f32 2e-5, bf16 1e-2; attention in bf16 2e-2,
-- its probabilities being rounded to bf16 before P V as in FlashAttention).
-- Skips, saying why, without a GPU.
local loom = require("loom")
local G = require("support.cuda")
local F = loom.F

if G.skip(describe, it, "cuda fused kernels") then return end
-- a device with 99 KiB of shared memory per block (sm_86/89; LOOM_EMU_ARCH):
-- 16-bit tiles of D = 256 do not fit, and those calls compose
local config = loom.show_config()
local SMALL_SMEM = config:find("sm_86", 1, true) or config:find("sm_89", 1, true)
-- the emulated device counts what ran (GEMMs); on a GPU emu_counters() is nil
local EMULATED = loom.cuda.emu_counters() ~= nil

-- forward and the gradients of the float inputs in `which` agree
local function fw_bw(tol, f, inputs, which)
  local w = function(out) loom.manual_seed(99) return loom.randn(out:size()) end
  local oc, gc = G.grads("cpu", f, inputs, which, w)
  local og, gg = G.grads("cuda", f, inputs, which, w)
  G.close(oc, og, tol, "forward")
  for i in pairs(which) do
    assert(gc[i] and gg[i], "gradient of input " .. i .. " missing")
    G.close(gc[i], gg[i], tol, "gradient of input " .. i)
  end
end

describe("cuda fused kernels", function()
  before_each(function() loom.manual_seed(17) end)

  for _, dt in ipairs({ "f32", "bf16" }) do
    for _, D in ipairs({ 64, 128 }) do
      for _, causal in ipairs({ false, true }) do
        local shapes = { { 2, 2, 100, 100 }, { 1, 3, 70, 130 }, { 1, 1, 300, 300 } }
        it(("attention %s, head dim %d%s"):format(dt, D, causal and ", causal" or ""), function()
          for _, s in ipairs(shapes) do
            local B, H, L, S = s[1], s[2], s[3], s[4]
            local q, k, v = loom.randn({ B, H, L, D }):to(dt), loom.randn({ B, H, S, D }):to(dt), loom.randn({ B, H, S, D }):to(dt)
            fw_bw(dt == "bf16" and 2e-2 or 2e-5, function(a, b, c)
              return F.scaled_dot_product_attention(a, b, c, { is_causal = causal })
            end, { q, k, v }, { true, true, true })
          end
        end)
      end
    end
  end

  -- masks run the fused kernels (an additive f32 bias on the scaled
  -- scores) against the composed ops on the CPU: a bool (L, S) mask, a
  -- float key-padding mask (B, 1, 1, S) with -inf, float biases (H, L, S)
  -- and (B, H, L, S);
  -- on the emulated device the forward is shown to run no GEMM (fused)
  for _, dt in ipairs({ "f32", "bf16" }) do
    it("attention " .. dt .. " with masks, head dims 64 and 40 (the fused kernels)", function()
      local B, H, L, S = 2, 2, 70, 100
      local r = loom.rand({ L, S })
      r:narrow(2, 1, 1):fill_(0)                          -- every row keeps its first key
      local keep = r:lt(0.7)
      local pad = loom.zeros({ B, 1, 1, S })
      pad:narrow(4, 91, 10):fill_(-math.huge)
      local masks = { keep, pad, loom.randn({ H, L, S }), loom.randn({ B, H, L, S }) } -- the last folds: no copy
      for _, D in ipairs({ 64, 40 }) do
        local q, k, v = loom.randn({ B, H, L, D }):to(dt), loom.randn({ B, H, S, D }):to(dt), loom.randn({ B, H, S, D }):to(dt)
        for _, m in ipairs(masks) do
          fw_bw(dt == "bf16" and 2e-2 or 2e-5, function(a, b, c, mk)
            return F.scaled_dot_product_attention(a, b, c, { attn_mask = mk })
          end, { q, k, v, m }, { true, true, true })
          local before = loom.cuda.emu_counters and loom.cuda.emu_counters()
          if before then
            local qc, kc, vc, mc = q:to("cuda"), k:to("cuda"), v:to("cuda"), m:to("cuda")
            before = loom.cuda.emu_counters().gemms
            F.scaled_dot_product_attention(qc, kc, vc, { attn_mask = mc })
            assert.equal(before, loom.cuda.emu_counters().gemms, "the masked attention ran GEMMs (composed)")
          end
        end
      end
    end)
  end

  -- head dims above 128: 192 and 256, and 136 and 200 on zero-padded
  -- copies (192, 256); each tile of rows has two blocks, one per half of
  -- the output's columns. Causal, not, a bool mask and a float (H, L, S)
  -- bias; forward and dq/dk/dv against the composed CPU ops (f32 2e-5,
  -- bf16 2e-2). On the emulated device, forward and backward under bf16
  -- autocast run no GEMM at all (so none in f32): the fused kernels (where
  -- their tiles fit the device's shared memory: not D = 256 on sm_86/89).
  for _, dt in ipairs({ "f32", "bf16" }) do
    for _, D in ipairs({ 256, 192, 136, 200 }) do
      it(("attention %s, head dim %d: causal, not, masked (the fused kernels)"):format(dt, D), function()
        local B, H, L, S = 1, 2, 70, 100
        local tol = dt == "bf16" and 2e-2 or 2e-5
        local q, k, v = loom.randn({ B, H, L, D }):to(dt), loom.randn({ B, H, S, D }):to(dt), loom.randn({ B, H, S, D }):to(dt)
        local r = loom.rand({ L, S })
        r:narrow(2, 1, 1):fill_(0) -- every row keeps its first key
        for _, causal in ipairs({ false, true }) do
          fw_bw(tol, function(a, b, c) return F.scaled_dot_product_attention(a, b, c, { is_causal = causal }) end,
                { q, k, v }, { true, true, true })
        end
        for _, m in ipairs({ r:lt(0.7), loom.randn({ H, L, S }) }) do
          fw_bw(tol, function(a, b, c, mk) return F.scaled_dot_product_attention(a, b, c, { attn_mask = mk }) end,
                { q, k, v, m }, { true, true, true })
        end
        if dt == "bf16" and EMULATED and (D <= 192 or not SMALL_SMEM) then
          local qc, kc, vc = loom.randn({ B, H, L, D }, { device = "cuda" }):requires_grad_(true),
                             loom.randn({ B, H, S, D }, { device = "cuda" }):requires_grad_(true),
                             loom.randn({ B, H, S, D }, { device = "cuda" }):requires_grad_(true)
          local mc = r:lt(0.7):to("cuda")
          local c0 = loom.cuda.emu_counters()
          loom.autocast("bf16", function()
            F.scaled_dot_product_attention(qc, kc, vc, { is_causal = true }):sum():backward()
            F.scaled_dot_product_attention(qc, kc, vc, { attn_mask = mc }):sum():backward()
          end)
          local c1 = loom.cuda.emu_counters()
          assert.equal(c0.f32_gemms_under_autocast, c1.f32_gemms_under_autocast, "f32 GEMMs under bf16 autocast")
          assert.equal(c0.gemms, c1.gemms, "attention under bf16 autocast ran GEMMs (composed)")
          assert.is_truthy(qc.grad and kc.grad and vc.grad, "gradients reached q, k, v")
        end
      end)
    end
  end

  -- f16: the f16 instantiations (mma.sync .f16, f16 tiles, stores) of the
  -- forward and both backward kernels, D up to 128 and the column split of
  -- D = 256, causal, not and masked; tolerance 5e-3 (P rounded to f16, 11
  -- bits, before P V). Then the f16 rows: cross entropy, rms norm, rope.
  it("attention f16, head dims 64, 128 and 256: causal, not, masked (the fused kernels)", function()
    local B, H, L, S = 1, 2, 70, 100
    local r = loom.rand({ L, S })
    r:narrow(2, 1, 1):fill_(0) -- every row keeps its first key
    for _, D in ipairs({ 64, 128, 256 }) do
      local q, k, v = loom.randn({ B, H, L, D }):to("f16"), loom.randn({ B, H, S, D }):to("f16"), loom.randn({ B, H, S, D }):to("f16")
      for _, causal in ipairs({ false, true }) do
        fw_bw(5e-3, function(a, b, c) return F.scaled_dot_product_attention(a, b, c, { is_causal = causal }) end,
              { q, k, v }, { true, true, true })
      end
      fw_bw(5e-3, function(a, b, c, mk) return F.scaled_dot_product_attention(a, b, c, { attn_mask = mk }) end,
            { q, k, v, r:lt(0.7) }, { true, true, true })
    end
    if EMULATED then -- the fused kernels ran: no GEMM
      local q = loom.randn({ B, H, L, 64 }, { device = "cuda" }):to("f16")
      local g0 = loom.cuda.emu_counters().gemms
      F.scaled_dot_product_attention(q, q, q, { is_causal = true })
      assert.equal(g0, loom.cuda.emu_counters().gemms, "f16 attention ran GEMMs (composed)")
    end
  end)

  it("cross entropy, rms norm and rope in f16", function()
    local x = (loom.randn({ 8, 5000 }) * 3):to("f16")
    local t = loom.randint(1, 5001, { 8 }, { dtype = "i64" })
    fw_bw(G.tol.f16, function(a, b) return F.cross_entropy(a, b, { label_smoothing = 0.1 }) end, { x, t }, { true })
    local xr, w = loom.randn({ 130, 256 }):to("f16"), loom.randn({ 256 }):to("f16")
    fw_bw(G.tol.f16, function(a, c) return F.rms_norm(a, { 256 }, c) end, { xr, w }, { true, true })
    local cos, sin = F.rope_tables(64, 128)
    fw_bw(G.tol.f16, function(a, c, d) return F.apply_rotary_emb(a, c, d) end,
          { loom.randn({ 2, 64, 4, 128 }):to("f16"), cos, sin }, { true })
  end)

  it("attention with a mask that drops every key of a row: zeros there, finite gradients", function()
    local q, k, v = loom.randn({ 1, 2, 40, 64 }), loom.randn({ 1, 2, 50, 64 }), loom.randn({ 1, 2, 50, 64 })
    local m = loom.ones({ 40, 50 }):to("bool")
    m:narrow(1, 7, 1):fill_(false)
    local qc, kc = q:to("cuda"):requires_grad_(true), k:to("cuda"):requires_grad_(true)
    local o = F.scaled_dot_product_attention(qc, kc, v:to("cuda"), { attn_mask = m:to("cuda") })
    assert.equal(0, o:narrow(3, 7, 1):abs():sum():item())
    G.close(F.scaled_dot_product_attention(q, k, v):narrow(3, 8, 33), o:narrow(3, 8, 33), 2e-5, "the other rows")
    o:sum():backward()
    for _, g in ipairs({ qc.grad, kc.grad }) do
      local x = g:sum():item()
      assert.is_true(x == x and math.abs(x) < math.huge, "a finite gradient")
    end
    assert.equal(0, qc.grad:narrow(3, 7, 1):abs():sum():item())
  end)

  it("attention with a scale and heads of 96 (the composed form)", function()
    local q, k, v = loom.randn({ 1, 2, 40, 96 }), loom.randn({ 1, 2, 50, 96 }), loom.randn({ 1, 2, 50, 96 })
    fw_bw(2e-5, function(a, b, c) return F.scaled_dot_product_attention(a, b, c, { scale = 0.3 }) end,
          { q, k, v }, { true, true, true })
  end)

  for _, dt in ipairs({ "f32", "bf16" }) do
    it("cross entropy over a vocabulary of 50257, " .. dt, function()
      local x = (loom.randn({ 8, 50257 }) * 3):to(dt)
      local t = loom.randint(1, 50258, { 8 }, { dtype = "i64" })
      fw_bw(G.tol[dt], function(a, b) return F.cross_entropy(a, b) end, { x, t }, { true })
      fw_bw(G.tol[dt], function(a, b) return F.cross_entropy(a, b, { label_smoothing = 0.1, reduction = "sum" }) end,
            { x, t }, { true })
    end)
  end

  it("cross entropy with class weights, ignored rows, smoothing, 3-D logits", function()
    local x, w = loom.randn({ 2, 9, 1000 }), loom.rand({ 1000 }) + 0.5
    local t = loom.randint(1, 1001, { 2, 9 }, { dtype = "i64" })
    t = t:where(t:gt(100), -100) -- some rows ignored (ids under 100 become ignore_index)
    fw_bw(2e-5, function(a, b, c)
      return F.cross_entropy(a, b, { weight = c, ignore_index = -100, label_smoothing = 0.2 })
    end, { x, t, w }, { true })
    fw_bw(2e-5, function(a, b) return F.cross_entropy(a, b, { reduction = "none", ignore_index = -100 }) end,
          { x, t }, { true })
  end)

  it("softmax and log_softmax backward over rows longer than a block", function()
    for _, n in ipairs({ 7, 1000, 5000 }) do
      local x = loom.randn({ 6, n }) * 2
      fw_bw(2e-5, function(a) return a:softmax(-1) end, { x }, { true })
      fw_bw(2e-5, function(a) return a:log_softmax(-1) end, { x }, { true })
    end
  end)

  it("layer_norm and rms_norm backward, weights over many row chunks", function()
    for _, s in ipairs({ { 200, 4096 }, { 3, 33 }, { 1000, 64 } }) do
      local x, w, b = loom.randn(s), loom.randn({ s[2] }), loom.randn({ s[2] })
      fw_bw(5e-5, function(a, c, d) return F.layer_norm(a, { s[2] }, c, d, 1e-5) end, { x, w, b }, { true, true, true })
      fw_bw(5e-5, function(a, c) return F.rms_norm(a, { s[2] }, c, 1e-6) end, { x, w }, { true, true })
      fw_bw(5e-5, function(a) return F.layer_norm(a, { s[2] }) end, { x }, { true })
    end
    local xb, wb = loom.randn({ 130, 256 }):to("bf16"), loom.randn({ 256 }):to("bf16")
    fw_bw(G.tol.bf16, function(a, c) return F.rms_norm(a, { 256 }, c) end, { xb, wb }, { true, true })
  end)

  it("rope forward and backward", function()
    for _, dt in ipairs({ "f32", "bf16" }) do
      local cos, sin = F.rope_tables(64, 128)
      local x = loom.randn({ 2, 64, 4, 128 }):to(dt)
      fw_bw(G.tol[dt], function(a, c, d) return F.apply_rotary_emb(a, c, d) end, { x, cos, sin }, { true })
    end
  end)

  it("unary derivatives, on strided inputs", function()
    local x = loom.randn({ 40, 30 })
    local pos = x:abs() + 0.1
    local fs = {
      exp = function(a) return a:exp() end, tanh = function(a) return a:tanh() end,
      sigmoid = function(a) return a:sigmoid() end, gelu = function(a) return F.gelu(a) end,
      gelu_tanh = function(a) return F.gelu(a, { approximate = "tanh" }) end, silu = function(a) return F.silu(a) end,
      relu = function(a) return F.relu(a) end, sin = function(a) return a:sin() end,
      clamp = function(a) return a:clamp(-0.5, 0.5) end, pow = function(a) return a:pow(3) end,
      swiglu = function(a) return F.silu(a:narrow(2, 1, 20)) * a:narrow(2, 21, 20) end,
    }
    for name, f in pairs(fs) do
      fw_bw(2e-5, function(a) return f(a:t()) end, { x }, { true }) -- a transposed view
      if name == "pow" then fw_bw(2e-5, function(a) return a:sqrt() + a:log() + a:rsqrt() end, { pos }, { true }) end
    end
  end)
end)
