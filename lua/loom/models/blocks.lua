-- blocks.lua: what the decoder models (loom.models.transformer, Llama-style,
-- and loom.models.gpt2) share: filling a config, the q/k/v projections,
-- attention over a KV cache, the pre-norm residual step, the stack of
-- blocks, running the layers over a sequence that may continue a cache, and
-- the tensor-parallel plan.
local loom = require("loom")
local F = loom.F
local T = require("loom.tensor")

local M = {}

-- config(who, defaults, cfg, optional): defaults overridden by cfg; a key of
-- cfg in neither defaults nor the set optional (keys without a default) is
-- an error naming who, at the caller of the model's config().
function M.config(who, defaults, cfg, optional)
  local c = {}
  for k, v in pairs(defaults) do c[k] = v end
  for k, v in pairs(cfg or {}) do
    if defaults[k] == nil and not optional[k] then error(string.format("%s: unknown config key %q", who, k), 4) end
    c[k] = v
  end
  return c
end

-- (B, T, kv, hd) -> (B, T, kv * n_rep, hd), each kv head repeated n_rep times
local function repeat_kv(x, n_rep)
  if n_rep == 1 then return x end
  local b, t, kv, hd = unpack(x:size())
  return x:unsqueeze(4):expand(b, t, kv, n_rep, hd):reshape(b, t, kv * n_rep, hd)
end

-- attend(who, q, k, v, n_rep, cache, window) -> (B, T, heads * hd):
-- attention of q (B, T, heads, hd) over k, v (B, T, kv heads, hd), each kv
-- head serving n_rep query heads; with window, a query sees only the last
-- window keys (a sliding window). cache (generation): this layer's {k, v}
-- so far, of (B, T, kv heads of this rank, hd), extended here; then
-- attention is causal only when the queries are the whole sequence (a
-- prefill), and a decoded token attends to every cached position (the
-- last window of them).
function M.attend(who, q, k, v, n_rep, cache, window)
  local b, t = q:size(1), q:size(2)
  if cache then
    if cache.k then k, v = loom.cat({ cache.k, k }, 2), loom.cat({ cache.v, v }, 2) end
    cache.k, cache.v = k, v
  end
  local causal = k:size(2) == t
  if not causal and t > 1 then error(who .. ": a cached step takes one token at a time", 4) end
  if window and not causal and k:size(2) > window then
    k, v = k:narrow(2, k:size(2) - window + 1, window), v:narrow(2, v:size(2) - window + 1, window)
  end
  k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
  local o = F.scaled_dot_product_attention(q:transpose(2, 3), k:transpose(2, 3), v:transpose(2, 3),
                                           { is_causal = causal, window = causal and window or nil })
  return o:transpose(2, 3):reshape(b, t, -1)
end

-- heads(y, b, t, hd): a projection's output (B, T, heads * hd) viewed as
-- (B, T, heads, hd). The head count is left to the weights (-1): a
-- tensor-parallel rank gets the heads it holds.
function M.heads(y, b, t, hd) return y:view(b, t, -1, hd) end

-- qkv(x, wq, wk, wv, hd) -> q, k, v: x (B, T, dim) through the three
-- projections, each viewed as (B, T, heads, hd)
function M.qkv(x, wq, wk, wv, hd)
  local b, t = x:size(1), x:size(2)
  return M.heads(wq(x), b, t, hd), M.heads(wk(x), b, t, hd), M.heads(wv(x), b, t, hd)
end

-- residual(x, y, drop): x + y, y through the dropout drop when there is one
function M.residual(x, y, drop)
  if drop then y = drop(y) end
  return x + y
end

-- span(who, ids, cache, limit, limit_name) -> t, pos: the length of ids
-- (B, T) and the position they start at (cache.pos, else 0), checked
-- against the model's longest sequence.
function M.span(who, ids, cache, limit, limit_name)
  T.check_tensor(ids, who, "ids")
  local t, pos = ids:size(2), cache and cache.pos or 0
  if pos + t > limit then
    error(string.format("%s: sequence length %d exceeds %s %d", who, pos + t, limit_name, limit), 3)
  end
  return t, pos
end

-- stack(Block, c, n) -> an nn.ModuleList of n Block(c)
function M.stack(Block, c, n)
  local list = {}
  for i = 1, n do list[i] = Block(c) end
  return loom.nn.ModuleList(list)
end

-- run_layers(layers, h, cache, t[, cos, sin]) -> h: h through each layer
-- as layer(h, cos, sin, layer_cache) given rotary tables (the Llamas), else
-- layer(h, layer_cache); layer i's cache is cache[i] (made on first use)
-- when there is a cache; then the cache holds t more positions. (The tables
-- are arguments, not a closure's upvalues, which a compiled trace would
-- keep: docs/architecture.md.)
function M.run_layers(layers, h, cache, t, cos, sin)
  for i, layer in layers:ipairs() do
    local c
    if cache then cache[i] = cache[i] or {} c = cache[i] end
    if cos then h = layer(h, cos, sin, c) else h = layer(h, c) end
  end
  if cache then cache.pos = (cache.pos or 0) + t end
  return h
end

-- each {name, count} of counts (head counts) must divide by the
-- tensor-parallel degree tp; the error lands at tp_plan's caller
local function check_tp(tp, counts)
  for _, kv in ipairs(counts) do
    if kv[2] % tp ~= 0 then
      error(string.format("tp_plan: %s (%d) must divide by the tensor-parallel degree (%d)", kv[1], kv[2], tp), 3)
    end
  end
end

-- tp_plan(names, opts, counts): Megatron's split of a decoder in PyTorch's
-- styles: the Linears names.colwise Colwise and names.rowwise Rowwise, the
-- embedding names.embedding vocabulary-parallel (Rowwise), the head
-- names.output Colwise. opts.sequence_parallel: the Rowwise outputs and the
-- embedding's are sharded on the sequence (Shard(2)), names.norms run
-- SequenceParallel. Each module of names.gathered (fqn = its number of
-- positional inputs) takes its first input as one Replicate DTensor
-- (gathered from the sequence shards with SP).
-- opts.loss_parallel: the logits stay a DTensor sharded on the vocabulary.
-- opts.async_tp (with sequence_parallel): the row-wise Linears
-- reduce-scatter in chunks overlapped with their matmul, and each gathered
-- module's input is gathered once in chunks, each chunk multiplied by its
-- column-wise children as it arrives (AsyncTPInput). names.seq_sharded:
-- modules besides the embedding whose output joins the residual stream,
-- cut to sequence shards with SP (GPT-2's position embedding).
-- counts (the model's head counts, when it is given) are checked against
-- opts.tp. The models' tp_plan tail-call this, so errors name their caller.
function M.tp_plan(names, opts, counts)
  opts = opts or {}
  if counts and opts.tp then check_tp(opts.tp, counts) end
  local tp = require("loom.parallel")
  local dt = require("loom.distributed.dtensor")
  local Shard, Replicate = dt.Shard, dt.Replicate
  local sp, lp = opts.sequence_parallel, opts.loss_parallel
  if opts.async_tp and not sp then error("tp_plan: async_tp needs sequence_parallel", 3) end
  local plan = {}
  for _, fqn in ipairs(names.colwise) do plan[fqn] = tp.ColwiseParallel{} end
  for _, fqn in ipairs(names.rowwise) do
    plan[fqn] = tp.RowwiseParallel{ output_layouts = sp and Shard(2) or nil, async_tp = opts.async_tp }
  end
  plan[names.embedding] = tp.RowwiseParallel{ input_layouts = Replicate(), output_layouts = sp and Shard(2) or Replicate() }
  plan[names.output] = tp.ColwiseParallel{ input_layouts = sp and Shard(2) or Replicate(),
                                           output_layouts = lp and Shard(-1) or Replicate(), use_local_output = not lp }
  -- modules that run whole on every rank with plain parameters (a mixture
  -- of experts under TP): their input gathered, their output cut back (a
  -- Partial output, as a mixture's with expert_tp, reduced or reduce-scattered)
  for _, fqn in ipairs(names.whole or {}) do
    plan[fqn] = tp.PrepareModuleInputOutput{ input_layouts = { sp and Shard(2) or Replicate() },
                                             desired_input_layouts = { Replicate() }, use_local_input = true,
                                             output_layouts = { Replicate() },
                                             desired_output_layouts = { sp and Shard(2) or Replicate() },
                                             use_local_output = true }
  end
  -- a mixture's experts with expert_tp: each expert's hidden dim cut over
  -- tp (its block's output then a Partial DTensor, reduced by `whole`)
  if opts.expert_tp then
    for _, fqn in ipairs(names.experts or {}) do plan[fqn] = tp.ExpertTensorParallel() end
  end
  -- norms of each head (Qwen3's q_norm): on this rank's heads (dim 3),
  -- their weight replicated, its gradient summed over the heads' ranks
  for _, fqn in ipairs(names.head_norms or {}) do
    plan[fqn] = tp.SequenceParallel{ sequence_dim = 3, use_local_output = true }
  end
  -- norms of a whole projection (OLMo 2's q_norm): this rank's columns
  -- gathered, normed whole, cut back to this rank's heads
  for _, fqn in ipairs(names.proj_norms or {}) do
    plan[fqn] = tp.NoParallel{ input_layout = Shard(-1), output_layout = Shard(-1) }
  end
  if sp then
    -- (a norm whose output joins the residual stream, as OLMo 2's after
    -- each sub-layer, hands it back as this rank's plain sequence shard)
    local joins = {}
    for _, fqn in ipairs(names.residual_norms or {}) do joins[fqn] = true end
    for _, fqn in ipairs(names.norms) do plan[fqn] = tp.SequenceParallel{ use_local_output = joins[fqn] } end
    for _, fqn in ipairs(names.seq_sharded or {}) do
      plan[fqn] = tp.PrepareModuleOutput{ output_layouts = { Replicate() }, desired_output_layouts = { Shard(2) } }
    end
  end
  -- the module's input one Replicate DTensor (gathered from the sequence
  -- shards with SP) that all its column-wise Linears read: their input
  -- gradients are summed before one all-reduce (dtensor/dispatch.c)
  for fqn, n in pairs(names.gathered or {}) do
    if opts.async_tp then
      local consumers = M.children_of(fqn, names.colwise)
      plan[fqn] = tp.AsyncTPInput{ consumers = consumers }
      for _, c in ipairs(consumers) do
        plan[fqn .. "." .. c] = tp.ColwiseParallel{ input_layouts = Shard(2), async_tp = true }
      end
    else
      plan[fqn] = tp.PrepareModuleInput{ input_layouts = { sp and Shard(2) or Replicate(), n = n },
                                         desired_input_layouts = { Replicate(), n = n } }
    end
  end
  return plan
end

-- children_of(fqn, list) -> the names of list's entries that are direct
-- children of fqn, in list's order ("a.*.b" of "a.*.b.wq" -> "wq")
function M.children_of(fqn, list)
  local out, prefix = {}, fqn .. "."
  for _, c in ipairs(list) do
    local child = c:sub(1, #prefix) == prefix and c:sub(#prefix + 1)
    if child and not child:find(".", 1, true) then out[#out + 1] = child end
  end
  return out
end

-- generate(model, ids, opts): the models' generate method, see
-- loom.models.generate (a KV cache; greedy unless sampling is asked)
function M.generate(model, ids, opts) return require("loom.models.generate").generate(model, ids, opts) end

return M
