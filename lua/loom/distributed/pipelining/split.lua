-- split.lua: a model cut into pipeline stages at layer FQNs, keeping each
-- parameter's FQN (a stage's state_dict holds "layers.3.attention.wq.weight"
-- as the whole model's does, so TP plans and checkpoints address it alike).
-- A model is cut into its parts, in the order its forward runs them:
--   nn.Sequential          its children
--   a model with a pipeline_parts() method (each of loom.models' families,
--                          from its recipe: loom.models.recipe): the parts
--                          it lists, "first" (embeddings), "layer" (the
--                          blocks, the parts a cut may fall between) and
--                          "last" (the head)
-- split_spec maps a part's FQN to SplitPoint.BEGINNING (a stage starts at
-- it) or SplitPoint.END (a stage ends after it), as PyTorch's pipeline().
local loom = require("loom")
local T = require("loom.tensor")
local nn = loom.nn

local describe = T.describe
local M = { SplitPoint = { BEGINNING = "BEGINNING", END = "END" } }

-- the parts of model: { fqn, module, role }, and the model's pipeline
-- description (nil for a Sequential)
local function parts_of(model)
  if type(model) == "table" and type(model.pipeline_parts) == "function" then
    local spec = model:pipeline_parts()
    return spec.parts, "model", spec
  end
  if getmetatable(model) == nn.Sequential then
    local p = {}
    for _, kv in ipairs(model:named_children()) do p[#p + 1] = { kv[1], kv[2], "seq" } end
    return p, "sequential"
  end
  error("pipeline: expected an nn.Sequential or a model with a pipeline_parts() method (loom.models' "
        .. "families), got " .. describe(model), 3)
end

-- a stage's module: the parts it holds, under their FQNs
local StageModule = nn.Module:extend("PipelineStageModule")
M.StageModule = StageModule
local Layers = nn.Module:extend("PipelineLayers")
-- its blocks in order (i, block), as a ModuleList gives them
Layers.ipairs = nn.ModuleList.ipairs

function StageModule:__init(kind, model, parts, spec)
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
    if p[3] == "first" then self.has_first = true elseif p[3] == "last" then self.has_last = true end
  end
  if spec then
    self.config, self.spec = model.config, spec
    for _, b in ipairs(spec.buffers) do self:register_buffer(b, model[b], { persistent = false }) end
  end
end

-- ids (first stage) or hidden states in; hidden states or logits out,
-- through the model's own embed, layer_args and head (its pipeline
-- description). The blocks' extra inputs are for the whole sequence: with
-- sequence parallelism hidden states hold 1/seq_shards of it (set
-- stage.submod.seq_shards = tp; the ids of the first stage hold all).
function StageModule:forward(h)
  local spec = self.spec
  if not spec then
    for _, p in ipairs(self.order) do h = p[2](h) end
    return h
  end
  local t = h:size(2)
  if self.has_first then h = spec.embed(self, h, 0) else t = t * (self.seq_shards or 1) end
  local a, b = spec.layer_args(self, 0, t)
  for _, p in ipairs(self.order) do
    if p[3] == "layer" then h = p[2](h, a, b) end
  end
  if self.has_last then h = spec.head(self, h) end
  return h
end

-- pipeline(model, {split_spec = {[fqn] = SplitPoint.BEGINNING|END}} or
-- {num_stages = n}): a Pipe. num_stages alone cuts the model's layers
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
  -- the cuttable parts: a model's layers, all of a Sequential
  local lo, hi = 1, #parts
  if kind == "model" then
    while parts[lo][3] == "first" do lo = lo + 1 end
    while parts[hi][3] == "last" do hi = hi - 1 end
  end
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
  local parts, kind, spec = parts_of(model)
  local starts = cut_points(kind, parts, opts)
  local stages, cur = {}, nil
  for i, p in ipairs(parts) do
    if starts[i] or not cur then cur = {} stages[#stages + 1] = cur end
    cur[#cur + 1] = p
  end
  return setmetatable({ model = model, kind = kind, spec = spec, stage_parts = stages, num_stages = #stages }, Pipe)
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
  return StageModule(self.kind, self.model, self.stage_parts[i + 1], self.spec)
end

-- the stage (0-based) holding the parameter fqn
function Pipe:stage_of(fqn)
  for s, parts in ipairs(self.stage_parts) do
    for _, p in ipairs(parts) do
      if fqn == p[1] or fqn:sub(1, #p[1] + 1) == p[1] .. "." then return s - 1 end
    end
  end
  error("pipeline: the model's tied weight " .. fqn .. " is in none of its parts", 3)
end

-- the weights tied across stages that stage i holds one use of (the
-- model's pipeline description lists its ties: a head tied to the
-- embedding): {fqn, peer = the stage holding the other use}
function Pipe:ties_of(i)
  local out = {}
  for _, pair in ipairs(self.spec and self.spec.tied or {}) do
    local a, b = self:stage_of(pair[1]), self:stage_of(pair[2])
    if a ~= b and a == i then out[#out + 1] = { fqn = pair[1], peer = b } end
    if a ~= b and b == i then out[#out + 1] = { fqn = pair[2], peer = a } end
  end
  return out
end

-- build_stage(i, {group, mesh_dim}): the PipelineStage of stage i
function Pipe:build_stage(i, opts)
  local Stage = require("loom.distributed.pipelining.stage")
  local stage = Stage.new(self:get_stage_module(i), i, self.num_stages, opts)
  stage.ties = self:ties_of(i)
  local firsts = {}   -- where the stages start: the ranks must cut the model alike
  for s = 0, self.num_stages - 1 do firsts[#firsts + 1] = self:stage_fqns(s)[1] end
  stage.split = table.concat(firsts, ",")
  return stage
end

return M
