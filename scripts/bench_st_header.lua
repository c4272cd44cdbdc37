-- bench_st_header.lua: the time and peak memory of opening a safetensors
-- file whose header is 95 MB of 1.6M zero-size entries (under the 100 MB
-- cap), through loom's reader (the C header parser) and, as the same-run
-- baseline, through the JSON path loom used before (dkjson.decode of the
-- header, which the reader then walked). Each runs in its own luajit so
-- that its peak resident memory (VmHWM) is its own.
--   luajit scripts/bench_st_header.lua [entries]   (default 1600000)
if arg[1] == "--help" or arg[1] == "-h" then
  print("Usage: luajit scripts/bench_st_header.lua [entries]   (default 1600000)")
  os.exit(0)
end
local n = tonumber(arg[1]) or 1600000
local ffi = require("ffi")
local path = os.tmpname()

local parts = {}
for i = 1, n do
  parts[i] = string.format('"t%07d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}', i)
end
local header = "{" .. table.concat(parts, ",") .. "}"
parts = nil   -- luacheck: ignore 311 (let the collector free it)
local f = assert(io.open(path, "wb"))
f:write(ffi.string(ffi.new("uint64_t[1]", #header), 8), header)
f:close()
header = nil   -- luacheck: ignore 311
collectgarbage()

local prelude = "package.path = 'lua/?.lua;lua/?/init.lua;' .. package.path; "
local cases = {
  { "loom reader (C header parser)", [[
      local r = require('loom.safetensors').open(PATH)
      assert(#r.names == N) ]] },
  { "baseline: dkjson.decode (before)", [[
      local f = io.open(PATH, 'rb') local s = f:read('*a') f:close()
      local h = require('dkjson').decode(s:sub(9), 1, nil)
      local k = 0 for _ in pairs(h) do k = k + 1 end assert(k == N) ]] },
}

local function run(code)
  local body = prelude .. string.format("local PATH, N = %q, %d; ", path, n)
      .. "local t0 = os.clock() " .. code:gsub("\n", " ")
      .. " local t = os.clock() - t0 "
      .. "local hwm = io.open('/proc/self/status'):read('*a'):match('VmHWM:%s*(%d+)') "
      .. "io.write(string.format('%.2f %d', t, hwm))"
  local p = io.popen("luajit -e '" .. body:gsub("'", "'\\''") .. "' 2>&1")
  local out = p:read("*a")
  p:close()
  local t, kb = out:match("([%d.]+) (%d+)")
  return tonumber(t), tonumber(kb), out
end

local cpu = io.popen("lscpu | grep 'Model name' | sed 's/.*: *//'"):read("*l") or "?"
print(string.format("safetensors header of %d zero-size entries, %.1f MB of JSON; CPU %s (shared machine)",
                    n, (io.open(path):seek("end") - 8) / 1e6, cpu))
print(string.format("%-36s %10s %14s", "path", "CPU s", "peak RSS MB"))
for _, c in ipairs(cases) do
  local t, kb, out = run(c[2])
  if t then print(string.format("%-36s %10.2f %14.0f", c[1], t, kb / 1024))
  else print(string.format("%-36s failed: %s", c[1], out:sub(1, 200))) end
end
os.remove(path)
