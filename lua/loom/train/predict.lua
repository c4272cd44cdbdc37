-- predict.lua: what a layout should hold and send on rank 0, said before
-- training and checked against what was measured after the first step:
-- the parameters and AdamW state rank 0 holds (its pipeline stage's parts,
-- cut by the model's TP plan and by FSDP with torch.chunk sizes) and the
-- bytes its stage sends by p2p per step. It reads the model only through
-- its parameters' shapes, its recipe's plan and its hidden size, so every
-- family is predicted alike.
local tp = require("loom.parallel")

local M = {}

local function ceil_div(n, k) return math.ceil(n / k) end

-- whether the module FQN fqn matches the plan key pattern, atom by atom
-- (as parallelize_module matches them)
local function matches(pattern, fqn)
  local a, b = {}, {}
  for x in pattern:gmatch("[^.]+") do a[#a + 1] = x end
  for x in fqn:gmatch("[^.]+") do b[#b + 1] = x end
  if #a ~= #b then return false end
  for i = 1, #a do if not tp.fnmatch(b[i], a[i]) then return false end end
  return true
end

-- the dim (1-based) of parameter pname of `module` (at fqn) that a plan's
-- style cuts over tp (nil: replicated), as the styles place them
local function tp_dim(plan, fqn, module, pname)
  local kind = module.__name
  for pattern, style in pairs(plan) do
    if matches(pattern, fqn) then
      if style.__name == "ColwiseParallel" then return kind == "Embedding" and 2 or 1 end
      if style.__name == "ExpertTensorParallel" then return module.hidden_dims[pname] end
      if style.__name == "RowwiseParallel" then
        if kind == "Embedding" then return 1 end
        return pname == "weight" and 2 or nil
      end
    end
  end
end

-- numel this rank holds of a parameter of size sz: TP cuts dim d, FSDP
-- (over dp ranks) dim 1, or the next dim when TP cuts dim 1 (a vector's
-- TP shard is cut again)
local function held(sz, d, tp_n, dp_n)
  local s = {}
  for i, v in ipairs(sz) do s[i] = v end
  if d then s[d] = ceil_div(s[d], tp_n) end
  local f = (d == 1 and #s > 1) and 2 or 1
  s[f] = ceil_div(s[f], dp_n)
  local n = 1
  for _, v in ipairs(s) do n = n * v end
  return n
end

-- whether parameter fqn lies in one of parts (FQNs of modules; nil: all)
local function in_parts(fqn, parts)
  if not parts then return true end
  for _, p in ipairs(parts) do
    if fqn == p or fqn:sub(1, #p + 1) == p .. "." then return true end
  end
  return false
end

-- numel rank 0 holds of the parameter p named fqn (an expert's weight:
-- its experts cut over ep, with --etp its hidden dim over tp, with FSDP
-- the rest over dp x cp)
local function held_of(model, plan, w, dp, fqn, p, experts)
  local mfqn, pname = fqn:match("^(.*)%.([^.]+)$")
  if experts and experts[p] and (w.ep or 1) > 1 then
    local sz = p:size()
    local d = (w.etp or 1) > 1 and experts[p] or nil
    return held({ ceil_div(sz[1], w.ep), unpack(sz, 2) }, d, w.tp, dp > 1 and w.dp * w.cp or 1)
  end
  local d = w.tp > 1 and tp_dim(plan, mfqn or "", model:get_submodule(mfqn or ""), pname) or nil
  return held(p:size(), d, w.tp, dp)
end

-- the parameters of the model's experts (its recipe's expert modules),
-- each to the dim that holds the hidden size (loom.nn.MoEExperts' hidden_dims)
local function experts_of(model)
  local set = {}
  for _, m in ipairs(require("loom.models.recipe").of(model).expert_modules(model)) do
    for _, kv in ipairs(m:named_parameters()) do set[kv[2]] = m.hidden_dims[kv[1]] end
  end
  return set
end

-- params(model, plan, w, fsdp, parts) -> numel of the parameters of parts
-- (a stage's module FQNs; nil: the whole model) that rank 0 holds
function M.params(model, plan, w, fsdp, parts)
  local dp = fsdp and w.dp * (w.ep or 1) * (w.cp or 1) or 1   -- FSDP shards over dp x ep x cp (experts: dp x cp)
  local n, experts = 0, experts_of(model)
  for _, kv in ipairs(model:named_parameters()) do
    if in_parts(kv[1], parts) then n = n + held_of(model, plan, w, dp, kv[1], kv[2], experts) end
  end
  return n
end

-- bytes a rank of stage s (0-based) sends by p2p per step: activations
-- forward and their gradients back, f32 (batch x sequence x hidden)
function M.p2p_bytes(hidden, w, s, batch, seq)
  local act = (batch / (w.data or w.dp)) * (seq / w.cp / (w.seq_shards or 1)) * hidden * 4   -- SP: 1/tp of the sequence
  return ((s < w.pp - 1) and act or 0) + ((s > 0) and act or 0)
end

-- bytes of all-to-all input rank 0 issues per step with expert
-- parallelism: per mixture of experts of its stage, the rows to the
-- experts' ranks and back in forward, the same two in backward (top_k rows
-- per token this rank routes: under TP every token of its sequence
-- share), and the counts (experts x 8 bytes). The rows a rank receives
-- are the router's choice: this is the balanced case, what a measured
-- step comes near when the experts take even loads.
function M.a2a_bytes(model, w, o, parts)
  local moe = model.config.moe
  if (w.ep or 1) == 1 or not moe then return 0 end
  local n = 0
  for i, m in ipairs(require("loom.models.recipe").of(model).expert_modules(model)) do
    local _ = m
    if in_parts("layers." .. i, parts) then n = n + 1 end
  end
  local tokens = (o.batch / w.data) * (o.seq / w.cp)
  local dim = require("loom.models.recipe").of(model).hidden_size(model)
  return n * (4 * tokens * moe.top_k * dim * 4 + moe.experts * 8)
end

-- predict(model, plan, w, o, parts) -> the prediction for rank 0 (stage 0,
-- whose parts are `parts`): {params = bytes, p2p = bytes}. With pp > 1 a
-- weight tied across stages (the head to the embedding) sends its
-- gradient to the other stage once a step.
function M.predict(model, plan, w, o, parts)
  local r = require("loom.models.recipe").of(model)
  local fsdp = o.fsdp and w.dp * w.ep * w.cp > 1
  local pred = { params = M.params(model, plan, w, fsdp, parts) * 4,
                 p2p = M.p2p_bytes(r.hidden_size(model), w, 0, o.batch, o.seq), a2a = M.a2a_bytes(model, w, o, parts) }
  if w.pp > 1 then
    local params = {}
    for _, kv in ipairs(model:named_parameters()) do params[kv[1]] = kv[2] end
    for _, pair in ipairs(r.tied(model)) do
      local p = params[pair[2]]
      pred.p2p = pred.p2p + 4 * held_of(model, plan, w, fsdp and w.dp * w.ep * w.cp or 1, pair[2], p)
    end
  end
  return pred
end

-- the line said before training
function M.before(pred)
  return string.format("predicted for rank 0: parameters %.2f MB + AdamW state %.2f MB, p2p %.3f MB sent per step%s",
                       pred.params / 2^20, 2 * pred.params / 2^20, pred.p2p / 2^20,
                       pred.a2a > 0 and string.format(", all-to-all %.3f MB", pred.a2a / 2^20) or "")
end

-- the line after the first step: measured next to predicted (sent_bytes:
-- what comm_mode counted, nil without pp; a2a_bytes: the all-to-all's)
function M.after(pred, model, opt, sent_bytes, a2a_bytes)
  local mem = require("loom.distributed.fsdp").memory(model, opt)
  return string.format("measured on rank 0: parameters %.2f MB (predicted %.2f), AdamW state %.2f MB (%.2f), "
                       .. "p2p %.3f MB sent (%.3f)%s", mem.params / 2^20, pred.params / 2^20, mem.optimizer / 2^20,
                       2 * pred.params / 2^20, (sent_bytes or 0) / 2^20, pred.p2p / 2^20,
                       pred.a2a > 0 and string.format(", all-to-all %.3f MB (%.3f)", (a2a_bytes or 0) / 2^20,
                                                      pred.a2a / 2^20) or "")
end

return M
