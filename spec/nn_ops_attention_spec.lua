-- nn_ops_attention_spec.lua: triu/tril, scaled_dot_product_attention and
-- rope (the registry ops of core/ops_nn.c called by name with C
-- conventions) and loom.F's rope helpers, against plain-Lua references in
-- f64 and their gradients against central differences; strided and f32
-- inputs, and no leaks from any nn op.
local loom, NO = require("loom"), require("support.nn_ops")
local T, flat, rand_flat, close, same_shape = NO.T, NO.flat, NO.rand_flat, NO.close, NO.same_shape
local gradcheck, errors_with = NO.gradcheck, NO.errors_with
local ref_softmax, ref_norm = NO.softmax, NO.norm

describe("triu and tril", function()
  local shape = { 2, 3, 4 }
  local function ref(xf, k, upper)
    local y = {}
    for b = 0, 1 do
      for i = 0, 2 do
        for j = 0, 3 do
          local at = b * 12 + i * 4 + j + 1
          local keep = upper and j - i >= k or (not upper and j - i <= k)
          y[at] = keep and xf[at] or 0
        end
      end
    end
    return y
  end
  for _, upper in ipairs { true, false } do
    local name = upper and "triu" or "tril"
    it(name .. " keeps the right diagonals, forward and backward", function()
      local xf = rand_flat(shape)
      for _, k in ipairs { -2, -1, 0, 1, 3 } do
        close(flat(loom.op(name, { T(xf, shape) }, { k })), ref(xf, k, upper), 0, name .. " k=" .. k)
        gradcheck(function(t) return loom.op(name, { t[1] }, { k }) end, { T(xf, shape) }, { 1 })
      end
      local b = loom.op(name, { loom.tensor({ { true, true }, { true, true } }) }, { 0 })
      assert.are.same(upper and { { true, true }, { false, true } } or { { true, false }, { true, true } }, b:totable())
    end)
  end
  it("needs 2 dims", function()
    errors_with("expected at least 2 dims", function() loom.op("triu", { T({ 1, 2 }, { 2 }) }, { 0 }) end)
  end)
end)

describe("scaled_dot_product_attention", function()
  -- q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev); mask(i, j) -> true/false or a number
  local function ref(q, k, v, B, H, L, S, E, Ev, o)
    local scale = o.scale or 1 / math.sqrt(E)
    local out = {}
    for bh = 0, B * H - 1 do
      for i = 0, L - 1 do
        local sc, m = {}, -math.huge
        for j = 0, S - 1 do
          local s = 0
          for e = 0, E - 1 do s = s + q[(bh * L + i) * E + e + 1] * k[(bh * S + j) * E + e + 1] end
          s = s * scale
          if o.causal and j > i then s = -math.huge end
          if o.mask then
            local mv = o.mask(i, j)
            if mv == false then s = -math.huge elseif type(mv) == "number" then s = s + mv end
          end
          sc[j] = s
          m = math.max(m, s)
        end
        local z = 0
        -- a row whose keys are all masked attends to nothing: zeros (PyTorch 2.15)
        for j = 0, S - 1 do sc[j] = m == -math.huge and 0 or math.exp(sc[j] - m) z = z + sc[j] end
        if z == 0 then z = 1 end
        for e = 0, Ev - 1 do
          local acc = 0
          for j = 0, S - 1 do acc = acc + sc[j] / z * v[(bh * S + j) * Ev + e + 1] end
          out[(bh * L + i) * Ev + e + 1] = acc
        end
      end
    end
    return out
  end

  local B, H, L, S, E, Ev = 2, 2, 3, 4, 3, 2
  local qs, ks, vs = { B, H, L, E }, { B, H, S, E }, { B, H, S, Ev }
  local qf, kf, vf = rand_flat(qs), rand_flat(ks), rand_flat(vs)

  it("matches the reference (plain, scaled, causal, bool and float masks)", function()
    local function run(o, mask)
      local inputs = { T(qf, qs), T(kf, ks), T(vf, vs), mask }
      local y = loom.op("scaled_dot_product_attention", inputs, { o.causal and 1 or 0 }, { o.scale or 0 })
      same_shape(y, { B, H, L, Ev })
      close(flat(y), ref(qf, kf, vf, B, H, L, S, E, Ev, o), 1e-12, "sdpa")
    end
    run({})
    run({ scale = 0.3 })
    run({ causal = true })
    local mb = { { true, false, true, true }, { false, true, true, false }, { true, true, false, true } }
    run({ mask = function(i, j) return mb[i + 1][j + 1] end }, loom.tensor(mb))
    local mf = rand_flat({ L, S })
    run({ mask = function(i, j) return mf[i * S + j + 1] end }, T(mf, { L, S }))
    mb[2] = { false, false, false, false } -- row 2 attends to nothing
    run({ mask = function(i, j) return mb[i + 1][j + 1] end }, loom.tensor(mb))
    for j = 1, S do mf[S + j] = -math.huge end
    run({ mask = function(i, j) return mf[i * S + j + 1] end }, T(mf, { L, S }))
  end)

  it("gives zeros and no gradient where a row's keys are all masked, as PyTorch 2.15 (f64, f32, bf16)", function()
    local m = loom.tensor { { true, false, true, true }, { false, false, false, false }, { true, true, false, true } }
    local f = function(t) return loom.op("scaled_dot_product_attention", t, { 0 }, { 0 }) end
    gradcheck(f, { T(qf, qs), T(kf, ks), T(vf, vs), m }, { 1, 2, 3 })
    for _, dt in ipairs { "f64", "f32", "bf16" } do
      local q, k, v = T(qf, qs, dt):requires_grad_(), T(kf, ks, dt):requires_grad_(), T(vf, vs, dt)
      local y = loom.F.scaled_dot_product_attention(q, k, v, { attn_mask = m })
      y:sum():backward()
      local row, grow = y:narrow(3, 2, 1):to("f64"), q.grad:narrow(3, 2, 1):to("f64")
      assert.equals(0, row:abs():sum():item(), dt .. ": the masked row's output")
      assert.equals(0, grow:abs():sum():item(), dt .. ": the masked row's query gradient")
      local total = y:to("f64"):sum():item() + k.grad:to("f64"):abs():sum():item()
      assert.is_true(total == total and math.abs(total) < math.huge, dt .. ": no NaN or inf elsewhere")
    end
  end)

  it("has the right gradients for q, k, v and a float mask", function()
    local function f(o) return function(t) return loom.op("scaled_dot_product_attention", t, { o.causal and 1 or 0 }, { o.scale or 0 }) end end
    gradcheck(f {}, { T(qf, qs), T(kf, ks), T(vf, vs) }, { 1, 2, 3 })
    gradcheck(f { causal = true, scale = 0.7 }, { T(qf, qs), T(kf, ks), T(vf, vs) }, { 1, 2, 3 })
    gradcheck(f {}, { T(qf, qs), T(kf, ks), T(vf, vs), T(rand_flat({ L, S }), { L, S }) }, { 1, 2, 3, 4 })
    local mb = loom.tensor { { true, false, true, true }, { false, true, true, false }, { true, true, false, true } }
    gradcheck(f {}, { T(qf, qs), T(kf, ks), T(vf, vs), mb }, { 1, 2, 3 })
  end)

  it("checks shapes", function()
    errors_with("argument #2 (key) expected the query's last dim", function()
      loom.op("scaled_dot_product_attention", { T(qf, qs), T(rand_flat({ B, H, S, 2 }), { B, H, S, 2 }), T(vf, vs) }, { 0 }, { 0 })
    end)
    errors_with("argument #3 (value) expected the key's length", function()
      loom.op("scaled_dot_product_attention", { T(qf, qs), T(kf, ks), T(rand_flat({ B, H, 2, Ev }), { B, H, 2, Ev }) }, { 0 }, { 0 })
    end)
    errors_with("attn_mask and is_causal", function()
      loom.op("scaled_dot_product_attention", { T(qf, qs), T(kf, ks), T(vf, vs), T(rand_flat({ L, S }), { L, S }) }, { 1 }, { 0 })
    end)
  end)
end)

describe("rope", function()
  -- x (B, T, H, D); angle(t, i) = t * theta^(-2i/D), pairs (2i, 2i+1) as complex numbers
  local B, Tn, H, D = 2, 3, 2, 4
  local shape = { B, Tn, H, D }
  local function tables(theta)
    local c, s = {}, {}
    for t = 0, Tn - 1 do
      for i = 0, D / 2 - 1 do
        local a = t * theta ^ (-2 * i / D)
        c[t * D / 2 + i + 1], s[t * D / 2 + i + 1] = math.cos(a), math.sin(a)
      end
    end
    return c, s
  end
  local function ref(xf, c, s)
    local y = {}
    for b = 0, B - 1 do
      for t = 0, Tn - 1 do
        for h = 0, H - 1 do
          for i = 0, D / 2 - 1 do
            local at = ((b * Tn + t) * H + h) * D + 2 * i + 1
            local re, im = xf[at], xf[at + 1]
            local cr, ci = c[t * D / 2 + i + 1], s[t * D / 2 + i + 1]
            y[at], y[at + 1] = re * cr - im * ci, re * ci + im * cr
          end
        end
      end
    end
    return y
  end
  local cf, sf = tables(10000)

  it("rotates interleaved pairs as Llama's apply_rotary_emb", function()
    local xf = rand_flat(shape)
    local y = loom.op("rope", { T(xf, shape), T(cf, { Tn, D / 2 }), T(sf, { Tn, D / 2 }) })
    same_shape(y, shape)
    close(flat(y), ref(xf, cf, sf), 1e-12, "rope")
    local yb = loom.op("rope", { T(xf, shape, "f32"), T(cf, { Tn, D / 2 }, "f32"), T(sf, { Tn, D / 2 }, "f32") })
    assert.are.equal("f32", yb.dtype)
    close(flat(yb), ref(xf, cf, sf), 1e-6, "rope f32")
  end)

  it("has the right gradient (rotation by the opposite angle)", function()
    local c, s = T(cf, { Tn, D / 2 }), T(sf, { Tn, D / 2 })
    gradcheck(function(t) return loom.op("rope", { t[1], c, s }) end, { T(rand_flat(shape), shape) }, { 1 })
  end)

  it("checks shapes", function()
    errors_with("expected shape (3, 2)", function()
      loom.op("rope", { T(rand_flat(shape), shape), T(rand_flat({ 2, 2 }), { 2, 2 }), T(sf, { Tn, D / 2 }) })
    end)
    errors_with("even head_dim", function()
      local x = T(rand_flat({ 1, Tn, 1, 3 }), { 1, Tn, 1, 3 })
      loom.op("rope", { x, T(cf, { Tn, D / 2 }), T(sf, { Tn, D / 2 }) })
    end)
  end)
end)

describe("rope helpers of loom.F", function()
  local F = loom.F
  it("rope_tables builds Llama's angles t * theta^(-2i/D)", function()
    local c, s = F.rope_tables(5, 6, { theta = 500, dtype = "f64" })
    same_shape(c, { 5, 3 })
    local wc, ws = {}, {}
    for t = 0, 4 do
      for i = 0, 2 do
        local a = t * 500 ^ (-2 * i / 6)
        wc[#wc + 1], ws[#ws + 1] = math.cos(a), math.sin(a)
      end
    end
    close(flat(c), wc, 1e-12, "cos")
    close(flat(s), ws, 1e-12, "sin")
    assert.are.equal("f32", (F.rope_tables(2, 4)).dtype)
  end)
  it("apply_rotary_emb keeps norms of pairs and inverts with the opposite angle", function()
    local c, s = F.rope_tables(3, 4, { dtype = "f64" })
    local xf = rand_flat({ 1, 3, 2, 4 })
    local y = F.apply_rotary_emb(T(xf, { 1, 3, 2, 4 }), c, s)
    local back = F.apply_rotary_emb(y, c, s:neg())
    close(flat(back), xf, 1e-12, "inverse")
  end)
end)

describe("nn ops on strided inputs and in f32", function()
  it("softmax, layer_norm and rope accept transposed views", function()
    local xf = rand_flat({ 4, 3 })
    local xt = T(xf, { 4, 3 }):transpose(1, 2) -- (3, 4), not contiguous
    local want = ref_softmax(flat(xt), { 3, 4 }, 2, false)
    close(flat(loom.op("softmax", { xt }, { 1 })), want, 1e-12, "softmax")
    close(flat(loom.op("layer_norm", { xt }, { 1 }, { 1e-5 })), ref_norm(flat(xt), 3, 4, nil, nil, 1e-5), 1e-12, "ln")
    local F = loom.F
    local c, s = F.rope_tables(3, 4, { dtype = "f64" })
    local x4 = T(rand_flat({ 2, 3, 1, 4 }), { 2, 3, 1, 4 })
    local xv = x4:transpose(1, 3):transpose(1, 3) -- same values, through views
    close(flat(F.apply_rotary_emb(xv, c, s)), flat(F.apply_rotary_emb(x4, c, s)), 0, "rope")
  end)

  it("attention in f32 keeps f32", function()
    local q, k, v = rand_flat({ 2, 3, 4 }), rand_flat({ 2, 5, 4 }), rand_flat({ 2, 5, 4 })
    local y64 = loom.op("scaled_dot_product_attention", { T(q, { 2, 3, 4 }), T(k, { 2, 5, 4 }), T(v, { 2, 5, 4 }) }, { 1 }, { 0 })
    local y32 = loom.op("scaled_dot_product_attention",
                        { T(q, { 2, 3, 4 }, "f32"), T(k, { 2, 5, 4 }, "f32"), T(v, { 2, 5, 4 }, "f32") }, { 1 }, { 0 })
    assert.are.equal("f32", y32.dtype)
    close(flat(y32), flat(y64), 1e-5, "f32")
  end)
end)

describe("nn ops leak nothing", function()
  it("forward and backward of every op leave no storages behind", function()
    local function round()
      local x = T(rand_flat({ 4, 5 }), { 4, 5 })
      x.requires_grad = true
      local w = T(rand_flat({ 5 }), { 5 })
      w.requires_grad = true
      local e = T(rand_flat({ 6, 5 }), { 6, 5 })
      e.requires_grad = true
      local ids = loom.tensor({ 0, 2, 5, 1 }, { dtype = "i64" })
      local h = loom.op("embedding", { e, ids }):add(x)
      h = loom.op("layer_norm", { h, w }, { 1, 1, 0 }, { 1e-5 })
      h = loom.op("rms_norm", { h, w }, { 1, 1 }, { 1e-5 })
      h = loom.op("softmax", { h }, { 0 }):add(loom.op("log_softmax", { h }, { 1 }))
      h = loom.op("triu", { h }, { 0 }):add(loom.op("tril", { h }, { 1 }))
      local q = h:reshape(1, 4, 5)
      h = loom.op("scaled_dot_product_attention", { q, q, q }, { 1 }, { 0 }):reshape(4, 5)
      local c, s = T(rand_flat({ 2, 1 }), { 2, 1 }), T(rand_flat({ 2, 1 }), { 2, 1 })
      h = loom.op("rope", { h:reshape(2, 2, 1, 5):narrow(4, 1, 2), c, s }):reshape(4, 2)
      local l = loom.op("cross_entropy", { h, loom.tensor({ 1, 0, -100, 1 }, { dtype = "i64" }) }, { -100, 1 }, { 0.1 })
      l:backward()
      assert.is_truthy(x.grad and w.grad and e.grad)
    end
    round()
    jit.flush()   -- (an earlier spec's closures, kept by traces, would be freed mid-count by a flush)
    collectgarbage() collectgarbage()
    local before = tonumber(loom.C.lm_storage_count())
    for _ = 1, 3 do round() end
    collectgarbage() collectgarbage()
    assert.are.equal(before, tonumber(loom.C.lm_storage_count()))
  end)
end)
