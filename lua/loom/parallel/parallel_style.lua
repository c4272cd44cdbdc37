-- parallel_style.lua: ParallelStyle, the base of the tensor-parallel styles, and the
-- input/output preparation they share (PyTorch's tensor/parallel/style.py).
-- A style's apply(module, mesh) shards the module's parameters and installs
-- forward hooks that lay out its inputs and outputs.
local T = require("loom.tensor")
local dt = require("loom.distributed.dtensor")

local M = {}

local ParallelStyle = { __name = "ParallelStyle" }
ParallelStyle.__index = ParallelStyle
M.ParallelStyle = ParallelStyle

-- ParallelStyle:extend("Name") makes a style class; Name{opts} an instance.
function ParallelStyle:extend(name)
  local cls = setmetatable({ __name = name }, { __index = self,
    __call = function(c, opts) return c.new(c, opts) end })
  cls.__index = cls
  cls.__tostring = function(s) return s:repr() end
  return cls
end

function ParallelStyle.new(cls, opts)
  local self = setmetatable({}, cls)
  if cls.__init then cls.__init(self, opts or {}) end
  return self
end

function ParallelStyle:apply(module, mesh)
  error(self.__name .. ": apply(module, device_mesh) is not implemented", 2)
end

-- tostring lists the settings, e.g. ColwiseParallel(input_layouts=(Replicate()), ...)
local function show(v)
  if type(v) == "table" and not dt.is_placement(v) then
    local parts = {}
    for i = 1, v.n or #v do parts[i] = v[i] == nil and "nil" or tostring(v[i]) end
    return "(" .. table.concat(parts, ", ") .. ")"
  end
  return tostring(v)
end
function ParallelStyle:repr()
  local keys = {}
  for k in pairs(self) do if not k:match("^_") then keys[#keys + 1] = k end end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. "=" .. show(self[k]) end
  return self.__name .. "(" .. table.concat(parts, ", ") .. ")"
end

---------------------------------------------------------------------------
-- shared pieces

-- a placement option: a placement, or nil for the default
function M.layout(style, name, v, default)
  if v == nil then return default end
  if not dt.is_placement(v) then T.argerror(style, name, "a placement (Shard, Replicate, Partial)", T.describe(v), 4) end
  return v
end

-- a list of placements (nil entries allowed), counted in .n; errors at
-- level (default 4: the caller of the style's constructor)
function M.layouts(style, name, v, level)
  level = level or 4
  if v == nil then return nil end
  if dt.is_placement(v) then v = { v } end
  if type(v) ~= "table" then T.argerror(style, name, "a table of placements", T.describe(v), level) end
  -- table.maxn, not a pairs() loop: LuaJIT 2.1's compiled next() gave a
  -- count that compared unequal to an equal one in a later trace
  local n = math.max(v.n or 0, table.maxn(v))
  local out = { n = n }
  for i = 1, n do
    if v[i] ~= nil and not dt.is_placement(v[i]) then
      T.argerror(style, name .. "[" .. i .. "]", "a placement or nil", T.describe(v[i]), level)
    end
    out[i] = v[i]
  end
  return out
end

-- x laid out as `from` (a plain x is this rank's shard of it), then moved
-- to `to`; to_local when asked.
function M.prepare(x, mesh, from, to, use_local)
  if not T.is_tensor(x) then return x end
  if from ~= nil and not dt.is_dtensor(x) then x = dt.from_local(x, mesh, { from }) end
  if to ~= nil and dt.is_dtensor(x) and x.placements[1] ~= to then x = x:redistribute(mesh, { to }) end
  if use_local and dt.is_dtensor(x) then x = x:to_local() end
  return x
end

-- Parameters already distributed, by the plain tensor they replaced: a
-- tied parameter (one tensor registered in two modules, e.g. the embedding
-- and the output projection) stays one parameter when both modules are
-- parallelized, provided both styles place it alike.
local distributed = setmetatable({}, { __mode = "k" })

local function pl_string(d)
  local t = {}
  for i, p in ipairs(d.placements) do t[i] = tostring(p) end
  return "(" .. table.concat(t, ", ") .. ")"
end

-- parameters of module replaced by DTensors made by fn(name, param);
-- what names the style and module for errors
function M.shard_parameters(module, fn, what)
  for _, kv in ipairs(module:named_parameters()) do
    local name, p = kv[1], kv[2]
    if not name:find(".", 1, true) then
      local d = fn(name, p)
      local prev = distributed[p]
      if prev ~= nil then
        if pl_string(prev) ~= pl_string(d) or prev.device_mesh ~= d.device_mesh then
          error(string.format("%s: parameter %s is tied to a parameter already distributed as %s on %s, "
                              .. "this style places it as %s; tied parameters must be placed alike",
                              what or "parallelize_module", name, pl_string(prev), tostring(prev.device_mesh),
                              pl_string(d)), 4)
        end
        d = prev
      else
        distributed[p] = d
      end
      module[name] = d
    end
  end
end

-- a module may be parallelized once
function M.claim(module, style, fqn)
  if rawget(module, "_tp_style") then
    error(string.format("parallelize_module: %s (%s) is already parallelized by %s", fqn ~= "" and fqn or "the root",
                        module.__name, rawget(module, "_tp_style")), 4)
  end
  rawset(module, "_tp_style", style.__name)
end

return M
