-- optim.lua: an optimizer's state as a state_dict for dist.checkpoint:
-- the state of DTensor parameters wrapped as DTensors, so that it reshards
-- like the parameters, and back.
local loom = require("loom")
local T = require("loom.tensor")
local plan = require("loom.distributed.checkpoint.plan")

local M = {}

local is_dtensor, sizes = plan.is_dtensor, plan.sizes
local function dist() return require("loom.distributed") end

-- opts.param_index, checked: one distinct number per parameter of opt
local function index_arg(fname, opt, opts)
  local index = opts and opts.param_index
  if index == nil then return {} end
  local seen = {}
  for i = 1, #opt.params do
    local n = type(index) == "table" and index[i] or nil
    if not T.is_int(n) or n < 1 or seen[n] then
      T.argerror(fname, "opts.param_index", "a distinct number >= 1 for each of the " .. #opt.params
                 .. " parameters", "at " .. i .. ": " .. T.describe(n), 3)
    end
    seen[n] = true
  end
  return index
end

-- param_index(whole, stage[, aliases]) -> {[i] = n} for opts.param_index
-- below: n is the number, among the whole model's parameters, of stage's
-- i-th one (by name; pipelining keeps the whole model's names). whole: the
-- whole model (a module; one not cut into stages, e.g. a twin) or its
-- parameter names in named_parameters order. aliases: {[name] = name in
-- whole} for a stage's copies of weights the whole model holds once (a
-- head tied to the embedding, on the last stage).
function M.param_index(whole, stage, aliases)
  local names = whole
  if type(whole) == "table" and type(whole.named_parameters) == "function" then
    names = {}
    for i, kv in ipairs(whole:named_parameters()) do names[i] = kv[1] end
  end
  if type(names) ~= "table" then T.argerror("param_index", "whole", "a module or a list of names", T.describe(whole)) end
  if type(stage) ~= "table" or type(stage.named_parameters) ~= "function" then
    T.argerror("param_index", "stage", "a module", T.describe(stage))
  end
  local number = {}
  for i, name in ipairs(names) do number[name] = i end
  local index = {}
  for i, kv in ipairs(stage:named_parameters()) do
    index[i] = number[kv[1]] or number[aliases and aliases[kv[1]] or ""]
    if index[i] == nil then error("param_index: the stage's parameter " .. kv[1] .. " is not in the whole model", 2) end
  end
  return index
end

-- AdamW's state at step 0 for each parameter that has none yet (not a
-- closure over opt, which a compiled trace would keep: docs/architecture.md)
local function fresh_adamw_state(opt)
  for i, p in ipairs(opt.params) do
    if opt.state[i] == nil then
      local lp = is_dtensor(p) and p:to_local() or p
      local sd = lp.dtype == "f64" and "f64" or "f32"
      local s = { step = 0, exp_avg = loom.zeros(lp:size(), { dtype = sd, device = lp.device }),
                  exp_avg_sq = loom.zeros(lp:size(), { dtype = sd, device = lp.device }) }
      if lp.dtype ~= sd then s.master = lp:to(sd):contiguous() end
      opt.state[i] = s
    end
  end
end

-- optim_state_dict(opt): the optimizer's state_dict for save/load, with the
-- state tensors of DTensor parameters (plain local shards in the
-- optimizer) wrapped as DTensors with their parameter's mesh, placements
-- and global size, so they reshard like the parameters. They share storage
-- with the optimizer's state. AdamW state is made for every parameter that
-- has none yet (step 0 and zero moments, which is what its first step
-- would make), so a fresh optimizer has tensors to load into.
-- opts.param_index: {[i] = n}, the number n under which the state of the
-- optimizer's i-th parameter is saved (a pipeline stage's parameters are
-- numbered as in the whole model, so that every layout reads them alike).
function M.optim_state_dict(opt, opts)
  if type(opt) ~= "table" or type(opt.params) ~= "table" or type(opt.state) ~= "table" then
    T.argerror("optim_state_dict", "opt", "an optimizer", T.describe(opt))
  end
  local D = dist()
  if opt.name == "AdamW" then
    loom.no_grad(fresh_adamw_state, opt)
  end
  local index = index_arg("optim_state_dict", opt, opts)
  local base = opt:state_dict()
  local out = { options = base.options, state = {} }
  for i, s in pairs(base.state) do
    local p, o = opt.params[i], {}
    for k, v in pairs(s) do
      if T.is_tensor(v) and p ~= nil and is_dtensor(p) and not is_dtensor(v) then
        local lsz, vsz = p:to_local():size(), v:size()
        if sizes(lsz) ~= sizes(vsz) then
          error(string.format("optim_state_dict: state[%d].%s has size %s, its parameter's shard %s", i, k,
                              sizes(vsz), sizes(lsz)), 2)
        end
        v = D.from_local(v, p.device_mesh, p.placements, { shape = p:size() })
      end
      o[k] = v
    end
    out.state[index[i] or i] = o
  end
  return out
end

-- load_optim_state_dict(opt, sd): gives the optimizer the state (options,
-- step counters, tensors as local shards) of sd, a table from
-- optim_state_dict that dist.checkpoint.load has filled. opts.param_index:
-- as for optim_state_dict (state of other numbers, another stage's, is
-- left out).
function M.load_optim_state_dict(opt, sd, opts)
  if type(opt) ~= "table" or type(opt.params) ~= "table" then
    T.argerror("load_optim_state_dict", "opt", "an optimizer", T.describe(opt))
  end
  if type(sd) ~= "table" or type(sd.state) ~= "table" then
    T.argerror("load_optim_state_dict", "sd", "a table from optim_state_dict", T.describe(sd))
  end
  local index, local_of = index_arg("load_optim_state_dict", opt, opts), nil
  if next(index) ~= nil then
    local_of = {}
    for i, n in pairs(index) do local_of[n] = i end
  end
  for k, v in pairs(sd.options or {}) do opt.defaults[k] = v end
  local state = {}
  for i, s in pairs(sd.state) do
    local li = tonumber(i)
    if local_of then li = local_of[li] end
    if li ~= nil then
      local o = {}
      for k, v in pairs(s) do o[k] = is_dtensor(v) and v:to_local() or v end
      state[li] = o
    end
  end
  opt.state = state
end

return M
