-- sgd.lua: SGD with momentum, dampening, Nesterov and weight decay, as
-- torch.optim.SGD.
local loom = require("loom")
local Optimizer = require("loom.optim.optimizer")

local SGD = {}
SGD.__index = SGD

function SGD.new(params, opts)
  local self = Optimizer.new(SGD, "SGD", params,
    { lr = 1e-3, momentum = 0, dampening = 0, nesterov = false, weight_decay = 0 }, opts)
  local d = self.defaults
  if d.nesterov and (d.momentum <= 0 or d.dampening ~= 0) then
    error(string.format("SGD: nesterov needs momentum > 0 and dampening 0, got momentum %s and dampening %s",
                        tostring(d.momentum), tostring(d.dampening)), 2)
  end
  return self
end

-- (not a closure over self, which a compiled trace would keep: docs/architecture.md)
local function update(self)
  local d = self.defaults
  for i, p in ipairs(self.params) do
    local g = p.grad
    if g ~= nil then
      if d.weight_decay ~= 0 then g = g + p * d.weight_decay end
      if d.momentum ~= 0 then
        local s = self.state[i] or {}
        self.state[i] = s
        if s.momentum_buffer == nil then s.momentum_buffer = g:clone()
        else s.momentum_buffer = s.momentum_buffer * d.momentum + g * (1 - d.dampening) end
        g = d.nesterov and g + s.momentum_buffer * d.momentum or s.momentum_buffer
      end
      p:copy_(p - g * d.lr)
    end
  end
end

function SGD:step()
  self:check_live()
  loom.no_grad(update, self)
end

return setmetatable(SGD, { __index = Optimizer, __call = function(_, ...) return SGD.new(...) end })
