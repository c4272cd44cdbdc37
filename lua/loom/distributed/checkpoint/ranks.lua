-- ranks.lua: agreement between ranks for the collective save and load
-- (over the world): exchanging int64 records, and raising an error on
-- every rank when any one fails, so none is left waiting in a collective.
local ffi = require("ffi")
local TC = require("loom.tensor_create")
local C = require("loom.lib").C

local M = {}

local MSGLEN = 1000   -- bytes of an error message passed between ranks

local function dist() return require("loom.distributed") end

-- i64s(n) -> a zeroed i64 tensor of n and a pointer to its data
function M.i64s(n)
  local t = TC.zeros({ n }, { dtype = "i64" })
  return t, ffi.cast("int64_t*", C.lm_data(t))
end

-- gather_i64(t) -> every rank's t, concatenated in rank order, as an
-- int64_t array of Lua's own (indexed from 0). A copy: a pointer into the
-- gathered tensor did not keep it alive (the collector freed it while a
-- caller still read through it), and a caller's closure over the tensor
-- would keep it in a compiled trace for good (jit_retention_spec).
function M.gather_i64(t)
  local g = dist().all_gather(t, 1, dist().world_group())
  local n = tonumber(g.numel_)
  local a = ffi.new("int64_t[?]", math.max(n, 1))
  ffi.copy(a, C.lm_data(g), 8 * n)
  local _ = g   -- (alive through the copy)
  return a
end

-- gather_strings(s) -> every rank's string s, in rank order
function M.gather_strings(s)
  local d = dist()
  if d.world_size() == 1 then return { s } end
  local n, np = M.i64s(1)
  np[0] = #s
  local lens = M.gather_i64(n)
  local maxlen = 1
  for r = 0, d.world_size() - 1 do maxlen = math.max(maxlen, tonumber(lens[r])) end
  local t = TC.zeros({ maxlen }, { dtype = "i32" })
  local p = ffi.cast("int32_t*", C.lm_data(t))
  for i = 1, #s do p[i - 1] = s:byte(i) end
  local g = d.all_gather(t, 1, d.world_group())
  local q = ffi.cast("int32_t*", C.lm_data(g))
  local out = {}
  for r = 0, d.world_size() - 1 do
    local b = {}
    for i = 0, tonumber(lens[r]) - 1 do b[i + 1] = string.char(q[r * maxlen + i]) end
    out[r + 1] = table.concat(b)
  end
  local _ = g   -- q points into g: g lives until here
  return out
end

-- every rank passes its error message (or nil); returns the message of the
-- lowest failing rank and that rank, or nil
local function agree(msg)
  local d = dist()
  if d.world_size() == 1 then return msg, msg and 0 or nil end
  local t = TC.zeros({ MSGLEN + 1 }, { dtype = "i32" })
  local p = ffi.cast("int32_t*", C.lm_data(t))
  if msg then
    msg = tostring(msg)
    p[0] = 1
    for i = 1, math.min(#msg, MSGLEN) do p[i] = msg:byte(i) end
  end
  local g = d.all_gather(t, 1, d.world_group())
  local q = ffi.cast("int32_t*", C.lm_data(g))
  for r = 0, d.world_size() - 1 do
    local base = r * (MSGLEN + 1)
    if q[base] ~= 0 then
      local b = {}
      for i = 1, MSGLEN do
        local c = q[base + i]
        if c == 0 then break end
        b[i] = string.char(c)
      end
      local _ = g   -- q points into g: g lives until here
      return table.concat(b), r
    end
  end
  local _ = g
  return nil
end

-- together(fn, ...): runs fn under pcall on every rank, then raises on
-- every rank if it failed on any (the lowest failing rank's message);
-- returns fn's first result
function M.together(fn, ...)
  local ok, err = pcall(fn, ...)
  local msg, r = agree(not ok and tostring(err) or nil)
  if msg then
    if r ~= dist().rank() then msg = msg .. " [on rank " .. r .. "]" end
    error(msg, 0)
  end
  return err
end

return M
