-- trace_json.lua: reading the Chrome trace JSON loom.profiler writes, for
-- spec/profiler_spec.lua and spec/dist/profiler_spec.lua.
local cjson = require("cjson")

local M = {}

-- read(path) -> true and the decoded trace, or false and why (no assert:
-- a multi-rank spec asserts only after every rank's collectives ran)
function M.read(path)
  local f = io.open(path, "rb")
  if not f then return false, "no file " .. path end
  local text = f:read("*a")
  f:close()
  return pcall(cjson.decode, text)
end

-- the events of trace j whose fields match `want` (a table of field = value)
function M.find(j, want)
  local out = {}
  for _, e in ipairs(j.traceEvents) do
    local ok = true
    for k, v in pairs(want) do if e[k] ~= v then ok = false end end
    if ok then out[#out + 1] = e end
  end
  return out
end

return M
