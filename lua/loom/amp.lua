-- amp.lua: mixed precision, as torch.amp. loom.autocast(dtype, fn) runs fn
-- with GEMMs (matmul, attention) on bf16/f16 casts of f32 inputs and
-- softmax, norms and losses in f32; parameters stay f32 (master weights),
-- so do their gradients and the optimizer's math. With f16, whose range is
-- small, a GradScaler scales the loss so gradients do not underflow.
local loom = require("loom")
local T = require("loom.tensor")
local C = loom.C

local M = {}
local LOW = { bf16 = C.LM_BF16, f16 = C.LM_F16 }

-- autocast(dtype, fn, ...) -> fn's results; dtype "bf16" or "f16"; the
-- previous setting comes back even when fn raises. Autocast is per thread
-- and nests.
function M.autocast(dtype, fn, ...)
  local id = LOW[dtype]
  if not id then T.argerror("autocast", "dtype", "\"bf16\" or \"f16\"", T.describe(dtype)) end
  if type(fn) ~= "function" then T.argerror("autocast", "fn", "a function", T.describe(fn)) end
  local old = C.lm_set_autocast(id)
  local res = T.pack(pcall(fn, ...))
  C.lm_set_autocast(old)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

-- GradScaler{init_scale=2^16, growth_factor=2, backoff_factor=0.5,
-- growth_interval=2000}: scaler:scale(loss):backward(); scaler:step(opt)
-- (unscales the gradients, skips the step when any is inf or NaN on any
-- rank); scaler:update() (halves the scale after a skip, doubles it after
-- growth_interval good steps).
local Scaler = {}
Scaler.__index = Scaler
-- the checks of PyTorch's GradScaler (growth_factor > 1, backoff_factor
-- < 1, an integer growth_interval), and a finite init_scale
local OPTS = { init_scale = true, growth_factor = true, backoff_factor = true, growth_interval = true }
local function finite(v) return type(v) == "number" and v > -math.huge and v < math.huge end
M.GradScaler = function(opts)
  opts = opts or {}
  if type(opts) ~= "table" then T.argerror("GradScaler", "options", "a table", T.describe(opts)) end
  for k in pairs(opts) do
    if not OPTS[k] then error(string.format("GradScaler: unknown option %s", tostring(k)), 2) end
  end
  local s = setmetatable({ scale_ = opts.init_scale or 2 ^ 16, growth = opts.growth_factor or 2,
                           backoff = opts.backoff_factor or 0.5, interval = opts.growth_interval or 2000,
                           good = 0, found_inf = false, unscaled = false }, Scaler)
  if not (finite(s.scale_) and s.scale_ > 0) then
    T.argerror("GradScaler", "init_scale", "a finite number > 0", T.describe(s.scale_))
  end
  if not (finite(s.growth) and s.growth > 1) then
    T.argerror("GradScaler", "growth_factor", "a finite number > 1 (PyTorch: the growth factor must be > 1.0)",
               T.describe(s.growth))
  end
  if not (type(s.backoff) == "number" and s.backoff > 0 and s.backoff < 1) then
    T.argerror("GradScaler", "backoff_factor", "a number in (0, 1)", T.describe(s.backoff))
  end
  if not (finite(s.interval) and s.interval >= 1 and s.interval == math.floor(s.interval)) then
    T.argerror("GradScaler", "growth_interval", "an integer >= 1", T.describe(s.interval))
  end
  return s
end

function Scaler:get_scale() return self.scale_ end
function Scaler:scale(loss) return loss * self.scale_ end

-- the gradients times inv; 1 if any is inf or NaN, else 0 (not a closure
-- over the parameters, which a compiled trace would keep: docs/architecture.md)
local function unscale(params, inv)
  local bad = 0
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then
      g:copy_(g * inv)
      local loc = g.dist ~= nil and g:to_local() or g
      if loc:numel() > 0 and not (loc:abs():max():to("f64"):item() < math.huge) then bad = 1 end
    end
  end
  return bad
end

-- the gradients divided by the scale; whether any is inf or NaN (on any rank)
function Scaler:unscale_(opt)
  if self.unscaled then return end
  local bad = loom.no_grad(unscale, opt.params, 1 / self.scale_)
  local dist = package.loaded["loom.distributed"]
  if dist and dist.is_initialized() and dist.world_size() > 1 then
    bad = dist.all_reduce(loom.tensor({ bad }), "max", dist.world_group()):item()
  end
  self.found_inf, self.unscaled = bad > 0, true
end

function Scaler:step(opt)
  self:unscale_(opt)
  if not self.found_inf then opt:step() end
end

function Scaler:update()
  if self.found_inf then self.scale_, self.good = self.scale_ * self.backoff, 0
  else
    self.good = self.good + 1
    if self.good >= self.interval then self.scale_, self.good = self.scale_ * self.growth, 0 end
  end
  self.found_inf, self.unscaled = false, false
end

function Scaler:state_dict() return { scale = self.scale_, good = self.good } end
function Scaler:load_state_dict(sd)
  if type(sd) ~= "table" or next(sd) == nil then
    T.argerror("GradScaler:load_state_dict", "state_dict", "a GradScaler state_dict {scale, good} (PyTorch: the "
               .. "source state dict is empty)", T.describe(sd))
  end
  if not (finite(sd.scale) and sd.scale > 0) then
    T.argerror("GradScaler:load_state_dict", "state_dict.scale", "a finite number > 0", T.describe(sd.scale))
  end
  if not (finite(sd.good) and sd.good >= 0 and sd.good == math.floor(sd.good)) then
    T.argerror("GradScaler:load_state_dict", "state_dict.good", "an integer >= 0", T.describe(sd.good))
  end
  self.scale_, self.good = sd.scale, sd.good
end

return M
