-- model.lua: the model of a training run: its family and config, from the
-- flags (--model, --dim, --layers, --heads, --kv-heads, --seq, --dropout),
-- from a Hugging Face checkpoint (--init-from: its config.json says which
-- family), or from the checkpoint a run resumes; then built on its device,
-- cut into this rank's pipeline stage and laid out through its family's
-- recipe (loom.models.recipe), with the layout's prediction made first.
local loom = require("loom")
local L = require("loom.train.layout")

local M = {}

-- from_flags(o, vocab) -> family, config of the model the flags describe
function M.from_flags(o, vocab)
  if o.model == "gpt2" then
    if o.experts > 0 then error("train.lua: --experts builds a llama-style mixture of experts, not --model gpt2", 0) end
    return "gpt2", { vocab_size = vocab, n_positions = o.seq, n_embd = o.dim, n_layer = o.layers, n_head = o.heads,
                     dropout = o.dropout }
  end
  if o.model ~= "llama" then error("train.lua: --model expects llama or gpt2, got " .. tostring(o.model), 0) end
  local moe = o.experts > 0 and { experts = o.experts, top_k = o["top-k"], norm_topk_prob = true,
                                  aux_loss_coef = o["aux-loss-coef"] } or nil
  if moe and moe.top_k > moe.experts then
    error(string.format("train.lua: --top-k %d must not exceed --experts %d", moe.top_k, moe.experts), 0)
  end
  return "llama", { vocab_size = vocab, dim = o.dim, n_layers = o.layers, n_heads = o.heads,
                    n_kv_heads = o["kv-heads"] > 0 and o["kv-heads"] or nil, max_seq_len = o.seq, dropout = o.dropout,
                    moe = moe }
end

-- from_hf(path, o, vocab) -> family, config of the checkpoint at path, with
-- the run's sequence length and dropout; the corpus' ids must fit in its
-- vocabulary
function M.from_hf(path, o, vocab)
  local family, c = loom.models.hf.read_config(path)
  if vocab > c.vocab_size then
    error(string.format("train.lua: --init-from: the corpus has %d distinct tokens, the checkpoint's vocabulary only %d",
                        vocab, c.vocab_size), 0)
  end
  if family == "gpt2" then   -- its positions are weights: the run's sequences must fit them
    if o.seq > c.n_positions then
      error(string.format("train.lua: --init-from: --seq %d is longer than the checkpoint's n_positions %d", o.seq, c.n_positions), 0)
    end
  else
    c.max_seq_len = o.seq
  end
  c.dropout = o.dropout
  return family, c
end

-- the line that says the model: "4 layers, dim 128, 4 heads (llama)"
function M.describe(family, cfg)
  local fam = loom.models.family(family)
  local d = fam.recipe.dims(fam.config(cfg))
  return string.format("%d layers, dim %d, %d heads (%s)", d.layers, d.hidden, d.heads, family)
end

-- build(o, family, cfg, w) -> this rank's module (the model, or its
-- pipeline stage), tensor- and data-parallel as laid out (f32: with
-- --dtype bf16 autocast runs its GEMMs in bf16), and the prediction for
-- rank 0 (loom.train.predict). w gets the model's recipe and the FSDP
-- units this rank holds (L.fully_shard shards them once weights are in).
function M.build(o, family, cfg, w)
  local tp = require("loom.parallel")
  loom.manual_seed(o.seed)   -- the same full weights on every rank, at any layout
  local whole = loom.device(w.device):use(loom.models.family(family).new, cfg)
  local recipe = loom.models.recipe(whole)
  w.recipe = recipe
  local plan = w.tp > 1 and recipe.tp_plan(whole, { sequence_parallel = o["sequence-parallel"], loss_parallel = o.lp,
                                                    async_tp = o["async-tp"], tp = w.tp,
                                                    expert_tp = o.etp > 1 and w.ep == 1 }) or {}
  local pred = require("loom.train.predict").predict(whole, plan, w, o, L.first_stage_parts(whole, w))
  local model = L.split(whole, w, { microbatches = o.microbatches > 0 and o.microbatches or nil, schedule = o.schedule })
  if w.tp > 1 then
    tp.parallelize_module(model, w.mesh["tp"], L.plan_for(plan, model), { src_data_rank = false })
  end
  L.expert_parallel(whole, model, w, o)   -- with --ep: the experts sharded over the ep ranks
  L.note_fsdp_units(whole, model, w)
  L.replicate(model, w, o)   -- gradients averaged over dp x ep x cp (not with --fsdp), the experts' apart
  return model, pred
end

-- memory_line(model, opt, nparams): parameters and AdamW state held by
-- this rank, next to the whole model's
function M.memory_line(model, opt, nparams)
  local mem = require("loom.distributed.fsdp").memory(model, opt)
  local full = nparams * 4
  return string.format("memory per rank: parameters %.2f MB + AdamW state %.2f MB = %.3f of the model's %.2f MB "
                       .. "(+ %.2f MB state)", mem.params / 2^20, mem.optimizer / 2^20, mem.total / (3 * full),
                       full / 2^20, 2 * full / 2^20)
end

return M
