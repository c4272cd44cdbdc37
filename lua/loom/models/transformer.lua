-- transformer.lua: a Llama-style decoder (token embedding, RMSNorm,
-- rotary attention with wq/wk/wv/wo, gated feed-forward w1/w2/w3, output
-- projection), and the variations of it that the families people
-- fine-tune make (loom.models.hf reads them from their configs):
--   head_dim          heads of their own width (Gemma, Qwen3), not dim / n_heads
--   qkv_bias          biases on wq, wk, wv (Qwen2)
--   qk_norm           "head": RMSNorm of each head of q and k before RoPE
--                     (Qwen3); "proj": of the whole q and k projections (OLMo 2)
--   norm_offset       RMSNorm scales by (offset + weight), weights from zeros (Gemma: 1)
--   act               the gate's activation: "silu" (SwiGLU) or "gelu_tanh" (Gemma's GeGLU)
--   embed_scale       the embedding output times this (Gemma: sqrt(dim))
--   post_norm         norms after attention and feed-forward, not before (OLMo 2)
--   sliding_window    a query sees the last sliding_window keys (Mistral, Phi-3)
--   rope_scaling      Llama 3.1's frequency scaling ({rope_type = "llama3", ...})
--   moe               a mixture of experts for every feed-forward (Mixtral,
--                     Qwen3-MoE): {experts, top_k, hidden, norm_topk_prob,
--                     aux_loss_coef} (loom.nn.MoE); the model's aux_loss()
--                     is the load-balancing loss over all its layers
-- Attention and the feed-forward take their per-rank head counts and widths
-- from their weights' local shapes, so the same code runs once tensor
-- parallelism has sharded those weights.
local loom = require("loom")
local nn = loom.nn
local F = loom.F
local blocks = require("loom.models.blocks")

local M = {}

local DEFAULTS = { vocab_size = 65, dim = 128, n_layers = 4, n_heads = 4, multiple_of = 32, max_seq_len = 256,
                   norm_eps = 1e-5, rope_theta = 10000, dropout = 0, tie_embeddings = false, qkv_bias = false,
                   norm_offset = 0, act = "silu", post_norm = false }
local OPTIONAL = { n_kv_heads = true, ffn_dim = true, head_dim = true, qk_norm = true, embed_scale = true,
                   sliding_window = true, rope_scaling = true, moe = true,
                   -- what a Hugging Face checkpoint said, kept for saving it back (loom.models.hf)
                   model_type = true, bos_token_id = true, eos_token_id = true, pad_token_id = true }

local function fail(fmt, ...) error("transformer: " .. string.format(fmt, ...), 4) end

-- Fills defaults and checks the config; ffn_dim defaults to Llama's
-- 2/3 * 4 * dim rounded up to a multiple of multiple_of.
function M.config(cfg)
  local c = blocks.config("transformer", DEFAULTS, cfg, OPTIONAL)
  c.n_kv_heads = c.n_kv_heads or c.n_heads
  if not c.head_dim and c.dim % c.n_heads ~= 0 then
    fail("dim (%d) must divide by n_heads (%d)", c.dim, c.n_heads)
  end
  c.head_dim = c.head_dim or c.dim / c.n_heads
  if c.n_heads % c.n_kv_heads ~= 0 then fail("n_heads (%d) must divide by n_kv_heads (%d)", c.n_heads, c.n_kv_heads) end
  if c.head_dim % 2 ~= 0 then fail("the head dim must be even for rotary embeddings, got %d", c.head_dim) end
  if c.qk_norm ~= nil and c.qk_norm ~= "head" and c.qk_norm ~= "proj" then
    fail("qk_norm expects nil, \"head\" or \"proj\", got %s", tostring(c.qk_norm))
  end
  if c.act ~= "silu" and c.act ~= "gelu_tanh" then fail("act expects \"silu\" or \"gelu_tanh\", got %s", tostring(c.act)) end
  if c.sliding_window ~= nil and (type(c.sliding_window) ~= "number" or c.sliding_window < 1 or c.sliding_window % 1 ~= 0) then
    fail("sliding_window expects a positive integer, got %s", tostring(c.sliding_window))
  end
  c.ffn_dim = c.ffn_dim or c.multiple_of * math.ceil(math.floor(2 * 4 * c.dim / 3) / c.multiple_of)
  if c.moe ~= nil then
    local m = c.moe
    if type(m) ~= "table" then fail("moe expects {experts, top_k, hidden, norm_topk_prob, aux_loss_coef}, got %s", tostring(m)) end
    for _, k in ipairs { "experts", "top_k" } do
      if type(m[k]) ~= "number" or m[k] < 1 or m[k] % 1 ~= 0 then fail("moe.%s expects a positive integer, got %s", k, tostring(m[k])) end
    end
    if m.top_k > m.experts then fail("moe.top_k (%d) exceeds moe.experts (%d)", m.top_k, m.experts) end
  end
  return c
end

local function norm(c, n) return nn.RMSNorm(n, { eps = c.norm_eps, offset = c.norm_offset }) end

local Attention = nn.Module:extend("Attention")
M.Attention = Attention
function Attention:__init(c)
  local hd = c.head_dim
  self.head_dim = hd
  self.n_rep = c.n_heads / c.n_kv_heads
  self.window = c.sliding_window
  self.wq = nn.Linear(c.dim, c.n_heads * hd, { bias = c.qkv_bias })
  self.wk = nn.Linear(c.dim, c.n_kv_heads * hd, { bias = c.qkv_bias })
  self.wv = nn.Linear(c.dim, c.n_kv_heads * hd, { bias = c.qkv_bias })
  self.wo = nn.Linear(c.n_heads * hd, c.dim, { bias = false })
  if c.qk_norm then
    self.per_head = c.qk_norm == "head"
    self.q_norm = norm(c, self.per_head and hd or c.n_heads * hd)
    self.k_norm = norm(c, self.per_head and hd or c.n_kv_heads * hd)
  end
end

-- cache (generation): see loom.models.blocks.attend
function Attention:forward(x, cos, sin, cache)
  local b, t, hd = x:size(1), x:size(2), self.head_dim
  local q, k, v = self.wq(x), self.wk(x), self.wv(x)
  if self.q_norm and not self.per_head then q, k = self.q_norm(q), self.k_norm(k) end
  q, k, v = blocks.heads(q, b, t, hd), blocks.heads(k, b, t, hd), blocks.heads(v, b, t, hd)
  if self.per_head then q, k = self.q_norm(q), self.k_norm(k) end
  q, k = F.apply_rotary_emb(q, cos, sin), F.apply_rotary_emb(k, cos, sin)
  return self.wo(blocks.attend("Attention", q, k, v, self.n_rep, cache, self.window))
end

local FeedForward = nn.Module:extend("FeedForward")
M.FeedForward = FeedForward
function FeedForward:__init(c)
  self.act = c.act
  self.w1 = nn.Linear(c.dim, c.ffn_dim, { bias = false })
  self.w2 = nn.Linear(c.ffn_dim, c.dim, { bias = false })
  self.w3 = nn.Linear(c.dim, c.ffn_dim, { bias = false })
end
function FeedForward:forward(x)
  if self.act == "gelu_tanh" then return self.w2(F.gelu(self.w1(x), { approximate = "tanh" }) * self.w3(x)) end
  return self.w2(F.swiglu(self.w1(x), self.w3(x)))
end

-- the feed-forward of a block: gated MLP, or a mixture of experts
local function feed_forward(c)
  if not c.moe then return FeedForward(c) end
  local m = c.moe
  return nn.MoE { dim = c.dim, hidden = m.hidden or c.ffn_dim, experts = m.experts, top_k = m.top_k,
                  norm_topk_prob = m.norm_topk_prob ~= false }
end

local Block = nn.Module:extend("TransformerBlock")
M.TransformerBlock = Block
function Block:__init(c)
  self.post_norm = c.post_norm
  self.attention_norm = norm(c, c.dim)
  self.attention = Attention(c)
  self.ffn_norm = norm(c, c.dim)
  self.feed_forward = feed_forward(c)
  if c.dropout > 0 then
    self.attention_dropout = nn.Dropout(c.dropout)
    self.ffn_dropout = nn.Dropout(c.dropout)
  end
end
function Block:forward(x, cos, sin, cache)
  if self.post_norm then   -- OLMo 2: each sub-layer's output normed, then added
    local h = blocks.residual(x, self.attention_norm(self.attention(x, cos, sin, cache)), self.attention_dropout)
    return blocks.residual(h, self.ffn_norm(self.feed_forward(h)), self.ffn_dropout)
  end
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
  self.norm = norm(c, c.dim)
  self.output = nn.Linear(c.dim, c.vocab_size,
                          { bias = false, weight = c.tie_embeddings and self.tok_embeddings.weight or nil })
  -- rotary tables: buffers that move with the model, not state (computed
  -- from the config)
  local cos, sin = F.rope_tables(c.max_seq_len, c.head_dim, { theta = c.rope_theta, scaling = c.rope_scaling })
  self:register_buffer("rope_cos", cos, { persistent = false })
  self:register_buffer("rope_sin", sin, { persistent = false })
end

-- the rotary tables again, where they live (after to_empty, say)
function Transformer:reset_parameters()
  local c = self.config
  local cos, sin = F.rope_tables(c.max_seq_len, c.head_dim, { theta = c.rope_theta, scaling = c.rope_scaling,
                                                               device = self.rope_cos.device, dtype = self.rope_cos.dtype })
  self.rope_cos, self.rope_sin = cos, sin
end

-- The three steps of a forward, which a pipeline stage holding some of
-- the parts runs too (they read only the parts and buffers they name):
-- the embedding of ids, the rotary tables of positions pos+1..pos+t (the
-- blocks' extra inputs), the head over the last hidden states.
function Transformer:embed(ids)
  local h = self.tok_embeddings(ids)
  if self.config.embed_scale then h = h * self.config.embed_scale end
  return h
end
function Transformer:layer_args(pos, t) return self.rope_cos:narrow(1, pos + 1, t), self.rope_sin:narrow(1, pos + 1, t) end
function Transformer:head(h) return self.output(self.norm(h)) end

-- forward(ids (B, T) i64, 1-based[, cache]) -> logits (B, T, vocab). With
-- a cache ({pos = 0}, then as this leaves it) ids continue the cached
-- sequence: the rotary angles start at cache.pos (see loom.models.generate).
function Transformer:forward(ids, cache)
  local t, pos = blocks.span("Transformer", ids, cache, self.config.max_seq_len, "max_seq_len")
  local cos, sin = self:layer_args(pos, t)
  return self:head(blocks.run_layers(self.layers, self:embed(ids), cache, t, cos, sin))
end

-- aux_loss() -> the mixture of experts' load-balancing loss of the last
-- forward over all the layers (transformers' load_balancing_loss_func of
-- the router logits), times moe.aux_loss_coef; nil for a dense model or a
-- coefficient of 0 (the training loop adds it to the loss)
function Transformer:aux_loss()
  local m = self.config.moe
  if not m or not m.aux_loss_coef or m.aux_loss_coef == 0 then return nil end
  local logits = {}
  for i, layer in self.layers:ipairs() do logits[i] = layer.feed_forward.router_logits end
  return require("loom.nn.moe").load_balancing_loss(logits, m.experts, m.top_k) * m.aux_loss_coef
end

-- generate(ids, {max_new_tokens, temperature, top_k, top_p, seed, ...}):
-- see loom.models.generate (a KV cache; greedy unless sampling is asked)
Transformer.generate = blocks.generate

-- new(cfg): the model; build it inside loom.device("meta"):use(...) to get
-- its shapes without memory, then parallelise, to_empty and init_weights.
function M.new(cfg) return Transformer(cfg) end

-- tp_plan({sequence_parallel, loss_parallel, async_tp, tp, expert_tp}): the
-- tensor-parallel plan of the model, as in PyTorch's Llama example: the
-- embedding Rowwise (vocab parallel), wq/wk/wv and w1/w3 Colwise, wo and w2
-- Rowwise, the norms SequenceParallel when asked, the output Colwise (kept
-- as a DTensor sharded on the vocabulary for loss_parallel); async_tp (with
-- sequence_parallel) overlaps the gathers and reduce-scatters with the
-- matmuls (loom.models.blocks.tp_plan); expert_tp cuts a mixture of
-- experts' experts over tp (ExpertTensorParallel). With tp given, the head
-- counts are checked against it.
function M.tp_plan(opts, model)
  local qk = model and model.config.qk_norm
  local qk_norms = { "layers.*.attention.q_norm", "layers.*.attention.k_norm" }
  -- (a mixture of experts runs whole on each rank: tensor parallelism
  -- cuts the attention, expert parallelism the experts; with expert_tp
  -- each expert's hidden dim is cut over tp too)
  local moe = model and model.config.moe
  local colwise = { "layers.*.attention.wq", "layers.*.attention.wk", "layers.*.attention.wv" }
  local rowwise = { "layers.*.attention.wo" }
  if not moe then
    colwise[#colwise + 1], colwise[#colwise + 2] = "layers.*.feed_forward.w1", "layers.*.feed_forward.w3"
    rowwise[#rowwise + 1] = "layers.*.feed_forward.w2"
  end
  return blocks.tp_plan({
    colwise = colwise, rowwise = rowwise,
    embedding = "tok_embeddings", output = "output",
    norms = { "layers.*.attention_norm", "layers.*.ffn_norm", "norm" },
    gathered = { ["layers.*.attention"] = 3, ["layers.*.feed_forward"] = not moe and 1 or nil },   -- (x, cos, sin) and (x)
    whole = moe and { "layers.*.feed_forward" } or nil, experts = moe and { "layers.*.feed_forward.experts" } or nil,
    head_norms = qk == "head" and qk_norms or nil, proj_norms = qk == "proj" and qk_norms or nil,
    residual_norms = model and model.config.post_norm and { "layers.*.attention_norm", "layers.*.ffn_norm" } or nil,
  }, opts, model and { { "n_heads", model.config.n_heads }, { "n_kv_heads", model.config.n_kv_heads } })
end

-- the family's recipe (loom.models.recipe): what parallelism needs from it
M.recipe = require("loom.models.recipe").decoder {
  name = "llama", class = Transformer, blocks = "layers", first = { "tok_embeddings" }, last = { "norm", "output" },
  buffers = { "rope_cos", "rope_sin" }, cp_buffers = { { "rope_cos", 1 }, { "rope_sin", 1 } }, tp_plan = M.tp_plan,
  tied = function(c) return c.tie_embeddings and { { "output.weight", "tok_embeddings.weight" } } or nil end,
  dims = function(c) return { layers = c.n_layers, hidden = c.dim, heads = c.n_heads } end,
  experts = function(block) return block.feed_forward.__name == "MoE" and block.feed_forward.experts or nil end,
}
require("loom.models.recipe").install(Transformer, M.recipe)

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
