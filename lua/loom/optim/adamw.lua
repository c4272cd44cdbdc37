-- adamw.lua: AdamW (decoupled weight decay, bias correction), as
-- torch.optim.AdamW. Moments are kept in f32 (f64 for f64 parameters), so
-- bf16 parameters get f32 optimizer state.
local loom = require "loom"
local Optimizer = require "loom.optim.optimizer"

local AdamW = {}
AdamW.__index = AdamW

function AdamW.new(params, opts)
  opts = opts or {}
  local betas = opts.betas
  local plain = {}
  for k, v in pairs(opts) do if k ~= "betas" then plain[k] = v end end
  local self = Optimizer.new(AdamW, "AdamW", params,
    { lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2 }, plain)
  if betas ~= nil then
    if type(betas) ~= "table" or type(betas[1]) ~= "number" or type(betas[2]) ~= "number" then
      error("AdamW: betas expected a table of two numbers", 2)
    end
    self.defaults.beta1, self.defaults.beta2 = betas[1], betas[2]
  end
  return self
end

function AdamW:step()
  local d = self.defaults
  loom.no_grad(function()
    for i, p in ipairs(self.params) do
      local g = p.grad
      if g ~= nil then
        local s = self.state[i]
        local sd = p.dtype == "f64" and "f64" or "f32"
        if s == nil then
          s = { step = 0, exp_avg = loom.zeros(p:size(), { dtype = sd }),
                exp_avg_sq = loom.zeros(p:size(), { dtype = sd }) }
          self.state[i] = s
        end
        s.step = s.step + 1
        g = g:to(sd)
        s.exp_avg = s.exp_avg * d.beta1 + g * (1 - d.beta1)
        s.exp_avg_sq = s.exp_avg_sq * d.beta2 + g * g * (1 - d.beta2)
        local bc1 = 1 - d.beta1 ^ s.step
        local bc2 = 1 - d.beta2 ^ s.step
        local denom = s.exp_avg_sq:sqrt() * (1 / math.sqrt(bc2)) + d.eps
        local master = p:to(sd)
        if d.weight_decay ~= 0 then master = master * (1 - d.lr * d.weight_decay) end
        p:copy_(master - s.exp_avg / denom * (d.lr / bc1))
      end
    end
  end)
end

return setmetatable(AdamW, { __index = Optimizer, __call = function(_, ...) return AdamW.new(...) end })
