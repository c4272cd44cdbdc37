-- token_file.lua: a flat binary file of token ids (uint16 or uint32, native
-- little-endian, nanoGPT's train.bin / val.bin) read through a read-only
-- memory map, and a seeded batch sampler over it that touches only the rows
-- it draws. The file holds 0-based ids (HF's, as nanoGPT writes them);
-- batches hold loom's 1-based ids (file id + 1).
local ffi = require("ffi")
local T = require("loom.tensor")

local errno_msg = require("loom.posix").errno_msg   -- and the libc functions used here

local M = {}
local O_RDONLY, SEEK_END, PROT_READ, MAP_PRIVATE = 0, 2, 1, 2
local CTYPES = { uint16 = "const uint16_t *", uint32 = "const uint32_t *" }
local SIZES = { uint16 = 2, uint32 = 4 }

local TokenFile = {}
TokenFile.__index = TokenFile
M.TokenFile = TokenFile

-- a mapping: unmapped when the last view of it is collected
local function map(path)
  local fd = ffi.C.loom_open(path, O_RDONLY)
  if fd < 0 then error("TokenFile: cannot open " .. path .. ": " .. errno_msg(), 3) end
  local size = ffi.C.loom_lseek(fd, 0, SEEK_END)
  if size <= 0 then
    ffi.C.loom_close(fd)
    error("TokenFile: " .. path .. " is empty", 3)
  end
  local p = ffi.C.loom_mmap(nil, size, PROT_READ, MAP_PRIVATE, fd, 0)
  ffi.C.loom_close(fd)
  if ffi.cast("intptr_t", p) == -1 then error("TokenFile: cannot map " .. path, 3) end
  local len = tonumber(size)
  local handle = ffi.gc(ffi.new("char[1]"), function() ffi.C.loom_munmap(p, len) end)
  return p, len, handle
end

-- TokenFile(path, {dtype = "uint16"}) -> a view of all the file's tokens
function M.open(path, opts)
  if type(path) ~= "string" then T.argerror("TokenFile", "path", "a string", T.describe(path)) end
  opts = opts or {}
  local dtype = opts.dtype or "uint16"
  if not CTYPES[dtype] then T.argerror("TokenFile", "dtype", '"uint16" or "uint32"', T.describe(dtype)) end
  local p, len, handle = map(path)
  if len % SIZES[dtype] ~= 0 then
    error(string.format("TokenFile: %s has %d bytes, not a whole number of %s ids (truncated, or another dtype?)",
                        path, len, dtype), 2)
  end
  return setmetatable({ path = path, dtype = dtype, ptr = ffi.cast(CTYPES[dtype], p), first = 0,
                        n = len / SIZES[dtype], handle = handle }, TokenFile)
end

function TokenFile:numel() return self.n end

-- the 1-based id at 1-based position i
function TokenFile:get(i)
  if type(i) ~= "number" or i < 1 or i > self.n or i % 1 ~= 0 then
    T.argerror("TokenFile:get", "i", "an integer in [1, " .. self.n .. "]", T.describe(i))
  end
  return self.ptr[self.first + i - 1] + 1
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

-- the largest id in the file + 1 (a scan: for checks, not the hot path)
function TokenFile:max_id()
  local m = 0
  for i = self.first, self.first + self.n - 1 do if self.ptr[i] > m then m = self.ptr[i] end end
  return m + 1
end

-- copies tokens [off, off + t) (0-based in the view) into dst (int64_t *) as 1-based ids
function TokenFile:copy_ids(dst, off, t)
  local src = self.ptr + self.first + off
  for j = 0, t - 1 do dst[j] = src[j] + 1 end
end

return M
