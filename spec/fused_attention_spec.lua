-- fused_attention_spec.lua: scaled_dot_product_attention's fused path (the
-- attention kernels: tiles of queries and keys, online softmax, the
-- log-sum-exp kept for backward, no (L, S) matrix) against the composed
-- form written in Lua from basic ops, softmax(q k^T * scale + causal mask) v,
-- forward and the gradients of q, k, v: causal and not, L = S, L < S and
-- L > S, sizes that are not multiples of the tiles (32 queries, 64 keys),
-- Ev != E, an explicit scale, strided (head-transposed) inputs, f64, f32 and
-- bf16 and f16; f64 gradient checks against central differences. With
-- LOOM_CPU_FUSED=0 the same checks hold for the composed form.
-- Tolerance: f64 1e-10, f32 2e-5, bf16 2e-2, f16 5e-3 (relative to max(1, |want|)).
local loom, X = require("loom"), require("support.fused")
local R = require("support.ref")
local F = loom.F

-- the composed form from basic ops, in f64: q (..., L, E), k (..., S, E)
local function ref(q, k, v, causal, scale)
  local L, S = q:size(-2), k:size(-2)
  local sc = q:matmul(k:transpose(-2, -1)) * (scale or 1 / math.sqrt(q:size(-1)))
  if causal then
    local i = loom.arange(0, L, 1, { dtype = "i64" }):view(L, 1)
    local j = loom.arange(0, S, 1, { dtype = "i64" }):view(1, S)
    sc = sc:masked_fill(j:gt(i), -math.huge)
  end
  return sc:softmax(-1):matmul(v)
end

-- fused (as loom.F runs it) vs the reference: output and the three gradients
local function check(what, shapes, dtype, tol, opts)
  local q, k, v = X.leaf(1, shapes[1], dtype), X.leaf(2, shapes[2], dtype), X.leaf(3, shapes[3], dtype)
  local y
  X.one_pass({ "matmul", "softmax" }, function() y = F.scaled_dot_product_attention(q, k, v, opts) end, what .. " forward")
  local g = X.rand(4, y:size(), dtype)
  X.one_pass({ "matmul", "softmax" }, function() y:backward(g) end, what .. " backward")
  local q64, k64, v64 = q:detach():to("f64"):requires_grad_(true), k:detach():to("f64"):requires_grad_(true),
                        v:detach():to("f64"):requires_grad_(true)
  local want = ref(q64, k64, v64, opts.is_causal, opts.scale)
  want:backward(g:to("f64"))
  assert.are.equal(dtype, y.dtype)
  X.close(y, want:detach(), tol, what .. " output")
  X.close(X.grad_of(q), q64.grad, tol, what .. " dq")
  X.close(X.grad_of(k), k64.grad, tol, what .. " dk")
  X.close(X.grad_of(v), v64.grad, tol, what .. " dv")
end

describe("scaled_dot_product_attention, fused (attention, attention_bwd)", function()
  local cases = {
    -- name, q, k, v shapes
    { "L = S = 70", { 2, 3, 70, 24 }, { 2, 3, 70, 24 }, { 2, 3, 70, 24 } },
    { "L 37 < S 101, Ev 10", { 2, 37, 16 }, { 2, 101, 16 }, { 2, 101, 10 } },
    { "L 101 > S 37", { 3, 101, 8 }, { 3, 37, 8 }, { 3, 37, 8 } },
    { "one query, one key", { 1, 1, 5 }, { 1, 1, 5 }, { 1, 1, 5 } },
  }
  for _, c in ipairs(cases) do
    for _, causal in ipairs { false, true } do
      it(string.format("f64 %s %s", c[1], causal and "causal" or "not causal"), function()
        check(c[1], { c[2], c[3], c[4] }, "f64", X.TOL64, { is_causal = causal })
      end)
    end
  end

  it("f32 causal (2, 4, 130, 32): threads and partial tiles", function()
    local s = { 2, 4, 130, 32 }
    check("f32 causal", { s, s, s }, "f32", X.TOL32, { is_causal = true })
  end)

  it("f32 not causal, L 70, S 200, explicit scale", function()
    check("f32 scaled", { { 3, 70, 16 }, { 3, 200, 16 }, { 3, 200, 12 } }, "f32", X.TOL32, { scale = 0.3 })
  end)

  it("bf16 and f16 operands compute in f32 and round once", function()
    local s = { 2, 2, 45, 16 }
    check("bf16 causal", { s, s, s }, "bf16", 2e-2, { is_causal = true })
    check("f16", { s, { 2, 2, 70, 16 }, { 2, 2, 70, 16 } }, "f16", 5e-3, {})
  end)

  it("takes strided inputs (heads transposed, as the transformer's)", function()
    local base = { X.leaf(5, { 2, 33, 3, 8 }), X.leaf(6, { 2, 33, 3, 8 }), X.leaf(7, { 2, 33, 3, 8 }) }
    local function qkv() return base[1]:transpose(2, 3), base[2]:transpose(2, 3), base[3]:transpose(2, 3) end
    local q, k, v = qkv()
    local g = X.rand(8, { 2, 3, 33, 8 })
    F.scaled_dot_product_attention(q, k, v, { is_causal = true }):backward(g)
    local got = { X.grad_of(base[1]), X.grad_of(base[2]), X.grad_of(base[3]) }
    q, k, v = qkv()
    ref(q, k, v, true):backward(g)
    for i = 1, 3 do X.close(got[i], X.grad_of(base[i]), X.TOL64, "strided gradient " .. i) end
  end)

  -- The CPU kernels read the heads of a (B, L, H, E) tensor transposed in
  -- place (no copies) and write each gradient in its input's layout: the
  -- same bits as the kernels on dense copies, f32 and bf16 (bf16: the
  -- tile products on bf16 dot products where the CPU has them).
  it("reads transposed heads in place, writes gradients in their layout, with the dense copies' bits", function()
    for _, dt in ipairs { "f32", "bf16" } do
      local base = { X.rand(9, { 2, 70, 3, 16 }, dt), X.rand(10, { 2, 70, 3, 16 }, dt), X.rand(11, { 2, 70, 3, 16 }, dt) }
      local g = X.rand(12, { 2, 3, 70, 16 }, dt)
      local function run(dense)
        local leaves = {}
        for i = 1, 3 do
          local t = base[i]:transpose(2, 3)
          leaves[i] = (dense and t:contiguous() or t):detach():requires_grad_(true)
        end
        local o = F.scaled_dot_product_attention(leaves[1], leaves[2], leaves[3], { is_causal = true })
        o:backward(g)
        return { o, leaves[1].grad, leaves[2].grad, leaves[3].grad }, leaves
      end
      local got, leaves = run(false)
      local want = run(true)
      for i = 1, 4 do
        local diff = (got[i]:to("f64") - want[i]:to("f64")):abs():max():item()
        assert.are.equal(0, diff, dt .. ": output or gradient " .. i .. " differs from the dense run")
      end
      if X.FUSED then
        for i = 1, 3 do
          assert.are.same(leaves[i]:stride(), got[i + 1]:stride(), dt .. ": gradient " .. i .. " in its input's layout")
        end
      end
    end
  end)

  it("passes f64 gradient checks, causal and not, L != S", function()
    for _, causal in ipairs { false, true } do
      local f = function(q, k, v) return F.scaled_dot_product_attention(q, k, v, { is_causal = causal }) end
      R.gradcheck(f, { X.leaf(9, { 2, 4, 3 }), X.leaf(10, { 2, 6, 3 }), X.leaf(11, { 2, 6, 2 }) })
      R.gradcheck(f, { X.leaf(12, { 1, 6, 3 }), X.leaf(13, { 1, 4, 3 }), X.leaf(14, { 1, 4, 3 }) })
    end
  end)

  it("keeps the log-sum-exp of each row as the op's second output; loom.F returns one value", function()
    local q, k, v = X.rand(15, { 2, 5, 4 }), X.rand(16, { 2, 7, 4 }), X.rand(17, { 2, 7, 3 })
    assert.are.equal(1, select("#", F.scaled_dot_product_attention(q, k, v)))
    local _, lse = loom.op("scaled_dot_product_attention", { q, k, v }, { 1 }, { 0 })
    assert.are.same({ 2, 5 }, lse:size())
    local sc = q:matmul(k:transpose(-2, -1)) * (1 / 2)
    local i, j = loom.arange(0, 5, 1, { dtype = "i64" }):view(5, 1), loom.arange(0, 7, 1, { dtype = "i64" }):view(1, 7)
    sc = sc:masked_fill(j:gt(i), -math.huge)
    local m = sc:max(3, true)
    X.close(lse, ((sc - m):exp():sum(3, true):log() + m):squeeze(3), X.TOL64, "lse")
  end)

  it("runs the composed form for a mask, mixed dtypes or broadcast batch dims", function()
    local q, k, v = X.rand(18, { 2, 5, 4 }), X.rand(19, { 2, 6, 4 }), X.rand(20, { 2, 6, 4 })
    local mask = X.rand(21, { 5, 6 })
    local n = X.calls({ "matmul" }, function() F.scaled_dot_product_attention(q, k, v, { attn_mask = mask }) end)
    assert.is_true(n.matmul > 0)
    local y = F.scaled_dot_product_attention(q, k:to("f32"), v)
    X.close(y, ref(q, k:to("f32"):to("f64"), v), 1e-6, "mixed dtypes")
    y = F.scaled_dot_product_attention(q, X.rand(22, { 1, 6, 4 }), X.rand(23, { 1, 6, 4 }))
    assert.are.same({ 2, 5, 4 }, y:size())
  end)
end)
