-- optimizer.lua: what SGD and AdamW share: parameter checks, zero_grad,
-- state_dict / load_state_dict. Updates run shard-locally on whatever
-- tensors the parameters are (plain or DTensor shards).
local T = require "loom.tensor"

local Optimizer = {}
Optimizer.__index = Optimizer

function Optimizer.new(cls, name, params, defaults, opts)
  if type(params) ~= "table" or #params == 0 then
    T.argerror(name, "params", "a non-empty table of tensors", T.describe(params), 3)
  end
  for i, p in ipairs(params) do T.check_tensor(p, name, "params[" .. i .. "]") end
  local self = setmetatable({ params = params, state = {}, name = name }, cls)
  self.defaults = {}
  for k, v in pairs(defaults) do
    local given = opts and opts[k]
    if given ~= nil and type(given) ~= type(v) then
      T.argerror(name, k, "a " .. type(v), T.describe(given), 3)
    end
    self.defaults[k] = given == nil and v or given
  end
  for k in pairs(opts or {}) do
    if defaults[k] == nil then error(string.format("%s: unknown option %q", name, k), 3) end
  end
  return self
end

-- The learning rate, read and set by schedulers.
function Optimizer:get_lr() return self.defaults.lr end
function Optimizer:set_lr(lr) self.defaults.lr = lr end

function Optimizer:zero_grad()
  for _, p in ipairs(self.params) do p.grad = nil end
end

-- state_dict(): { state = {[i] = {...}}, options = {...} }, tensors shared
function Optimizer:state_dict()
  local opts = {}
  for k, v in pairs(self.defaults) do opts[k] = v end
  return { state = self.state, options = opts }
end

function Optimizer:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd.state) ~= "table" then
    T.argerror("load_state_dict", "state_dict", "an optimizer state_dict", T.describe(sd))
  end
  for k, v in pairs(sd.options or {}) do self.defaults[k] = v end
  local state = {}
  for i, s in pairs(sd.state) do
    local copy = {}
    for k, v in pairs(s) do copy[k] = T.is_tensor(v) and v:clone() or v end
    state[tonumber(i)] = copy
  end
  self.state = state
end

return Optimizer
