-- weights.lua: loom.nn.init, PyTorch's torch.nn.init: in-place fills of
-- parameters, without autograd. Random fills draw each element from its
-- global index (the counter-based RNG), so a DTensor's shard gets exactly
-- its slice of the full draw and a meta tensor uses the counters a real
-- draw would: a model built on meta, parallelised and materialised, then
-- initialised, equals the model built the ordinary way, bit for bit.
local loom = require("loom")
local T = require("loom.tensor")
local C = loom.C

local M = {}
local UNIFORM, NORMAL = 0, 1

-- the local tensor and, for a DTensor, its global shape and offsets
local function layout(t)
  if t.dist == nil then return t, nil, nil end
  local g, off = T.shard_block(t)
  return t:to_local(), g, off
end

local function check(fname, t)
  T.check_tensor(t, fname, "tensor")
  if not T.is_float_dtype(t.dtype) then T.argerror(fname, "tensor", "a floating point tensor", t.dtype .. " tensor", 3) end
end

-- (fill_random and fill take the tensor as an argument: a closure over it
-- would be kept by a compiled trace, docs/architecture.md)
local function fill_random(t, kind, a, b)
  local loc, g, off = layout(t)
  if C.lm_random_(loc, kind, a, b, g, off) < 0 then T.c_error(4) end
end

local function fill(t, v)
  if C.lm_fill_((layout(t)), v) < 0 then T.c_error(3) end
end

local function random_(fname, t, kind, a, b)
  check(fname, t)
  for name, v in pairs { a = a, b = b } do
    if type(v) ~= "number" or v ~= v then T.argerror(fname, name, "a number", T.describe(v), 3) end
  end
  loom.no_grad(fill_random, t, kind, a, b)
  return t
end

-- uniform_(t, a, b): U(a, b)
function M.uniform_(t, a, b) return random_("uniform_", t, UNIFORM, a or 0, b or 1) end
-- normal_(t, mean, std): N(mean, std^2)
function M.normal_(t, mean, std)
  if std ~= nil and (type(std) ~= "number" or std < 0) then T.argerror("normal_", "std", "a number >= 0", T.describe(std)) end
  return random_("normal_", t, NORMAL, mean or 0, std or 1)
end

function M.constant_(t, v)
  check("constant_", t)
  if type(v) ~= "number" then T.argerror("constant_", "val", "a number", T.describe(v)) end
  loom.no_grad(fill, t, v)
  return t
end
function M.zeros_(t) return M.constant_(t, 0) end
function M.ones_(t) return M.constant_(t, 1) end

return M
