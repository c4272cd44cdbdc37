-- utils.lua: loom.nn.utils, gradient clipping.
local loom = require("loom")
local T = require("loom.tensor")

local M = {}

-- sum of g's squares: f64 and f32 gradients squared as they are (an f32
-- square rounded once, 6e-8 of it), bf16/f16 ones widened to f32 first,
-- the sum accumulated in f64 by the CPU's sum kernel: a third of the bytes
-- of widening every gradient to f64 (a 97M model's clipping: 69 -> 21 ms).
-- sum_sq: a number (a wait for the device), the temporaries freed at once
-- rather than left to the GC; sum_sq_t: a 1-element f64 tensor on g's
-- device (no wait)
local function squares(g)
  local d = (g.dtype == "f64" or g.dtype == "f32") and g or g:to("f32")
  return d * d, d
end
local function sum_sq(g)
  local sq, d = squares(g)
  local v = sq:sum():item()
  sq:free()
  if d ~= g then d:free() end
  return v
end
local function sum_sq_t(g)
  return (squares(g)):sum():to("f64"):reshape(1)
end

-- The terms of the squared norm: total (plain gradients) and the groups
-- of DTensor gradients by (mesh, sharded dims), each with its sum of local
-- squares and the device its all-reduce runs on. sq sums one gradient,
-- zero() is an empty sum (numbers or tensors).
local function norm_terms(params, sq, zero)
  local total, groups, order = zero(), {}, {}
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
      local key = table.concat(dims, ",")
      groups[mesh] = groups[mesh] or {}
      local grp = groups[mesh][key]
      if not grp then
        grp = { mesh = mesh, dims = dims, sum = zero(), device = loc.device } -- the mesh's collectives run there
        groups[mesh][key], order[#order + 1] = grp, grp
      end
      grp.sum = grp.sum + sq(loc)
    elseif g ~= nil then
      total = total + sq(g)
    end
  end
  return total, order
end

-- a group's sum all-reduced over its sharded dims (a tensor on its device)
local function reduced(grp)
  local t = type(grp.sum) == "number" and loom.tensor({ grp.sum }, { dtype = "f64" }):to(grp.device) or grp.sum
  local dist = require("loom.distributed")
  for _, d in ipairs(grp.dims) do t = dist.all_reduce(t, "sum", grp.mesh, d) end
  return t
end

-- The squared L2 norm of all the gradients, summed in f64, global over
-- sharded ones: a DTensor gradient adds the squares of its local shard,
-- all-reduced over the mesh dims where it is sharded (a replicated dim
-- counts it once; a Partial one is reduced first). One all-reduce per
-- (mesh, sharded dims) group; every rank must pass the same parameters,
-- as SPMD code does.
function M.grad_norm_squared(params)
  local total, order = norm_terms(params, sum_sq, function() return 0 end)
  for _, grp in ipairs(order) do total = total + reduced(grp):item() end
  return total
end

-- On a GPU (every gradient on one device that is not the CPU) the same
-- sum is kept there, a 1-element f64 tensor, with no copy to the host per
-- gradient (each would wait for the device); nil elsewhere.
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
  local total, order = norm_terms(params, sum_sq_t, function() return loom.zeros({ 1 }, { dtype = "f64", device = dev }) end)
  for _, grp in ipairs(order) do total = total + reduced(grp) end
  return total
end

-- the gradients times min(1, max_norm / (norm + 1e-6)), norm a tensor on
-- their device. (scale_by* are functions of the module, not closures over
-- params: docs/architecture.md, "Rules of the house".)
local function scale_by_tensor(params, max_norm, norm)
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
    loom.no_grad(scale_by_tensor, params, max_norm, norm)
    if opts.tensor then return norm end
    return norm:item()
  end
  local norm = math.sqrt(M.grad_norm_squared(params))
  M.clip_grads_with_norm_(params, max_norm, norm)
  return norm
end

-- clip_grads_with_norm_(params, max_norm, total_norm): scales gradients in
-- place by max_norm / (total_norm + 1e-6) when that is below 1, with a norm
-- computed elsewhere (PyTorch's name; pipeline stages sum theirs over pp)
local function scale_by(params, coef)
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then g:copy_(g * coef) end
  end
end

function M.clip_grads_with_norm_(params, max_norm, total_norm)
  local coef = max_norm / (total_norm + 1e-6)
  if coef >= 1 then return end
  loom.no_grad(scale_by, params, coef)
end

return M
