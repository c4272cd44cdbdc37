-- lr_scheduler.lua: cosine decay with linear warmup.
local T = require("loom.tensor")

local M = {}

-- opts of a schedule: lr and min_lr finite >= 0, warmup and total whole
-- numbers of steps >= 0 (a run may stop inside the warmup)
local function check_schedule(fname, o, need_lr)
  if type(o) ~= "table" or T.is_tensor(o) then T.argerror(fname, "options", "a table", T.describe(o), 3) end
  local function nonneg(k, v, int)
    if type(v) ~= "number" or not (v >= 0 and v < math.huge) or (int and v ~= math.floor(v)) then
      T.argerror(fname, k, int and "an integer >= 0" or "a finite number >= 0", T.describe(v), 4)
    end
  end
  if need_lr then nonneg("lr", o.lr) end
  if o.min_lr ~= nil then nonneg("min_lr", o.min_lr) end
  if o.warmup ~= nil then nonneg("warmup", o.warmup, true) end
  nonneg("total", o.total, true)
end

-- lr at `step` (1-based): linear warmup to base_lr over `warmup` steps, then
-- cosine decay to min_lr at `total` steps (and min_lr after).
function M.cosine_lr(step, opts)
  if type(step) ~= "number" or step ~= step then T.argerror("cosine_lr", "step", "a number", T.describe(step)) end
  check_schedule("cosine_lr", opts, true)
  local base, warmup, total, min_lr = opts.lr, opts.warmup or 0, opts.total, opts.min_lr or 0
  if step <= warmup then return base * step / math.max(1, warmup) end
  if step >= total then return min_lr end
  local t = (step - warmup) / math.max(1, total - warmup)
  return min_lr + 0.5 * (base - min_lr) * (1 + math.cos(math.pi * t))
end

-- CosineWithWarmup(optimizer, {warmup, total, min_lr}): :step() sets the
-- optimizer's lr for the next step.
function M.CosineWithWarmup(optimizer, opts)
  if type(optimizer) ~= "table" or type(optimizer.set_lr) ~= "function" then
    T.argerror("CosineWithWarmup", "optimizer", "an optimizer (SGD, AdamW)", T.describe(optimizer))
  end
  check_schedule("CosineWithWarmup", opts, false)
  local self = { opt = optimizer, last = 0, opts = { lr = optimizer:get_lr(), warmup = opts.warmup,
                 total = opts.total, min_lr = opts.min_lr } }
  function self.step(s)
    s.last = s.last + 1
    s.opt:set_lr(M.cosine_lr(s.last, s.opts))
  end
  self:step()
  return self
end

return M
