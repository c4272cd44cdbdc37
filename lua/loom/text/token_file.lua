-- token_file.lua: a flat binary file of token ids (uint16 or uint32, native
-- little-endian, nanoGPT's train.bin / val.bin), read with pread: a batch
-- touches only the rows it draws, and a file that shrinks while it is open
-- is an error naming it (a memory map would kill the process with SIGBUS).
-- Only a regular file is opened (a FIFO, a directory or a device is
-- refused by name; O_NONBLOCK: no open waits on a FIFO's writer). The file
-- holds 0-based ids (HF's, as nanoGPT writes them); batches hold loom's
-- 1-based ids (file id + 1).
local ffi = require("ffi")
local T = require("loom.tensor")
local posix = require("loom.posix")   -- and the libc functions used here

local M = {}
local O_RDONLY, O_NONBLOCK, O_CLOEXEC, SEEK_END = 0, 2048, 524288, 2
local CTYPES = { uint16 = "uint16_t[?]", uint32 = "uint32_t[?]" }
local SIZES = { uint16 = 2, uint32 = 4 }

local TokenFile = {}
TokenFile.__index = TokenFile
M.TokenFile = TokenFile

local function close_fd(p) if p[0] >= 0 then ffi.C.loom_close(p[0]) p[0] = -1 end end

-- an open regular file: its descriptor (closed when the last view of it
-- is collected) and its size
local function open(path)
  local mode = require("lfs").attributes(path, "mode")
  if mode == nil then error("TokenFile: cannot open " .. path .. ": no such file", 3) end
  if mode ~= "file" then error(string.format("TokenFile: %s is a %s, not a regular file", path, mode), 3) end
  local fd = ffi.C.loom_open(path, O_RDONLY + O_NONBLOCK + O_CLOEXEC)
  if fd < 0 then error("TokenFile: cannot open " .. path .. ": " .. posix.errno_msg(), 3) end
  local handle = ffi.gc(ffi.new("int[1]", fd), close_fd)
  local size = tonumber(ffi.C.loom_lseek(fd, 0, SEEK_END))
  if size <= 0 then error("TokenFile: " .. path .. " is empty", 3) end
  return handle, size
end

-- TokenFile(path, {dtype = "uint16"}) -> a view of all the file's tokens
function M.open(path, opts)
  if type(path) ~= "string" then T.argerror("TokenFile", "path", "a string", T.describe(path)) end
  opts = opts or {}
  local dtype = opts.dtype or "uint16"
  if not CTYPES[dtype] then T.argerror("TokenFile", "dtype", '"uint16" or "uint32"', T.describe(dtype)) end
  local handle, len = open(path)
  if len % SIZES[dtype] ~= 0 then
    error(string.format("TokenFile: %s has %d bytes, not a whole number of %s ids (truncated, or another dtype?)",
                        path, len, dtype), 2)
  end
  return setmetatable({ path = path, dtype = dtype, fd = handle, first = 0, n = len / SIZES[dtype] }, TokenFile)
end

function TokenFile:numel() return self.n end

-- n ids from 0-based position off of the view, in a buffer of the file's dtype
function TokenFile:read(off, n)
  local buf = ffi.new(CTYPES[self.dtype], math.max(n, 1))
  local size = SIZES[self.dtype]
  local ok, why = posix.pread_all(self.fd[0], buf, n * size, (self.first + off) * size)
  if not ok then error("TokenFile: " .. self.path .. ": " .. why, 3) end
  return buf
end

-- the 1-based id at 1-based position i
function TokenFile:get(i)
  if type(i) ~= "number" or i < 1 or i > self.n or i % 1 ~= 0 then
    T.argerror("TokenFile:get", "i", "an integer in [1, " .. self.n .. "]", T.describe(i))
  end
  return self:read(i - 1, 1)[0] + 1
end

-- narrow(start, len): a view of tokens start .. start + len - 1 (1-based)
function TokenFile:narrow(start, len)
  if start < 1 or len < 0 or start + len - 1 > self.n or start % 1 ~= 0 or len % 1 ~= 0 then
    error(string.format("TokenFile:narrow: [%s, +%s) is out of the %d tokens", tostring(start), tostring(len), self.n), 2)
  end
  local v = setmetatable({}, TokenFile)
  for k, x in pairs(self) do v[k] = x end
  v.first, v.n = self.first + start - 1, len
  return v
end

-- split(frac) -> the first frac of the tokens and the rest (views)
function TokenFile:split(frac)
  local k = math.floor(self.n * (frac or 0.9))
  return self:narrow(1, k), self:narrow(k + 1, self.n - k)
end

-- the largest id in the view + 1 (a scan in 1 MiB reads: for checks, not
-- the hot path)
function TokenFile:max_id()
  local m, chunk = 0, 262144
  for off = 0, self.n - 1, chunk do
    local k = math.min(chunk, self.n - off)
    local buf = self:read(off, k)
    for i = 0, k - 1 do if buf[i] > m then m = buf[i] end end
  end
  return m + 1
end

-- copies tokens [off, off + t) (0-based in the view) into dst (int64_t *) as 1-based ids
function TokenFile:copy_ids(dst, off, t)
  local src = self:read(off, t)
  for j = 0, t - 1 do dst[j] = src[j] + 1 end
end

return M
