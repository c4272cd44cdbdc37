-- transformer.lua: a Llama-style decoder (token embedding, RMSNorm,
-- rotary attention with wq/wk/wv/wo, SwiGLU feed-forward w1/w2/w3, output
-- projection). Attention and the feed-forward take their per-rank head
-- counts and widths from their weights' local shapes, so the same code runs
-- once tensor parallelism has sharded those weights.
local loom = require("loom")
local nn = loom.nn
local F = loom.F
local blocks = require("loom.models.blocks")

local M = {}

local DEFAULTS = { vocab_size = 65, dim = 128, n_layers = 4, n_heads = 4, n_kv_heads = nil,
                   ffn_dim = nil, multiple_of = 32, max_seq_len = 256, norm_eps = 1e-5,
                   rope_theta = 10000, dropout = 0, tie_embeddings = false }

-- Fills defaults and checks the config; ffn_dim defaults to Llama's
-- 2/3 * 4 * dim rounded up to a multiple of multiple_of.
function M.config(cfg)
  local c = blocks.config("transformer", DEFAULTS, cfg, { n_kv_heads = true, ffn_dim = true })
  c.n_kv_heads = c.n_kv_heads or c.n_heads
  if c.dim % c.n_heads ~= 0 then
    error(string.format("transformer: dim (%d) must divide by n_heads (%d)", c.dim, c.n_heads), 3)
  end
  if c.n_heads % c.n_kv_heads ~= 0 then
    error(string.format("transformer: n_heads (%d) must divide by n_kv_heads (%d)", c.n_heads, c.n_kv_heads), 3)
  end
  if (c.dim / c.n_heads) % 2 ~= 0 then error("transformer: the head dim must be even for rotary embeddings", 3) end
  c.ffn_dim = c.ffn_dim or c.multiple_of * math.ceil(math.floor(2 * 4 * c.dim / 3) / c.multiple_of)
  return c
end

local Attention = nn.Module:extend("Attention")
M.Attention = Attention
function Attention:__init(c)
  self.head_dim = c.dim / c.n_heads
  self.n_rep = c.n_heads / c.n_kv_heads
  self.wq = nn.Linear(c.dim, c.n_heads * self.head_dim, { bias = false })
  self.wk = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, { bias = false })
  self.wv = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, { bias = false })
  self.wo = nn.Linear(c.n_heads * self.head_dim, c.dim, { bias = false })
end

-- cache (generation): see loom.models.blocks.attend
function Attention:forward(x, cos, sin, cache)
  local q, k, v = blocks.qkv(x, self.wq, self.wk, self.wv, self.head_dim)
  q, k = F.apply_rotary_emb(q, cos, sin), F.apply_rotary_emb(k, cos, sin)
  return self.wo(blocks.attend("Attention", q, k, v, self.n_rep, cache))
end

local FeedForward = nn.Module:extend("FeedForward")
M.FeedForward = FeedForward
function FeedForward:__init(c)
  self.w1 = nn.Linear(c.dim, c.ffn_dim, { bias = false })
  self.w2 = nn.Linear(c.ffn_dim, c.dim, { bias = false })
  self.w3 = nn.Linear(c.dim, c.ffn_dim, { bias = false })
end
function FeedForward:forward(x) return self.w2(F.swiglu(self.w1(x), self.w3(x))) end

local Block = nn.Module:extend("TransformerBlock")
M.TransformerBlock = Block
function Block:__init(c)
  self.attention_norm = nn.RMSNorm(c.dim, { eps = c.norm_eps })
  self.attention = Attention(c)
  self.ffn_norm = nn.RMSNorm(c.dim, { eps = c.norm_eps })
  self.feed_forward = FeedForward(c)
  if c.dropout > 0 then
    self.attention_dropout = nn.Dropout(c.dropout)
    self.ffn_dropout = nn.Dropout(c.dropout)
  end
end
function Block:forward(x, cos, sin, cache)
  local h = blocks.residual(x, self.attention(self.attention_norm(x), cos, sin, cache), self.attention_dropout)
  return blocks.residual(h, self.feed_forward(self.ffn_norm(h)), self.ffn_dropout)
end

local Transformer = nn.Module:extend("Transformer")
M.Transformer = Transformer
function Transformer:__init(cfg)
  local c = M.config(cfg)
  self.config = c
  self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
  self.layers = blocks.stack(Block, c, c.n_layers)
  self.norm = nn.RMSNorm(c.dim, { eps = c.norm_eps })
  self.output = nn.Linear(c.dim, c.vocab_size,
                          { bias = false, weight = c.tie_embeddings and self.tok_embeddings.weight or nil })
  -- rotary tables: buffers that move with the model, not state (computed
  -- from the config)
  local cos, sin = F.rope_tables(c.max_seq_len, c.dim / c.n_heads, { theta = c.rope_theta })
  self:register_buffer("rope_cos", cos, { persistent = false })
  self:register_buffer("rope_sin", sin, { persistent = false })
end

-- the rotary tables again, where they live (after to_empty, say)
function Transformer:reset_parameters()
  local c = self.config
  local cos, sin = F.rope_tables(c.max_seq_len, c.dim / c.n_heads,
                                 { theta = c.rope_theta, device = self.rope_cos.device, dtype = self.rope_cos.dtype })
  self.rope_cos, self.rope_sin = cos, sin
end

-- forward(ids (B, T) i64, 1-based[, cache]) -> logits (B, T, vocab). With
-- a cache ({pos = 0}, then as this leaves it) ids continue the cached
-- sequence: the rotary angles start at cache.pos (see loom.models.generate).
function Transformer:forward(ids, cache)
  local t, pos = blocks.span("Transformer", ids, cache, self.config.max_seq_len, "max_seq_len")
  local cos, sin = self.rope_cos:narrow(1, pos + 1, t), self.rope_sin:narrow(1, pos + 1, t)
  local h = blocks.run_layers(self.layers, self.tok_embeddings(ids), cache, t, cos, sin)
  return self.output(self.norm(h))
end

-- generate(ids, {max_new_tokens, temperature, top_k, top_p, seed, ...}):
-- see loom.models.generate (a KV cache; greedy unless sampling is asked)
Transformer.generate = blocks.generate

-- new(cfg): the model; build it inside loom.device("meta"):use(...) to get
-- its shapes without memory, then parallelise, to_empty and init_weights.
function M.new(cfg) return Transformer(cfg) end

-- tp_plan({sequence_parallel, loss_parallel, tp}): the tensor-parallel plan of
-- the model, as in PyTorch's Llama example: the embedding Rowwise (vocab
-- parallel), wq/wk/wv and w1/w3 Colwise, wo and w2 Rowwise, the norms
-- SequenceParallel when asked, the output Colwise (kept as a DTensor sharded
-- on the vocabulary for loss_parallel). With tp given, the head counts are
-- checked against it.
function M.tp_plan(opts, model)
  return blocks.tp_plan({
    colwise = { "layers.*.attention.wq", "layers.*.attention.wk", "layers.*.attention.wv",
                "layers.*.feed_forward.w1", "layers.*.feed_forward.w3" },
    rowwise = { "layers.*.attention.wo", "layers.*.feed_forward.w2" },
    embedding = "tok_embeddings", output = "output",
    norms = { "layers.*.attention_norm", "layers.*.ffn_norm", "norm" },
    gathered = { ["layers.*.attention"] = 3, ["layers.*.feed_forward"] = 1 },   -- (x, cos, sin) and (x)
  }, opts, model and { { "n_heads", model.config.n_heads }, { "n_kv_heads", model.config.n_kv_heads } })
end

-- n ids sampled after out (appended to it), with no gradient; the ids go
-- where the model's parameters are (an op never copies across devices)
local function sample(model, out, n, temp, opts)
  local p1 = model:parameters()[1]
  local device = p1.dist ~= nil and p1:to_local().device or p1.device
  for _ = 1, n do
    local ctx = { unpack(out, math.max(1, #out - model.config.max_seq_len + 1)) }
    local logits = model(loom.tensor({ ctx }, { dtype = "i64" }):to(device))
    local last = logits:narrow(2, #ctx, 1):reshape(-1)
    if last.dist ~= nil then last = last:full_tensor() end   -- vocabulary-sharded logits
    local probs = (last * (1 / temp)):softmax(1):totable()
    if opts.top_k then
      local sorted = { unpack(probs) }
      table.sort(sorted, function(a, b) return a > b end)
      local cut = sorted[math.min(opts.top_k, #sorted)]
      for i, p in ipairs(probs) do if p < cut then probs[i] = 0 end end
    end
    local total = 0
    for _, p in ipairs(probs) do total = total + p end
    local u, acc, pick = loom.rand(1):item() * total, 0, #probs
    for i, p in ipairs(probs) do
      acc = acc + p
      if u < acc then pick = i break end
    end
    out[#out + 1] = pick
  end
end

-- generate(model, ids (1, T), n, {temperature=1, top_k}): appends n sampled
-- ids; the draws come from loom's RNG (loom.manual_seed reproduces them).
function M.generate(model, ids, n, opts)
  opts = opts or {}
  local temp = opts.temperature or 1
  local was_training = model.training
  model:eval()
  local out = ids:totable()[1]
  loom.no_grad(sample, model, out, n, temp, opts)
  model:train(was_training)
  return out
end

return M
