-- serialize.lua: loom.save / loom.load, one file holding a Lua value made of
-- tables, strings, numbers, booleans, 64-bit integer cdata and tensors.
--
-- Format, version 2 (little endian):
--   "LOOM" u8 version (2) "\n"      the magic
--   u64 the file's total length in bytes
--   one record
--   u64 FNV-1a checksum (lm_fnv1a) of every byte before it
-- A record is a tag byte and its data:
--   'n' f64 | 's' u32 length + bytes | 'b' u8 (0 or 1)
--   'i' int64_t cdata (8 bytes) | 'u' uint64_t cdata (8 bytes)
--   't' u32 count, then count (key, value) records; keys are 'n' or 's'
--   'T' u8 dtype id (lm_dtype: f32 f64 bf16 f16 i32 i64 bool = 0..6),
--       u8 ndim (<= 8), i64 size per dim, then the elements, contiguous
-- Table keys are written sorted (numbers first), so equal values make equal
-- files. A file is written to a fresh PATH.tmp-PID-N (created exclusively),
-- flushed to disk and renamed over PATH, so a crash never leaves a
-- half-written file where a good one was.
-- load tells a truncated file (shorter than its header says) from a
-- corrupt one (checksum mismatch) and from a file that is not loom's.
-- load also reads a dist.checkpoint directory (whole, plain tensors); save
-- refuses DTensors (dist.checkpoint.save writes them, shard by shard).
local ffi = require("ffi")
local T = require("loom.tensor")
local TC = require("loom.tensor_create")
local C = require("loom.lib").C
local fs = require("loom.fs")
local posix = require("loom.posix")   -- and the libc functions load calls

local M = {}
local MAGIC = "LOOM\2\n"
local HEAD = #MAGIC + 8           -- magic and length
local MIN_SIZE = HEAD + 1 + 8     -- one record tag and the checksum


local i64_ct, u64_ct = ffi.typeof("int64_t"), ffi.typeof("uint64_t")
local O_RDONLY, O_NONBLOCK, O_CLOEXEC, SEEK_END = 0, 0x800, 0x80000, 2

local function u32(n) local b = ffi.new("uint32_t[1]", n) return ffi.string(b, 4) end
local function u64(n) local b = ffi.new("uint64_t[1]", n) return ffi.string(b, 8) end
local function f64(n) local b = ffi.new("double[1]", n) return ffi.string(b, 8) end

local visiting = {}   -- the tables on the path being encoded (a cycle is an error)
local function encode(v, out, path)
  local tv = type(v)
  if tv == "number" then out[#out + 1] = "n" .. f64(v)
  elseif tv == "string" then out[#out + 1] = "s" .. u32(#v) .. v
  elseif tv == "boolean" then out[#out + 1] = v and "b\1" or "b\0"
  elseif T.is_tensor(v) then
    if v.dist ~= nil then
      error("save: " .. path .. " is a DTensor (each rank holds a shard): save a state_dict with DTensors through "
            .. "dist.checkpoint.save(state_dict, dir), or save " .. path .. ":full_tensor()", 0)
    end
    if v.is_meta then error("save: " .. path .. " is a meta tensor, which has no data", 0) end
    -- files are device-neutral: a GPU tensor is saved from a CPU copy
    local c = v.device == "cpu" and v:contiguous() or v:detach():to("cpu")
    local dims = ffi.new("int64_t[?]", math.max(1, c:dim()))
    for d = 1, c:dim() do dims[d - 1] = c:size(d) end
    out[#out + 1] = "T" .. string.char(c.dtype_, c:dim()) .. ffi.string(dims, 8 * c:dim())
    local nbytes = c:numel() * C.lm_dtype_size(c.dtype_)
    if nbytes > 0 then out[#out + 1] = ffi.string(C.lm_data(c), nbytes) end
  elseif tv == "cdata" and ffi.istype(i64_ct, v) then
    out[#out + 1] = "i" .. ffi.string(ffi.new("int64_t[1]", v), 8)
  elseif tv == "cdata" and ffi.istype(u64_ct, v) then
    out[#out + 1] = "u" .. u64(v)
  elseif tv == "table" then
    if visiting[v] then error("save: " .. path .. " holds itself (a cycle): a file can hold trees only", 0) end
    visiting[v] = true
    local keys = {}
    for k in pairs(v) do
      if type(k) ~= "string" and type(k) ~= "number" then
        error("save: " .. path .. ": table keys must be strings or numbers, got " .. type(k), 0)
      end
      keys[#keys + 1] = k
    end
    table.sort(keys, function(a, b)   -- a stable order makes identical files
      if type(a) == type(b) then return a < b end
      return type(a) == "number"
    end)
    out[#out + 1] = "t" .. u32(#keys)
    for _, k in ipairs(keys) do
      encode(k, out, path)
      encode(v[k], out, path .. "." .. tostring(k))
    end
    visiting[v] = nil
  else
    error("save: " .. path .. ": cannot save a " .. tv, 0)
  end
end

-- save(obj, path): the whole file is built in memory, written to a fresh
-- temporary beside path (fs.write_atomic: created exclusively, never
-- through a link) and renamed over path.
function M.save(obj, path)
  if type(path) ~= "string" or path == "" then T.argerror("save", "path", "a file name", T.describe(path)) end
  if fs.is_dir(path) then
    error("save: " .. path .. " is a directory; loom.save writes one file (dist.checkpoint.save writes a "
          .. "checkpoint directory)", 2)
  end
  local out = {}
  visiting = {}
  encode(obj, out, "obj")
  local rec = table.concat(out)
  local body = MAGIC .. u64(HEAD + #rec + 8) .. rec
  local sum = u64(C.lm_fnv1a(body, #body, 0))
  local ok, err = fs.write_atomic(path, function(put) put(body) put(sum) end)
  if not ok then error("save: " .. path .. ": " .. err, 2) end
end

-- The file is read through fd in windows of BUF bytes (pread), so load
-- holds at most one window besides the values it returns, whatever the
-- file's size.
local BUF = 2^16

-- decoder(fd, path, stop, buf): the record at HEAD, read up to stop (where
-- the checksum starts)
local function decoder(fd, path, stop, buf)
  local base, len, pos = 0, 0, HEAD   -- buf holds the bytes [base, base + len)
  local function corrupt(what) error("load: " .. path .. " is corrupt (" .. what .. ")", 0) end
  local function read(dst, n, at)
    local ok, why = posix.pread_all(fd, dst, n, at)
    if not ok then error("load: " .. path .. ": " .. why, 0) end
  end
  local function need(n) if pos + n > stop then corrupt("a record runs past the end") end end
  -- a pointer to the n (<= BUF) bytes at pos, which it passes
  local function window(n)
    need(n)
    if pos + n > base + len then
      base, len = pos, math.min(BUF, stop - pos)
      read(buf, len, base)
    end
    local p = buf + (pos - base)
    pos = pos + n
    return p
  end
  -- the n bytes at pos into dst
  local function into(dst, n)
    if n <= BUF then return ffi.copy(dst, window(n), n) end
    need(n)
    read(dst, n, pos)
    pos = pos + n
  end
  local function take(n)
    if n <= BUF then return ffi.string(window(n), n) end
    need(n)   -- before the buffer: a forged length must not size an allocation
    local b = ffi.new("uint8_t[?]", n)
    into(b, n)
    return ffi.string(b, n)
  end
  local function rd(ct, n) return ffi.cast(ct, window(n))[0] end
  local function decode(depth)
    if depth > 200 then corrupt("tables nested too deep") end
    local tag = take(1)
    if tag == "n" then return tonumber(rd("double*", 8))
    elseif tag == "s" then return take(tonumber(rd("uint32_t*", 4)))
    elseif tag == "b" then return take(1) == "\1"
    elseif tag == "i" then return ffi.new(i64_ct, rd("int64_t*", 8))
    elseif tag == "u" then return ffi.new(u64_ct, rd("uint64_t*", 8))
    elseif tag == "t" then
      local t = {}
      for _ = 1, tonumber(rd("uint32_t*", 4)) do
        local k = decode(depth + 1)
        if type(k) ~= "string" and type(k) ~= "number" or k ~= k then corrupt("bad table key") end
        t[k] = decode(depth + 1)
      end
      return t
    elseif tag == "T" then
      local dt, nd = take(1):byte(), take(1):byte()
      if dt >= #T.dtypes or nd > 8 then corrupt("bad tensor header") end
      local size = {}
      for d = 1, nd do
        size[d] = tonumber(rd("int64_t*", 8))
        if size[d] < 0 then corrupt("negative tensor size") end
      end
      local numel = 1
      for d = 1, nd do numel = numel * size[d] end
      local nbytes = numel * C.lm_dtype_size(dt)
      if pos + nbytes > stop then corrupt("tensor data runs past the end") end
      local t = TC.empty(size, { dtype = T.dtypes[dt + 1] })
      if nbytes > 0 then into(C.lm_data(t), nbytes) end
      return t
    end
    corrupt(string.format("unknown record tag 0x%02x at byte %d", tag:byte(), pos - 1))
  end
  return function()
    local v = decode(0)
    if pos ~= stop then corrupt("trailing bytes after the value") end
    return v
  end
end

-- the FNV-1a checksum of fd's first n bytes, read through buf
local function checksum(fd, n, buf)
  local h, at = 0, 0
  while at < n do
    local k = math.min(BUF, n - at)
    local ok, why = posix.pread_all(fd, buf, k, at)
    if not ok then return nil, why end
    h, at = C.lm_fnv1a(buf, k, h), at + k
  end
  return h
end

-- a directory: a distributed checkpoint, read whole (see
-- loom.distributed.checkpoint.interop); anything else is an error
local function load_dir(path)
  local dir = path:gsub("(.)/+$", "%1")
  local format = require("loom.distributed.checkpoint.format")
  if format.is_checkpoint(dir) then return require("loom.distributed.checkpoint.interop").read_dir(dir, "load") end
  error("load: " .. dir .. " is a directory, not a loom file nor a checkpoint (no " .. format.MANIFEST .. ")"
        .. format.old_hint(dir, "load"), 0)
end

-- the value in the loom file open as fd: its header, length and checksum
-- checked before any of it is decoded
local function read_file(fd, path)
  local size = tonumber(ffi.C.loom_lseek(fd, 0, SEEK_END))
  if size < 0 then error("load: cannot read " .. path .. ": " .. posix.errno_msg(), 0) end
  local buf = ffi.new("uint8_t[?]", BUF)
  local nh = math.min(size, HEAD)
  local ok, why = posix.pread_all(fd, buf, nh, 0)
  if not ok then error("load: cannot read " .. path .. ": " .. why, 0) end
  local head = ffi.string(buf, nh)
  if head:sub(1, 4) ~= "LOOM" then
    if size < 4 and head == ("LOOM"):sub(1, size) then
      error(string.format("load: %s is truncated (%d bytes)", path, size), 0)
    end
    error("load: " .. path .. " is not a loom file (no LOOM header)", 0)
  end
  if size >= #MAGIC and head:sub(1, #MAGIC) ~= MAGIC then
    error(string.format("load: %s has an unsupported format version %d (this loom reads version %d)",
                        path, head:byte(5), MAGIC:byte(5)), 0)
  end
  if size < MIN_SIZE then error(string.format("load: %s is truncated (%d bytes)", path, size), 0) end
  local declared = tonumber(ffi.cast("uint64_t*", buf + #MAGIC)[0])
  if declared < MIN_SIZE or declared > 2 ^ 53 then
    error(string.format("load: %s is corrupt (its header gives a length of %.0f bytes)", path, declared), 0)
  end
  if size < declared then error(string.format("load: %s is truncated (%d of %d bytes)", path, size, declared), 0) end
  local stored = ffi.new("uint64_t[1]")
  ok, why = posix.pread_all(fd, stored, 8, size - 8)
  if not ok then error("load: cannot read " .. path .. ": " .. why, 0) end
  local sum
  sum, why = checksum(fd, size - 8, buf)
  if not sum then error("load: cannot read " .. path .. ": " .. why, 0) end
  if size ~= declared or sum ~= stored[0] then error("load: " .. path .. " is corrupt (checksum mismatch)", 0) end
  return decoder(fd, path, size - 8, buf)()
end

-- load(path) -> obj. path may be a dist.checkpoint directory: its
-- state_dict comes back whole, with plain tensors.
function M.load(path)
  if type(path) ~= "string" then T.argerror("load", "path", "a file name", T.describe(path)) end
  if fs.is_dir(path) then return load_dir(path) end
  local mode = require("lfs").attributes(path, "mode")
  if mode and mode ~= "file" then error("load: " .. path .. " is a " .. mode .. ", not a regular file", 2) end
  local fd = ffi.C.loom_open(path, O_RDONLY + O_NONBLOCK + O_CLOEXEC)
  if fd < 0 then
    local why, dir = posix.errno_msg(), path:gsub("(.)/+$", "%1")
    local hint = fs.exists(dir .. ".old") and require("loom.distributed.checkpoint.format").old_hint(dir, "load") or ""
    error("load: cannot open " .. path .. ": " .. why .. hint, 2)
  end
  local ok, v = pcall(read_file, fd, path)
  ffi.C.loom_close(fd)
  if not ok then error(v, 2) end
  return v
end

return M
