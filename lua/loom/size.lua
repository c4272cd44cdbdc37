-- size.lua: loom.Size, what x:size() returns (torch.Size): a list of the
-- sizes that prints as loom.Size{8, 6}, compares with == against another
-- Size, and is indexed and measured as a table (s[1], #s, ipairs, unpack).
-- one metatable per process, even when a test reloads loom's modules:
-- == compares Sizes only when both share their __eq (Lua 5.1)
local registry = debug.getregistry()
local Size = registry["loom.Size"] or {}
registry["loom.Size"] = Size
Size.__index = Size

local M = { Size = Size }

-- new(t): t (a list of integers) made a Size, in place
function M.new(t) return setmetatable(t, Size) end

function M.is_size(v) return getmetatable(v) == Size end

function Size.__tostring(s)
  local parts = {}
  for i = 1, #s do parts[i] = tostring(s[i]) end
  return "loom.Size{" .. table.concat(parts, ", ") .. "}"
end

function Size.__eq(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    if a[i] ~= b[i] then return false end
  end
  return true
end

function Size.__concat(a, b) return tostring(a) .. tostring(b) end

-- s:numel(): the product of the sizes (1 for a scalar's Size{})
function Size.numel(s)
  local n = 1
  for i = 1, #s do n = n * s[i] end
  return n
end

-- show(s): sizes as messages say them: "2x3", or "a scalar" for {}
function Size.show(s) return #s == 0 and "a scalar" or table.concat(s, "x") end
-- x.shape is x's Size, and x:shape() calls it: the Size itself, or its
-- size d with x:shape(d) (negative from the end), as x:size(d)
function Size.__call(s, _, d)
  if d == nil then return s end
  local n = #s
  if type(d) ~= "number" or d % 1 ~= 0 or d == 0 or d > n or d < -n then
    error(string.format("shape: dim expected an integer in [1, %d] or [-%d, -1], got %s", n, n, tostring(d)), 2)
  end
  return s[d > 0 and d or n + d + 1]
end

-- s:totable(): a plain copy
function Size.totable(s) return { unpack(s) } end

-- loom.Size{8, 6} or loom.Size(8, 6): a Size of these integers
setmetatable(Size, { __call = function(_, first, ...)
  local t = type(first) == "table" and { unpack(first) } or { first, ... }
  for i, v in ipairs(t) do
    if type(v) ~= "number" or v < 0 or v % 1 ~= 0 then
      error(string.format("loom.Size: size #%d expected an integer >= 0, got %s", i, tostring(v)), 2)
    end
  end
  return M.new(t)
end })

return M
