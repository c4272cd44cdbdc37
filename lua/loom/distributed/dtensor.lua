-- dtensor.lua: placements (Shard, Replicate, Partial), DTensor creation
-- (distribute_tensor, from_local, factories), redistribution and the
-- DTensor face of a tensor (global size, placements, device_mesh). The
-- spec lives in C on the tensor; ops on DTensors are dispatched there.
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local TC = require("loom.tensor_create")
local C = loom.C

local M = {}
local Tensor = T.Tensor

---------------------------------------------------------------------------
-- placements

-- one Placement class per process, in the registry (see meshes below)
local Placement = debug.getregistry()["loom.Placement"] or {}
debug.getregistry()["loom.Placement"] = Placement
Placement.__index = Placement
-- kinds and reduce ops by name, as core/loom.h numbers them
local KIND = { Replicate = C.LM_REPLICATE, Shard = C.LM_SHARD, Partial = C.LM_PARTIAL }
local REDUCE = { sum = C.LM_RED_SUM, avg = C.LM_RED_AVG, max = C.LM_RED_MAX, min = C.LM_RED_MIN }
local REDUCE_NAME = {}
for name, id in pairs(REDUCE) do REDUCE_NAME[id] = name end

local function placement(kind, dim, op) return setmetatable({ kind = kind, dim = dim, reduce_op = op }, Placement) end

-- Shard(dim): dim is 1-based; negative counts from the end of the tensor.
function M.Shard(dim)
  if type(dim) ~= "number" or dim ~= math.floor(dim) or dim == 0 then
    T.argerror("Shard", "dim", "a non-zero integer (1-based, negative from the end)", T.describe(dim))
  end
  return placement("Shard", dim)
end
function M.Replicate() return placement("Replicate") end
function M.Partial(op)
  op = op or "sum"
  if not REDUCE[op] then T.argerror("Partial", "reduce_op", "\"sum\", \"avg\", \"max\" or \"min\"", T.describe(op)) end
  return placement("Partial", nil, op)
end

function Placement:is_shard(dim) return self.kind == "Shard" and (dim == nil or self.dim == dim) end
function Placement:is_replicate() return self.kind == "Replicate" end
function Placement:is_partial() return self.kind == "Partial" end
function Placement.__eq(a, b) return a.kind == b.kind and a.dim == b.dim and a.reduce_op == b.reduce_op end
function Placement.__tostring(p)
  if p.kind == "Shard" then return "Shard(dim=" .. p.dim .. ")" end
  if p.kind == "Partial" then return "Partial(" .. p.reduce_op .. ")" end
  return "Replicate()"
end
local function is_placement(p) return getmetatable(p) == Placement end
M.is_placement = is_placement

-- Lua placements -> lm_placement[ndim] for a tensor of nd dims (Shard dims
-- normalised): the one place Lua placements become C's. argname names
-- them in errors ("placements" by default); shards_only refuses Partial.
local function c_placements(fname, mesh, placements, nd, argname, shards_only)
  argname = argname or "placements"
  if is_placement(placements) then placements = { placements } end
  if type(placements) ~= "table" or #placements ~= mesh.ndim then
    T.argerror(fname, argname, string.format("a table of %d placements (one per mesh dim)", mesh.ndim),
               type(placements) == "table" and #placements .. " placements" or T.describe(placements), 4)
  end
  local pl = ffi.new("lm_placement[?]", C.LM_MAX_MESH)
  for k, p in ipairs(placements) do
    if not is_placement(p) or (shards_only and p.kind == "Partial") then
      T.argerror(fname, argname .. "[" .. k .. "]", shards_only and "Shard(d) or Replicate()"
                 or "Shard(d), Replicate() or Partial(op)", is_placement(p) and tostring(p) or T.describe(p), 4)
    end
    pl[k - 1].kind = KIND[p.kind]
    if p.kind == "Shard" then
      local d = p.dim < 0 and nd + p.dim + 1 or p.dim
      if d < 1 or d > nd then
        T.argerror(fname, argname .. "[" .. k .. "]", string.format("a Shard dim within the tensor's %d dims", nd),
                   tostring(p), 4)
      end
      pl[k - 1].dim = d - 1
    elseif p.kind == "Partial" then
      pl[k - 1].op = REDUCE[p.reduce_op]
    end
  end
  return pl
end

---------------------------------------------------------------------------
-- meshes in C: one lm_mesh per DeviceMesh, found back by address

-- C mesh address -> DeviceMesh. Meshes live as long as the program; the
-- table sits in the Lua registry so that a second load of this module
-- (busted reloads modules per spec file) sees the same meshes.
local REG = debug.getregistry()
REG["loom.meshes"] = REG["loom.meshes"] or {}
local meshes = REG["loom.meshes"]

local function c_mesh(mesh)
  local dist = require("loom.distributed")
  if not dist.is_mesh(mesh) then T.argerror("DTensor", "device_mesh", "a DeviceMesh", T.describe(mesh), 4) end
  local h = rawget(mesh, "_c")
  if h then return h end
  local n = mesh.ndim
  local shape, coord, comms = ffi.new("int64_t[4]"), ffi.new("int64_t[4]"), ffi.new("lm_comm*[4]")
  for k = 1, n do
    shape[k - 1], coord[k - 1] = mesh.shape[k], mesh:get_coordinate()[k]
    comms[k - 1] = mesh:get_group(k).comm
  end
  h = C.lm_mesh_new(n, shape, coord, comms, mesh.device_type == "cuda" and 1 or 0)
  if h == nil then T.c_error(3) end
  h = ffi.gc(h, C.lm_mesh_release)
  rawset(mesh, "_c", h)
  meshes[T.address(h)] = mesh
  return h
end
M._c_mesh = c_mesh
M._c_placements = c_placements

local function is_dtensor(x) return T.is_tensor(x) and x.dist ~= nil end
M.is_dtensor = is_dtensor

-- spec of a DTensor: placements (Lua), global size, mesh (Lua)
local spec_pl, spec_shape, spec_mesh = ffi.new("lm_placement[4]"), ffi.new("int64_t[8]"), ffi.new("lm_mesh*[1]")
local function spec(x)
  local nm = C.lm_dtensor_spec(x, spec_pl, spec_shape, spec_mesh)
  local placements, size = {}, {}
  for k = 1, nm do
    local p = spec_pl[k - 1]
    if p.kind == C.LM_REPLICATE then placements[k] = M.Replicate()
    elseif p.kind == C.LM_SHARD then placements[k] = M.Shard(p.dim + 1)
    else placements[k] = M.Partial(REDUCE_NAME[p.op]) end
  end
  for d = 1, x.ndim do size[d] = tonumber(spec_shape[d - 1]) end
  return placements, size, meshes[T.address(spec_mesh[0])]
end

---------------------------------------------------------------------------
-- making DTensors

local shapebuf = ffi.new("int64_t[8]")

-- DTensor.from_local(t, mesh, placements, {run_check=false, shape}): t is
-- this rank's shard; shape (the global size) is needed for uneven shards.
function M.from_local(t, mesh, placements, opts)
  T.check_tensor(t, "from_local", "local_tensor")
  mesh = mesh or (require("loom.distributed")).current_mesh()
  opts = T.check_opts("from_local", opts, { run_check = true, shape = true, stride = true })
  local m = c_mesh(mesh)
  local pl = c_placements("from_local", mesh, placements, t:dim())
  local gs = nil
  if opts.shape then
    if type(opts.shape) ~= "table" or #opts.shape ~= t:dim() then
      T.argerror("from_local", "shape", "a table of " .. t:dim() .. " sizes", T.describe(opts.shape))
    end
    T.check_size("from_local", opts.shape)
    for d = 1, #opts.shape do shapebuf[d - 1] = opts.shape[d] end
    gs = shapebuf
  end
  return T.wrap(C.lm_dtensor_from_local(t, m, pl, gs, opts.run_check and 1 or 0))
end

-- t's shard as a DTensor (see distribute_tensor; a function of the module,
-- not a closure over t, which a compiled trace would keep: docs/architecture.md)
local function distribute(t, mesh, m, pl, src)
  local full = t:detach()
  if src ~= nil and not t.is_meta then   -- (a meta tensor has no data to send)
    if type(src) ~= "number" then T.argerror("distribute_tensor", "src_data_rank", "a rank or nil", T.describe(src)) end
    local dist = require("loom.distributed")
    for k = 1, mesh.ndim do full = dist.broadcast(full, src, mesh, k) end
  end
  local gshape = full:size()
  for i = 1, #gshape do shapebuf[i - 1] = gshape[i] end
  local lshape, off = ffi.new("int64_t[8]"), ffi.new("int64_t[8]")
  C.lm_shard_layout(m, #gshape, shapebuf, pl, nil, lshape, off)
  local piece = full
  for i = 1, #gshape do
    if tonumber(lshape[i - 1]) ~= gshape[i] then piece = piece:narrow(i, tonumber(off[i - 1]) + 1, tonumber(lshape[i - 1])) end
  end
  return T.wrap(C.lm_dtensor_from_local(piece:contiguous():clone(), m, pl, shapebuf, 0))
end

-- distribute_tensor(t, mesh, placements, {src_data_rank=0}): t is the whole
-- tensor; with src_data_rank (a rank of each mesh dim, 0 by default) every
-- rank takes its shard of that rank's data (a broadcast per mesh dim); with
-- src_data_rank = false (PyTorch's None) each rank slices its own t with no
-- communication. The result is a leaf with t's requires_grad.
function M.distribute_tensor(t, mesh, placements, opts)
  T.check_tensor(t, "distribute_tensor", "tensor")
  if is_dtensor(t) then error("distribute_tensor: the tensor is already a DTensor", 2) end
  mesh = mesh or (require("loom.distributed")).current_mesh()
  if mesh == nil then error("distribute_tensor: no device_mesh given and no ambient mesh (mesh:use)", 2) end
  opts = T.check_opts("distribute_tensor", opts, { src_data_rank = true })
  -- Lua tables cannot hold nil: src_data_rank = false asks for no communication
  local src = opts.src_data_rank
  if src == nil then src = 0 elseif src == false then src = nil end
  local m = c_mesh(mesh)
  if src ~= nil then   -- a rank along every mesh dim: below the smallest dim's size
    local smallest = math.huge
    for k = 1, mesh.ndim do smallest = math.min(smallest, mesh.shape[k]) end
    if not T.is_int(src) or src < 0 or src >= smallest then
      T.argerror("distribute_tensor", "src_data_rank", string.format("a rank in [0, %d] or false", smallest - 1),
                 T.describe(src))
    end
  end
  local pl = c_placements("distribute_tensor", mesh, placements, t:dim())
  for k = 0, mesh.ndim - 1 do
    if pl[k].kind == C.LM_PARTIAL then error("distribute_tensor: Partial placements cannot be distributed (use from_local)", 2) end
  end
  local requires_grad = t.requires_grad
  local d = loom.no_grad(distribute, t, mesh, m, pl, src)
  if requires_grad then d:requires_grad_(true) end
  return d
end

-- rank 0's RNG state, on every rank (PyTorch's DTensor random ops sync it
-- from rank 0): ranks seeded differently still draw one replicated tensor
-- or dropout mask. A collective over the world, as every random DTensor
-- op is (SPMD: every rank makes the same calls).
local function sync_rng()
  local dist = require("loom.distributed")
  if not dist.is_initialized() or dist.world_size() == 1 then return end
  local st = TC.get_rng_state()
  local buf = TC.empty({ 2 }, { dtype = "i64" })
  local p = ffi.cast("uint64_t *", C.lm_data(buf))
  p[0], p[1] = st.seed, st.offset
  buf = dist.broadcast(buf, 0, dist.world_group())
  p = ffi.cast("uint64_t *", C.lm_data(buf))
  TC.set_rng_state({ seed = p[0], offset = p[1] })
end
M._sync_rng = sync_rng

-- factories: only this rank's shard is allocated; random ones draw each
-- element from its global index, so they equal slices of the full draw.
local function factory(name, fill, float_only)
  return function(size, mesh, placements, opts)
    if type(size) == "number" then size = { size } end
    T.check_size(name, size)
    mesh = mesh or (require("loom.distributed")).current_mesh()
    if mesh == nil then error(name .. ": no device_mesh given and no ambient mesh (mesh:use)", 2) end
    opts = T.check_opts(name, opts, TC.CREATE_OPTS)
    if float_only then TC.check_float_dtype(name, opts.dtype) end
    local m = c_mesh(mesh)
    local pl = c_placements(name, mesh, placements, #size)
    for i = 1, #size do shapebuf[i - 1] = size[i] end
    local lshape, off = ffi.new("int64_t[8]"), ffi.new("int64_t[8]")
    C.lm_shard_layout(m, #size, shapebuf, pl, nil, lshape, off)
    local ls = {}
    for i = 1, #size do ls[i] = tonumber(lshape[i - 1]) end
    local t = loom.empty(ls, { dtype = opts.dtype, device = opts.device })
    if float_only then sync_rng() end   -- (the random factories)
    fill(t, off, #size)
    local d = T.wrap(C.lm_dtensor_from_local(t, m, pl, shapebuf, 0))
    if opts.requires_grad then d:requires_grad_(true) end
    return d
  end
end
local function random(kind, a, b)
  return function(t, off)
    if C.lm_random_(t, kind, a, b, shapebuf, off) < 0 then T.c_error(4) end
  end
end
M.empty = factory("empty", function() end)
M.zeros = factory("zeros", function(t) t:fill_(0) end)
M.ones = factory("ones", function(t) t:fill_(1) end)
M.rand = factory("rand", random(0, 0, 1), true)
M.randn = factory("randn", random(1, 0, 1), true)
function M.full(size, value, mesh, placements, opts)
  if type(value) ~= "number" and type(value) ~= "boolean" then T.argerror("full", "value", "a number", T.describe(value)) end
  local dt = type(opts) == "table" and opts.dtype and T.dtype_id(opts.dtype, "full") or 0
  T.check_fits(value, dt, "full", "value")
  return factory("full", function(t) t:fill_(value) end)(size, mesh, placements, opts)
end

-- implicit_replication(fn, ...): plain tensors mixed with DTensors count
-- as replicated inside fn.
function M.implicit_replication(fn, ...)
  local old = C.lm_set_implicit_replication(1)
  local res = (function(...) return { n = select("#", ...), ... } end)(pcall(fn, ...))
  C.lm_set_implicit_replication(old)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

---------------------------------------------------------------------------
-- the DTensor face of a tensor

local function need_dtensor(x, fname)
  if not is_dtensor(x) then error(fname .. ": expected a DTensor, got a plain tensor", 3) end
end

-- d:to_local(): the shard (differentiable). grad_placements is accepted for
-- PyTorch compatibility: gradients are always the shards of d's placements.
function Tensor.to_local(x)
  need_dtensor(x, "to_local")
  return T.wrap(C.lm_dtensor_to_local(x))
end

function Tensor.redistribute(x, mesh, placements)
  need_dtensor(x, "redistribute")
  if placements == nil then placements, mesh = mesh, nil end
  local _, _, own = spec(x)
  if mesh ~= nil and mesh ~= own then error("redistribute: moving to another mesh is not supported", 2) end
  local pl = c_placements("redistribute", own, placements, x:dim())
  return T.wrap(C.lm_dtensor_redistribute(x, pl))
end

-- d:full_tensor(): the whole tensor on every rank (differentiable)
function Tensor.full_tensor(x)
  need_dtensor(x, "full_tensor")
  local _, _, mesh = spec(x)
  local all = {}
  for k = 1, mesh.ndim do all[k] = M.Replicate() end
  return x:redistribute(all):to_local()
end

T.props.placements = function(x)
  if not is_dtensor(x) then return nil end
  return (spec(x))
end
T.props.device_mesh = function(x)
  if not is_dtensor(x) then return nil end
  local _, _, mesh = spec(x)
  return mesh
end

-- describe(x): a DTensor's mesh, placements and global size, as its
-- printed form names them (tensor_print.lua)
function M.describe(x)
  local placements, size, mesh = spec(x)
  local ps = {}
  for i, p in ipairs(placements) do ps[i] = tostring(p) end
  return string.format("mesh=%s, placements=(%s), size=%s", tostring(mesh), table.concat(ps, ", "), table.concat(size, "x"))
end

-- visualize_sharding(d): rank 0 prints which ranks hold which rows/columns
-- of a 1-D or 2-D DTensor and it returns nothing, as PyTorch's (so a REPL
-- does not echo it a second time); with {quiet = true} it prints nothing
-- and returns the text on every rank.
function M.visualize_sharding(x, opts)
  need_dtensor(x, "visualize_sharding")
  if x:dim() > 2 then error("visualize_sharding: expected a 1-D or 2-D DTensor, got " .. x:dim() .. " dims", 2) end
  local placements, size, mesh = spec(x)
  local m = c_mesh(mesh)
  local pl = c_placements("visualize_sharding", mesh, placements, #size)
  for i = 1, #size do shapebuf[i - 1] = size[i] end
  local blocks, order = {}, {}
  local coord, lshape, off = ffi.new("int64_t[4]"), ffi.new("int64_t[8]"), ffi.new("int64_t[8]")
  local ranks = mesh:ranks()
  for i, rank in ipairs(ranks) do
    local c = require("loom.distributed.mesh").unravel(i - 1, mesh.shape)
    for k = 1, mesh.ndim do coord[k - 1] = c[k] end
    C.lm_shard_layout(m, #size, shapebuf, pl, coord, lshape, off)
    local parts = {}
    for d = 1, #size do
      local a, n = tonumber(off[d - 1]), tonumber(lshape[d - 1])
      parts[d] = n == 0 and "empty" or string.format("%d:%d", a + 1, a + n)
    end
    local key = table.concat(parts, ", ")
    if not blocks[key] then blocks[key] = {} order[#order + 1] = key end
    table.insert(blocks[key], rank)
  end
  local lines = { string.format("%s of size %s, placements (%s):", #size == 1 and "1-D" or "2-D",
                                table.concat(size, "x"), table.concat((function()
                                  local t = {} for i, p in ipairs(placements) do t[i] = tostring(p) end return t end)(), ", ")) }
  for _, key in ipairs(order) do
    lines[#lines + 1] = string.format("  [%s]  ranks %s", key, table.concat(blocks[key], ", "))
  end
  local text = table.concat(lines, "\n")
  if opts and opts.quiet then return text end
  if C.lm_dist_rank() == 0 then print(text) end
end

M.DTensor = { from_local = M.from_local }

return M
