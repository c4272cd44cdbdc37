-- fields.lua: typed reads of a tokenizer.json's fields. A field of the wrong
-- JSON type is a Lua error naming the field (its path in the file), what
-- was expected and what came, as HF tokenizers refuses it, instead of a Lua
-- internal error or a silent default.
local cjson = require("cjson")

local M = {}
local NULL = cjson.null
M.NULL = NULL
-- the metatable lua-cjson gives arrays where it can mark them (2.1.0.9 and later)
M.ARRAY_MT = cjson.array_mt or {}

-- what(v): a JSON value in words, for messages
local function what(v)
  if v == nil then return "nothing" end
  if v == NULL then return "null" end
  if type(v) == "string" then return #v <= 40 and string.format("the string %q", v) or "a string" end
  if type(v) == "number" then return "the number " .. tostring(v) end
  if type(v) == "boolean" then return tostring(v) end
  if type(v) == "table" then return M.is_array(v) and next(v) ~= nil and "an array" or "an object" end
  return "a " .. type(v)
end
M.what = what

-- is_array(v): a JSON array: marked so by the reader, or a Lua table with
-- keys 1..n only (an empty table counts as both)
function M.is_array(v)
  if type(v) ~= "table" then return false end
  if getmetatable(v) == M.ARRAY_MT then return true end
  local n = 0
  for k in pairs(v) do
    if type(k) ~= "number" then return false end
    n = n + 1
  end
  return n == #v
end

function M.is_object(v)
  if type(v) ~= "table" then return false end
  if getmetatable(v) == M.ARRAY_MT then return false end
  return next(v) == nil or not M.is_array(v)
end

function M.fail(path, expected, v)
  error(string.format("Tokenizer: %s: expected %s, got %s", path, expected, what(v)), 0)
end

local CHECK = {
  string = { function(v) return type(v) == "string" end, "a string" },
  boolean = { function(v) return type(v) == "boolean" end, "true or false" },
  number = { function(v) return type(v) == "number" and v == v end, "a number" },
  integer = { function(v) return type(v) == "number" and v % 1 == 0 and v >= 0 and v < 2 ^ 31 end,
              "an integer in [0, 2^31)" },
  object = { M.is_object, "an object" },
  array = { M.is_array, "an array" },
}

-- get(obj, key, kind, path, default): obj[key] when it is of kind (string,
-- boolean, number, integer, object, array); default when absent or null;
-- an error naming path.key otherwise
function M.get(obj, key, kind, path, default)
  local v = obj[key]
  if v == nil or v == NULL then return default end
  local c = CHECK[kind]
  if not c[1](v) then M.fail(path .. "." .. key, c[2], v) end
  return v
end

-- need(obj, key, kind, path): the same, and absent or null is an error too
function M.need(obj, key, kind, path)
  local v = M.get(obj, key, kind, path)
  if v == nil then M.fail(path .. "." .. key, CHECK[kind][2], obj[key]) end
  return v
end

-- object(v, path): v when it is an object (a stage of the pipeline), an error otherwise
function M.object(v, path)
  if not M.is_object(v) then M.fail(path, "an object", v) end
  return v
end

-- array(v, path): the same for arrays
function M.array(v, path)
  if not M.is_array(v) then M.fail(path, "an array", v) end
  return v
end

return M
