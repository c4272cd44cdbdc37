-- tensor_create.lua: the factories (empty, zeros, ones, full, arange,
-- rand, randn, randint, tensor), the default device of loom.device(d):use
-- and the random generator's seed and state. loom exports them all.
local ffi = require("ffi")
local lib = require("loom.lib")
local T = require("loom.tensor")
local C = lib.C

local M = {}
local wrap, c_error, argerror, describe = T.wrap, T.c_error, T.argerror, T.describe
local check_int, check_fits, check_opts, fits, is_int = T.check_int, T.check_fits, T.check_opts, T.fits, T.is_int
local dtype_id, device_id = T.dtype_id, T.device_id

local CREATE_OPTS = { dtype = true, device = true, requires_grad = true }
M.CREATE_OPTS = CREATE_OPTS

-- Size from (2, 3), ({2, 3}) or a tensor's size table; then an options table.
local function parse_size(fname, ...)
  local args = { ... }
  -- an explicit nil as the size (loom.zeros(nil), as torch.zeros(None) raises)
  -- or inside it (loom.ones(nil, 2)); trailing nils are absent options
  local n = select("#", ...)
  while n > 0 and args[n] == nil do n = n - 1 end
  if select("#", ...) > 0 and n == 0 then argerror(fname, "size", "sizes (numbers or a table of them)", "nil", 3) end
  for i = 1, n do
    if args[i] == nil then argerror(fname, "size[" .. i .. "]", "sizes (numbers or a table of them)", "nil", 3) end
  end
  local opts, last = nil, args[#args]
  -- a trailing table is options when it has only named keys, or follows a size table
  if type(last) == "table" and ((#last == 0 and next(last) ~= nil) or
                                (#args > 1 and type(args[1]) == "table")) then
    opts = table.remove(args)
  end
  local size = type(args[1]) == "table" and args[1] or args
  T.check_size(fname, size, 3)
  return size, check_opts(fname, opts, CREATE_OPTS, 3)
end

local shapebuf = ffi.new("int64_t[8]")
-- the device factories use when none is given (loom.device(d):use(fn))
local default_device = 0
local function device_of(opts, fname) return opts.device and device_id(opts.device, fname) or default_device end

local function empty_of(fname, size, opts)
  local dt = opts.dtype and dtype_id(opts.dtype, fname) or 0
  local dev = device_of(opts, fname)
  for k = 1, #size do shapebuf[k - 1] = size[k] end
  local t = wrap(C.lm_empty(#size, shapebuf, dt, dev), 3)
  return t
end

local function finish(t, opts)
  if opts.requires_grad then
    if C.lm_set_requires_grad(t, 1) < 0 then c_error(3) end
  end
  return t
end

function M.empty(...)
  local size, opts = parse_size("empty", ...)
  return finish(empty_of("empty", size, opts), opts)
end

function M.full(size, value, opts)
  opts = check_opts("full", opts, CREATE_OPTS)
  if type(size) == "number" then size = { size } end
  T.check_size("full", size)
  if type(value) ~= "number" and type(value) ~= "boolean" then
    argerror("full", "value", "a number", describe(value))
  end
  check_fits(value, opts.dtype and dtype_id(opts.dtype, "full") or 0, "full", "value")
  local t = empty_of("full", size, opts)
  if C.lm_fill_(t, value == true and 1 or value == false and 0 or value) < 0 then c_error() end
  return finish(t, opts)
end

function M.zeros(...)
  local size, opts = parse_size("zeros", ...)
  return M.full(size, 0, opts)
end

function M.ones(...)
  local size, opts = parse_size("ones", ...)
  return M.full(size, 1, opts)
end

-- arange(n), arange(start, stop[, step]): stop is exclusive, as in PyTorch.
function M.arange(a, b, step, opts)
  if type(b) == "table" then opts, b = b, nil end
  if type(step) == "table" then opts, step = step, nil end
  opts = check_opts("arange", opts, CREATE_OPTS)
  local start, stop = b and a or 0, b or a
  step = step or 1
  for _, kv in ipairs { { "start", start }, { "end", stop }, { "step", step } } do
    local v = kv[2]
    if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then
      argerror("arange", kv[1], "a finite number", describe(v))
    end
  end
  local dt = opts.dtype and dtype_id(opts.dtype, "arange") or 0
  if step ~= 0 and (stop - start) / step > 2 ^ 53 then
    argerror("arange", "end", "at most 2^53 elements from start by step", string.format("%.17g", stop))
  end
  check_fits(start, dt, "arange", "start")
  if step ~= 0 and (stop - start) / step > 0 then   -- the last element: start + (n - 1) * step
    check_fits(start + (math.ceil((stop - start) / step) - 1) * step, dt, "arange", "end")
  end
  local dev = device_of(opts, "arange")
  return finish(wrap(C.lm_arange(start, stop, step, dt, dev)), opts)
end

local RANDOM = { uniform = 0, normal = 1, randint = 2 }

-- rand/randn draw reals: an integer dtype would hold only zeros
function M.check_float_dtype(fname, dtype, level)
  if dtype ~= nil and dtype_id(dtype, fname) >= 4 then
    argerror(fname, "dtype", "a floating-point dtype (f32, f64, bf16, f16)", describe(dtype), (level or 2) + 1)
  end
end

local function random(fname, kind, a, b, size, opts)
  local t = empty_of(fname, size, opts)
  if C.lm_random_(t, RANDOM[kind], a, b, nil, nil) < 0 then c_error(3) end
  return finish(t, opts)
end

function M.rand(...)
  local size, opts = parse_size("rand", ...)
  M.check_float_dtype("rand", opts.dtype)
  return random("rand", "uniform", 0, 1, size, opts)
end

function M.randn(...)
  local size, opts = parse_size("randn", ...)
  M.check_float_dtype("randn", opts.dtype)
  return random("randn", "normal", 0, 1, size, opts)
end

-- randint(low, high, size): integers in [low, high), i64 unless told.
function M.randint(low, high, size, opts)
  check_int(low, "randint", "low")
  check_int(high, "randint", "high")
  if type(size) == "number" then size = { size } end
  T.check_size("randint", size)
  opts = check_opts("randint", opts, CREATE_OPTS)
  if not opts.dtype then opts = { dtype = "i64", device = opts.device, requires_grad = opts.requires_grad } end
  if low >= high then
    argerror("randint", "low", string.format("less than high (%.17g)", high), string.format("%.17g", low))
  end
  local dt = dtype_id(opts.dtype, "randint")
  check_fits(low, dt, "randint", "low")
  check_fits(high - 1, dt, "randint", "high")
  return random("randint", "randint", low, high, size, opts)
end

-- loom.device("meta"):use(fn): tensors made without a device inside fn
-- are made on that device (PyTorch's `with torch.device(...)`), e.g. a big
-- model built on meta without memory.
local Device = {}
Device.__index = Device
function M.device(name)
  return setmetatable({ id = device_id(name, "device"), name = name }, Device)
end
function Device:use(fn, ...)
  local old = default_device
  default_device = self.id
  local res = T.pack(pcall(fn, ...))
  default_device = old
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end
function Device:__tostring() return "device(" .. self.name .. ")" end

function M.manual_seed(seed)
  if not is_int(seed) or seed < -2 ^ 63 or seed >= 2 ^ 64 then
    argerror("manual_seed", "seed", "an integer in [-2^63, 2^64)", describe(seed))
  end
  C.lm_manual_seed(seed)
end

function M.get_rng_state()
  local s, o = ffi.new("uint64_t[1]"), ffi.new("uint64_t[1]")
  C.lm_rng_get_state(s, o)
  return { seed = s[0], offset = o[0] }
end

function M.set_rng_state(st)
  if type(st) ~= "table" then argerror("set_rng_state", "state", "a table {seed, offset} from get_rng_state", describe(st)) end
  for _, k in ipairs { "seed", "offset" } do
    local v = st[k]
    if not (type(v) == "cdata" and (ffi.istype("uint64_t", v) or ffi.istype("int64_t", v)))
       and not (is_int(v) and v >= 0) then
      argerror("set_rng_state", "state." .. k, "a non-negative integer", describe(v))
    end
  end
  C.lm_rng_set_state(st.seed, st.offset)
end

-- loom.tensor(nested table or number, {dtype, device, requires_grad}).
-- Lua has one number type, so the default dtype is f32 (as in Torch7);
-- a table of booleans makes a bool tensor.
function M.tensor(data, opts)
  opts = check_opts("tensor", opts, CREATE_OPTS)
  local size, flat = {}, {}
  local function shape_of(v, d)
    if type(v) == "table" then
      if #v == 0 and next(v) ~= nil then argerror("tensor", "data", "a nested array", "a table with non-array keys", 4) end
      if size[d] == nil then size[d] = #v
      elseif size[d] ~= #v then
        argerror("tensor", "data", string.format("%d elements in dim %d (a rectangular table)", size[d], d),
                 tostring(#v), 4)
      end
      for i = 1, #v do shape_of(v[i], d + 1) end
    elseif type(v) == "number" or type(v) == "boolean" then
      if size[d] ~= nil and size[d] ~= -1 then
        argerror("tensor", "data", "a rectangular table", "a number where a table was expected", 4)
      end
      size[d] = -1
      flat[#flat + 1] = v
    else
      argerror("tensor", "data", "numbers, booleans or tables of them", describe(v), 4)
    end
  end
  shape_of(data, 1)
  local dims = {}
  for d = 1, #size do if size[d] >= 0 then dims[#dims + 1] = size[d] end end
  local dt = opts.dtype or (type(flat[1]) == "boolean" and "bool" or "f32")
  local dtid = dtype_id(dt, "tensor")
  local src = empty_of("tensor", dims, { dtype = "f64" })
  local p = ffi.cast("double*", C.lm_data(src))
  for i = 1, #flat do
    local v = flat[i]
    if type(v) == "number" and not fits(v, dtid) then check_fits(v, dtid, "tensor", "data[" .. i .. "] (flat index)") end
    p[i - 1] = v == true and 1 or v == false and 0 or v
  end
  local t = empty_of("tensor", dims, { dtype = dt, device = opts.device })
  if C.lm_copy_(t, src) < 0 then c_error() end
  return finish(t, opts)
end

return M
