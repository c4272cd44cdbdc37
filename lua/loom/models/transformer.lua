-- transformer.lua: a Llama-style decoder (token embedding, RMSNorm,
-- rotary attention with wq/wk/wv/wo, SwiGLU feed-forward w1/w2/w3, output
-- projection). Attention and the feed-forward take their per-rank head
-- counts and widths from their weights' local shapes, so the same code runs
-- once tensor parallelism has sharded those weights.
local loom = require "loom"
local nn = loom.nn
local F = loom.F
local T = require "loom.tensor"

local M = {}

local DEFAULTS = { vocab_size = 65, dim = 128, n_layers = 4, n_heads = 4, n_kv_heads = nil,
                   ffn_dim = nil, multiple_of = 32, max_seq_len = 256, norm_eps = 1e-5,
                   rope_theta = 10000, dropout = 0, tie_embeddings = false }

-- Fills defaults and checks the config; ffn_dim defaults to Llama's
-- 2/3 * 4 * dim rounded up to a multiple of multiple_of.
function M.config(cfg)
  cfg = cfg or {}
  local c = {}
  for k, v in pairs(DEFAULTS) do c[k] = v end
  for k, v in pairs(cfg) do
    if DEFAULTS[k] == nil and k ~= "n_kv_heads" and k ~= "ffn_dim" then
      error(string.format("transformer: unknown config key %q", k), 3)
    end
    c[k] = v
  end
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

-- (B, T, kv, hd) -> (B, T, kv * n_rep, hd), each kv head repeated n_rep times
local function repeat_kv(x, n_rep)
  if n_rep == 1 then return x end
  local b, t, kv, hd = unpack(x:size())
  return x:unsqueeze(4):expand(b, t, kv, n_rep, hd):reshape(b, t, kv * n_rep, hd)
end

-- cache (generation): this layer's keys and values so far, {k, v} of
-- (B, T, heads of this rank, hd), extended here; then attention is causal
-- only when the queries are the whole sequence (a prefill), and a decoded
-- token attends to every cached position.
function Attention:forward(x, cos, sin, cache)
  local b, t = x:size(1), x:size(2)
  local hd = self.head_dim
  -- -1: the heads this rank holds, whatever the TP degree
  local q = self.wq(x):view(b, t, -1, hd)
  local k = self.wk(x):view(b, t, -1, hd)
  local v = self.wv(x):view(b, t, -1, hd)
  q, k = F.apply_rotary_emb(q, cos, sin), F.apply_rotary_emb(k, cos, sin)
  if cache then
    if cache.k then k, v = loom.cat({ cache.k, k }, 2), loom.cat({ cache.v, v }, 2) end
    cache.k, cache.v = k, v
  end
  local causal = k:size(2) == t
  if not causal and t > 1 then error("Attention: a cached step takes one token at a time", 3) end
  k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)
  q, k, v = q:transpose(2, 3), k:transpose(2, 3), v:transpose(2, 3)
  local o = F.scaled_dot_product_attention(q, k, v, { is_causal = causal })
  return self.wo(o:transpose(2, 3):reshape(b, t, -1))
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
  local a = self.attention(self.attention_norm(x), cos, sin, cache)
  if self.attention_dropout then a = self.attention_dropout(a) end
  local h = x + a
  local f = self.feed_forward(self.ffn_norm(h))
  if self.ffn_dropout then f = self.ffn_dropout(f) end
  return h + f
end

local Transformer = nn.Module:extend("Transformer")
M.Transformer = Transformer
function Transformer:__init(cfg)
  local c = M.config(cfg)
  self.config = c
  self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
  local layers = {}
  for i = 1, c.n_layers do layers[i] = Block(c) end
  self.layers = nn.ModuleList(layers)
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
  T.check_tensor(ids, "Transformer", "ids")
  local t, pos = ids:size(2), cache and cache.pos or 0
  if pos + t > self.config.max_seq_len then
    error(string.format("Transformer: sequence length %d exceeds max_seq_len %d", pos + t, self.config.max_seq_len), 2)
  end
  local cos, sin = self.rope_cos:narrow(1, pos + 1, t), self.rope_sin:narrow(1, pos + 1, t)
  local h = self.tok_embeddings(ids)
  for i, layer in self.layers:ipairs() do
    local c
    if cache then cache[i] = cache[i] or {} c = cache[i] end
    h = layer(h, cos, sin, c)
  end
  if cache then cache.pos = pos + t end
  return self.output(self.norm(h))
end

-- generate(ids, {max_new_tokens, temperature, top_k, top_p, seed, ...}):
-- see loom.models.generate (a KV cache; greedy unless sampling is asked)
function Transformer:generate(ids, opts) return require("loom.models.generate").generate(self, ids, opts) end

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
  opts = opts or {}
  local tp = require "loom.parallel"
  local dt = require "loom.distributed.dtensor"
  local Shard, Replicate = dt.Shard, dt.Replicate
  if model and opts.tp then
    local c = model.config
    for _, kv in ipairs { { "n_heads", c.n_heads }, { "n_kv_heads", c.n_kv_heads } } do
      if kv[2] % opts.tp ~= 0 then
        error(string.format("tp_plan: %s (%d) must divide by the tensor-parallel degree (%d)", kv[1], kv[2], opts.tp), 2)
      end
    end
  end
  local sp, lp = opts.sequence_parallel, opts.loss_parallel
  local plan = {
    ["layers.*.attention.wq"] = tp.ColwiseParallel{},
    ["layers.*.attention.wk"] = tp.ColwiseParallel{},
    ["layers.*.attention.wv"] = tp.ColwiseParallel{},
    ["layers.*.attention.wo"] = tp.RowwiseParallel{ output_layouts = sp and Shard(2) or nil },
    ["layers.*.feed_forward.w1"] = tp.ColwiseParallel{},
    ["layers.*.feed_forward.w2"] = tp.RowwiseParallel{ output_layouts = sp and Shard(2) or nil },
    ["layers.*.feed_forward.w3"] = tp.ColwiseParallel{},
    tok_embeddings = tp.RowwiseParallel{ input_layouts = Replicate(), output_layouts = sp and Shard(2) or Replicate() },
    output = tp.ColwiseParallel{ input_layouts = sp and Shard(2) or Replicate(),
                                 output_layouts = lp and Shard(-1) or Replicate(), use_local_output = not lp },
  }
  if sp then
    plan["layers.*.attention_norm"] = tp.SequenceParallel{}
    plan["layers.*.ffn_norm"] = tp.SequenceParallel{}
    plan.norm = tp.SequenceParallel{}
    plan["layers.*.attention"] = tp.PrepareModuleInput{ input_layouts = { Shard(2), n = 3 },
                                                         desired_input_layouts = { Replicate(), n = 3 } }
    plan["layers.*.feed_forward"] = tp.PrepareModuleInput{ input_layouts = { Shard(2) },
                                                            desired_input_layouts = { Replicate() } }
  end
  return plan
end

-- generate(model, ids (1, T), n, {temperature=1, top_k}): appends n sampled
-- ids; the draws come from loom's RNG (loom.manual_seed reproduces them).
function M.generate(model, ids, n, opts)
  opts = opts or {}
  local temp = opts.temperature or 1
  local was_training = model.training
  model:eval()
  local out = ids:totable()[1]
  loom.no_grad(function()
    for _ = 1, n do
      local ctx = { unpack(out, math.max(1, #out - model.config.max_seq_len + 1)) }
      local logits = model(loom.tensor({ ctx }, { dtype = "i64" }))
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
  end)
  model:train(was_training)
  return out
end

return M
