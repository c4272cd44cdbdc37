-- adamw.lua: AdamW (decoupled weight decay, bias correction), as
-- torch.optim.AdamW. Moments are kept in f32 (f64 for f64 parameters), so
-- bf16 parameters get f32 optimizer state.
local loom = require("loom")
local T = require("loom.tensor")
local C = require("loom.lib").C
local Optimizer = require("loom.optim.optimizer")

local AdamW = {}
AdamW.__index = AdamW

function AdamW.new(params, opts)
  if opts ~= nil and (type(opts) ~= "table" or T.is_tensor(opts)) then
    T.argerror("AdamW", "options", "a table", T.describe(opts))
  end
  opts = opts or {}
  local betas = opts.betas
  local plain = {}
  for k, v in pairs(opts) do if k ~= "betas" then plain[k] = v end end
  local self = Optimizer.new(AdamW, "AdamW", params,
    { lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2 }, plain)
  if betas ~= nil then
    if type(betas) ~= "table" or T.is_tensor(betas) or #betas ~= 2 or type(betas[1]) ~= "number"
       or type(betas[2]) ~= "number" then
      T.argerror("AdamW", "betas", "a table of two numbers {beta1, beta2}", T.describe(betas))
    end
    Optimizer.check_value("AdamW", "beta1", betas[1])
    Optimizer.check_value("AdamW", "beta2", betas[2])
    self.defaults.beta1, self.defaults.beta2 = betas[1], betas[2]
  end
  return self
end

-- The state of parameter i (made at its first update): moments in f32
-- (f64 for f64 parameters) and, for other dtypes (bf16), an f32 master copy.
function AdamW:_state(i, p)
  local s = self.state[i]
  if s == nil then
    local sd = p.dtype == "f64" and "f64" or "f32"
    s = { step = 0, exp_avg = loom.zeros(p:size(), { dtype = sd, device = p.device }),
          exp_avg_sq = loom.zeros(p:size(), { dtype = sd, device = p.device }) }
    if p.dtype ~= sd then s.master = p:to(sd):contiguous() end
    self.state[i] = s
  end
  return s
end

-- _adamw_multi_ takes at most 256 tensors: 64 parameters per call
local PER_CALL = 64

-- All parameters in one fused update (the _adamw_multi_ op, one call per
-- 64 parameters and per step count, which differs only for parameters
-- that went without a gradient at some step). DTensors update shard by
-- shard; parameters that are not f32/f64 (bf16) update their f32 master
-- copy, which is then rounded into the parameter. (update is not a closure
-- over self, which a compiled trace would keep: docs/architecture.md.)
local function update(self)
  local d = self.defaults
  local by_step, steps, masters = {}, {}, {}
  for i, p in ipairs(self.params) do
    local g = p.grad
    if p.dist ~= nil then
      p = p:to_local()
      g = g and g:to_local()
    end
    if g ~= nil then
      local s = self:_state(i, p)
      s.step = s.step + 1
      local master = s.master or p
      local list = by_step[s.step]
      if list == nil then
        list = {}
        by_step[s.step] = list
        steps[#steps + 1] = s.step
      end
      local n = #list
      list[n + 1], list[n + 2], list[n + 3], list[n + 4] = master, g:to(master.dtype):contiguous(), s.exp_avg, s.exp_avg_sq
      if s.master then masters[#masters + 1] = { p, s.master } end
    end
  end
  table.sort(steps)
  for _, step in ipairs(steps) do
    local list, hyper = by_step[step], { d.lr, d.beta1, d.beta2, d.eps, d.weight_decay, 1 - d.beta1 ^ step, 1 - d.beta2 ^ step }
    for first = 1, #list, 4 * PER_CALL do
      T.op(C.LM_OP_ADAMW_MULTI, { unpack(list, first, math.min(#list, first + 4 * PER_CALL - 1)) }, nil, hyper)
    end
  end
  for _, pm in ipairs(masters) do pm[1]:copy_(pm[2]) end
end

function AdamW:step()
  self:check_live()
  loom.no_grad(update, self)
end

return setmetatable(AdamW, { __index = Optimizer, __call = function(_, ...) return AdamW.new(...) end })
