-- fsdp_setup.lua: what fully_shard does once: checks its arguments and
-- the module's parallelisation, finds the unit's parameters and where they
-- are registered, and replaces each by its dp shard (a DTensor).
--
-- The layout: a parameter that tensor parallelism made a DTensor on
-- mesh["tp"] is sharded over dp on a dim its TP placement leaves whole
-- (a Colwise weight, Shard(1) over tp, gets Shard(2) over dp; a Rowwise
-- one Shard(1); a replicated norm weight Shard(1)) and becomes a DTensor on
-- the {dp, tp} mesh: a plain 2-D block per rank. A parameter whose every
-- dim TP shards (a Colwise bias) is cut inside its TP shard instead, on the
-- {tp, dp} mesh (nested Shard: tp first, then dp). A plain parameter gets
-- Shard(1) on the dp mesh.
local T = require("loom.tensor")
local dist = require("loom.distributed")
local L = require("loom.distributed.fsdp_layout")

local M = {}

local address = T.address

-- sharded parameter's address -> its unit (weak: units live with modules)
local managed = setmetatable({}, { __mode = "v" })

local OPTIONS = { mesh = true, reshard_after_forward = true, overlap = true, ignored_params = true }

local function fail(fmt, ...) error(string.format("fully_shard: " .. fmt, ...), 4) end

local function check_opts(module, opts)
  local Module = require("loom.nn.module")
  if not Module.is_module(module) then T.argerror("fully_shard", "module", "an nn.Module", T.describe(module), 4) end
  if opts ~= nil and type(opts) ~= "table" then
    T.argerror("fully_shard", "options", "a table like {mesh = mesh[\"dp\"]}", T.describe(opts), 4)
  end
  opts = opts or {}
  for k in pairs(opts) do
    if not OPTIONS[k] then
      fail("unknown option %s (options: mesh, reshard_after_forward, overlap, ignored_params)", tostring(k))
    end
  end
  local mesh = opts.mesh or dist.current_mesh()
  if not dist.is_mesh(mesh) or mesh.ndim ~= 1 then
    T.argerror("fully_shard", "mesh", "a 1-D DeviceMesh (mesh[\"dp\"])",
               dist.is_mesh(mesh) and mesh.ndim .. "-D DeviceMesh" or T.describe(mesh), 4)
  end
  for _, k in ipairs { "reshard_after_forward", "overlap" } do
    if opts[k] ~= nil and type(opts[k]) ~= "boolean" then T.argerror("fully_shard", k, "a boolean", T.describe(opts[k]), 4) end
  end
  if rawget(module, "_fsdp") then fail("the %s is already sharded by fully_shard", module.__name) end
  if rawget(module, "_dp") then
    fail("the %s is data-parallel by replicate() already; use one of replicate and fully_shard over dp", module.__name)
  end
  return mesh, opts
end

local function dim_name(mesh)
  return mesh.mesh_dim_names and mesh.mesh_dim_names[1] or "?"
end

-- the sub-mesh of root on dims `names` in that order (root itself when it
-- is exactly that)
local slices = setmetatable({}, { __mode = "k" })
local function sub_mesh(root, names)
  local have = root.mesh_dim_names
  if root.ndim == #names then
    local same = true
    for i, n in ipairs(names) do if have[i] ~= n then same = false end end
    if same then return root end
  end
  slices[root] = slices[root] or {}
  local key = table.concat(names, "|")
  slices[root][key] = slices[root][key] or root:slice(names)
  return slices[root][key]
end

-- the dp layout of parameter p (its fqn for messages): shard dim, mesh and
-- placements of the sharded DTensor, and the TP spec when p is a DTensor
-- (on a 1-D mesh, or an N-D one such as expert parallelism's (ep, tp))
local function layout(fqn, p, mesh)
  local dev = p.device:match("^[^:]*")
  if dev ~= "meta" and dev ~= mesh.device_type then
    fail("parameter %s is on %s, but the mesh is a %q mesh", fqn, p.device, mesh.device_type)
  end
  if p:dim() == 0 then fail("parameter %s is a scalar (0 dims): there is nothing to shard", fqn) end
  if p.dist == nil then return { d = 1, mesh = mesh, placements = { dist.Shard(1) } } end
  local tpm, pl = p.device_mesh, p.placements
  for _, q in ipairs(pl) do
    if q:is_partial() then fail("parameter %s is a Partial DTensor; expected Shard or Replicate", fqn) end
  end
  local root, dpname = mesh:root_mesh(), dim_name(mesh)
  local tpnames = {}
  for k = 1, tpm.ndim do
    tpnames[k] = tpm.mesh_dim_names and tpm.mesh_dim_names[k] or "?"
    if tpnames[k] == dpname then tpnames.clash = true end
  end
  if root == nil or tpm:root_mesh() ~= root or tpnames.clash or mesh == tpm then
    fail("parameter %s is a DTensor on %s; it must be a slice of the same device mesh as fully_shard's "
         .. "mesh (%s), on other dims (parallelize_module on mesh[\"tp\"], fully_shard on mesh[\"dp\"] "
         .. "of one init_device_mesh)", fqn, tostring(tpm), tostring(mesh))
  end
  local tp = { mesh = tpm, placements = pl, shape = p:size() }
  -- dp cuts the first dim no TP placement cuts
  local cut = {}
  for _, q in ipairs(pl) do if q:is_shard() then cut[q.dim] = true end end
  local d
  for k = 1, p:dim() do if not cut[k] then d = k break end end
  if d then
    local names, placements = { dpname }, { dist.Shard(d) }
    for k = 1, tpm.ndim do names[k + 1], placements[k + 1] = tpnames[k], pl[k] end
    return { d = d, mesh = sub_mesh(root, names), placements = placements, tp = tp }
  end
  -- every dim is TP-sharded: dp cuts the TP shard (nested, tp first)
  if tpm.ndim ~= 1 then
    fail("parameter %s is a DTensor on a %d-D mesh cutting each of its dims; fully_shard has no dim left to "
         .. "shard over %s", fqn, tpm.ndim, dpname)
  end
  local q = pl[1]
  return { d = q.dim, mesh = sub_mesh(root, { tpnames[1], dpname }), placements = { q, dist.Shard(q.dim) }, tp = tp }
end

-- the unit's parameters: those of module's subtree not managed by a unit
-- made earlier on a submodule; each with every (module, name) it is
-- registered under (tied weights)
local function collect(unit, module, ignored)
  local entries, by_addr, inside = {}, {}, {}
  local mods = module:named_modules()
  for _, mm in ipairs(mods) do inside[mm[2]] = true end
  for _, mm in ipairs(mods) do
    local m = mm[2]
    local sub = rawget(m, "_fsdp")
    if sub and m ~= module and sub.parent == nil then sub.parent = unit end
    local params = rawget(m, "_parameters")
    for _, name in ipairs(rawget(m, "_order")._parameters) do
      local p = params[name]
      if p ~= nil and not ignored[p] then
        local key = address(p)
        local owner = managed[key]
        if owner and not inside[owner.module] then
          fail("parameter %s is managed by fully_shard on an enclosing module already; apply "
               .. "fully_shard to the blocks first, then to the root", mm[1] == "" and name or mm[1] .. "." .. name)
        end
        if not owner then
          local e = by_addr[key]
          if not e then
            e = { fqn = mm[1] == "" and name or mm[1] .. "." .. name, param = p, sites = {} }
            by_addr[key] = e
            entries[#entries + 1] = e
          end
          e.sites[#e.sites + 1] = { module = m, name = name }
        end
      end
    end
  end
  return entries
end

-- this rank's dp shard of e's parameter, as a DTensor leaf
local function shard(unit, e)
  local p = e.param
  local lo = layout(e.fqn, p, unit.mesh)
  local whole = p.dist ~= nil and p:to_local() or p
  e.requires_grad, e.tp, e.d = p.requires_grad, lo.tp, lo.d
  e.mesh, e.placements, e.shape = lo.mesh, lo.placements, p:size()
  e.info = L.info(whole:size(), lo.d, unit.ndp, unit.dp_rank)
  -- detached: from_local of a tensor that needs no gradient records nothing
  local piece = whole:detach():narrow(lo.d, e.info.off + 1, e.info.mine):clone()
  e.sharded = dist.from_local(piece, lo.mesh, lo.placements, { shape = e.shape })
  if e.requires_grad then e.sharded:requires_grad_(true) end
  T.replaced[p] = "fully_shard"
  e.param = nil
  managed[address(e.sharded)] = unit
end

function M.new_unit(module, opts)
  local mesh
  mesh, opts = check_opts(module, opts)
  local unit = { module = module, mesh = mesh, ndp = mesh:size(), dp_rank = mesh:get_local_rank(),
                 reshard = opts.reshard_after_forward ~= false, overlap = opts.overlap ~= false, infos = {} }
  local ignored = {}   -- (PyTorch's ignored_params: left as they are, e.g. an expert-parallel expert's)
  for _, p in ipairs(opts.ignored_params or {}) do ignored[p] = true end
  unit.entries = collect(unit, module, ignored)
  for _, e in ipairs(unit.entries) do   -- one flat gather per unit: one dtype (FSDP2 refuses mixed ones)
    local first = unit.entries[1]
    if e.param.dtype ~= first.param.dtype then
      fail("the parameters of one unit must share a dtype (they are gathered as one flat tensor), but %s is %s "
           .. "and %s is %s; convert the module (Module:to) first, or apply fully_shard to the %s part on its own",
           first.fqn, first.param.dtype, e.fqn, e.param.dtype, e.param.dtype)
    end
  end
  for _, e in ipairs(unit.entries) do layout(e.fqn, e.param, mesh) end   -- every check before any change
  for i, e in ipairs(unit.entries) do
    shard(unit, e)
    unit.infos[i] = e.info
    for _, s in ipairs(e.sites) do rawget(s.module, "_parameters")[s.name] = e.sharded end
  end
  rawset(module, "_fsdp", unit)
  return unit
end

function M.unit_of(module) return rawget(module, "_fsdp") end

-- the outermost unit around unit (the root, which stays gathered through
-- backward)
function M.root_of(unit)
  while unit.parent do unit = unit.parent end
  return unit
end

-- the same DTensor layout (mesh, placements, sizes): what to_empty,
-- Module:to or a dtype change put in place of a sharded parameter
local function same_layout(a, b)
  if a.dist == nil or b.dist == nil or a.device_mesh ~= b.device_mesh then return false end
  local pa, pb = a.placements, b.placements
  for k = 1, #pa do if pa[k] ~= pb[k] then return false end end
  return table.concat(a:size(), "x") == table.concat(b:size(), "x")
     and table.concat(a:to_local():size(), "x") == table.concat(b:to_local():size(), "x")
end

-- The modules must still hold the sharded parameters fully_shard put
-- there, or tensors of the same layout (a model built on meta, sharded,
-- then to_empty): those become the unit's. Returns whether one changed.
function M.check_sites(unit)
  local changed = false
  for _, e in ipairs(unit.entries) do
    for k, s in ipairs(e.sites) do
      local v = rawget(s.module, "_parameters")[s.name]
      if v == nil or address(v) ~= address(e.sharded) then
        if k == 1 and v ~= nil and same_layout(v, e.sharded) then
          e.sharded, changed = v, true
          managed[address(v)] = unit
        else
          error(string.format("fully_shard: parameter %s was replaced after fully_shard (by parallelize_module, "
                              .. "or an assignment); parallelise the model first, then apply fully_shard", e.fqn), 0)
        end
      end
    end
  end
  return changed
end

return M
