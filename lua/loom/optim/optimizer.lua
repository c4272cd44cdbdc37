-- optimizer.lua: what SGD and AdamW share: parameter checks, zero_grad,
-- state_dict / load_state_dict. Updates run shard-locally on whatever
-- tensors the parameters are (plain or DTensor shards).
local T = require("loom.tensor")

local Optimizer = {}
Optimizer.__index = Optimizer

-- params: a non-empty list of leaf tensors, each once (PyTorch raises on a
-- parameter listed twice: it would be updated twice per step)
local function check_params(name, params)
  if type(params) ~= "table" or T.is_tensor(params) or #params == 0 then
    T.argerror(name, "params", "a non-empty table of tensors", T.describe(params), 4)
  end
  local seen = {}
  for i, p in ipairs(params) do
    if not T.is_tensor(p) then T.argerror(name, "params[" .. i .. "]", "a tensor", T.describe(p), 4) end
    if not p.is_leaf then
      T.argerror(name, "params[" .. i .. "]", "a leaf tensor (an nn.Parameter)", "a tensor computed by an op", 4)
    end
    local addr = T.address(p)
    if seen[addr] then
      T.argerror(name, "params", "each parameter once", string.format("params[%d] and params[%d] are the same tensor",
                 seen[addr], i), 4)
    end
    seen[addr] = i
  end
end

-- range checks of the shared hyperparameters: lr, eps, weight_decay, momentum >= 0
local NON_NEGATIVE = { lr = true, eps = true, weight_decay = true, momentum = true, dampening = true }
function Optimizer.check_value(name, k, v, level)
  if type(v) == "number" and NON_NEGATIVE[k] and not (v >= 0 and v < math.huge) then
    T.argerror(name, k, "a finite number >= 0", T.describe(v), (level or 2) + 1)
  end
  if (k == "beta1" or k == "beta2") and not (v >= 0 and v < 1) then
    T.argerror(name, "betas", "numbers in [0, 1)", string.format("%s = %s", k, T.describe(v)), (level or 2) + 1)
  end
end

-- (errors name the line that called SGD(...) or AdamW(...): level 4 here)
function Optimizer.new(cls, name, params, defaults, opts)
  check_params(name, params)
  if opts ~= nil and (type(opts) ~= "table" or T.is_tensor(opts)) then
    T.argerror(name, "options", "a table", T.describe(opts), 4)
  end
  local self = setmetatable({ params = params, state = {}, name = name }, cls)
  self.defaults = {}
  for k, v in pairs(defaults) do
    local given = opts and opts[k]
    if given ~= nil and type(given) ~= type(v) then
      T.argerror(name, k, "a " .. type(v), T.describe(given), 4)
    end
    if given == nil then given = v end   -- (not `given == nil and v or given`: v may be false)
    self.defaults[k] = given
    Optimizer.check_value(name, k, self.defaults[k], 3)
  end
  for k in pairs(opts or {}) do
    if defaults[k] == nil then error(string.format("%s: unknown option %q", name, tostring(k)), 3) end
  end
  return self
end

-- at each step: no parameter was replaced in its module after the
-- optimizer was built (it would update a tensor the model no longer uses)
function Optimizer:check_live()
  for i, p in ipairs(self.params) do
    local by = T.replaced[p]
    if by then
      error(string.format("%s.step: params[%d] was replaced by %s after this optimizer was built, so step() would "
                          .. "train a tensor the model no longer uses; build the optimizer after %s, from "
                          .. "model:parameters()", self.name, i, by, by), 3)
    end
  end
end

-- The learning rate, read and set by schedulers.
function Optimizer:get_lr() return self.defaults.lr end
function Optimizer:set_lr(lr)
  if type(lr) ~= "number" then T.argerror("set_lr", "lr", "a number", T.describe(lr)) end
  Optimizer.check_value("set_lr", "lr", lr)
  self.defaults.lr = lr
end

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
  if sd.options ~= nil and type(sd.options) ~= "table" then
    T.argerror("load_state_dict", "state_dict.options", "a table", T.describe(sd.options))
  end
  for k, v in pairs(sd.options or {}) do
    local own = self.defaults[k]
    if own == nil then error(string.format("load_state_dict: %s has no option %q", self.name, tostring(k)), 2) end
    if type(v) ~= type(own) then
      T.argerror("load_state_dict", "options." .. k, "a " .. type(own), T.describe(v))
    end
    Optimizer.check_value("load_state_dict", k, v)
  end
  for k, v in pairs(sd.options or {}) do self.defaults[k] = v end
  local state = {}
  for i, s in pairs(sd.state) do
    local n = tonumber(i)
    if n == nil or n ~= math.floor(n) or n < 1 or n > #self.params or type(s) ~= "table" then
      T.argerror("load_state_dict", "state_dict.state", string.format("entries for parameters 1 to %d", #self.params),
                 "an entry " .. T.describe(i), 2)
    end
    local copy = {}
    for k, v in pairs(s) do copy[k] = T.is_tensor(v) and v:clone() or v end
    state[n] = copy
  end
  self.state = state
end

return Optimizer
