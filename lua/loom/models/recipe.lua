-- recipe.lua: what a model family tells loom's parallel machinery about
-- itself, as torchtitan's ModelSpec does: its tensor-parallel plans, its
-- FSDP units, how a pipeline cuts it (the parts in forward order, the
-- buffers every stage needs, weights tied across stages), what context
-- parallelism shards besides the batch, and the sizes the layout's
-- predictions need. loom.parallel, loom.distributed and loom.train read a
-- model only through its recipe, so none of them names a module of any
-- model, and a new family is its model file + its recipe + a spec.
--
--   local r = loom.models.recipe(model)   -- the recipe of model's family
--   tp.parallelize_module(model, mesh["tp"], r.tp_plan(model, {sequence_parallel = true}))
--   for _, block in ipairs(r.fsdp_units(model)) do fsdp.fully_shard(block, opts) end
--
-- A recipe's functions take the model as their first argument (a recipe
-- holds no model: docs/architecture.md, "no closure keeps a model").
local T = require("loom.tensor")

local M = {}

-- of(model) -> the recipe of model's family
function M.of(model)
  local r = type(model) == "table" and type(model.named_parameters) == "function" and model.recipe
  if type(r) ~= "table" then
    T.argerror("models.recipe", "model", "a model of one of loom's families (loom.models.transformer, gpt2, ...)",
               T.describe(model), 2)
  end
  return r
end

-- the blocks of model (the ModuleList the recipe names), in order
local function blocks_of(spec, model) return model[spec.blocks] end

-- decoder(spec) -> the recipe of a decoder family: embedding(s), a stack
-- of blocks, a head. spec:
--   name         the family ("llama", "gpt2", ...)
--   class        the model's class: its embed(ids, pos), layer_args(pos, t)
--                and head(h) run a pipeline stage's parts (they read only
--                the modules and buffers named here)
--   blocks       the FQN of the ModuleList of blocks
--   first, last  the FQNs of the parts before and after the blocks
--   buffers      buffers every pipeline stage holds (the rotary tables)
--   cp_buffers   {name, sequence dim} of buffers context parallelism cuts
--                like the sequence
--   tp_plan      function(opts, model) -> the plan (loom.models.blocks.tp_plan)
--   tied         function(config) -> {{fqn of the second use, fqn of the
--                first}} of weights tied across the model (nil: none)
--   experts      function(block) -> its mixture of experts' experts
--                (loom.nn.MoEExperts), or nil
--   dims         function(config) -> {layers, hidden (the width of the
--                residual stream), heads}
function M.decoder(spec)
  local r = { name = spec.name, blocks = spec.blocks }
  function r.tp_plan(model, opts) return spec.tp_plan(opts, model) end
  -- the modules FSDP shards one by one (the root is sharded last, apart)
  function r.fsdp_units(model)
    local units = {}
    for _, b in blocks_of(spec, model):ipairs() do units[#units + 1] = b end
    return units
  end
  -- what loom.distributed.pipelining cuts: the parts in forward order with
  -- their roles ("first", "layer", "last") and how a stage runs them
  function r.pipeline_parts(model)
    local parts = {}
    for _, fqn in ipairs(spec.first) do parts[#parts + 1] = { fqn, model[fqn], "first" } end
    for i, b in blocks_of(spec, model):ipairs() do parts[#parts + 1] = { spec.blocks .. "." .. i, b, "layer" } end
    for _, fqn in ipairs(spec.last) do parts[#parts + 1] = { fqn, model[fqn], "last" } end
    return { parts = parts, buffers = spec.buffers or {}, embed = spec.class.embed,
             layer_args = spec.class.layer_args, head = spec.class.head,
             tied = spec.tied and spec.tied(model.config) or {} }
  end
  -- {module, name} pairs and their sequence dims for context_parallel's buffers
  function r.cp_buffers(model)
    local bufs, dims = {}, {}
    for i, b in ipairs(spec.cp_buffers or {}) do bufs[i], dims[i] = { model, b[1] }, b[2] end
    return bufs, dims
  end
  function r.dims(config) return spec.dims(config) end
  function r.hidden_size(model) return spec.dims(model.config).hidden end
  function r.tied(model) return spec.tied and spec.tied(model.config) or {} end
  -- the experts of each mixture of experts (what expert parallelism shards)
  function r.expert_modules(model)
    local out = {}
    for _, b in blocks_of(spec, model):ipairs() do
      local e = spec.experts and spec.experts(b)
      if e then out[#out + 1] = e end
    end
    return out
  end
  return r
end

-- install(Class, recipe): the class's recipe, and the method
-- loom.distributed.pipelining looks for on a model it cuts
function M.install(Class, recipe)
  Class.recipe = recipe
  function Class:pipeline_parts() return recipe.pipeline_parts(self) end
end

return M
