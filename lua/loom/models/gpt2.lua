-- gpt2.lua: GPT-2 (learned position embeddings, pre-LayerNorm blocks with
-- biases, GELU-tanh MLP, lm_head tied to the token embedding), laid out so
-- tensor parallelism can shard it like the Llama transformer: attention
-- has separate q, k, v projections (Hugging Face's fused c_attn is split
-- when loading, see loom.models.hf) and takes its per-rank head count from
-- its weights' local shapes.
local loom = require "loom"
local nn = loom.nn
local F = loom.F
local T = require "loom.tensor"

local M = {}

local DEFAULTS = { vocab_size = 50257, n_positions = 1024, n_embd = 768, n_layer = 12, n_head = 12,
                   n_inner = nil, layer_norm_epsilon = 1e-5, dropout = 0 }

-- Fills defaults and checks the config; n_inner defaults to 4 * n_embd.
function M.config(cfg)
  local c = {}
  for k, v in pairs(DEFAULTS) do c[k] = v end
  for k, v in pairs(cfg or {}) do
    if DEFAULTS[k] == nil and k ~= "n_inner" then error(string.format("gpt2: unknown config key %q", k), 3) end
    c[k] = v
  end
  if c.n_embd % c.n_head ~= 0 then
    error(string.format("gpt2: n_embd (%d) must divide by n_head (%d)", c.n_embd, c.n_head), 3)
  end
  c.n_inner = c.n_inner or 4 * c.n_embd
  return c
end

local Attention = nn.Module:extend("GPT2Attention")
M.Attention = Attention
function Attention:__init(c)
  self.head_dim = c.n_embd / c.n_head
  self.q = nn.Linear(c.n_embd, c.n_embd)
  self.k = nn.Linear(c.n_embd, c.n_embd)
  self.v = nn.Linear(c.n_embd, c.n_embd)
  self.c_proj = nn.Linear(c.n_embd, c.n_embd)
end
-- cache (generation): {k, v} of (B, heads of this rank, T, hd) so far, as
-- the Llama model's (loom.models.transformer)
function Attention:forward(x, cache)
  local b, t, hd = x:size(1), x:size(2), self.head_dim
  local q = self.q(x):view(b, t, -1, hd):transpose(2, 3)   -- -1: the heads of this rank
  local k = self.k(x):view(b, t, -1, hd):transpose(2, 3)
  local v = self.v(x):view(b, t, -1, hd):transpose(2, 3)
  if cache then
    if cache.k then k, v = loom.cat({ cache.k, k }, 3), loom.cat({ cache.v, v }, 3) end
    cache.k, cache.v = k, v
  end
  local causal = k:size(3) == t
  if not causal and t > 1 then error("GPT2Attention: a cached step takes one token at a time", 3) end
  local o = F.scaled_dot_product_attention(q, k, v, { is_causal = causal })
  return self.c_proj(o:transpose(2, 3):reshape(b, t, -1))
end

local MLP = nn.Module:extend("GPT2MLP")
M.MLP = MLP
function MLP:__init(c)
  self.c_fc = nn.Linear(c.n_embd, c.n_inner)
  self.c_proj = nn.Linear(c.n_inner, c.n_embd)
end
function MLP:forward(x) return self.c_proj(F.gelu(self.c_fc(x), { approximate = "tanh" })) end

local Block = nn.Module:extend("GPT2Block")
M.Block = Block
function Block:__init(c)
  self.ln_1 = nn.LayerNorm(c.n_embd, { eps = c.layer_norm_epsilon })
  self.attn = Attention(c)
  self.ln_2 = nn.LayerNorm(c.n_embd, { eps = c.layer_norm_epsilon })
  self.mlp = MLP(c)
  if c.dropout > 0 then self.drop = nn.Dropout(c.dropout) end
end
function Block:forward(x, cache)
  local a = self.attn(self.ln_1(x), cache)
  if self.drop then a = self.drop(a) end
  local h = x + a
  local m = self.mlp(self.ln_2(h))
  if self.drop then m = self.drop(m) end
  return h + m
end

local GPT2 = nn.Module:extend("GPT2")
M.GPT2 = GPT2
function GPT2:__init(cfg)
  local c = M.config(cfg)
  self.config = c
  self.wte = nn.Embedding(c.vocab_size, c.n_embd)
  self.wpe = nn.Embedding(c.n_positions, c.n_embd)
  local h = {}
  for i = 1, c.n_layer do h[i] = Block(c) end
  self.h = nn.ModuleList(h)
  self.ln_f = nn.LayerNorm(c.n_embd, { eps = c.layer_norm_epsilon })
  self.lm_head = nn.Linear(c.n_embd, c.vocab_size, { bias = false })
  self.lm_head.weight = self.wte.weight   -- tied, as in GPT-2
end

-- forward(ids (B, T) i64, 1-based[, cache]) -> logits (B, T, vocab); with a
-- cache ({pos = 0}, then as this leaves it) ids continue the cached sequence
function GPT2:forward(ids, cache)
  T.check_tensor(ids, "GPT2", "ids")
  local t, start = ids:size(2), cache and cache.pos or 0
  if start + t > self.config.n_positions then
    error(string.format("GPT2: sequence length %d exceeds n_positions %d", start + t, self.config.n_positions), 2)
  end
  local pos = loom.arange(start + 1, start + t + 1, 1, { dtype = "i64", device = ids.device }):reshape(1, t)
  local x = self.wte(ids) + self.wpe(pos)
  for i, block in self.h:ipairs() do
    local c
    if cache then cache[i] = cache[i] or {} c = cache[i] end
    x = block(x, c)
  end
  if cache then cache.pos = start + t end
  return self.lm_head(self.ln_f(x))
end

-- generate(ids, opts): see loom.models.generate
function GPT2:generate(ids, opts) return require("loom.models.generate").generate(self, ids, opts) end

function M.new(cfg) return GPT2(cfg) end

-- tp_plan({loss_parallel}, model): Megatron's split: q/k/v and c_fc
-- Colwise, both c_proj Rowwise (their bias added once, after the
-- reduction), wte vocab-parallel (Rowwise) and lm_head Colwise; the tied
-- weight is Shard(1) in both. Position embeddings and LayerNorms stay
-- replicated. With tp given, n_head is checked against it.
function M.tp_plan(opts, model)
  opts = opts or {}
  local tp = require "loom.parallel"
  local Shard, Replicate = loom.distributed.Shard, loom.distributed.Replicate
  if model and opts.tp and model.config.n_head % opts.tp ~= 0 then
    error(string.format("tp_plan: n_head (%d) must divide by the tensor-parallel degree (%d)", model.config.n_head,
                        opts.tp), 2)
  end
  local lp = opts.loss_parallel
  return {
    ["h.*.attn.q"] = tp.ColwiseParallel{},
    ["h.*.attn.k"] = tp.ColwiseParallel{},
    ["h.*.attn.v"] = tp.ColwiseParallel{},
    ["h.*.attn.c_proj"] = tp.RowwiseParallel{},
    ["h.*.mlp.c_fc"] = tp.ColwiseParallel{},
    ["h.*.mlp.c_proj"] = tp.RowwiseParallel{},
    wte = tp.RowwiseParallel{ input_layouts = Replicate(), output_layouts = Replicate() },
    lm_head = tp.ColwiseParallel{ input_layouts = Replicate(), output_layouts = lp and Shard(-1) or Replicate(),
                                  use_local_output = not lp },
  }
end

return M
