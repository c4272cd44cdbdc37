-- checks.lua: the argument checks every entry point shares. A failed check
-- raises "FNAME: ARG expected WHAT, got VALUE" at the caller's line (level
-- counts as in error(): 2, the default, is the caller of the function that
-- calls the check). loom.tensor re-exports them (T.argerror, T.check_opts).
local ffi = require("ffi")
local C = require("loom.lib").C

local M = {}

local tensor_ct = ffi.typeof("lm_tensor")
local function is_tensor(x) return type(x) == "cdata" and ffi.istype(tensor_ct, x) end

local function argerror(fname, argname, expected, got, level)
  error(string.format("%s: %s expected %s, got %s", fname, argname, expected, got), (level or 2) + 1)
end
M.argerror = argerror

-- a value as the messages name it: strings quoted, tables and tensors by kind
local function describe(v)
  if is_tensor(v) then return "a tensor" end
  if type(v) == "string" then return string.format("%q", v) end
  return type(v) == "table" and "a table" or tostring(v)
end
M.describe = describe

-- integers are finite: inf passes v == floor(v) but has no int64 value
local function is_int(v)
  return type(v) == "number" and v == math.floor(v) and v > -math.huge and v < math.huge
end
M.is_int = is_int

function M.check_int(v, fname, argname)
  if not is_int(v) then argerror(fname, argname, "an integer", describe(v), 3) end
  return v
end

-- What an integer dtype (by id: 4 i32, 5 i64) holds: a value fits when its
-- truncation does (i32 in [-2^31, 2^31 - 1], i64 in [-2^63, 2^63 - 1]); NaN
-- and inf never fit. Floats and bool take any number (bool: non-zero is true).
local INT_LIMITS = { [4] = { -2 ^ 31 - 1, 2 ^ 31, "i32", "[-2147483648, 2147483647]" },
                     [5] = { -2 ^ 63 - 2048, 2 ^ 63, "i64", "[-2^63, 2^63 - 1]" } }
local function fits(v, dt)
  local lim = INT_LIMITS[dt]
  return lim == nil or (v > lim[1] and v < lim[2])
end
M.fits = fits

-- check_fits(v, dtype id, fname, argname): v must convert to the dtype
-- without overflow (numbers only; booleans always fit)
function M.check_fits(v, dt, fname, argname, level)
  if type(v) == "number" and not fits(v, dt) then
    local lim = INT_LIMITS[dt]
    argerror(fname, argname, string.format("a value that fits %s %s", lim[3], lim[4]),
             string.format("%.17g", v), (level or 2) + 1)
  end
  return v
end

-- opts: a table (or nil: {} comes back) whose keys are all in `known` (a set)
function M.check_opts(fname, opts, known, level)
  if opts == nil then return {} end
  if type(opts) ~= "table" or is_tensor(opts) then
    argerror(fname, "options", "a table", describe(opts), (level or 2) + 1)
  end
  for k in pairs(opts) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      argerror(fname, "options", "only the keys " .. table.concat(names, ", "),
               "an unknown option " .. describe(k), (level or 2) + 1)
    end
  end
  return opts
end

-- size: a list of at most 8 non-negative integers (sizes past 2^62 are
-- left to the core, which names the element count that overflows)
function M.check_size(fname, size, level)
  level = (level or 2) + 1
  if type(size) ~= "table" or is_tensor(size) then argerror(fname, "size", "a table of sizes", describe(size), level) end
  if #size > C.LM_MAX_DIMS then argerror(fname, "size", "at most " .. C.LM_MAX_DIMS .. " dims", #size .. " dims", level) end
  for k, v in pairs(size) do
    if type(k) ~= "number" or k < 1 or k > #size or k ~= math.floor(k) then
      argerror(fname, "size", "a list of sizes", "a table with the key " .. describe(k), level)
    end
    if not is_int(v) or v < 0 then
      argerror(fname, "size", "non-negative integers", string.format("%s in dim %d", describe(v), k), level)
    end
  end
  return size
end

-- d (1-based, negative from the end) of a tensor of n dims, as a 0-based
-- index; fname names the method in the error
function M.dim_index(fname, d, n, level)
  if not is_int(d) or d == 0 or d > n or d < -n then
    argerror(fname, "dim", n == 0 and "no dim (the tensor is 0-dim)"
             or string.format("an integer dim in [1, %d] or [%d, -1]", n, -n), describe(d), (level or 2) + 1)
  end
  return d > 0 and d - 1 or n + d
end

return M
