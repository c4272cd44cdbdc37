-- split.lua: a model cut into pipeline stages at layer FQNs, keeping each
-- parameter's FQN (a stage's state_dict holds "layers.3.attention.wq.weight"
-- as the whole model's does, so TP plans and checkpoints address it alike).
-- A model is cut into its parts, in the order its forward runs them:
--   nn.Sequential          its children
--   Transformer (loom.models.transformer)  tok_embeddings, layers.1..n, norm+output
-- split_spec maps a part's FQN to SplitPoint.BEGINNING (a stage starts at
-- it) or SplitPoint.END (a stage ends after it), as PyTorch's pipeline().
local loom = require("loom")
local T = require("loom.tensor")
local nn = loom.nn

local describe = T.describe
local M = { SplitPoint = { BEGINNING = "BEGINNING", END = "END" } }

-- the parts of model: { fqn, module, head }; head names the part the
-- stage's forward treats specially (the transformer's embedding and output)
local function parts_of(model)
  local c = model.config
  if c and model.tok_embeddings and model.layers and model.output then
    if c.tie_embeddings then
      error("pipeline: a transformer with tie_embeddings shares a weight between the first and "
            .. "last stage; untie it to split it", 3)
    end
    local p = { { "tok_embeddings", model.tok_embeddings, "embed" } }
    for i = 1, model.layers:len() do p[#p + 1] = { "layers." .. i, model.layers:at(i), "layer" } end
    p[#p + 1] = { "norm", model.norm, "norm" }
    p[#p + 1] = { "output", model.output, "output" }
    return p, "transformer"
  end
  if getmetatable(model) == nn.Sequential then
    local p = {}
    for _, kv in ipairs(model:named_children()) do p[#p + 1] = { kv[1], kv[2], "seq" } end
    return p, "sequential"
  end
  error("pipeline: expected an nn.Sequential or a loom.models.transformer model, got " .. describe(model), 3)
end

-- a stage's module: the parts it holds, under their FQNs
local StageModule = nn.Module:extend("PipelineStageModule")
M.StageModule = StageModule
local Layers = nn.Module:extend("PipelineLayers")
-- its blocks in order (i, block), as a ModuleList gives them
Layers.ipairs = nn.ModuleList.ipairs

function StageModule:__init(kind, model, parts)
  self.kind = kind
  self.order = {}
  for _, p in ipairs(parts) do
    local fqn, mod = p[1], p[2]
    local parent, name = fqn:match("^(.-)%.([^.]+)$")
    if parent then
      if not self[parent] then self[parent] = Layers() end
      self[parent]:register_module(name, mod)
    else
      self:register_module(fqn, mod)
    end
    self.order[#self.order + 1] = { fqn, mod, p[3] }
  end
  if kind == "transformer" then
    self.config = model.config
    self:register_buffer("rope_cos", model.rope_cos, { persistent = false })
    self:register_buffer("rope_sin", model.rope_sin, { persistent = false })
  end
end

-- ids (first stage) or hidden states in; hidden states or logits out. The
-- rotary tables are cut to the sequence length of what comes in: with
-- sequence parallelism hidden states hold 1/seq_shards of the sequence
-- (set stage.submod.seq_shards = tp; the ids of the first stage hold all).
function StageModule:forward(h)
  local cos, sin
  if self.kind == "transformer" then
    local t = h:size(2)
    if self.order[1][3] ~= "embed" then t = t * (self.seq_shards or 1) end
    cos, sin = self.rope_cos:narrow(1, 1, t), self.rope_sin:narrow(1, 1, t)
  end
  for _, p in ipairs(self.order) do
    if p[3] == "layer" then h = p[2](h, cos, sin) else h = p[2](h) end
  end
  return h
end

-- pipeline(model, {split_spec = {[fqn] = SplitPoint.BEGINNING|END}} or
-- {num_stages = n}): a Pipe. num_stages alone cuts the transformer's layers
-- (or a Sequential's children) into n runs as even as they go, the first
-- run one longer than the last when they do not divide.
local Pipe = {}
Pipe.__index = Pipe

local function cut_points(kind, parts, opts)
  local starts = { [1] = true }
  if opts.split_spec then
    if type(opts.split_spec) ~= "table" then
      error("pipeline: split_spec expected a table {[fqn] = SplitPoint.BEGINNING|END}, got " .. describe(opts.split_spec), 3)
    end
    local index = {}
    for i, p in ipairs(parts) do index[p[1]] = i end
    for fqn, where in pairs(opts.split_spec) do
      local i = index[fqn]
      if not i then
        local names = {}
        for _, p in ipairs(parts) do names[#names + 1] = p[1] end
        error(string.format("pipeline: split_spec names %q, which is not a part of the model (%s)",
                            tostring(fqn), table.concat(names, ", ")), 3)
      end
      if where == M.SplitPoint.BEGINNING then starts[i] = true
      elseif where == M.SplitPoint.END then starts[i + 1] = true
      else error(string.format("pipeline: split_spec[%q] expected SplitPoint.BEGINNING or END, got %s", fqn, describe(where)), 3) end
    end
    starts[#parts + 1] = nil
    return starts
  end
  local n = opts.num_stages
  if type(n) ~= "number" or n < 1 or n ~= math.floor(n) then
    error("pipeline: expected {split_spec = ...} or {num_stages = n >= 1}, got num_stages " .. describe(n), 3)
  end
  -- the cuttable parts: the layers of a transformer, all of a Sequential
  local lo, hi = 1, #parts
  if kind == "transformer" then lo, hi = 2, #parts - 2 end
  local k = hi - lo + 1
  if n > k then error(string.format("pipeline: %d stages but only %d layers to spread over them", n, k), 3) end
  local at = lo
  for s = 1, n - 1 do
    at = at + math.floor(k / n) + (s <= k % n and 1 or 0)
    starts[at] = true
  end
  return starts
end

function M.pipeline(model, opts)
  opts = opts or {}
  local parts, kind = parts_of(model)
  local starts = cut_points(kind, parts, opts)
  local stages, cur = {}, nil
  for i, p in ipairs(parts) do
    if starts[i] or not cur then cur = {} stages[#stages + 1] = cur end
    cur[#cur + 1] = p
  end
  return setmetatable({ model = model, kind = kind, stage_parts = stages, num_stages = #stages }, Pipe)
end

-- the FQNs of stage i's parts (0-based i)
function Pipe:stage_fqns(i)
  local r = {}
  for _, p in ipairs(self.stage_parts[i + 1] or {}) do r[#r + 1] = p[1] end
  return r
end

function Pipe:get_stage_module(i)
  if type(i) ~= "number" or not self.stage_parts[i + 1] then
    error(string.format("get_stage_module: stage expected an integer in [0, %d), got %s", self.num_stages, describe(i)), 2)
  end
  return StageModule(self.kind, self.model, self.stage_parts[i + 1])
end

-- build_stage(i, {group, mesh_dim}): the PipelineStage of stage i
function Pipe:build_stage(i, opts)
  local Stage = require("loom.distributed.pipelining.stage")
  return Stage.new(self:get_stage_module(i), i, self.num_stages, opts)
end

return M
