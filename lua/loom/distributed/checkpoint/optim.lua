-- optim.lua: an optimizer's state as a state_dict for dist.checkpoint:
-- the state of DTensor parameters wrapped as DTensors, so that it reshards
-- like the parameters, and back.
local loom = require "loom"
local T = require "loom.tensor"
local plan = require "loom.distributed.checkpoint.plan"

local M = {}

local is_dtensor, sizes = plan.is_dtensor, plan.sizes
local function dist() return require "loom.distributed" end

-- optim_state_dict(opt): the optimizer's state_dict for save/load, with the
-- state tensors of DTensor parameters (plain local shards in the
-- optimizer) wrapped as DTensors with their parameter's mesh, placements
-- and global size, so they reshard like the parameters. They share storage
-- with the optimizer's state. AdamW state is made for every parameter that
-- has none yet (step 0 and zero moments, which is what its first step
-- would make), so a fresh optimizer has tensors to load into.
function M.optim_state_dict(opt)
  if type(opt) ~= "table" or type(opt.params) ~= "table" or type(opt.state) ~= "table" then
    T.argerror("optim_state_dict", "opt", "an optimizer", T.describe(opt))
  end
  local D = dist()
  if opt.name == "AdamW" then
    loom.no_grad(function()
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
    end)
  end
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
    out.state[i] = o
  end
  return out
end

-- load_optim_state_dict(opt, sd): gives the optimizer the state (options,
-- step counters, tensors as local shards) of sd, a table from
-- optim_state_dict that dist.checkpoint.load has filled.
function M.load_optim_state_dict(opt, sd)
  if type(opt) ~= "table" or type(opt.params) ~= "table" then
    T.argerror("load_optim_state_dict", "opt", "an optimizer", T.describe(opt))
  end
  if type(sd) ~= "table" or type(sd.state) ~= "table" then
    T.argerror("load_optim_state_dict", "sd", "a table from optim_state_dict", T.describe(sd))
  end
  for k, v in pairs(sd.options or {}) do opt.defaults[k] = v end
  local state = {}
  for i, s in pairs(sd.state) do
    local o = {}
    for k, v in pairs(s) do o[k] = is_dtensor(v) and v:to_local() or v end
    state[tonumber(i)] = o
  end
  opt.state = state
end

return M
