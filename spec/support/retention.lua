-- retention.lua: what keeps tensors alive, for the leak checks
-- (`local H = require("support.retention")`). A LuaJIT trace holds as constants the closures it specialised on (the function a
-- call guard checks, the current function of a loop whose upvalues it read),
-- and so whatever those closures capture: a per-call closure of library code
-- that captures a tensor or a model keeps it alive for as long as the trace
-- lives. H.held() -> a list of paths ("trace 12 > utils.lua:144 upvalue
-- params[3]"), one for each tensor reachable from a trace's constants;
-- H.settled_storages() -> the live storage count once full collections
-- stop freeing any.
local ju = require("jit.util")
local ffi = require("ffi")

local H = {}

local function is_tensor(v)
  return type(v) == "cdata" and tostring(ffi.typeof(v)):match("lm_tensor [%*&]>") ~= nil
end

function H.held()
  local found, seen = {}, {}
  local function walk(v, path, depth)
    if is_tensor(v) then found[#found + 1] = path return end
    local t = type(v)
    if (t ~= "function" and t ~= "table") or seen[v] or depth > 8 then return end
    seen[v] = true
    if t == "function" then
      local info = debug.getinfo(v, "S")
      local where = info.short_src:match("[^/]*$") .. ":" .. info.linedefined
      for u = 1, 255 do
        local name, uv = debug.getupvalue(v, u)
        if not name then break end
        walk(uv, path .. " > " .. where .. " upvalue " .. name, depth + 1)
      end
    elseif v ~= package.loaded and v ~= _G then
      local mt = debug.getmetatable(v)
      local mode = mt and rawget(mt, "__mode")
      if type(mode) == "string" and mode:find("v") then return end   -- weak values keep nothing alive
      for k, x in pairs(v) do walk(x, path .. "[" .. tostring(k) .. "]", depth + 1) end
    end
  end
  local misses = 0
  for tr = 1, 1e6 do   -- trace numbers are reused after a flush: stop after 1000 free ones
    local info = ju.traceinfo(tr)
    if info then
      misses = 0
      for k = -1, -info.nk, -1 do walk((ju.tracek(tr, k)), "trace " .. tr, 0) end
    else
      misses = misses + 1
      if misses > 1000 then break end
    end
  end
  return found
end

-- (a finalizer that runs in one collection can let go of tensors only the
-- next one frees)
function H.settled_storages()
  local C = require("loom").C
  local now = tonumber(C.lm_storage_count())
  for _ = 1, 10 do
    collectgarbage()
    local last = now
    now = tonumber(C.lm_storage_count())
    if now == last then break end
  end
  return now
end

return H
