-- safetensors_reader.lua: opens safetensors files and indexes for
-- loom.safetensors, treating them as hostile (they come from elsewhere).
--
-- The header is parsed in C (core/tensor/st_header.c) with bounded work
-- and every rule of the format enforced. Tensor bytes are read with pread
-- straight into the tensor's memory, never through a memory map: a file
-- that another process truncates after it was opened gives a Lua error
-- ("the file shrank"), not a SIGBUS. Errors name the file and the tensor.
local ffi = require("ffi")
local json = require("dkjson")
local T = require("loom.tensor")
local TC = require("loom.tensor_create")
local C = require("loom.lib").C
local libc = ffi.C
local errno_msg = require("loom.posix").errno_msg   -- and the libc functions used here

local M = {}

local O_RDONLY, O_NONBLOCK, O_CLOEXEC, SEEK_END = 0, 0x800, 0x80000, 2

M.MAX_HEADER = 100000000   -- bytes of JSON, the limit of the reference implementation
M.MAX_INDEX = 16000000     -- bytes of an index file (a 405B model's is under 1 MB; dkjson's work is bounded)
M.MAX_DEPTH = 64           -- nesting of an index's JSON

-- safetensors dtype -> element size (from the C list); loom's name where loom has it
M.SIZES, M.DTYPES = {}, {}
for i = 0, 63 do
  local n = C.lm_st_dtype_name(i)
  if n == nil then break end
  M.DTYPES[i] = ffi.string(n)
  M.SIZES[M.DTYPES[i]] = C.lm_st_dtype_size(i)
end
M.TO_LOOM = { F64 = "f64", F32 = "f32", F16 = "f16", BF16 = "bf16", I64 = "i64", I32 = "i32", BOOL = "bool" }

-- fail(fname, path, msg, ...): an error naming the function and the file
local function fail(fname, path, msg, ...) error(string.format("%s: %s: " .. msg, fname, path, ...), 0) end
M.fail = fail
local numel = require("loom.size").Size.numel

local pread_all = require("loom.posix").pread_all

---------------------------------------------------------------------------
-- the header

-- the Lua table of entry e of header h
local function entry_of(h, e, name)
  local shape, at = {}, e.shape
  for d = 1, e.ndim do shape[d] = tonumber(h.shapes[at + d - 1]) end
  return { name = name, dtype = M.DTYPES[e.dtype], shape = shape, begin = tonumber(e.begin), stop = tonumber(e["end"]) }
end

-- the entries of header h by name, made on first use (a binary search of
-- the C parser's sorted entries): a header of millions of tensors costs
-- no Lua table per tensor until one is read
local function entries_of(h)
  local n, S = tonumber(h.n), h.strings
  return setmetatable({}, { __index = function(t, name)
    if type(name) ~= "string" then return nil end
    local lo, hi, len = 0, n - 1, #name
    while lo <= hi do
      local mid = math.floor((lo + hi) / 2)
      local e = h.entries[mid]
      local el = tonumber(e.name_len)
      local c = libc.loom_memcmp(S + e.name, name, math.min(el, len))
      if c == 0 then c = el - len end
      if c == 0 then
        local v = entry_of(h, e, name)
        rawset(t, name, v)
        return v
      end
      if c < 0 then lo = mid + 1 else hi = mid - 1 end
    end
  end })
end

-- parses the header: reader fields tensors (by name), names (sorted),
-- metadata, and the C header itself (h)
local function parse_header(self, fname, buf, n)
  local h = C.lm_st_header_parse(buf, n, self.data_len)
  if h == nil then fail(fname, self.path, "%s", ffi.string(C.lm_last_error())) end
  h = ffi.gc(h, C.lm_st_header_free)
  local names, meta, S = {}, {}, h.strings
  for i = 0, tonumber(h.n) - 1 do names[i + 1] = ffi.string(S + h.entries[i].name, h.entries[i].name_len) end
  for i = 0, tonumber(h.nmeta) - 1 do
    local m = h.meta + 4 * i
    meta[ffi.string(S + m[0], m[1])] = ffi.string(S + m[2], m[3])
  end
  self.h, self.tensors, self.names, self.metadata = h, entries_of(h), names, meta
end

---------------------------------------------------------------------------
-- one file

local Reader = {}
Reader.__index = Reader

local function close_fd(p) if p[0] >= 0 then libc.loom_close(p[0]) p[0] = -1 end end

-- open_file(path, fname) -> reader: reader.names (sorted),
-- reader.tensors[name] = {dtype, shape, begin, stop} (looked up by name;
-- reader:all_tensors() makes the whole table), reader.metadata;
-- reader:read(name, [offset, size]); reader:close().
function M.open_file(path, fname)
  -- (O_NONBLOCK: a FIFO planted at path cannot stall the open; it then fails to seek)
  local fd = libc.loom_open(path, O_RDONLY + O_NONBLOCK + O_CLOEXEC)
  if fd < 0 then fail(fname, path, "cannot open: %s", errno_msg()) end
  local self = setmetatable({ path = path, fdp = ffi.gc(ffi.new("int[1]", fd), close_fd) }, Reader)
  local ok, err = pcall(function()
    local len = tonumber(libc.loom_lseek(fd, 0, SEEK_END))
    if len < 0 then fail(fname, path, "cannot seek: %s", errno_msg()) end
    if len < 8 then
      fail(fname, path, "is truncated (%d bytes; a safetensors file starts with an 8-byte header length)", len)
    end
    local nb = ffi.new("uint64_t[1]")
    local ok, why = pread_all(fd, nb, 8, 0)
    if not ok then fail(fname, path, "cannot read its header length (%s)", why) end
    local n = tonumber(nb[0])
    if n > M.MAX_HEADER then
      fail(fname, path, "header length %.0f exceeds the limit of %d bytes (corrupt, or not a safetensors file)",
           n, M.MAX_HEADER)
    end
    if n < 2 then fail(fname, path, "header length %d is too small for a JSON object (corrupt)", n) end
    if 8 + n > len then
      fail(fname, path, "is truncated: its header says %d bytes of JSON, the file has %d bytes after the length",
           n, len - 8)
    end
    local buf = ffi.new("char[?]", n)
    ok, why = pread_all(fd, buf, n, 8)
    if not ok then fail(fname, path, "cannot read its header (%s)", why) end
    self.data_at, self.data_len = 8 + n, len - 8 - n
    parse_header(self, fname, buf, n)
  end)
  if not ok then self:close() error(err, 0) end
  return self
end

function Reader:close() close_fd(self.fdp) end

function Reader:all_tensors()
  local t = {}
  for _, n in ipairs(self.names) do t[n] = self.tensors[n] end
  return t
end

-- the loom dtype of a tensor of the file, or an error naming it
function Reader:loom_dtype(name, fname)
  local e = self.tensors[name]
  local dt = M.TO_LOOM[e.dtype]
  if not dt then
    fail(fname or "load_safetensors", self.path, "tensor %s has dtype %s, which loom does not have "
         .. "(it reads F32, F64, BF16, F16, I32, I64, BOOL)", name, e.dtype)
  end
  return dt
end

-- the runs of bytes of a block: calls fn(file offset, bytes) in order
local function each_run(e, offset, size, esize, fn)
  local shape, nd = e.shape, #e.shape
  local stride, s = {}, esize
  for d = nd, 1, -1 do stride[d] = s s = s * shape[d] end
  -- dims after j are whole: one run covers size[j] of dim j
  local j = nd
  while j >= 1 and size[j] == shape[j] and (offset[j] or 0) == 0 do j = j - 1 end
  if j == 0 then return fn(e.begin, numel(shape) * esize) end
  local run = size[j] * stride[j]
  local idx = {}
  for d = 1, j - 1 do idx[d] = 0 end
  while true do
    local at = (offset[j] or 0) * stride[j]
    for d = 1, j - 1 do at = at + ((offset[d] or 0) + idx[d]) * stride[d] end
    fn(e.begin + at, run)
    local d = j - 1
    while d >= 1 do
      idx[d] = idx[d] + 1
      if idx[d] < size[d] then break end
      idx[d] = 0
      d = d - 1
    end
    if d < 1 then return end
  end
end

-- read(name, [offset, size]): a CPU tensor of the file's dtype holding the
-- block of the tensor at 0-based offset (per dim) of the given size (all
-- of it by default), read run by run with pread.
function Reader:read(name, offset, size, fname)
  fname = fname or "load_safetensors"
  if self.fdp[0] < 0 then fail(fname, self.path, "the file was closed") end
  local e = self.tensors[name]
  if e == nil then fail(fname, self.path, "has no tensor %s", name) end
  local shape = e.shape
  local dt = self:loom_dtype(name, fname)
  offset, size = offset or {}, size or shape
  for d = 1, #shape do
    local o = offset[d] or 0
    if o < 0 or size[d] < 0 or o + size[d] > shape[d] then
      fail(fname, self.path, "tensor %s: block offset %d size %d is outside dim %d of size %d", name, o,
           size[d], d, shape[d])
    end
  end
  local out = TC.empty(size, { dtype = dt })
  local total = numel(size) * M.SIZES[e.dtype]
  if total == 0 then return out end
  local dst, pos = ffi.cast("uint8_t *", C.lm_data(out)), 0
  each_run(e, offset, size, M.SIZES[e.dtype], function(at, n)
    local ok, why = pread_all(self.fdp[0], dst + pos, n, self.data_at + at)
    if not ok then
      fail(fname, self.path, "tensor %s: cannot read its bytes (%s)", name, why)
    end
    pos = pos + n
  end)
  if e.dtype == "BOOL" then
    for i = 0, total - 1 do
      if dst[i] > 1 then fail(fname, self.path, "tensor %s: a BOOL byte is %d, not 0 or 1 (corrupt)", name, dst[i]) end
    end
  end
  return out
end

---------------------------------------------------------------------------
-- an index: a checkpoint split over several files (HF's
-- model.safetensors.index.json, {"weight_map": {name: file}}) and the
-- readers of its files, behind the interface of one reader. Its files
-- must be safetensors files beside it: never an index (no cycles).

local Multi = {}
Multi.__index = Multi

-- JSON from elsewhere, decoded with its size and nesting bounded
function M.decode_json(text, fname, path, max_depth)
  local depth = C.lm_json_depth(text, #text, max_depth or M.MAX_DEPTH)
  if depth > (max_depth or M.MAX_DEPTH) then
    fail(fname, path, "its JSON nests deeper than %d (corrupt)", max_depth or M.MAX_DEPTH)
  end
  local v, _, err = json.decode(text, 1, json.null)
  if err then fail(fname, path, "is not valid JSON (%s)", tostring(err)) end
  return v
end

-- the text of a small file from elsewhere, or an error
function M.read_text(path, fname, limit)
  local mode = require("lfs").attributes(path, "mode")
  if mode and mode ~= "file" then fail(fname, path, "is a %s, not a regular file", mode) end
  local f, err = io.open(path, "rb")
  if not f then fail(fname, path, "cannot open: %s", tostring(err)) end
  local size = f:seek("end")
  if size == nil or size > limit then
    f:close()
    fail(fname, path, "is %s bytes, over the limit of %d for this kind of file", tostring(size), limit)
  end
  f:seek("set", 0)
  local text = f:read("*a") or ""
  f:close()
  return text
end

function M.open_index(path, fname)
  local h = M.decode_json(M.read_text(path, fname, M.MAX_INDEX), fname, path)
  if type(h) ~= "table" or type(h.weight_map) ~= "table" then
    fail(fname, path, "is not a safetensors index (no weight_map object)")
  end
  local dir = path:match("^(.*)/[^/]*$") or "."
  local self = setmetatable({ path = path, readers = {}, owner = {}, tensors = {}, names = {},
                              metadata = type(h.metadata) == "table" and h.metadata or {} }, Multi)
  local ok, e = pcall(function()
    for name, file in pairs(h.weight_map) do
      if type(name) ~= "string" or type(file) ~= "string" or file:find("/", 1, true) or file == "" or file == "."
         or file == ".." then
        fail(fname, path, "weight_map[%s] is not a file name beside the index", tostring(name))
      end
      if file:match("%.json$") then
        fail(fname, path, "weight_map[%s] names %s, an index: an index names safetensors files only", name, file)
      end
      local r = self.readers[file]
      if not r then
        r = M.open_file(dir .. "/" .. file, fname)
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
function Multi:all_tensors() return self.tensors end

-- open(path, [fname]): a reader of a file, or of an index (a path ending
-- in .json)
function M.open(path, fname)
  fname = fname or "safetensors.open"
  if type(path) ~= "string" then T.argerror(fname, "path", "a file name", T.describe(path), 3) end
  if path:match("%.json$") then return M.open_index(path, fname) end
  return M.open_file(path, fname)
end

return M
