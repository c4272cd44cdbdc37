-- tensor.lua: the Tensor type (an lm_tensor cdata with methods), op calls,
-- creation functions and Torch7-style printing.
local ffi = require "ffi"
local lib = require "loom.lib"
local checks = require "loom.checks"
local C = lib.C

local M = {}            -- the functions `loom` exports from this file
local Tensor = {}       -- methods
local props = {}        -- computed fields: x.dtype, x.grad, ...
M.Tensor = Tensor
M.props = props

local tensor_ct = ffi.typeof("lm_tensor")
local function is_tensor(x) return type(x) == "cdata" and ffi.istype(tensor_ct, x) end
M.is_tensor = is_tensor

local DTYPES = { "f32", "f64", "bf16", "f16", "i32", "i64", "bool" }
local FLOATS = { f32 = true, f64 = true, bf16 = true, f16 = true }
function M.is_float_dtype(name) return FLOATS[name] == true end
local DTYPE_ID = {}
for i, n in ipairs(DTYPES) do DTYPE_ID[n] = i - 1 end
M.dtypes = DTYPES

---------------------------------------------------------------------------
-- errors and argument checks

local function c_error(level)
  error(ffi.string(C.lm_last_error()), (level or 2) + 1)
end
M.c_error = c_error

local argerror, describe = checks.argerror, checks.describe
M.argerror, M.describe = argerror, describe

local function check_tensor(v, fname, argname)
  if not is_tensor(v) then argerror(fname, argname, "a tensor", describe(v), 3) end
  return v
end
M.check_tensor = check_tensor

local is_int, check_int, fits, check_fits, check_opts =
  checks.is_int, checks.check_int, checks.fits, checks.check_fits, checks.check_opts
M.is_int, M.check_int, M.fits, M.check_fits, M.check_opts = is_int, check_int, fits, check_fits, check_opts
M.check_size, M.dim_index = checks.check_size, checks.dim_index
local dim_index = checks.dim_index

-- Lua dim (1-based, negative from the end) to C (0-based, negative kept).
local function cdim(d, fname, argname)
  if not is_int(d) or d == 0 then
    argerror(fname, argname or "dim", "a non-zero integer dim (1-based, negative from the end)",
             describe(d), 3)
  end
  return d > 0 and d - 1 or d
end
M.cdim = cdim

local function dtype_id(name, fname)
  local id = DTYPE_ID[name]
  if not id then
    argerror(fname, "dtype", "one of f32, f64, bf16, f16, i32, i64, bool", describe(name), 3)
  end
  return id
end
M.dtype_id = dtype_id

local function device_id(name, fname)
  if type(name) ~= "string" then argerror(fname, "device", "\"cpu\" or \"cuda[:N]\"", describe(name), 3) end
  local d = C.lm_device_from_name(name)
  if d < 0 then c_error(3) end
  return d
end
M.device_id = device_id

---------------------------------------------------------------------------
-- lifetime: tensors from C carry one reference, released by the GC or free()

local gc_threshold, gc_floor = 64 * 2^20, 64 * 2^20
-- LuaJIT cannot see C memory: collect when live tensor bytes double.
local function gc_pressure()
  local live = tonumber(C.lm_allocated_bytes())
  if live > gc_threshold then
    collectgarbage()
    gc_threshold = math.max(gc_floor, 2 * tonumber(C.lm_allocated_bytes()))
  end
end

-- Lua holds tensors as struct references (ptr[0]), not pointers: LuaJIT
-- gives pointers built-in arithmetic, which would shadow __add and friends.
local function wrap(ptr, level)
  if ptr == nil then c_error((level or 2) + 1) end
  gc_pressure()
  return ffi.gc(ptr[0], C.lm_release)
end
M.wrap = wrap

-- Releases the tensor's memory now (views keep theirs); any later use of x
-- is an error.
function Tensor.free(x)
  if C.lm_tensor_free(x) < 0 then c_error() end
end

---------------------------------------------------------------------------
-- op calls, by id: C.LM_OP_<ID>, from the op list (core/op_list.h)

local function op_name(id)
  local p = type(id) == "number" and C.lm_op_name(id) or nil
  return p ~= nil and ffi.string(p) or "op " .. tostring(id)
end
M.op_name = op_name

local inbuf = ffi.new("lm_tensor*[256]")
local outbuf = ffi.new("lm_tensor*[4]")
local attrs = ffi.new("lm_attrs")

-- attrs from Lua lists of integers and reals, and handles (e.g. a
-- communicator, {comm}); the lists must fit the fixed arrays of lm_attrs
local MAXI, MAXF, MAXH = 24, 8, 2
local comm_ptr = ffi.typeof("lm_comm *")
local function set_attrs(id, ints, floats, handles)
  attrs.ni, attrs.nf, attrs.nh = 0, 0, 0
  if ints then
    if #ints > MAXI then error(string.format("%s: at most %d integer arguments, got %d", op_name(id), MAXI, #ints), 4) end
    for k = 1, #ints do attrs.i[k - 1] = ints[k] end
    attrs.ni = #ints
  end
  if floats then
    if #floats > MAXF then error(string.format("%s: at most %d real arguments, got %d", op_name(id), MAXF, #floats), 4) end
    for k = 1, #floats do attrs.f[k - 1] = floats[k] end
    attrs.nf = #floats
  end
  if handles then -- communicators only, as lm_comm* cdata (never a number or another pointer)
    if #handles > MAXH then error(string.format("%s: at most %d handles, got %d", op_name(id), MAXH, #handles), 4) end
    for k = 1, #handles do
      local h = handles[k]
      if type(h) ~= "cdata" or not ffi.istype(comm_ptr, h) or h == nil then
        error(string.format("%s: handle %d expected a communicator (lm_comm*), got %s", op_name(id), k, describe(h)), 4)
      end
      attrs.h[k - 1], attrs.hk[k - 1] = h, C.LM_HANDLE_COMM
    end
    attrs.nh = #handles
  end
end

-- an op's id from its name, for tools and the REPL (code calls by id)
local ids_by_name = setmetatable({}, { __index = function(t, name)
  local id = C.lm_op_find(name)
  if id < 0 then error("loom: no op named " .. tostring(name), 3) end
  t[name] = id
  return id
end })

-- op(id or name, {tensors}, {ints}, {floats}, {handles}) -> first output [, second output]
local function op(id, inputs, ints, floats, handles)
  if type(id) == "string" then id = ids_by_name[id] end
  local n = #inputs
  if n > 256 then error(op_name(id) .. ": at most 256 tensors, got " .. n, 2) end
  for k = 1, n do
    local t = inputs[k]
    if not is_tensor(t) then argerror(op_name(id), "argument #" .. k, "a tensor", describe(t)) end
    inbuf[k - 1] = t
  end
  set_attrs(id, ints, floats, handles)
  local nout = C.lm_op_call(id, n, inbuf, attrs, 4, outbuf)
  if nout < 0 then c_error(2) end
  if nout == 0 then return end   -- in-place ops (optimizer updates)
  local a = wrap(outbuf[0])
  if nout == 1 then return a end
  return a, wrap(outbuf[1])
end
M.op = op

-- Fast paths for the common shapes of a call. They wrap their result
-- themselves rather than through wrap(): a small helper called from every
-- op gets hot in the interpreter before the loops that call it do, and when
-- LuaJIT's traces starting there abort often (returns through __add's
-- frame, finalizers running while recording) it blacklists it, after which
-- no loop that makes a tensor compiles.
local function op1(id, x, ints, floats)
  inbuf[0] = x
  set_attrs(id, ints, floats)
  if C.lm_op_call(id, 1, inbuf, attrs, 4, outbuf) < 0 then c_error(3) end
  gc_pressure()
  return ffi.gc(outbuf[0][0], C.lm_release)
end
M.op1 = op1

-- two tensors (already checked), no attributes: binary ops and operators
local function op2(id, a, b)
  inbuf[0], inbuf[1] = a, b
  attrs.ni, attrs.nf, attrs.nh = 0, 0, 0
  if C.lm_op_call(id, 2, inbuf, attrs, 4, outbuf) < 0 then c_error(3) end
  gc_pressure()
  return ffi.gc(outbuf[0][0], C.lm_release)
end
M.op2 = op2

---------------------------------------------------------------------------
-- creation

local CREATE_OPTS = { dtype = true, device = true, requires_grad = true }
M.CREATE_OPTS = CREATE_OPTS

-- Size from (2, 3), ({2, 3}) or a tensor's size table; then an options table.
local function parse_size(fname, ...)
  local args = { ... }
  local opts, last = nil, args[#args]
  -- a trailing table is options when it has only named keys, or follows a size table
  if type(last) == "table" and ((#last == 0 and next(last) ~= nil) or
                                (#args > 1 and type(args[1]) == "table")) then
    opts = table.remove(args)
  end
  local size = type(args[1]) == "table" and args[1] or args
  M.check_size(fname, size, 3)
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

local function finish(fname, t, opts)
  if opts.requires_grad then
    if C.lm_set_requires_grad(t, 1) < 0 then c_error(3) end
  end
  return t
end

function M.empty(...)
  local size, opts = parse_size("empty", ...)
  return finish("empty", empty_of("empty", size, opts), opts)
end

function M.full(size, value, opts)
  opts = check_opts("full", opts, CREATE_OPTS)
  if type(size) == "number" then size = { size } end
  M.check_size("full", size)
  if type(value) ~= "number" and type(value) ~= "boolean" then
    argerror("full", "value", "a number", describe(value))
  end
  check_fits(value, opts.dtype and dtype_id(opts.dtype, "full") or 0, "full", "value")
  local t = empty_of("full", size, opts)
  if C.lm_fill_(t, value == true and 1 or value == false and 0 or value) < 0 then c_error() end
  return finish("full", t, opts)
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
  return finish("arange", wrap(C.lm_arange(start, stop, step, dt, dev)), opts)
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
  return finish(fname, t, opts)
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
  M.check_size("randint", size)
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
  local res = M.pack(pcall(fn, ...))
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
  return finish("tensor", t, opts)
end

-- A 0-dim tensor for a Lua number mixed with tensor `like`.
local function scalar_for(v, like)
  local dt = like.dtype_
  if dt >= 4 and v ~= math.floor(v) then dt = 1 end   -- int tensor, fractional number
  if dt == 6 then dt = 5 end
  local t = wrap(C.lm_empty(0, nil, dt <= 3 and 1 or dt, like.device_))
  C.lm_fill_(t, v)
  return t
end
M.scalar_for = scalar_for

-- x (op) v, or v (op) x when swap, for a Lua number v: v becomes a 0-dim
-- tensor in the dtype the op computes in (f64 for f64 tensors, else f32;
-- the integer rules of scalar_for), freed right after the call: no
-- finalizer, no cast.
local function op2n(id, x, v, swap)
  if v == true or v == false then v = v and 1 or 0 end
  local dt = x.dtype_
  if dt >= 4 and v ~= math.floor(v) then dt = 1 end
  if dt == 6 then dt = 5 end
  local s = C.lm_empty(0, nil, (dt == 2 or dt == 3) and 0 or dt, x.device_)
  if s == nil then c_error(3) end
  C.lm_fill_(s, v)
  if swap then inbuf[0], inbuf[1] = s, x else inbuf[0], inbuf[1] = x, s end
  attrs.ni, attrs.nf, attrs.nh = 0, 0, 0
  local n = C.lm_op_call(id, 2, inbuf, attrs, 4, outbuf)
  C.lm_release(s)
  if n < 0 then c_error(3) end
  gc_pressure()
  return ffi.gc(outbuf[0][0], C.lm_release)
end
M.op2n = op2n

local function as_tensor(v, like, fname, argname)
  if type(v) == "number" then return scalar_for(v, like) end
  if type(v) == "boolean" then return scalar_for(v and 1 or 0, like) end
  return check_tensor(v, fname, argname)
end
M.as_tensor = as_tensor

---------------------------------------------------------------------------
-- fields

function props.dtype(x) return DTYPES[x.dtype_ + 1] end
function props.shape(x) return Tensor.size(x) end   -- a table, as x:size()
local META = C.LM_META
function props.device(x)
  local d = x.device_
  if d == 0 then return "cpu" end
  if d == META then return "meta" end
  return "cuda:" .. (d - 1)
end
function props.is_meta(x) return x.device_ == META end
function props.requires_grad(x) return x.needs_grad ~= 0 end
function props.is_leaf(x) return x.grad_fn_ == nil end
function props.grad(x)
  local g = C.lm_grad(x)
  if g == nil then return nil end
  return ffi.gc(g[0], C.lm_release)
end

local setters = {}
function setters.requires_grad(x, v)
  if C.lm_set_requires_grad(x, v and 1 or 0) < 0 then c_error(3) end
end
function setters.grad(x, g)
  if g ~= nil then check_tensor(g, "grad", "value") end
  if C.lm_set_grad(x, g) < 0 then c_error(3) end
end

---------------------------------------------------------------------------
-- size and layout

function Tensor.dim(x) return x.ndim end
function Tensor.numel(x) return tonumber(x.numel_) end
Tensor.nelement = Tensor.numel

function Tensor.size(x, d)
  if d == nil then
    local s = {}
    for k = 0, x.ndim - 1 do s[k + 1] = tonumber(x.shape_[k]) end
    return s
  end
  return tonumber(x.shape_[dim_index("size", d, x.ndim)])
end

function Tensor.stride(x, d)
  if d == nil then
    local s = {}
    for k = 0, x.ndim - 1 do s[k + 1] = tonumber(x.stride_[k]) end
    return s
  end
  return tonumber(x.stride_[dim_index("stride", d, x.ndim)])
end

function Tensor.is_contiguous(x) return C.lm_is_contiguous(x) == 1 end

function Tensor.data_ptr(x) return C.lm_data(x) end

-- integers from (2, 3) or ({2, 3}): the sizes of view(2, 3), view({2, 3}),
-- view(-1) (what = "size": each >= -1), or the dims of permute
local function int_list(fname, what, ...)
  local s = select("#", ...) == 1 and type((...)) == "table" and not is_tensor((...)) and (...) or { ... }
  local n = 0
  for _ in pairs(s) do n = n + 1 end
  if n ~= #s then argerror(fname, what .. "s", "a list of integers", "a table with non-list keys", 3) end
  if #s > 8 then argerror(fname, what, "at most 8 " .. what .. "s", #s .. " " .. what .. "s", 3) end
  local numel = 1
  for k, v in ipairs(s) do
    check_int(v, fname, what .. " #" .. k)
    if what == "size" and (v < -1 or v >= 2 ^ 62) then
      argerror(fname, "size #" .. k, "a size >= 0 (or -1 to infer it)", describe(v), 3)
    end
    if v > 0 then numel = numel * v end
  end
  -- the core multiplies sizes in int64: a product past 2^62 would wrap
  if what == "size" and numel >= 2 ^ 62 then
    argerror(fname, "size", "sizes whose product is below 2^62", string.format("{%s} (%.17g elements)",
             table.concat(s, ", "), numel), 3)
  end
  return s
end
local function sizes(fname, ...) return int_list(fname, "size", ...) end

function Tensor.view(x, ...) return op1(C.LM_OP_VIEW, x, sizes("view", ...)) end
function Tensor.reshape(x, ...) return op1(C.LM_OP_RESHAPE, x, sizes("reshape", ...)) end
function Tensor.expand(x, ...) return op1(C.LM_OP_EXPAND, x, sizes("expand", ...)) end
function Tensor.expand_as(x, y) return op1(C.LM_OP_EXPAND, x, check_tensor(y, "expand_as", "other"):size()) end
function Tensor.view_as(x, y) return op1(C.LM_OP_VIEW, x, check_tensor(y, "view_as", "other"):size()) end
function Tensor.flatten(x) return op1(C.LM_OP_RESHAPE, x, { -1 }) end

function Tensor.transpose(x, d1, d2)
  return op1(C.LM_OP_TRANSPOSE, x, { cdim(d1, "transpose", "dim1"), cdim(d2, "transpose", "dim2") })
end

function Tensor.t(x)
  if x.ndim > 2 then argerror("t", "self", "a tensor with at most 2 dims", x.ndim .. " dims") end
  if x.ndim < 2 then return x end
  return op1(C.LM_OP_TRANSPOSE, x, { 0, 1 })
end

function Tensor.permute(x, ...)
  local dims = int_list("permute", "dim", ...)
  for k, d in ipairs(dims) do dims[k] = cdim(d, "permute", "dim #" .. k) end
  return op1(C.LM_OP_PERMUTE, x, dims)
end

-- narrow(dim, start, length): start is 1-based
function Tensor.narrow(x, d, start, len)
  check_int(start, "narrow", "start")
  check_int(len, "narrow", "length")
  if start < 1 then argerror("narrow", "start", "a 1-based index >= 1", tostring(start)) end
  if len < 0 then argerror("narrow", "length", "a length >= 0", tostring(len)) end
  return op1(C.LM_OP_NARROW, x, { cdim(d, "narrow"), start - 1, len })
end

function Tensor.select(x, d, index)
  local n = x:size(d)
  if not is_int(index) or index < 1 or index > n then
    argerror("select", "index", string.format("an index in [1, %d] (dim %s)", n, tostring(d)), describe(index))
  end
  return op1(C.LM_OP_SQUEEZE, Tensor.narrow(x, d, index, 1), { cdim(d, "select") })
end

function Tensor.unsqueeze(x, d)
  local n = x.ndim + 1
  local i = dim_index("unsqueeze", d, n)
  return op1(C.LM_OP_UNSQUEEZE, x, { d > 0 and i or d })
end

function Tensor.squeeze(x, d)
  if d == nil then return op1(C.LM_OP_SQUEEZE, x) end
  return op1(C.LM_OP_SQUEEZE, x, { cdim(d, "squeeze") })
end

function Tensor.contiguous(x)
  if C.lm_is_contiguous(x) == 1 then return x end
  return op1(C.LM_OP_CONTIGUOUS, x)
end

function Tensor.clone(x) return op1(C.LM_OP_CLONE, x) end

-- to("f64"), to("cpu"), to({dtype=..., device=...})
local TO_OPTS = { dtype = true, device = true }
function Tensor.to(x, what)
  local dtype, device = nil, nil
  if type(what) == "table" and not is_tensor(what) then
    check_opts("to", what, TO_OPTS)
    dtype, device = what.dtype, what.device
  elseif type(what) == "string" and DTYPE_ID[what] then dtype = what
  elseif type(what) == "string" then device = what
  else argerror("to", "argument #1", "a dtype name, a device name or {dtype=, device=}", describe(what)) end
  local y = x
  if dtype and dtype_id(dtype, "to") ~= x.dtype_ then y = op1(C.LM_OP_TO, y, { DTYPE_ID[dtype] }) end
  if device and device_id(device, "to") ~= y.device_ then   -- differentiable: the gradient goes back
    y = op1(C.LM_OP_TO_DEVICE, y, { device_id(device, "to") })
  end
  return y
end
function Tensor.cpu(x) return x:to("cpu") end
function Tensor.cuda(x, k) return x:to(k and ("cuda:" .. k) or "cuda") end
function Tensor.float(x) return x:to("f32") end
function Tensor.double(x) return x:to("f64") end
function Tensor.long(x) return x:to("i64") end
function Tensor.int(x) return x:to("i32") end
function Tensor.bool(x) return x:to("bool") end

-- In-place changes of a tensor that requires grad would corrupt its
-- gradient: they are allowed only where autograd records nothing.
local function check_inplace(x, fname)
  if x.needs_grad ~= 0 and C.lm_is_grad_enabled() == 1 then
    error(string.format("%s: a tensor that requires grad cannot be changed in place while autograd "
                        .. "records (its gradient would be wrong); do it inside loom.no_grad(function() ... end) "
                        .. "or on x:detach()", fname), 3)
  end
end

function Tensor.fill_(x, v)
  check_inplace(x, "fill_")
  if type(v) ~= "number" and type(v) ~= "boolean" then argerror("fill_", "value", "a number", describe(v)) end
  check_fits(v, x.dtype_, "fill_", "value")
  if C.lm_fill_(x, v == true and 1 or v == false and 0 or v) < 0 then c_error() end
  return x
end
function Tensor.zero_(x) return Tensor.fill_(x, 0) end
function Tensor.copy_(x, src)
  check_tensor(src, "copy_", "src")
  check_inplace(x, "copy_")
  if C.lm_copy_(x, src) < 0 then c_error() end
  return x
end
-- the version of x's storage, incremented by every in-place change
function Tensor._version(x) return tonumber(C.lm_tensor_version(x)) end

-- values as Lua numbers, through an f64 copy
local function values(x)
  local c = empty_of("totable", x:size(), { dtype = "f64" })
  if C.lm_copy_(c, x) < 0 then c_error(3) end
  return ffi.cast("double*", C.lm_data(c)), c
end

function Tensor.item(x)
  if x.numel_ ~= 1 then
    argerror("item", "self", "a tensor with one element", tonumber(x.numel_) .. " elements")
  end
  local p, keep = values(x)
  local v = p[0]
  if x.dtype_ == 6 then v = v ~= 0 end
  local _ = keep
  return v
end

function Tensor.totable(x)
  local p, keep = values(x)
  local size, i = x:size(), 0
  local isbool = x.dtype_ == 6
  local function build(d)
    if d > #size then
      local v = p[i]
      i = i + 1
      if isbool then return v ~= 0 end
      return v
    end
    local t = {}
    for k = 1, size[d] do t[k] = build(d + 1) end
    return t
  end
  local r = build(1)
  local _ = keep
  return r
end

---------------------------------------------------------------------------
-- autograd

function Tensor.backward(x, grad)
  if grad ~= nil then check_tensor(grad, "backward", "gradient") end
  if C.lm_backward(x, grad) < 0 then c_error(3) end   -- through autograd_hooks' wrapper
end

function Tensor.detach(x) return wrap(C.lm_detach(x)) end

function Tensor.requires_grad_(x, flag)
  if C.lm_set_requires_grad(x, flag == nil and 1 or (flag and 1 or 0)) < 0 then c_error() end
  return x
end

function Tensor.retain_grad(x)
  if C.lm_retain_grad(x) < 0 then c_error() end
  return x
end

function Tensor.zero_grad(x) C.lm_set_grad(x, nil) end

function props.grad_fn(x)
  if x.grad_fn_ == nil then return nil end
  return "node"
end

local function pack(...) return { n = select("#", ...), ... } end
M.pack = pack

-- Runs fn(...) without recording autograd; the mode is restored on error.
function M.no_grad(fn, ...)
  local old = C.lm_set_grad_enabled(0)
  local res = pack(pcall(fn, ...))
  C.lm_set_grad_enabled(old)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

function M.is_grad_enabled() return C.lm_is_grad_enabled() == 1 end

---------------------------------------------------------------------------
-- printing, Torch7 style: values, then a footer with dtype, device, size

local function fmt_for(x, flat)
  if x.dtype_ >= 4 then return "%d", 0 end
  local maxabs, allint = 0, true
  for _, v in ipairs(flat) do
    if v == v and math.abs(v) ~= math.huge then
      maxabs = math.max(maxabs, math.abs(v))
      if v ~= math.floor(v) then allint = false end
    end
  end
  if allint and maxabs < 1e9 then return "%.0f", 0 end
  if maxabs >= 1e5 or (maxabs < 1e-3 and maxabs > 0) then return "%.4e", 0 end
  return "%.4f", 0
end

function M.format(x)
  local size = x:size()
  local footer = string.format("[loom.Tensor %s %s of size %s]", props.dtype(x), props.device(x),
                               #size == 0 and "scalar" or table.concat(size, "x"))
  if x.numel_ == 0 then return "[empty tensor]\n" .. footer end
  local full = x.numel_ <= 1000
  local p, keep = values(x)
  local flat = {}
  for i = 0, tonumber(x.numel_) - 1 do flat[#flat + 1] = p[i] end
  local _ = keep
  local f = fmt_for(x, flat)
  local function s(v)
    if x.dtype_ == 6 then return v ~= 0 and "true" or "false" end
    return string.format(f, v)
  end
  local strs, width = {}, 0
  for i, v in ipairs(flat) do strs[i] = s(v) width = math.max(width, #strs[i]) end
  local function cell(i) return string.rep(" ", width - #strs[i] + 1) .. strs[i] end
  local lines = {}
  if #size == 0 then return strs[1] .. "\n" .. footer end
  local cols = size[#size]
  local rows = tonumber(x.numel_) / cols
  local function row(r)
    local parts = {}
    if full or cols <= 8 then
      for c = 1, cols do parts[c] = cell(r * cols + c) end
    else
      for c = 1, 3 do parts[#parts + 1] = cell(r * cols + c) end
      parts[#parts + 1] = " ..."
      for c = cols - 2, cols do parts[#parts + 1] = cell(r * cols + c) end
    end
    return table.concat(parts)
  end
  local rows_per_mat = #size >= 2 and size[#size - 1] or 1
  for r = 0, rows - 1 do
    local in_mat = r % rows_per_mat
    local show = full or rows <= 20 or r < 3 or r >= rows - 3
    if #size > 2 and in_mat == 0 and show then
      local idx, rem = {}, r / rows_per_mat
      for d = #size - 2, 1, -1 do idx[d] = rem % size[d] + 1 rem = math.floor(rem / size[d]) end
      if #lines > 0 then lines[#lines + 1] = "" end
      lines[#lines + 1] = "(" .. table.concat(idx, ",") .. ",.,.) = "
    end
    if show then lines[#lines + 1] = row(r)
    elseif r == 3 then lines[#lines + 1] = " ..." end
  end
  return table.concat(lines, "\n") .. "\n" .. footer
end

---------------------------------------------------------------------------
-- the metatype: methods first, then computed fields

local mt = {
  __index = function(x, k)
    if x.freed ~= 0 and k ~= "free" then error("tensor: this tensor was freed (t:free()); it cannot be used any more", 2) end
    local m = Tensor[k]
    if m ~= nil then return m end
    local p = props[k]
    if p then return p(x) end
    return nil
  end,
  __newindex = function(x, k, v)
    local s = setters[k]
    if not s then error("tensor: cannot set field " .. tostring(k), 2) end
    s(x, v)
  end,
  __tostring = function(x) return M.format(x) end,
  __len = function(x) return x.ndim > 0 and tonumber(x.shape_[0]) or 0 end,
}
M.metatable = mt

function M.install()
  ffi.metatype(tensor_ct, mt)
end

return M
