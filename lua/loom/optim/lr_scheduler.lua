-- lr_scheduler.lua: cosine decay with linear warmup.
local M = {}

-- lr at `step` (1-based): linear warmup to base_lr over `warmup` steps, then
-- cosine decay to min_lr at `total` steps (and min_lr after).
function M.cosine_lr(step, opts)
  local base, warmup, total, min_lr = opts.lr, opts.warmup or 0, opts.total, opts.min_lr or 0
  if step <= warmup then return base * step / math.max(1, warmup) end
  if step >= total then return min_lr end
  local t = (step - warmup) / math.max(1, total - warmup)
  return min_lr + 0.5 * (base - min_lr) * (1 + math.cos(math.pi * t))
end

-- CosineWithWarmup(optimizer, {warmup, total, min_lr}): :step() sets the
-- optimizer's lr for the next step.
function M.CosineWithWarmup(optimizer, opts)
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
