-- utils.lua: loom.nn.utils, gradient clipping.
local loom = require "loom"
local T = require "loom.tensor"

local M = {}

-- The squared L2 norm of each gradient, summed in f64. A hook lets the
-- distributed layer add the reduction across shards.
function M.grad_norm_squared(params)
  local total = 0
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then total = total + (g:to("f64") ^ 2):sum():item() end
  end
  return total
end

-- clip_grad_norm_(params, max_norm): scales gradients in place so their
-- global L2 norm is at most max_norm (PyTorch's rule: coef = max_norm /
-- (norm + 1e-6), capped at 1); returns the norm before clipping.
function M.clip_grad_norm_(params, max_norm)
  if T.is_tensor(params) then params = { params } end
  if type(params) ~= "table" then T.argerror("clip_grad_norm_", "parameters", "a table of tensors", T.describe(params)) end
  if type(max_norm) ~= "number" or max_norm <= 0 then
    T.argerror("clip_grad_norm_", "max_norm", "a positive number", T.describe(max_norm))
  end
  local norm = math.sqrt(M.grad_norm_squared(params))
  local coef = max_norm / (norm + 1e-6)
  if coef < 1 then
    loom.no_grad(function()
      for _, p in ipairs(params) do
        local g = p.grad
        if g ~= nil then g:copy_(g * coef) end
      end
    end)
  end
  return norm
end

return M
