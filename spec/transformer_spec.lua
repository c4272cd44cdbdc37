-- transformer_spec.lua: loom.models.transformer, the Llama-style decoder:
-- config, submodule names, shapes, causality, grouped-query attention
-- against an explicit repeat of the kv heads, heads derived from local
-- weight shapes (what tensor parallelism relies on), tied embeddings and
-- reproducible generation.
local loom = require("loom")
local R = require("support.ref")
local nn = loom.nn
local tr = loom.models.transformer

local errmsg = R.errmsg
local function ids(t) return loom.tensor(t, { dtype = "i64" }) end
local small = { vocab_size = 11, dim = 16, n_layers = 2, n_heads = 4, max_seq_len = 12 }
local function cfg(extra)
  local c = {}
  for k, v in pairs(small) do c[k] = v end
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

describe("transformer config", function()
  it("fills defaults", function()
    local c = tr.config()
    assert.equal(65, c.vocab_size)
    assert.equal(128, c.dim)
    assert.equal(4, c.n_layers)
    assert.equal(4, c.n_heads)
    assert.equal(4, c.n_kv_heads)          -- as many as n_heads
    assert.equal(352, c.ffn_dim)           -- 32 * ceil(floor(2 * 4 * 128 / 3) / 32)
    assert.equal(256, c.max_seq_len)
    assert.equal(1e-5, c.norm_eps)
    assert.equal(10000, c.rope_theta)
    assert.equal(0, c.dropout)
    assert.is_false(c.tie_embeddings)
    assert.equal(64, tr.config({ dim = 16, ffn_dim = 64 }).ffn_dim)
  end)

  it("rejects bad head counts and unknown keys", function()
    assert.truthy(errmsg(tr.config, { dim = 30, n_heads = 4 }):find("dim (30) must divide by n_heads (4)", 1, true))
    assert.truthy(errmsg(tr.config, { n_heads = 4, n_kv_heads = 3 }):find("n_heads (4) must divide by n_kv_heads (3)", 1, true))
    assert.truthy(errmsg(tr.config, { dim = 12, n_heads = 4 }):find("head dim must be even", 1, true))
    assert.truthy(errmsg(tr.config, { n_layer = 2 }):find('unknown config key "n_layer"', 1, true))
  end)
end)

describe("Transformer", function()
  it("uses the Llama submodule names", function()
    loom.manual_seed(1)
    local m = tr.new(cfg({ n_kv_heads = 2 }))
    local have = {}
    for _, kv in ipairs(m:named_modules()) do have[kv[1]] = kv[2].__name end
    local expected = { tok_embeddings = "Embedding", layers = "ModuleList", norm = "RMSNorm", output = "Linear" }
    for i = 1, 2 do
      local p = "layers." .. i
      expected[p] = "TransformerBlock"
      expected[p .. ".attention_norm"] = "RMSNorm"
      expected[p .. ".attention"] = "Attention"
      expected[p .. ".ffn_norm"] = "RMSNorm"
      expected[p .. ".feed_forward"] = "FeedForward"
      for _, w in ipairs { "wq", "wk", "wv", "wo" } do expected[p .. ".attention." .. w] = "Linear" end
      for _, w in ipairs { "w1", "w2", "w3" } do expected[p .. ".feed_forward." .. w] = "Linear" end
    end
    for name, cls in pairs(expected) do assert.equal(cls, have[name], name) end
    local n = 0
    for _ in pairs(have) do n = n + 1 end
    assert.equal(n, 1 + (function() local k = 0 for _ in pairs(expected) do k = k + 1 end return k end)())
    -- weight shapes: (out, in); GQA shrinks wk and wv
    local sd = m:state_dict()
    assert.same({ 11, 16 }, sd["tok_embeddings.weight"]:size())
    assert.same({ 16, 16 }, sd["layers.1.attention.wq.weight"]:size())
    assert.same({ 8, 16 }, sd["layers.1.attention.wk.weight"]:size())
    assert.same({ 8, 16 }, sd["layers.2.attention.wv.weight"]:size())
    assert.same({ 16, 16 }, sd["layers.2.attention.wo.weight"]:size())
    local h = m.config.ffn_dim
    assert.same({ h, 16 }, sd["layers.1.feed_forward.w1.weight"]:size())
    assert.same({ 16, h }, sd["layers.1.feed_forward.w2.weight"]:size())
    assert.same({ h, 16 }, sd["layers.1.feed_forward.w3.weight"]:size())
    assert.same({ 11, 16 }, sd["output.weight"]:size())
    assert.is_nil(sd["layers.1.attention.wq.bias"])
  end)

  it("gives (B, T, vocab) logits and gradients for every parameter", function()
    loom.manual_seed(2)
    local m = tr.new(cfg())
    local x = ids({ { 1, 2, 3, 4, 5 }, { 11, 10, 9, 8, 7 } })
    local logits = m(x)
    assert.same({ 2, 5, 11 }, logits:size())
    local loss = loom.F.cross_entropy(logits, ids({ { 2, 3, 4, 5, 6 }, { 10, 9, 8, 7, 6 } }))
    -- an untrained model is near uniform: loss about log(11)
    assert.is_true(math.abs(loss:item() - math.log(11)) < 1.5, "loss " .. loss:item())
    loss:backward()
    for _, kv in ipairs(m:named_parameters()) do assert.is_not_nil(kv[2].grad, kv[1]) end
    assert.truthy(errmsg(m, ids({ { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1, 2 } })):find("exceeds max_seq_len 12", 1, true))
  end)

  it("is causal: a later token does not change earlier logits", function()
    loom.manual_seed(3)
    local m = tr.new(cfg())
    local a = m(ids({ { 3, 1, 4, 1, 5, 9, 2, 6 } })):totable()[1]
    local b = m(ids({ { 3, 1, 4, 1, 5, 7, 7, 7 } })):totable()[1]
    for t = 1, 5 do R.assert_close(b[t], a[t], 1e-6, 1e-6) end
    local differs = false
    for v = 1, 11 do if math.abs(a[6][v] - b[6][v]) > 1e-4 then differs = true end end
    assert.is_true(differs, "position 6 should see its own token")
  end)

  -- MHA weights equivalent to a GQA model: query head j uses kv head
  -- floor(j / n_rep) (0-based), so wk/wv rows are repeated per head group
  local function repeat_rows(w, n_kv, n_rep, hd)
    local rows, out = w:totable(), {}
    for j = 0, n_kv * n_rep - 1 do
      local kvh = math.floor(j / n_rep)
      for r = 1, hd do out[#out + 1] = rows[kvh * hd + r] end
    end
    return loom.tensor(out)
  end

  it("grouped-query attention matches multi-head attention with repeated kv heads", function()
    loom.manual_seed(4)
    local gqa = tr.new(cfg({ n_kv_heads = 2 }))
    local mha = tr.new(cfg({ n_kv_heads = 4 }))
    local sd = {}
    for k, v in pairs(gqa:state_dict()) do
      if k:find("attention%.w[kv]%.weight$") then sd[k] = repeat_rows(v, 2, 2, 4) else sd[k] = v end
    end
    mha:load_state_dict(sd)
    local x = ids({ { 1, 5, 2, 8, 3, 11, 4 }, { 7, 7, 1, 2, 9, 10, 6 } })
    R.assert_close(gqa(x):totable(), mha(x):totable(), 1e-5, 1e-5)
    -- n_kv_heads = 1 (multi-query) runs too
    assert.same({ 2, 7, 11 }, tr.new(cfg({ n_kv_heads = 1 }))(x):size())
  end)

  it("derives head counts and widths from the local weight shapes (a TP=2 split sums to the whole)", function()
    loom.manual_seed(5)
    local c = tr.config(cfg({ n_kv_heads = 2 }))
    local full_attn, full_ffn = tr.Attention(c), tr.FeedForward(c)
    local x = loom.tensor(R.rand({ 2, 6, 16 }))
    local cos, sin = loom.F.rope_tables(6, 4)
    local want_a, want_f = full_attn(x, cos, sin):totable(), full_ffn(x):totable()
    local sum_a, sum_f
    for r = 0, 1 do
      -- rank r holds q heads {2r, 2r+1}, kv head r, and wo's matching columns
      local a, f = tr.Attention(c), tr.FeedForward(c)
      a.wq.weight = nn.Parameter(full_attn.wq.weight:narrow(1, r * 8 + 1, 8):contiguous())
      a.wk.weight = nn.Parameter(full_attn.wk.weight:narrow(1, r * 4 + 1, 4):contiguous())
      a.wv.weight = nn.Parameter(full_attn.wv.weight:narrow(1, r * 4 + 1, 4):contiguous())
      a.wo.weight = nn.Parameter(full_attn.wo.weight:narrow(2, r * 8 + 1, 8):contiguous())
      local h = c.ffn_dim / 2
      f.w1.weight = nn.Parameter(full_ffn.w1.weight:narrow(1, r * h + 1, h):contiguous())
      f.w3.weight = nn.Parameter(full_ffn.w3.weight:narrow(1, r * h + 1, h):contiguous())
      f.w2.weight = nn.Parameter(full_ffn.w2.weight:narrow(2, r * h + 1, h):contiguous())
      local pa, pf = a(x, cos, sin), f(x)
      sum_a = sum_a and sum_a + pa or pa
      sum_f = sum_f and sum_f + pf or pf
    end
    R.assert_close(sum_a:totable(), want_a, 1e-5, 1e-5)
    R.assert_close(sum_f:totable(), want_f, 1e-5, 1e-5)
  end)

  it("tie_embeddings shares one weight between tok_embeddings and output", function()
    loom.manual_seed(6)
    local m = tr.new(cfg({ tie_embeddings = true }))
    assert.equal(m.tok_embeddings.weight, m.output.weight)
    local untied = tr.new(cfg())
    assert.equal(#untied:parameters() - 1, #m:parameters())
    local names = {}
    for _, kv in ipairs(m:named_parameters()) do names[kv[1]] = true end
    assert.is_true(names["tok_embeddings.weight"])
    assert.is_nil(names["output.weight"])
    -- the gradient of both uses lands in the one tensor
    loom.F.cross_entropy(m(ids({ { 1, 2, 3 } })), ids({ { 2, 3, 4 } })):backward()
    local g = m.tok_embeddings.weight.grad:totable()
    -- token 11 is never an input, so its row's gradient comes only from the output projection
    local nz = false
    for _, v in ipairs(g[11]) do if v ~= 0 then nz = true end end
    assert.is_true(nz)
  end)

  it("generate is reproducible under manual_seed", function()
    loom.manual_seed(7)
    local m = tr.new(cfg())
    local start = ids({ { 3 } })
    loom.manual_seed(42)
    local a = tr.generate(m, start, 20, { temperature = 0.8 })
    loom.manual_seed(42)
    local b = tr.generate(m, start, 20, { temperature = 0.8 })
    assert.equal(21, #a)
    assert.same(a, b)
    assert.equal(3, a[1])
    for _, id in ipairs(a) do assert.is_true(id >= 1 and id <= 11) end
    -- longer than max_seq_len: the context slides
    loom.manual_seed(42)
    assert.equal(31, #tr.generate(m, start, 30, { top_k = 3 }))
    assert.is_true(m.training)     -- the mode is restored
    loom.manual_seed(43)
    local c = tr.generate(m, start, 20, { temperature = 0.8 })
    assert.are_not.same(a, c)
  end)
end)
