-- mesh.lua: DeviceMesh (PyTorch semantics: row-major rank layout, one
-- communicator per mesh dim made by splitting the world, slicing by name)
-- and Group, the Lua face of an lm_comm.
local ffi = require("ffi")
local loom = require("loom")
local T = require("loom.tensor")
local C = loom.C

local M = {}

local cerr, describe = T.c_error, T.describe   -- cerr(level): the C side's last error, raised at level

---------------------------------------------------------------------------
-- Group: a communicator (the world, or one mesh dim's slice of it)

local Group = {}
Group.__index = Group
M.Group = Group

function M.wrap_group(ptr, owned)
  if ptr == nil then cerr(2) end
  if owned then ptr = ffi.gc(ptr, C.lm_comm_free) end
  return setmetatable({ comm = ptr }, Group)
end

function Group:rank() return C.lm_comm_rank(self.comm) end
function Group:size() return C.lm_comm_size(self.comm) end
-- world ranks of the members, in group-rank order
function Group:ranks()
  local r = {}
  for i = 0, self:size() - 1 do r[i + 1] = C.lm_comm_world_rank(self.comm, i) end
  return r
end
function Group:__tostring()
  return string.format("Group(rank %d of %d, world ranks {%s})", self:rank(), self:size(),
                       table.concat(self:ranks(), ", "))
end

---------------------------------------------------------------------------
-- DeviceMesh

local DeviceMesh = {}
M.DeviceMesh = DeviceMesh
local methods = {}
DeviceMesh.methods = methods

local function is_mesh(x) return getmetatable(x) == DeviceMesh end
M.is_mesh = is_mesh

-- 0-based coordinates of linear index i in a row-major shape, and back.
local function unravel(i, shape)
  local c = {}
  for d = #shape, 1, -1 do
    c[d] = i % shape[d]
    i = (i - c[d]) / shape[d]
  end
  return c
end
M.unravel = unravel
local function ravel(c, shape)
  local i = 0
  for d = 1, #shape do i = i * shape[d] + c[d] end
  return i
end

local function device_ok(device_type, fname)
  if device_type == "cpu" then return end
  if device_type == "cuda" then
    if C.lm_device_available(C.LM_CUDA0) == 1 then return end
    error(string.format("%s: device_type \"cuda\" is not available (this build of loom has no "
                        .. "CUDA backend, or there is no GPU)", fname), 3)
  end
  error(string.format("%s: device_type expected \"cpu\" or \"cuda\", got %s", fname,
                      describe(device_type)), 3)
end

local function check_shape(shape, world, fname)
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" or #shape == 0 then
    error(string.format("%s: mesh_shape expected a list of positive integers, got %s", fname,
                        describe(shape)), 3)
  end
  local n, s = 1, {}
  for d, v in ipairs(shape) do
    if type(v) ~= "number" or v < 1 or v ~= math.floor(v) then
      error(string.format("%s: mesh_shape[%d] expected a positive integer, got %s", fname, d,
                          describe(v)), 3)
    end
    s[d], n = v, n * v
  end
  if n ~= world then
    error(string.format("%s: mesh_shape {%s} holds %d ranks, but the world has %d", fname,
                        table.concat(s, ", "), n, world), 3)
  end
  return s
end

local function check_names(names, ndim, fname)
  if names == nil then return nil end
  if type(names) ~= "table" or #names ~= ndim then
    error(string.format("%s: mesh_dim_names expected %d names (one per dim), got %s", fname, ndim,
                        type(names) == "table" and tostring(#names) or describe(names)), 3)
  end
  local seen, out = {}, {}
  for d, n in ipairs(names) do
    if type(n) ~= "string" then
      error(string.format("%s: mesh_dim_names[%d] expected a string, got %s", fname, d, describe(n)), 3)
    end
    if seen[n] then
      error(string.format("%s: mesh_dim_names has %q twice", fname, n), 3)
    end
    if methods[n] or n == "ndim" or n == "device_type" or n == "mesh_dim_names" or n == "shape" then
      error(string.format("%s: mesh dim name %q is taken by a DeviceMesh field", fname, n), 3)
    end
    seen[n], out[d] = true, n
  end
  return out
end

-- init_device_mesh("cpu", {2, 2}, {mesh_dim_names = {"dp", "tp"}}): collective
-- over the world (every rank calls it, in the same order).
function M.init_device_mesh(device_type, mesh_shape, opts)
  local fname = "init_device_mesh"
  opts = opts or {}
  if type(opts) ~= "table" then
    error(fname .. ": options expected a table like {mesh_dim_names = {...}}, got " .. describe(opts), 2)
  end
  device_ok(device_type, fname)
  local world, me = C.lm_dist_world_size(), C.lm_dist_rank()
  if world < 0 then cerr(2) end
  local shape = check_shape(mesh_shape, world, fname)
  local names = check_names(opts.mesh_dim_names, #shape, fname)
  local coord = unravel(me, shape)
  local groups = {}
  for d = 1, #shape do
    -- color: my position with dim d removed; key: my position along d
    local rest, rest_shape = {}, {}
    for e = 1, #shape do
      if e ~= d then rest[#rest + 1], rest_shape[#rest_shape + 1] = coord[e], shape[e] end
    end
    local ptr = C.lm_comm_split(C.lm_comm_world(), ravel(rest, rest_shape), coord[d])
    groups[d] = M.wrap_group(ptr, true)
  end
  local ranks = {}
  for i = 1, world do ranks[i] = i - 1 end
  if device_type == "cuda" then -- each rank on its own GPU: local rank modulo the GPUs here
    local n = loom.cuda.device_count()
    local k = C.lm_dist_local_rank() % n
    loom.cuda.set_device(k)
    -- NCCL communicators now, collectively, in dim order on every rank
    for d = 1, #shape do
      if C.lm_comm_nccl_init(groups[d].comm, C.LM_CUDA0 + k) < 0 then cerr(2) end
    end
  end
  return M.new(device_type, shape, names, ranks, coord, groups)
end

function M.new(device_type, shape, names, ranks, coord, groups)
  return setmetatable({ device_type = device_type, shape = shape, ndim = #shape,
                        mesh_dim_names = names, _ranks = ranks, _coord = coord,
                        _groups = groups }, DeviceMesh)
end

-- A mesh dim from a 1-based number (negative from the end) or a name.
function methods:_dim(d, fname)
  if d == nil then
    if self.ndim == 1 then return 1 end
    error(string.format("%s: this mesh is %d-D, pass a mesh dim (a 1-based number or a name)",
                        fname, self.ndim), 3)
  end
  if type(d) == "string" then
    for i, n in ipairs(self.mesh_dim_names or {}) do
      if n == d then return i end
    end
    error(string.format("%s: mesh has no dim named %q (%s)", fname, d,
                        self.mesh_dim_names and "dims: " .. table.concat(self.mesh_dim_names, ", ")
                        or "it has no mesh_dim_names"), 3)
  end
  if type(d) ~= "number" or d ~= math.floor(d) or d == 0 or d > self.ndim or d < -self.ndim then
    error(string.format("%s: mesh dim expected a name or an integer in [1, %d] (or [-%d, -1]), got %s",
                        fname, self.ndim, self.ndim, describe(d)), 3)
  end
  return d > 0 and d or self.ndim + d + 1
end

function methods:size(d)
  if d == nil then return #self._ranks end
  return self.shape[self:_dim(d, "DeviceMesh:size")]
end
function methods:get_local_rank(d) return self._coord[self:_dim(d, "DeviceMesh:get_local_rank")] end
-- the getters below hand out copies: the mesh's own lists stay as made
local function copy(list)
  local c = {}
  for i, v in ipairs(list) do c[i] = v end
  return c
end
function methods:get_coordinate() return copy(self._coord) end
function methods:get_group(d) return self._groups[self:_dim(d, "DeviceMesh:get_group")] end
function methods:get_all_groups() return copy(self._groups) end
function methods:get_rank() return C.lm_dist_rank() end
-- world ranks of this mesh, row-major (mesh.mesh.flatten() in PyTorch)
function methods:ranks() return copy(self._ranks) end
-- nested tables of world ranks, like mesh.mesh.tolist()
function methods:tolist()
  local function build(d, base)
    local t = {}
    local stride = 1
    for e = d + 1, self.ndim do stride = stride * self.shape[e] end
    for i = 0, self.shape[d] - 1 do
      t[i + 1] = d == self.ndim and self._ranks[base + i + 1] or build(d + 1, base + i * stride)
    end
    return t
  end
  return build(1, 0)
end

-- a slice's entry for dim name n: the root dims it covers (one, or several
-- for a dim made by _flatten), their sizes, my coordinate and communicator
local function entry(self, n, fname)
  local flat = rawget(self, "_flat")
  if flat and flat[n] then return flat[n] end
  local d = self:_dim(n, fname)
  return { dims = { d }, sizes = { self.shape[d] }, size = self.shape[d], coord = self._coord[d],
           group = self._groups[d], name = self.mesh_dim_names[d] }
end

-- mesh["tp"] or mesh[{"dp", "tp"}]: the sub-mesh through this rank on those
-- dims (a dim made by _flatten among them). It reuses the parent's
-- communicators, so slicing is not collective.
function methods:slice(names)
  local fname = "DeviceMesh slice"
  if not self.mesh_dim_names then
    error(fname .. ": this mesh has no mesh_dim_names, so it cannot be sliced by name", 3)
  end
  if type(names) == "string" then names = { names } end
  local entries, seen = {}, {}
  for i, n in ipairs(names) do
    if type(n) ~= "string" then
      error(string.format("%s: expected dim names, got %s at position %d", fname, describe(n), i), 3)
    end
    local e = entry(self, n, fname)
    for _, d in ipairs(e.dims) do
      if seen[d] then error(string.format("%s: dim %q named twice (or inside a flattened dim named too)", fname, n), 3) end
      seen[d] = true
    end
    entries[i] = e
  end
  if #entries == 0 then error(fname .. ": expected at least one dim name", 3) end
  local shape, coord, groups, sub_names = {}, {}, {}, {}
  for i, e in ipairs(entries) do
    shape[i], coord[i], groups[i], sub_names[i] = e.size, e.coord, e.group, e.name
  end
  -- ranks: walk the sub-mesh row-major, the other dims fixed at mine
  local ranks, n = {}, 1
  for _, s in ipairs(shape) do n = n * s end
  for i = 0, n - 1 do
    local sub, c = unravel(i, shape), self:get_coordinate()
    for k, e in ipairs(entries) do
      local parts = unravel(sub[k], e.sizes)
      for j, d in ipairs(e.dims) do c[d] = parts[j] end
    end
    ranks[i + 1] = self._ranks[ravel(c, self.shape) + 1]
  end
  local sub = M.new(self.device_type, shape, sub_names, ranks, coord, groups)
  -- the mesh it was cut from (fully_shard joins mesh["dp"] and mesh["tp"] back into one)
  rawset(sub, "_root", rawget(self, "_root") or self)
  return sub
end

-- The mesh a slice was cut from (the top one, for slices of slices), or nil
-- for a mesh made by init_device_mesh.
function methods:root_mesh() return rawget(self, "_root") end

-- mesh[{"dp", "cp"}]:_flatten("dp_cp"): one dim over those dims of the
-- root mesh (PyTorch's DeviceMesh._flatten), its rank dp_rank * cp + cp_rank;
-- the root then slices by the new name too (root["dp_cp"],
-- root[{"dp_cp", "tp"}]). Collective over the world (a new communicator):
-- every rank calls it, in the same order. The name defaults to the dims'
-- names joined by "_"; flattening the same dims again returns that mesh.
function methods:_flatten(name)
  local fname = "DeviceMesh:_flatten"
  local root = rawget(self, "_root") or self
  if not self.mesh_dim_names or not root.mesh_dim_names then
    error(fname .. ": the mesh has no mesh_dim_names: slice a named mesh (mesh[{\"dp\", \"cp\"}])", 2)
  end
  local dims, sizes = {}, {}
  for i, n in ipairs(self.mesh_dim_names) do
    local d
    for j, m in ipairs(root.mesh_dim_names) do if m == n then d = j end end
    if not d then error(string.format("%s: dim %q is flattened already (flatten the root's dims)", fname, n), 2) end
    if i > 1 and d <= dims[i - 1] then
      error(string.format("%s: dims expected in the root mesh's order (%s), got %s", fname,
                          table.concat(root.mesh_dim_names, ", "), table.concat(self.mesh_dim_names, ", ")), 2)
    end
    dims[i], sizes[i] = d, root.shape[d]
  end
  name = name == nil and table.concat(self.mesh_dim_names, "_") or name
  if type(name) ~= "string" or name == "" or methods[name] or name == "ndim" or name == "device_type"
     or name == "mesh_dim_names" or name == "shape" then
    error(fname .. ": mesh_dim_name expected a string that is not a DeviceMesh field, got " .. describe(name), 2)
  end
  for _, m in ipairs(root.mesh_dim_names) do
    if m == name then error(string.format("%s: %q names a dim of the mesh already", fname, name), 2) end
  end
  local flat = rawget(root, "_flat") or {}
  rawset(root, "_flat", flat)
  local old = flat[name]
  if old then
    if table.concat(old.dims, ",") ~= table.concat(dims, ",") then
      error(string.format("%s: %q names another flattening already", fname, name), 2)
    end
    return old.mesh
  end
  -- color: my position on the other dims; key: my position on the flattened ones
  local rest, rest_shape, mine, inside = {}, {}, {}, {}
  for _, d in ipairs(dims) do inside[d] = true end
  for e = 1, root.ndim do
    if not inside[e] then rest[#rest + 1], rest_shape[#rest_shape + 1] = root._coord[e], root.shape[e] end
  end
  for i, d in ipairs(dims) do mine[i] = root._coord[d] end
  local key, size = ravel(mine, sizes), 1
  for _, v in ipairs(sizes) do size = size * v end
  local group = M.wrap_group(C.lm_comm_split(C.lm_comm_world(), ravel(rest, rest_shape), key), true)
  if root.device_type == "cuda" then
    local k = C.lm_dist_local_rank() % loom.cuda.device_count()
    if C.lm_comm_nccl_init(group.comm, C.LM_CUDA0 + k) < 0 then cerr(2) end
  end
  flat[name] = { dims = dims, sizes = sizes, size = size, coord = key, group = group, name = name }
  flat[name].mesh = root:slice({ name })
  return flat[name].mesh
end

-- mesh:use(fn, ...): fn runs with this mesh as the ambient one (nestable;
-- the previous one is restored even when fn raises).
local stack = {}
function methods:use(fn, ...)
  if type(fn) ~= "function" then
    error("DeviceMesh:use: expected a function, got " .. describe(fn), 2)
  end
  stack[#stack + 1] = self
  local depth = #stack
  local res = { n = select("#", ...) + 1, pcall(fn, ...) }
  for i = #stack, depth, -1 do stack[i] = nil end
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, math.max(res.n, table.maxn(res)))
end
function M.current_mesh() return stack[#stack] end

DeviceMesh.__index = function(self, k)
  local m = methods[k]
  if m then return m end
  if k == "mesh_dim_names" then return nil end -- unnamed mesh
  if type(k) == "table" or type(k) == "string" then return methods.slice(self, k) end
  error(string.format("DeviceMesh: no field or dim named %s", describe(k)), 2)
end

-- DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))
function DeviceMesh.__tostring(self)
  local function show(t)
    if type(t) ~= "table" then return tostring(t) end
    local parts = {}
    for i, v in ipairs(t) do parts[i] = show(v) end
    return "[" .. table.concat(parts, ", ") .. "]"
  end
  local s = string.format("DeviceMesh('%s', %s", self.device_type, show(self:tolist()))
  if self.mesh_dim_names then
    s = s .. ", mesh_dim_names=('" .. table.concat(self.mesh_dim_names, "', '") .. "')"
  end
  return s .. ")"
end

function DeviceMesh.__eq(a, b)
  if a.device_type ~= b.device_type or a.ndim ~= b.ndim then return false end
  for d = 1, a.ndim do
    if a.shape[d] ~= b.shape[d] or a._groups[d] ~= b._groups[d] then return false end
  end
  return true
end

return M
