-- predict.lua: what a layout of the Llama (loom.models.transformer) should
-- hold and send on this rank, said before training and checked against
-- what was measured after the first step: the parameters and AdamW state
-- this rank holds (its pipeline stage's layers, cut by TP and FSDP with
-- torch.chunk sizes) and the bytes its stage sends by p2p per step.
local M = {}

local function ceil_div(n, k) return math.ceil(n / k) end

-- the layers stage s (0-based) of pp holds, as pipeline() cuts them
local function stage_layers(n_layers, pp, s)
  return math.floor(n_layers / pp) + (s < n_layers % pp and 1 or 0)
end

-- numel this rank holds of a weight (out, in): TP cuts `tp_dim` (1 or 2,
-- nil: replicated), FSDP the other dim (or dim 1 of a vector)
local function held(out, inp, tp_dim, w, fsdp)
  local tp, dp = w.tp, fsdp and w.dp * (w.cp or 1) or 1   -- FSDP shards over dp x cp
  if inp == nil then return ceil_div(out, dp) end   -- a norm's weight
  if tp_dim == 1 then out = ceil_div(out, tp) elseif tp_dim == 2 then inp = ceil_div(inp, tp) end
  if tp_dim == 1 then inp = ceil_div(inp, dp) else out = ceil_div(out, dp) end
  return out * inp
end

-- parameters (numel) rank 0 of the pp dim `s` holds (c: the model's
-- config, defaults filled or not)
function M.params(c, w, s, fsdp)
  c = require("loom.models.transformer").config(c)
  local D, V, F, hd = c.dim, c.vocab_size, c.ffn_dim, c.dim / c.n_heads
  local kv = c.n_kv_heads * hd
  local layer = held(D, D, 1, w, fsdp) + 2 * held(kv, D, 1, w, fsdp) + held(D, D, 2, w, fsdp)
                + 2 * held(F, D, 1, w, fsdp) + held(D, F, 2, w, fsdp) + 2 * held(D, nil, nil, w, fsdp)
  local n = stage_layers(c.n_layers, w.pp, s) * layer
  if s == 0 then n = n + held(V, D, 1, w, fsdp) end
  if s == w.pp - 1 then n = n + held(D, nil, nil, w, fsdp) + held(V, D, 1, w, fsdp) end
  return n
end

-- bytes a rank of stage s sends by p2p per step (activations forward,
-- their gradients back), f32
function M.p2p_bytes(c, w, s, batch, seq)
  c = require("loom.models.transformer").config(c)
  local act = (batch / w.dp) * (seq / w.cp / (w.seq_shards or 1)) * c.dim * 4   -- SP: 1/tp of the sequence
  return ((s < w.pp - 1) and act or 0) + ((s > 0) and act or 0)
end

-- the line said before training (for rank 0, stage 0)
function M.before(c, w, o)
  local p = M.params(c, w, 0, o.fsdp and w.dp * w.cp > 1)
  return string.format("predicted for rank 0: parameters %.2f MB + AdamW state %.2f MB, p2p %.3f MB sent per step",
                       p * 4 / 2^20, 2 * p * 4 / 2^20, M.p2p_bytes(c, w, 0, o.batch, o.seq) / 2^20)
end

-- the line after the first step: measured next to predicted (sent_bytes:
-- what comm_mode counted, nil without pp)
function M.after(c, w, o, model, opt, sent_bytes)
  local mem = require("loom.distributed.fsdp").memory(model, opt)
  local p = M.params(c, w, 0, o.fsdp and w.dp * w.cp > 1) * 4
  local want = M.p2p_bytes(c, w, 0, o.batch, o.seq)
  return string.format("measured on rank 0: parameters %.2f MB (predicted %.2f), AdamW state %.2f MB (%.2f), "
                       .. "p2p %.3f MB sent (%.3f)", mem.params / 2^20, p / 2^20, mem.optimizer / 2^20, 2 * p / 2^20,
                       (sent_bytes or 0) / 2^20, want / 2^20)
end

return M
