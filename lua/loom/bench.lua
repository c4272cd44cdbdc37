-- bench.lua: what the scripts/bench_* share: a monotonic clock, flag
-- parsing, medians and a plain table printer.
local ffi = require "ffi"

local M = {}

pcall(ffi.cdef, [[
typedef struct { long tv_sec; long tv_nsec; } loom_timespec;
int clock_gettime(int clk, loom_timespec *ts);
]])
local ts = ffi.new("loom_timespec")
function M.now()
  ffi.C.clock_gettime(1, ts)   -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- args(arg, defaults): --name value pairs over numeric or string defaults
function M.args(argv, defaults)
  local o = {}
  for k, v in pairs(defaults) do o[k] = v end
  local i = 1
  while argv and i <= #argv do
    local name = argv[i]:match("^%-%-(.+)$")
    if not name or o[name] == nil then error("unknown argument " .. argv[i], 0) end
    local v = argv[i + 1]
    o[name] = type(defaults[name]) == "number" and assert(tonumber(v), "--" .. name .. " needs a number") or v
    i = i + 2
  end
  return o
end

function M.median(t)
  local s = {}
  for i = 1, #t do s[i] = t[i] end   -- (unpack overflows the stack on long lists)
  table.sort(s)
  local n = #s
  if n == 0 then return 0 / 0 end
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

function M.min(t)
  local m = math.huge
  for _, v in ipairs(t) do m = math.min(m, v) end
  return m
end

-- time(fn, n): median seconds of n calls after two warm-up calls
function M.time(fn, n)
  fn() fn()
  local ts_ = {}
  for i = 1, n do
    local t0 = M.now()
    fn()
    ts_[i] = M.now() - t0
  end
  return M.median(ts_)
end

local function cell(v)
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 1e15 then return string.format("%d", v) end
    return string.format(math.abs(v) >= 100 and "%.1f" or "%.3f", v)
  end
  return tostring(v)
end

-- table(header, rows): aligned columns
function M.table(header, rows)
  local w = {}
  for c, h in ipairs(header) do w[c] = #h end
  for _, r in ipairs(rows) do for c = 1, #header do w[c] = math.max(w[c], #cell(r[c])) end end
  local function line(r)
    local parts = {}
    for c = 1, #header do
      local s = cell(r[c])
      parts[c] = c == 1 and s .. string.rep(" ", w[c] - #s) or string.rep(" ", w[c] - #s) .. s
    end
    print(table.concat(parts, "  "))
  end
  line(header)
  local sep = {}
  for c = 1, #header do sep[c] = string.rep("-", w[c]) end
  print(table.concat(sep, "  "))
  for _, r in ipairs(rows) do line(r) end
end

-- json(value): tables with string keys become objects, arrays stay arrays
function M.json(v)
  local t = type(v)
  if t == "number" then
    if v ~= v or math.abs(v) == math.huge then return "null" end
    return string.format("%.6g", v)
  end
  if t == "string" then return string.format("%q", v) end
  if t == "boolean" then return tostring(v) end
  if t ~= "table" then return "null" end
  local parts = {}
  if #v > 0 or next(v) == nil then
    for i = 1, #v do parts[i] = M.json(v[i]) end
    return "[" .. table.concat(parts, ", ") .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for i, k in ipairs(keys) do parts[i] = string.format("%q: %s", k, M.json(v[k])) end
  return "{" .. table.concat(parts, ", ") .. "}"
end

return M
