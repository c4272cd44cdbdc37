-- serialize.lua: loom.save / loom.load, one file holding a Lua value made of
-- tables, strings, numbers, booleans and tensors.
--
-- Format (little endian): "LOOM\1\n", then one record, then the FNV-1a
-- checksum (u64) of every byte before it. A record is a tag byte and data:
--   'n' f64 | 's' u32 length + bytes | 'b' u8 | 't' u32 count + count (key, value) records
--   'T' u8 dtype id, u8 ndim, i64 size per dim, then the elements, contiguous
-- Files are written under a temporary name and renamed, so a crash never
-- leaves a half-written file where a good one was.
local ffi = require "ffi"
local T = require "loom.tensor"
local C = require("loom.lib").C

local M = {}
local MAGIC = "LOOM\1\n"

local function u32(n) local b = ffi.new("uint32_t[1]", n) return ffi.string(b, 4) end
local function f64(n) local b = ffi.new("double[1]", n) return ffi.string(b, 8) end

local function encode(v, out, path)
  local tv = type(v)
  if tv == "number" then out[#out + 1] = "n" .. f64(v)
  elseif tv == "string" then out[#out + 1] = "s" .. u32(#v) .. v
  elseif tv == "boolean" then out[#out + 1] = v and "b\1" or "b\0"
  elseif T.is_tensor(v) then
    if v.device ~= "cpu" then error("save: " .. path .. ": only CPU tensors can be saved; call :to(\"cpu\")", 0) end
    local c = v:contiguous()
    local dims = ffi.new("int64_t[?]", math.max(1, c:dim()))
    for d = 1, c:dim() do dims[d - 1] = c:size(d) end
    out[#out + 1] = "T" .. string.char(c.dtype_, c:dim()) .. ffi.string(dims, 8 * c:dim())
    out[#out + 1] = ffi.string(C.lm_data(c), c:numel() * C.lm_dtype_size(c.dtype_))
  elseif tv == "table" then
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
  else
    error("save: " .. path .. ": cannot save a " .. tv, 0)
  end
end

-- save(obj, path)
function M.save(obj, path)
  if type(path) ~= "string" then T.argerror("save", "path", "a file name", T.describe(path)) end
  local out = { MAGIC }
  encode(obj, out, "obj")
  local body = table.concat(out)
  local sum = ffi.new("uint64_t[1]", C.lm_fnv1a(body, #body, 0))
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error("save: cannot write " .. tmp .. ": " .. tostring(err), 2) end
  local ok, werr = f:write(body, ffi.string(sum, 8))
  f:close()
  if not ok then os.remove(tmp) error("save: writing " .. tmp .. " failed: " .. tostring(werr), 2) end
  local rok, rerr = os.rename(tmp, path)
  if not rok then error("save: cannot rename " .. tmp .. " to " .. path .. ": " .. tostring(rerr), 2) end
end

local function decoder(s, path)
  local pos = #MAGIC + 1
  local function need(n)
    if pos + n - 1 > #s - 8 then error("load: " .. path .. " is truncated or corrupt", 0) end
  end
  local function take(n)
    need(n)
    local chunk = s:sub(pos, pos + n - 1)
    pos = pos + n
    return chunk
  end
  local function rd(ct, n) return ffi.cast(ct, take(n))[0] end
  local function decode()
    local tag = take(1)
    if tag == "n" then return tonumber(rd("double*", 8))
    elseif tag == "s" then return take(tonumber(rd("uint32_t*", 4)))
    elseif tag == "b" then return take(1) == "\1"
    elseif tag == "t" then
      local t = {}
      for _ = 1, tonumber(rd("uint32_t*", 4)) do
        local k = decode()
        t[k] = decode()
      end
      return t
    elseif tag == "T" then
      local dt, nd = take(1):byte(), take(1):byte()
      if dt >= #T.dtypes or nd > 8 then error("load: " .. path .. " is corrupt (bad tensor header)", 0) end
      local size = {}
      for d = 1, nd do size[d] = tonumber(rd("int64_t*", 8)) end
      local t = T.empty(size, { dtype = T.dtypes[dt + 1] })
      local nbytes = t:numel() * C.lm_dtype_size(dt)
      ffi.copy(C.lm_data(t), take(nbytes), nbytes)
      return t
    end
    error("load: " .. path .. " is corrupt (unknown record)", 0)
  end
  return decode
end

-- load(path) -> obj
function M.load(path)
  if type(path) ~= "string" then T.argerror("load", "path", "a file name", T.describe(path)) end
  local f, err = io.open(path, "rb")
  if not f then error("load: cannot open " .. path .. ": " .. tostring(err), 2) end
  local s = f:read("*a")
  f:close()
  if #s < #MAGIC + 9 or s:sub(1, #MAGIC) ~= MAGIC then
    error("load: " .. path .. " is not a loom file (or is truncated)", 2)
  end
  local stored = ffi.cast("uint64_t*", s:sub(-8))[0]
  if C.lm_fnv1a(s, #s - 8, 0) ~= stored then
    error("load: " .. path .. " is corrupt or truncated (checksum mismatch)", 2)
  end
  local ok, v = pcall(decoder(s, path))
  if not ok then error(v, 2) end
  return v
end

return M
