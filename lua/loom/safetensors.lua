-- safetensors.lua: reads and writes the safetensors format (Hugging Face's
-- weight files): loom.load_safetensors and loom.save_safetensors.
--
-- A file is: u64 N (little endian), N bytes of JSON, the tensors' bytes.
-- The JSON maps each name to {dtype, shape, data_offsets = [begin, end]}
-- (offsets into the bytes after the header) and may hold "__metadata__",
-- a table of strings. Elements are little endian and C-contiguous.
--
-- Reading (loom.safetensors_reader) parses the header in C with bounded
-- work and copies only the bytes asked for, with pread: a DTensor layout
-- makes each rank read its own block (contiguous rows for Shard(1),
-- strided column runs for Shard(2)). Every offset is checked against the
-- file's size, dtype and shape before a byte is read; errors name the
-- file and the tensor.
local ffi = require("ffi")
local json = require("dkjson")
local loom = require("loom")
local T = require("loom.tensor")
local TC = require("loom.tensor_create")
local R = require("loom.safetensors_reader")
local C = loom.C

local M = {}

local SIZES, TO_LOOM = R.SIZES, R.TO_LOOM
local FROM_LOOM = {}
for k, v in pairs(TO_LOOM) do FROM_LOOM[v] = k end
M.dtypes = TO_LOOM
local FLOATING = { f32 = true, f64 = true, f16 = true, bf16 = true }

local fail = R.fail
local sizes = require("loom.size").Size.show
local numel = require("loom.size").Size.numel

-- reading: loom.safetensors_reader (pread, the header parsed in C)
M.open, M.MAX_HEADER = R.open, R.MAX_HEADER

---------------------------------------------------------------------------
-- layouts: which block of a tensor this rank holds

-- block(mesh, placements, shape): 0-based offset and size of this rank's
-- shard (torch.chunk sizes, as DTensors lay them out)
function M.block(mesh, placements, shape, fname, name)
  local dt = require("loom.distributed.dtensor")
  local m = dt._c_mesh(mesh)
  local nd = #shape
  local pl = dt._c_placements(fname, mesh, placements, nd, "placements of " .. name, true)
  local gs, ls, off = ffi.new("int64_t[8]"), ffi.new("int64_t[8]"), ffi.new("int64_t[8]")
  for d = 1, nd do gs[d - 1] = shape[d] end
  if C.lm_shard_layout(m, nd, gs, pl, nil, ls, off) ~= 0 then T.c_error(3) end
  local o, s = {}, {}
  for d = 1, nd do o[d], s[d] = tonumber(off[d - 1]), tonumber(ls[d - 1]) end
  return o, s
end

-- a DTensor's mesh and placements, or nil for a plain tensor
local function layout_of(t)
  if T.is_tensor(t) and t.dist ~= nil then return { mesh = t.device_mesh, placements = t.placements } end
end

-- the layout asked for name (a table {mesh, placements}) or nil
local function wanted_layout(opts, name, shape, like)
  if opts.layout and opts.layout[name] then return opts.layout[name] end
  if like then return layout_of(like) end
  if opts.placements then
    local pl = opts.placements
    if type(pl) == "function" then pl = pl(name, shape) end
    if pl then
      local mesh = opts.mesh or require("loom.distributed").current_mesh()
      if mesh == nil then error("load_safetensors: placements given without a mesh (opts.mesh, or mesh:use)", 0) end
      return { mesh = mesh, placements = pl }
    end
  end
end

---------------------------------------------------------------------------
-- load

local function check_names(fname, names)
  if type(names) ~= "table" then T.argerror(fname, "names", "a list of tensor names", T.describe(names), 4) end
  for i, n in ipairs(names) do
    if type(n) ~= "string" then T.argerror(fname, "names[" .. i .. "]", "a string", T.describe(n), 4) end
  end
end

-- names' tensors read from r as opts and like ask (see load)
local function read_all(r, names, opts, like, fname, path)
  local out = {}
  for _, n in ipairs(names) do
    local e, ref = r.tensors[n], like and like[n]
    if ref ~= nil and sizes(ref:size()) ~= sizes(e.shape) then
      fail(fname, path, "tensor %s has shape %s in the file, the model's has %s", n, sizes(e.shape),
           sizes(ref:size()))
    end
    local lay = wanted_layout(opts, n, e.shape, ref)
    local t
    if lay then
      local off, sz = M.block(lay.mesh, lay.placements, e.shape, fname, n)
      t = r:read(n, off, sz, fname)
    else
      t = r:read(n, nil, nil, fname)
    end
    local dt = opts.dtype or (ref and ref.dtype)
    if dt and FLOATING[t.dtype] and dt ~= t.dtype then t = t:to(dt) end
    local dev = opts.device or (ref and ref.device) or (lay and lay.mesh.device_type)
    if dev and dev ~= "cpu" then t = t:to(dev) end
    if lay then
      t = require("loom.distributed.dtensor").from_local(t, lay.mesh, lay.placements, { shape = e.shape })
    end
    out[n] = t
  end
  return out
end

-- names to read from r: opts.names, like's or all of the file's; errors
-- name any the file lacks. (read_all and this take their state as arguments:
-- a closure over it would be kept by a compiled trace, docs/architecture.md.)
local function load_from(r, opts, like, fname, path)
  local names = opts.names
  if names then check_names(fname, names)
  elseif like then
    names = {}
    for k in pairs(like) do names[#names + 1] = k end
    table.sort(names)
  else names = r.names end
  local missing = {}
  for _, n in ipairs(names) do if not r.tensors[n] then missing[#missing + 1] = n end end
  if #missing > 0 then fail(fname, path, "has no tensor %s", table.concat(missing, ", ")) end
  return loom.no_grad(read_all, r, names, opts, like, fname, path)
end

-- load(path, opts) -> {name = tensor}. opts:
--   names      a list: only these tensors (each must be in the file)
--   dtype      floating tensors converted to it (integer and bool kept)
--   device     where the tensors go ("cpu" by default)
--   layout     {[name] = {mesh=, placements=}}: those tensors as DTensors,
--              each rank reading only its block
--   mesh, placements  one layout for every tensor (placements may be a
--              function(name, shape) -> placements or nil for a plain one)
--   model      a Module or a table name -> tensor (a state_dict): only its
--              names are read (all must be in the file) and each takes the
--              layout, dtype and device of the model's tensor
function M.load(path, opts)
  local fname = "load_safetensors"
  opts = opts or {}
  if type(opts) ~= "table" then T.argerror(fname, "opts", "a table", T.describe(opts)) end
  if opts.dtype ~= nil then T.dtype_id(opts.dtype, fname) end
  local like = opts.model
  if like ~= nil then
    if type(like) ~= "table" then T.argerror(fname, "model", "a Module or a state_dict", T.describe(like)) end
    if type(like.state_dict) == "function" then like = like:state_dict() end
  end
  local r = M.open(path, fname)
  local ok, res = pcall(load_from, r, opts, like, fname, path)
  r:close()
  if not ok then error(res, 2) end
  return res
end

-- metadata(path) -> the __metadata__ table and the header's entries
function M.metadata(path)
  local r = M.open(path, "safetensors.metadata")
  local meta, tensors = r.metadata, r:all_tensors()
  r:close()
  return meta, tensors
end

---------------------------------------------------------------------------
-- save

-- on every rank: rank 0 runs fn(...); its error, if any, is raised on all
-- ranks (a broadcast, so the others wait for the file and none is left
-- hanging). Without loom.distributed initialised this process is alone:
-- fn(...) runs. (Arguments, not a closure over them: jit_retention_spec.)
function M._on_rank0(fn, ...)
  local dist = require("loom.distributed")
  if not dist.is_initialized() then return fn(...) end
  local rank = dist.rank()
  local ok, err = true, nil
  if rank == 0 then ok, err = pcall(fn, ...) end
  if dist.world_size() > 1 then
    local LEN = 1000
    local buf = TC.zeros({ LEN + 1 }, { dtype = "i32" })
    local p = ffi.cast("int32_t *", C.lm_data(buf))
    if not ok then
      local msg = tostring(err)
      p[0] = 1
      for i = 1, math.min(#msg, LEN) do p[i] = msg:byte(i) end
    end
    buf = dist.broadcast(buf, 0, dist.world_group())
    p = ffi.cast("int32_t *", C.lm_data(buf))
    if p[0] ~= 0 and rank ~= 0 then
      local b = {}
      for i = 1, LEN do
        if p[i] == 0 then break end
        b[i] = string.char(p[i])
      end
      ok, err = false, table.concat(b) .. " [on rank 0]"
    end
  end
  if not ok then error(err, 0) end
end

local function dims_json(shape)
  local s = {}
  for i, v in ipairs(shape) do s[i] = string.format("%.0f", v) end
  return table.concat(s, ",")
end

local function header_json(items, meta)
  local parts = {}
  if next(meta) ~= nil then
    local keys, kv = {}, {}
    for k in pairs(meta) do keys[#keys + 1] = k end
    table.sort(keys)
    for i, k in ipairs(keys) do kv[i] = json.quotestring(k) .. ":" .. json.quotestring(meta[k]) end
    parts[1] = '"__metadata__":{' .. table.concat(kv, ",") .. "}"
  end
  for _, it in ipairs(items) do
    parts[#parts + 1] = string.format('%s:{"dtype":"%s","shape":[%s],"data_offsets":[%.0f,%.0f]}',
                                      json.quotestring(it.name), it.dtype, dims_json(it.shape), it.begin, it.stop)
  end
  local s = "{" .. table.concat(parts, ",") .. "}"
  return s .. string.rep(" ", (8 - (8 + #s) % 8) % 8)   -- the data starts 8-byte aligned
end

local function write_file(path, header, items)
  return require("loom.fs").write_atomic(path, function(put)
    put(ffi.new("uint64_t[1]", #header), 8)
    put(header)
    for _, it in ipairs(items) do put(C.lm_data(it.t), it.stop - it.begin) end
  end)
end

-- writes items (their tensors) to path under a header of their places
-- (a function of its own, not a closure: a trace compiled through a
-- closure would keep its tensors alive; jit_retention_spec)
local function write_items(fname, path, items, meta)
  local ok, err = write_file(path, header_json(items, meta), items)
  if not ok then fail(fname, path, "%s", err) end
end

-- {name, t, dtype, shape} of each named tensor, whole, contiguous, on the
-- CPU (not a closure over tensors, which a compiled trace would keep)
local function items_of(tensors, names)
  local items = {}
  for _, k in ipairs(names) do
    local t = tensors[k]:detach()
    if t.dist ~= nil then t = t:full_tensor() end
    if t.device ~= "cpu" then t = t:to("cpu") end
    items[#items + 1] = { name = k, t = t:contiguous(), dtype = FROM_LOOM[t.dtype], shape = t:size() }
  end
  return items
end

-- save(tensors, path, {metadata = {k = "v"}}): tensors is a table name ->
-- tensor. Plain tensors are written by the calling process. A DTensor is
-- gathered (full_tensor, a collective): when any value is one, every rank
-- must call save with the same names, rank 0 writes the file, and save
-- returns on every rank once it is complete (an error raises everywhere).
-- The file is written to a fresh temporary beside PATH (created
-- exclusively, never through a link), synced and renamed over PATH.
function M.save(tensors, path, opts)
  local fname = "save_safetensors"
  if type(tensors) ~= "table" then T.argerror(fname, "tensors", "a table name -> tensor", T.describe(tensors)) end
  if type(path) ~= "string" or path == "" then T.argerror(fname, "path", "a file name", T.describe(path)) end
  opts = opts or {}
  local meta = opts.metadata or {}
  if type(meta) ~= "table" then T.argerror(fname, "metadata", "a table of strings", T.describe(meta)) end
  for k, v in pairs(meta) do
    if type(k) ~= "string" or type(v) ~= "string" then
      T.argerror(fname, "metadata[" .. tostring(k) .. "]", "a string", T.describe(v))
    end
  end
  local names, distributed = {}, false
  for k, v in pairs(tensors) do
    if type(k) ~= "string" or k == "" or k == "__metadata__" then
      T.argerror(fname, "tensors", "names that are non-empty strings other than __metadata__", T.describe(k))
    end
    if not T.is_tensor(v) then T.argerror(fname, "tensors." .. k, "a tensor", T.describe(v)) end
    if not FROM_LOOM[v.dtype] then T.argerror(fname, "tensors." .. k, "a tensor of a safetensors dtype", v.dtype) end
    if v.dist ~= nil then distributed = true end
    names[#names + 1] = k
  end
  table.sort(names)
  local items = loom.no_grad(items_of, tensors, names)
  -- widest elements first (then by name): every tensor is aligned
  table.sort(items, function(a, b)
    local sa, sb = SIZES[a.dtype], SIZES[b.dtype]
    if sa ~= sb then return sa > sb end
    return a.name < b.name
  end)
  local at = 0
  for _, it in ipairs(items) do
    it.begin, at = at, at + numel(it.shape) * SIZES[it.dtype]
    it.stop = at
  end
  if distributed then M._on_rank0(write_items, fname, path, items, meta) else write_items(fname, path, items, meta) end
end

return M
