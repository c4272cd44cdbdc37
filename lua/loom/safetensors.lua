-- safetensors.lua: reads and writes the safetensors format (Hugging Face's
-- weight files): loom.load_safetensors and loom.save_safetensors.
--
-- A file is: u64 N (little endian), N bytes of JSON, the tensors' bytes.
-- The JSON maps each name to {dtype, shape, data_offsets = [begin, end]}
-- (offsets into the bytes after the header) and may hold "__metadata__",
-- a table of strings. Elements are little endian and C-contiguous.
--
-- Reading memory-maps the file (libc open/mmap through the FFI) and copies
-- only the bytes asked for: a DTensor layout makes each rank copy its own
-- block (contiguous rows for Shard(1), strided column runs for Shard(2)),
-- so the pages of the other ranks' shards are never touched. Every offset
-- is checked against the file's size, dtype and shape before a byte is
-- copied; errors name the file and the tensor.
local ffi = require "ffi"
local json = require "dkjson"
local loom = require "loom"
local T = require "loom.tensor"
local TC = require "loom.tensor_create"
require "loom.serialize"   -- declares fopen/fwrite/fflush/fileno/fsync/fclose
local C = loom.C
local libc = ffi.C

local M = {}

for _, decl in ipairs {
  "int open(const char *path, int flags, ...);",
  "int close(int fd);",
  "long lseek(int fd, long offset, int whence);",
  "void *mmap(void *addr, size_t len, int prot, int flags, int fd, long offset);",
  "int munmap(void *addr, size_t len);",
  "char *strerror(int errnum);",
} do pcall(ffi.cdef, decl) end
local O_RDONLY, SEEK_END, PROT_READ, MAP_PRIVATE = 0, 2, 1, 2
local MAP_FAILED = ffi.cast("void *", -1)

M.MAX_HEADER = 100000000   -- bytes of JSON, the limit of the reference implementation

-- safetensors dtype -> element size; loom's name where loom has the dtype
local SIZES = { F64 = 8, F32 = 4, F16 = 2, BF16 = 2, I64 = 8, I32 = 4, I16 = 2, I8 = 1, U64 = 8, U32 = 4,
                U16 = 2, U8 = 1, BOOL = 1, F8_E4M3 = 1, F8_E5M2 = 1 }
local TO_LOOM = { F64 = "f64", F32 = "f32", F16 = "f16", BF16 = "bf16", I64 = "i64", I32 = "i32", BOOL = "bool" }
local FROM_LOOM = {}
for k, v in pairs(TO_LOOM) do FROM_LOOM[v] = k end
M.dtypes = TO_LOOM
local FLOATING = { f32 = true, f64 = true, f16 = true, bf16 = true }

local function fail(fname, path, msg, ...) error(string.format("%s: %s: " .. msg, fname, path, ...), 0) end
local function sizes(s) return #s == 0 and "a scalar" or table.concat(s, "x") end
local function numel(s)
  local n = 1
  for _, v in ipairs(s) do n = n * v end
  return n
end

---------------------------------------------------------------------------
-- the header

local function is_int(v) return type(v) == "number" and v >= 0 and v == math.floor(v) and v < 2 ^ 53 end

-- checks one entry of the header; returns {dtype, shape, begin, stop}
local function entry_of(fname, path, name, e, data_len)
  local function bad(what, ...) fail(fname, path, "tensor %s: " .. what .. " (corrupt header)", name, ...) end
  if type(e) ~= "table" then bad("its entry is not an object") end
  if type(e.dtype) ~= "string" or not SIZES[e.dtype] then bad("unknown dtype %s", tostring(e.dtype)) end
  if type(e.shape) ~= "table" then bad("no shape") end
  local shape = {}
  for i = 1, #e.shape do
    if not is_int(e.shape[i]) then bad("shape[%d] is %s, not a size", i, tostring(e.shape[i])) end
    shape[i] = e.shape[i]
  end
  if next(e.shape) ~= nil and #e.shape == 0 or #shape > 8 then bad("a shape of more than 8 dims or not a list") end
  local o = e.data_offsets
  if type(o) ~= "table" or #o ~= 2 or not is_int(o[1]) or not is_int(o[2]) or o[1] > o[2] then
    bad("data_offsets is not [begin, end] with 0 <= begin <= end")
  end
  if o[2] > data_len then
    fail(fname, path, "tensor %s: its data (bytes %d to %d after the header) runs past the end of the file, "
         .. "which holds %d bytes of data (truncated?)", name, o[1], o[2], data_len)
  end
  local need = numel(shape) * SIZES[e.dtype]
  if o[2] - o[1] ~= need then
    bad("data_offsets [%d, %d] hold %d bytes, but dtype %s and shape %s need %d", o[1], o[2], o[2] - o[1],
        e.dtype, sizes(shape), need)
  end
  return { name = name, dtype = e.dtype, shape = shape, begin = o[1], stop = o[2] }
end

local function parse_header(fname, path, text, data_len)
  if text:match("^%s*(.)") ~= "{" then fail(fname, path, "the header is not a JSON object (corrupt)") end
  local h, pos, err = json.decode(text, 1, nil)
  if err or type(h) ~= "table" then
    fail(fname, path, "the header is not valid JSON (%s) (corrupt)", tostring(err or "not an object"))
  end
  if text:sub(pos):match("%S") then fail(fname, path, "trailing bytes after the header's JSON (corrupt)") end
  local meta = h.__metadata__
  if meta ~= nil then
    if type(meta) ~= "table" then fail(fname, path, "__metadata__ is not an object of strings") end
    for k, v in pairs(meta) do
      if type(k) ~= "string" or type(v) ~= "string" then
        fail(fname, path, "__metadata__[%s] is a %s, not a string", tostring(k), type(v))
      end
    end
  end
  local entries, order = {}, {}
  for name, e in pairs(h) do
    if name ~= "__metadata__" then
      entries[name] = entry_of(fname, path, name, e, data_len)
      order[#order + 1] = name
    end
  end
  table.sort(order)
  -- no two tensors may share bytes
  local byoff = {}
  for _, n in ipairs(order) do if entries[n].stop > entries[n].begin then byoff[#byoff + 1] = entries[n] end end
  table.sort(byoff, function(a, b) return a.begin < b.begin end)
  for i = 2, #byoff do
    if byoff[i].begin < byoff[i - 1].stop then
      fail(fname, path, "tensors %s and %s overlap (corrupt header)", byoff[i - 1].name, byoff[i].name)
    end
  end
  return entries, order, meta or {}
end

---------------------------------------------------------------------------
-- a mapped file

local Reader = {}
Reader.__index = Reader

local function errno_msg() return ffi.string(libc.strerror(ffi.errno())) end

-- open(path, [fname]) -> reader: the file mapped and its header checked.
-- reader.names (sorted), reader.tensors[name] = {dtype, shape, ...},
-- reader.metadata; reader:read(name, [offset, size]); reader:close().
local open_index   -- below: the reader of an index

-- A path ending in .json is an index of a checkpoint split over files.
function M.open(path, fname)
  fname = fname or "safetensors.open"
  if type(path) ~= "string" then T.argerror(fname, "path", "a file name", T.describe(path), 3) end
  if path:match("%.json$") then return open_index(path, fname) end
  local fd = libc.open(path, O_RDONLY)
  if fd < 0 then fail(fname, path, "cannot open: %s", errno_msg()) end
  local len = tonumber(libc.lseek(fd, 0, SEEK_END))
  if len < 0 then libc.close(fd) fail(fname, path, "cannot seek: %s", errno_msg()) end
  if len < 8 then
    libc.close(fd)
    fail(fname, path, "is truncated (%d bytes; a safetensors file starts with an 8-byte header length)", len)
  end
  local base = libc.mmap(nil, len, PROT_READ, MAP_PRIVATE, fd, 0)
  libc.close(fd)   -- the mapping outlives the descriptor
  if base == MAP_FAILED then fail(fname, path, "cannot mmap %d bytes: %s", len, errno_msg()) end
  local self = setmetatable({ path = path, len = len }, Reader)
  self.base = ffi.gc(ffi.cast("uint8_t *", base), function(p) libc.munmap(p, len) end)
  local ok, err = pcall(function()
    local n = tonumber(ffi.cast("uint64_t *", self.base)[0])
    if n > M.MAX_HEADER then
      fail(fname, path, "header length %.0f exceeds the limit of %d bytes (corrupt, or not a safetensors file)",
           n, M.MAX_HEADER)
    end
    if n < 2 then fail(fname, path, "header length %d is too small for a JSON object (corrupt)", n) end
    if 8 + n > len then
      fail(fname, path, "is truncated: its header says %d bytes of JSON, the file has %d bytes after the length",
           n, len - 8)
    end
    self.data = self.base + 8 + n
    self.data_len = len - 8 - n
    self.tensors, self.names, self.metadata = parse_header(fname, path, ffi.string(self.base + 8, n), self.data_len)
  end)
  if not ok then self:close() error(err, 0) end
  return self
end

-- a checkpoint split over several files: an index (HF's
-- model.safetensors.index.json, {"weight_map": {name: file}}) and the
-- readers of its files, behind the interface of one reader
local Multi = {}
Multi.__index = Multi

function open_index(path, fname)
  local f, err = io.open(path, "rb")
  if not f then fail(fname, path, "cannot open: %s", tostring(err)) end
  local text = f:read("*a")
  f:close()
  local h = json.decode(text, 1, nil)
  if type(h) ~= "table" or type(h.weight_map) ~= "table" then
    fail(fname, path, "is not a safetensors index (no weight_map object)")
  end
  local dir = path:match("^(.*)/[^/]*$") or "."
  local self = setmetatable({ path = path, readers = {}, owner = {}, tensors = {}, names = {},
                              metadata = type(h.metadata) == "table" and h.metadata or {} }, Multi)
  local ok, e = pcall(function()
    for name, file in pairs(h.weight_map) do
      if type(name) ~= "string" or type(file) ~= "string" or file:find("/", 1, true) then
        fail(fname, path, "weight_map[%s] is not a file name beside the index", tostring(name))
      end
      local r = self.readers[file]
      if not r then
        r = M.open(dir .. "/" .. file, fname)
        self.readers[file] = r
      end
      if not r.tensors[name] then
        fail(fname, path, "weight_map puts tensor %s in %s, which does not hold it", name, file)
      end
      self.owner[name], self.tensors[name] = r, r.tensors[name]
      self.names[#self.names + 1] = name
    end
  end)
  if not ok then self:close() error(e, 0) end
  table.sort(self.names)
  return self
end
function Multi:read(name, ...)
  if not self.owner[name] then fail(select(3, ...) or "load_safetensors", self.path, "has no tensor %s", name) end
  return self.owner[name]:read(name, ...)
end
function Multi:loom_dtype(name, fname) return self.owner[name]:loom_dtype(name, fname) end
function Multi:close() for _, r in pairs(self.readers) do r:close() end end

function Reader:close()
  if self.base ~= nil then
    libc.munmap(ffi.gc(self.base, nil), self.len)
    self.base, self.data = nil, nil
  end
end

-- the loom dtype of a tensor of the file, or an error naming it
function Reader:loom_dtype(name, fname)
  local e = self.tensors[name]
  local dt = TO_LOOM[e.dtype]
  if not dt then
    fail(fname or "load_safetensors", self.path, "tensor %s has dtype %s, which loom does not have "
         .. "(it reads F32, F64, BF16, F16, I32, I64, BOOL)", name, e.dtype)
  end
  return dt
end

-- read(name, [offset, size]): a CPU tensor of the file's dtype holding the
-- block of the tensor at 0-based offset (per dim) of the given size (all
-- of it by default). Copies runs of contiguous bytes straight from the map.
function Reader:read(name, offset, size, fname)
  fname = fname or "load_safetensors"
  if self.base == nil then fail(fname, self.path, "the file was closed") end
  local e = self.tensors[name]
  if e == nil then fail(fname, self.path, "has no tensor %s", name) end
  local shape, nd = e.shape, #e.shape
  local dt = self:loom_dtype(name, fname)
  offset, size = offset or {}, size or shape
  for d = 1, nd do
    local o = offset[d] or 0
    if o < 0 or size[d] < 0 or o + size[d] > shape[d] then
      fail(fname, self.path, "tensor %s: block offset %d size %d is outside dim %d of size %d", name, o,
           size[d], d, shape[d])
    end
  end
  local out = TC.empty(size, { dtype = dt })
  if numel(size) == 0 then return out end
  local esize = SIZES[e.dtype]
  local stride = {}
  local s = esize
  for d = nd, 1, -1 do stride[d] = s s = s * shape[d] end
  -- dims after j are whole: one run covers size[j] of dim j
  local j = nd
  while j >= 1 and size[j] == shape[j] and (offset[j] or 0) == 0 do j = j - 1 end
  local src, dst = self.data + e.begin, ffi.cast("uint8_t *", C.lm_data(out))
  if j == 0 then
    ffi.copy(dst, src, numel(shape) * esize)
    return out
  end
  local run = size[j] * stride[j]
  local idx = {}
  for d = 1, j - 1 do idx[d] = 0 end
  local pos = 0
  while true do
    local at = (offset[j] or 0) * stride[j]
    for d = 1, j - 1 do at = at + ((offset[d] or 0) + idx[d]) * stride[d] end
    ffi.copy(dst + pos, src + at, run)
    pos = pos + run
    local d = j - 1
    while d >= 1 do
      idx[d] = idx[d] + 1
      if idx[d] < size[d] then break end
      idx[d] = 0
      d = d - 1
    end
    if d < 1 then break end
  end
  return out
end

---------------------------------------------------------------------------
-- layouts: which block of a tensor this rank holds

-- block(mesh, placements, shape): 0-based offset and size of this rank's
-- shard (torch.chunk sizes, as DTensors lay them out)
function M.block(mesh, placements, shape, fname, name)
  local dt = require "loom.distributed.dtensor"
  local m = dt._c_mesh(mesh)
  local nd = #shape
  local pl = ffi.new("lm_placement[4]")
  if type(placements) ~= "table" or #placements ~= mesh.ndim then
    T.argerror(fname, "placements of " .. name, mesh.ndim .. " placements (one per mesh dim)",
               T.describe(placements), 4)
  end
  for k, p in ipairs(placements) do
    if not dt.is_placement(p) or p:is_partial() then
      T.argerror(fname, "placements of " .. name, "Shard(d) or Replicate()", tostring(p), 4)
    end
    if p:is_shard() then
      local d = p.dim < 0 and nd + p.dim + 1 or p.dim
      if d < 1 or d > nd then
        T.argerror(fname, "placements of " .. name, "Shard dims within the tensor's " .. nd .. " dims", tostring(p), 4)
      end
      pl[k - 1].kind, pl[k - 1].dim = 1, d - 1
    end
  end
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
  local ok, res = pcall(function()
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
    local out = {}
    loom.no_grad(function()
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
    end)
    return out
  end)
  r:close()
  if not ok then error(res, 2) end
  return res
end

-- metadata(path) -> the __metadata__ table and the header's entries
function M.metadata(path)
  local r = M.open(path, "safetensors.metadata")
  local meta, tensors = r.metadata, r.tensors
  r:close()
  return meta, tensors
end

---------------------------------------------------------------------------
-- save

-- on every rank: rank 0 runs fn; its error, if any, is raised on all ranks
-- (a broadcast, so the others wait for the file and none is left hanging).
-- Without loom.distributed initialised this process is alone: fn runs.
function M._on_rank0(fn)
  local dist = require "loom.distributed"
  if not dist.is_initialized() then return fn() end
  local rank = dist.rank()
  local ok, err = true, nil
  if rank == 0 then ok, err = pcall(fn) end
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
  local f = libc.fopen(path, "wb")
  if f == nil then return nil, "cannot open for writing: " .. errno_msg(), false end
  local len = ffi.new("uint64_t[1]", #header)
  local ok = libc.fwrite(len, 8, 1, f) == 1 and libc.fwrite(header, 1, #header, f) == #header
  for _, it in ipairs(items) do
    local n = it.stop - it.begin
    if not ok then break end
    if n > 0 then ok = libc.fwrite(C.lm_data(it.t), 1, n, f) == n end
  end
  ok = ok and libc.fflush(f) == 0 and libc.fsync(libc.fileno(f)) == 0
  if libc.fclose(f) ~= 0 then ok = false end
  if not ok then return nil, "write failed (disk full?)", true end
  return true
end

-- save(tensors, path, {metadata = {k = "v"}}): tensors is a table name ->
-- tensor. Plain tensors are written by the calling process. A DTensor is
-- gathered (full_tensor, a collective): when any value is one, every rank
-- must call save with the same names, rank 0 writes the file, and save
-- returns on every rank once it is complete (an error raises everywhere).
-- The file is written to PATH.tmp, synced and renamed over PATH.
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
  local items = {}
  loom.no_grad(function()
    for _, k in ipairs(names) do
      local t = tensors[k]:detach()
      if t.dist ~= nil then t = t:full_tensor() end
      if t.device ~= "cpu" then t = t:to("cpu") end
      items[#items + 1] = { name = k, t = t:contiguous(), dtype = FROM_LOOM[t.dtype], shape = t:size() }
    end
  end)
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
  local function write()
    local tmp = path .. ".tmp"
    local ok, err, created = write_file(tmp, header_json(items, meta), items)
    if not ok then
      if created then os.remove(tmp) end
      fail(fname, tmp, "%s", err)
    end
    local rok, rerr = os.rename(tmp, path)
    if not rok then
      os.remove(tmp)
      fail(fname, path, "cannot rename %s over it: %s", tmp, tostring(rerr))
    end
  end
  if distributed then M._on_rank0(write) else write() end
end

return M
