-- gpt2.lua: GPT-2 (learned position embeddings, pre-LayerNorm blocks with
-- biases, GELU-tanh MLP, lm_head tied to the token embedding), laid out so
-- tensor parallelism can shard it like the Llama transformer: attention
-- has separate q, k, v projections (Hugging Face's fused c_attn is split
-- when loading, see loom.models.hf) and takes its per-rank head count from
-- its weights' local shapes.
local loom = require("loom")
local nn = loom.nn
local F = loom.F
local blocks = require("loom.models.blocks")

local M = {}

local DEFAULTS = { vocab_size = 50257, n_positions = 1024, n_embd = 768, n_layer = 12, n_head = 12,
                   n_inner = nil, layer_norm_epsilon = 1e-5, dropout = 0 }

-- Fills defaults and checks the config; n_inner defaults to 4 * n_embd.
function M.config(cfg)
  local c = blocks.config("gpt2", DEFAULTS, cfg, { n_inner = true })
  if c.n_embd % c.n_head ~= 0 then
    error(string.format("gpt2: n_embd (%d) must divide by n_head (%d)", c.n_embd, c.n_head), 3)
  end
  c.n_inner = c.n_inner or 4 * c.n_embd
  return c
end

local Attention = nn.Module:extend("GPT2Attention")
M.Attention = Attention
-- GPT-2's init: every weight N(0, 0.02^2), biases zero, the projections
-- back to the residual stream scaled by 1/sqrt(2 n_layer) (the paper's)
local STD = 0.02
local function proj_std(c) return STD / math.sqrt(2 * c.n_layer) end

function Attention:__init(c)
  self.head_dim = c.n_embd / c.n_head
  self.q = nn.Linear(c.n_embd, c.n_embd, { init_std = STD })
  self.k = nn.Linear(c.n_embd, c.n_embd, { init_std = STD })
  self.v = nn.Linear(c.n_embd, c.n_embd, { init_std = STD })
  self.c_proj = nn.Linear(c.n_embd, c.n_embd, { init_std = proj_std(c) })
end
-- cache (generation): see loom.models.blocks.attend
function Attention:forward(x, cache)
  local q, k, v = blocks.qkv(x, self.q, self.k, self.v, self.head_dim)
  return self.c_proj(blocks.attend("GPT2Attention", q, k, v, 1, cache))
end

local MLP = nn.Module:extend("GPT2MLP")
M.MLP = MLP
function MLP:__init(c)
  self.c_fc = nn.Linear(c.n_embd, c.n_inner, { init_std = STD })
  self.c_proj = nn.Linear(c.n_inner, c.n_embd, { init_std = proj_std(c) })
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
  local h = blocks.residual(x, self.attn(self.ln_1(x), cache), self.drop)
  return blocks.residual(h, self.mlp(self.ln_2(h)), self.drop)
end

local GPT2 = nn.Module:extend("GPT2")
M.GPT2 = GPT2
function GPT2:__init(cfg)
  local c = M.config(cfg)
  self.config = c
  self.wte = nn.Embedding(c.vocab_size, c.n_embd, { init_std = STD })
  self.wpe = nn.Embedding(c.n_positions, c.n_embd, { init_std = 0.01 })
  self.h = blocks.stack(Block, c, c.n_layer)
  self.ln_f = nn.LayerNorm(c.n_embd, { eps = c.layer_norm_epsilon })
  self.lm_head = nn.Linear(c.n_embd, c.vocab_size, { bias = false })
  self.lm_head.weight = self.wte.weight   -- tied, as in GPT-2
  -- the position ids 1..n_positions, a buffer (not state) that moves with
  -- the model and that context parallelism cuts like the sequence
  self:register_buffer("pos_ids", loom.arange(1, c.n_positions + 1, 1, { dtype = "i64" }), { persistent = false })
end

-- the position ids again, where they live (after to_empty, say)
function GPT2:reset_parameters()
  self.pos_ids = loom.arange(1, self.config.n_positions + 1, 1, { dtype = "i64", device = self.pos_ids.device })
end

-- The three steps of a forward, which a pipeline stage holding some of
-- the parts runs too: token and position embeddings of ids at positions
-- pos+1..pos+T, the blocks' extra inputs (none), the head.
function GPT2:embed(ids, pos)
  local t = ids:size(2)
  return self.wte(ids) + self.wpe(self.pos_ids:narrow(1, (pos or 0) + 1, t):view(1, t))
end
function GPT2.layer_args() end
function GPT2:head(h) return self.lm_head(self.ln_f(h)) end

-- forward(ids (B, T) i64, 1-based[, cache]) -> logits (B, T, vocab); with a
-- cache ({pos = 0}, then as this leaves it) ids continue the cached sequence
function GPT2:forward(ids, cache)
  local t, start = blocks.span("GPT2", ids, cache, self.config.n_positions, "n_positions")
  return self:head(blocks.run_layers(self.h, self:embed(ids, start), cache, t))
end

-- generate(ids, opts): see loom.models.generate
GPT2.generate = blocks.generate

function M.new(cfg) return GPT2(cfg) end

-- tp_plan({sequence_parallel, loss_parallel, async_tp, tp}, model):
-- Megatron's split: q/k/v and c_fc Colwise, both c_proj Rowwise (their
-- bias added once, after the reduction), wte vocab-parallel (Rowwise) and
-- lm_head Colwise; the tied weight is Shard(1) in both. Position
-- embeddings stay replicated (with sequence parallelism their output is
-- cut to the sequence shards, like wte's); the LayerNorms replicated, or
-- SequenceParallel. With tp given, n_head is checked against it.
function M.tp_plan(opts, model)
  return blocks.tp_plan({ colwise = { "h.*.attn.q", "h.*.attn.k", "h.*.attn.v", "h.*.mlp.c_fc" },
                          rowwise = { "h.*.attn.c_proj", "h.*.mlp.c_proj" }, embedding = "wte", output = "lm_head",
                          norms = { "h.*.ln_1", "h.*.ln_2", "ln_f" }, seq_sharded = { "wpe" },
                          gathered = { ["h.*.attn"] = 1, ["h.*.mlp"] = 1 } },   -- q, k and v read one input: one all-reduce
                        opts, model and { { "n_head", model.config.n_head } })
end

-- the family's recipe (loom.models.recipe): what parallelism needs from it
M.recipe = require("loom.models.recipe").decoder {
  name = "gpt2", class = GPT2, blocks = "h", first = { "wte", "wpe" }, last = { "ln_f", "lm_head" },
  buffers = { "pos_ids" }, cp_buffers = { { "pos_ids", 1 } }, tp_plan = M.tp_plan,
  tied = function() return { { "lm_head.weight", "wte.weight" } } end,
  dims = function(c) return { layers = c.n_layer, hidden = c.n_embd, heads = c.n_head } end,
}
require("loom.models.recipe").install(GPT2, M.recipe)

return M
