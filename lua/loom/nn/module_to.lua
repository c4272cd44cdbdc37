-- module_to.lua: where a module's tensors live and in what dtype:
-- Module:to(device | dtype | {device=, dtype=}) and its shorthands, and the
-- meta-device flow of big models: build on "meta" (shapes, no memory),
-- parallelise, then to_empty(device) and init_weights() materialise only
-- this rank's shards, drawn from the same global-index RNG as an ordinary
-- build (so they equal its slices bit for bit).
-- As in PyTorch, build the optimizer after moving the model: moved
-- parameters are new tensors.
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local Module = require("loom.nn.module")


-- Replaces every parameter and buffer t of the module tree by make(t, fqn,
-- is_param) (the same new tensor where one was shared, e.g. tied weights);
-- parameters keep requires_grad. (Not a closure over self: a compiled trace
-- would keep it; docs/architecture.md, "Rules of the house".)
local function convert_all(self, make, by)
  local memo = {}
  for _, mm in ipairs(self:named_modules()) do
    for _, kind in ipairs { "_parameters", "_buffers" } do
      local tab = rawget(mm[2], kind)
      for _, name in ipairs(rawget(mm[2], "_order")[kind]) do  -- in registration order
        local t = tab[name]
        if t == nil then goto next end
        local key = T.address(t)
        if memo[key] == nil then
          local new = make(t, mm[1] == "" and name or mm[1] .. "." .. name, kind == "_parameters")
          if new ~= t and kind == "_parameters" and t.requires_grad then new = new:detach():requires_grad_(true) end
          if new ~= t and kind == "_parameters" then T.replaced[t] = by end
          memo[key] = new
        end
        tab[name] = memo[key]
        ::next::
      end
    end
  end
end

local function convert(self, make, by)
  loom.no_grad(convert_all, self, make, by)
  return self
end

-- the device a DTensor's mesh is on, or nil
local function mesh_device(t)
  if t.dist == nil then return nil end
  return t.device_mesh.device_type
end

-- to(device), to(dtype), to({device=, dtype=}): dtypes apply to floating
-- point tensors only (as PyTorch's); a DTensor stays on its mesh's device.
function Module:to(what)
  local dtype, device
  if type(what) == "table" then dtype, device = what.dtype, what.device
  elseif type(what) == "string" and T.is_float_dtype(what) then dtype = what
  elseif type(what) == "string" and pcall(T.dtype_id, what) then   -- i64, bool: a dtype, not a device
    T.argerror("Module:to", "dtype", "a floating point dtype (f32, f64, bf16, f16): Module:to converts floating "
               .. "point tensors only", what .. ", a non-float dtype")
  elseif type(what) == "string" then device = what
  else T.argerror("Module:to", "argument #1", "a device, a floating point dtype or {device=, dtype=}", T.describe(what)) end
  if dtype ~= nil and not T.is_float_dtype(dtype) then
    T.argerror("Module:to", "dtype", "a floating point dtype (f32, f64, bf16, f16)", T.describe(dtype))
  end
  -- by device number: "cuda" is the current cuda:k, and a tensor on
  -- another cuda:j moves to it (as torch's module.to("cuda") does)
  local did = device ~= nil and T.device_id(device, "Module:to") or nil
  return convert(self, function(t, fqn)
    local md = mesh_device(t)
    if device and md and not device:match("^" .. md) then
      error(string.format("Module:to: %s is a DTensor on a %q mesh; it cannot move to %s (build the mesh on %s)",
                          fqn, md, device, device), 5)
    end
    if t.is_meta and device and device ~= "meta" then
      error(string.format("Module:to: %s is on the meta device, which has no data; use to_empty(%q), "
                          .. "then init_weights()", fqn, device), 5)
    end
    local y = t
    if dtype and T.is_float_dtype(t.dtype) and t.dtype ~= dtype then y = y:to(dtype) end
    if did and y.device_ ~= did then y = y:to(device) end
    return y
  end, "Module:to")
end
function Module:cuda(k) return self:to(k and ("cuda:" .. k) or "cuda") end
function Module:cpu() return self:to("cpu") end
function Module:float() return self:to("f32") end
function Module:double() return self:to("f64") end
function Module:bfloat16() return self:to("bf16") end
function Module:half() return self:to("f16") end

-- to_empty(device): every tensor of a module built on meta gets memory on
-- device, uninitialised (a DTensor: its shard only); then init_weights().
function Module:to_empty(device)
  local dev = T.device_id(device, "to_empty")
  local dist = package.loaded["loom.distributed"]
  return convert(self, function(t, fqn)
    if not t.is_meta then
      error(string.format("to_empty: %s is on %s; to_empty materialises a module built on the meta device",
                          fqn, t.device), 5)
    end
    local loc = t.dist ~= nil and t:to_local() or t
    local e = T.wrap(loom.C.lm_empty(loc:dim(), ffi.new("int64_t[8]", loc:size()), loc.dtype_, dev))
    if t.dist == nil then return e end
    return dist.DTensor.from_local(e, t.device_mesh, t.placements, { shape = t:size(), run_check = false })
  end, "to_empty")
end

-- init_weights(): every module's reset_parameters(), in the order the
-- modules were built, drawing what their constructors drew.
local function reset_all(self)
  for _, mm in ipairs(self:named_modules()) do
    if mm[2].reset_parameters then mm[2]:reset_parameters() end
  end
end

function Module:init_weights()
  loom.no_grad(reset_all, self)
  return self
end

return Module
