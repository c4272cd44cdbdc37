-- utils.lua: loom.nn.utils, gradient clipping.
local loom = require "loom"
local T = require "loom.tensor"

local M = {}

-- sum of g's squares in f64 (where squares of f32 are exact), the
-- temporaries freed at once rather than left to the GC
local function sum_sq(g)
  local d = g.dtype == "f64" and g or g:to("f64")
  local sq = d * d
  local v = sq:sum():item()
  sq:free()
  if d ~= g then d:free() end
  return v
end

-- The squared L2 norm of all the gradients, summed in f64, global over
-- sharded ones: a DTensor gradient adds the squares of its local shard,
-- all-reduced over the mesh dims where it is sharded (a replicated dim
-- counts it once; a Partial one is reduced first). One all-reduce per
-- (mesh, sharded dims) group; every rank must pass the same parameters,
-- as SPMD code does.
function M.grad_norm_squared(params)
  local total = 0
  local groups, order = {}, {}
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil and g.dist ~= nil then
      local pl, mesh = g.placements, g.device_mesh
      local partial, dims = false, {}
      for k, q in ipairs(pl) do
        if q:is_partial() then partial = true end
        if q:is_shard() then dims[#dims + 1] = k end
      end
      if partial then
        local to = {}
        for k, q in ipairs(pl) do to[k] = q:is_partial() and require("loom.distributed").Replicate() or q end
        g = g:redistribute(mesh, to)
      end
      local loc = g:to_local()
      local sq = sum_sq(loc)
      local key = table.concat(dims, ",")
      groups[mesh] = groups[mesh] or {}
      local grp = groups[mesh][key]
      if not grp then
        grp = { mesh = mesh, dims = dims, sum = 0, device = loc.device } -- the mesh's collectives run there
        groups[mesh][key] = grp
        order[#order + 1] = grp
      end
      grp.sum = grp.sum + sq
    elseif g ~= nil then
      total = total + sum_sq(g)
    end
  end
  if #order > 0 then
    local dist = require "loom.distributed"
    for _, grp in ipairs(order) do
      local t = loom.tensor({ grp.sum }, { dtype = "f64" }):to(grp.device)
      for _, d in ipairs(grp.dims) do t = dist.all_reduce(t, "sum", grp.mesh, d) end
      total = total + t:item()
    end
  end
  return total
end

-- On a GPU (every gradient on one device that is not the CPU) the norm is
-- summed there, as a 1-element f64 tensor, with no copy to the host per
-- gradient (each would wait for the device); nil elsewhere. The terms and
-- the all-reduces are grad_norm_squared's.
local function norm_sq_on_device(params)
  local dev
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then
      local d = g.dist ~= nil and g:to_local().device or g.device
      if d == "cpu" or (dev and d ~= dev) then return nil end
      dev = d
    end
  end
  if not dev then return nil end
  local function sq(g)
    local d = g.dtype == "f64" and g or g:to("f64")
    return (d * d):sum():reshape(1)
  end
  local total = loom.zeros({ 1 }, { dtype = "f64", device = dev })
  local groups, order = {}, {}
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil and g.dist ~= nil then
      local pl, mesh, partial, dims = g.placements, g.device_mesh, false, {}
      for k, q in ipairs(pl) do
        if q:is_partial() then partial = true end
        if q:is_shard() then dims[#dims + 1] = k end
      end
      if partial then
        local to = {}
        for k, q in ipairs(pl) do to[k] = q:is_partial() and require("loom.distributed").Replicate() or q end
        g = g:redistribute(mesh, to)
      end
      local key = table.concat(dims, ",")
      groups[mesh] = groups[mesh] or {}
      local grp = groups[mesh][key]
      if not grp then
        grp = { mesh = mesh, dims = dims, sum = loom.zeros({ 1 }, { dtype = "f64", device = dev }) }
        groups[mesh][key], order[#order + 1] = grp, grp
      end
      grp.sum = grp.sum + sq(g:to_local())
    elseif g ~= nil then
      total = total + sq(g)
    end
  end
  local dist = #order > 0 and require "loom.distributed"
  for _, grp in ipairs(order) do
    local t = grp.sum
    for _, d in ipairs(grp.dims) do t = dist.all_reduce(t, "sum", grp.mesh, d) end
    total = total + t
  end
  return total
end

-- clip_grad_norm_(params, max_norm [, {tensor = true}]): scales gradients
-- in place so their global L2 norm is at most max_norm (PyTorch's rule:
-- coef = max_norm / (norm + 1e-6), capped at 1); returns the norm before
-- clipping, a number (on a GPU: one wait for it), or with tensor = true and
-- the gradients on a GPU a 1-element f64 tensor there (no wait: a training
-- step that does not read it waits for nothing).
function M.clip_grad_norm_(params, max_norm, opts)
  if T.is_tensor(params) then params = { params } end
  if type(params) ~= "table" then T.argerror("clip_grad_norm_", "parameters", "a table of tensors", T.describe(params)) end
  for i, p in ipairs(params) do
    if not T.is_tensor(p) then T.argerror("clip_grad_norm_", "parameters[" .. i .. "]", "a tensor", T.describe(p)) end
  end
  if type(max_norm) ~= "number" or not (max_norm > 0) then
    T.argerror("clip_grad_norm_", "max_norm", "a positive number", T.describe(max_norm))
  end
  opts = T.check_opts("clip_grad_norm_", opts, { tensor = true })
  local sq = norm_sq_on_device(params)
  if sq then
    local norm = sq:sqrt()
    loom.no_grad(function()
      local coef = (max_norm / (norm + 1e-6)):clamp(nil, 1)
      local by = {}
      for _, p in ipairs(params) do
        local g = p.grad
        if g ~= nil then
          if g.dist ~= nil then g = g:to_local() end
          local cd = g.dtype == "f64" and "f64" or "f32"  -- coef in the compute dtype, as a number would be
          by[cd] = by[cd] or coef:to(cd)
          g:copy_(g * by[cd])
        end
      end
    end)
    if opts.tensor then return norm end
    return norm:item()
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
