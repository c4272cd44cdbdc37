-- tensor.lua: the Tensor type (an lm_tensor cdata with methods, fields
-- and the metatype), argument checks and op calls. The factories live in
-- tensor_create.lua, printing in tensor_print.lua.
local ffi = require("ffi")
local lib = require("loom.lib")
local checks = require("loom.checks")
local Size = require("loom.size")
local C = lib.C

local M = {}            -- the functions `loom` exports from this file
local Tensor = {}       -- methods
local props = {}        -- computed fields: x.dtype, x.grad, ...
M.Tensor = Tensor
M.props = props
-- tensor -> what replaced it in its module (fully_shard, to_empty,
-- Module:to): an optimizer built before holds it and would train nothing
-- (weak keys: a replaced tensor no one holds is forgotten)
M.replaced = setmetatable({}, { __mode = "k" })

local tensor_ct = ffi.typeof("lm_tensor")
local function is_tensor(x) return type(x) == "cdata" and ffi.istype(tensor_ct, x) end
M.is_tensor = is_tensor
-- address(p): a C object's pointer as a string, the key of tables that
-- know tensors (or meshes) by identity
function M.address(p) return tostring(ffi.cast("void*", p)) end

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

local gc_pressure = require("loom.gc_pacing").pressure   -- when to collect: C memory LuaJIT cannot see

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

local inbuf = ffi.new("lm_tensor*[?]", C.LM_MAX_INPUTS)
local outbuf = ffi.new("lm_tensor*[4]")
local attrs = ffi.new("lm_attrs")

-- attrs from Lua lists of integers and reals, and handles (e.g. a
-- communicator, {comm}); the lists must fit the fixed arrays of lm_attrs
local MAXI, MAXF, MAXH = C.LM_MAX_ATTR_INTS, C.LM_MAX_ATTR_REALS, C.LM_MAX_ATTR_HANDLES
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
  if n > C.LM_MAX_INPUTS then error(op_name(id) .. ": at most " .. C.LM_MAX_INPUTS .. " tensors, got " .. n, 2) end
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

-- one tensor and one real attribute: x (op) v for a Lua number v as the
-- *_scalar ops take it (no 0-dim tensor, no table)
local function op1f(id, x, v)
  inbuf[0] = x
  attrs.ni, attrs.nf, attrs.nh = 0, 1, 0
  attrs.f[0] = v
  if C.lm_op_call(id, 1, inbuf, attrs, 4, outbuf) < 0 then c_error(3) end
  gc_pressure()
  return ffi.gc(outbuf[0][0], C.lm_release)
end
M.op1f = op1f


-- The dtype of the 0-dim tensor a Lua number v becomes beside a tensor of
-- dtype dt, the one policy of mixed arithmetic: integers stay integers
-- (bool as i64) and a fraction beside them is f64; beside floats, f64 when
-- `wide` (scalar_for keeps the number exact), else the dtype the op
-- computes in (f64 for f64, f32 for f32, bf16 and f16).
local function number_dtype(dt, v, wide)
  if dt >= C.LM_I32 then
    if v ~= math.floor(v) then return C.LM_F64 end
    return dt == C.LM_BOOL and C.LM_I64 or dt
  end
  if wide or dt == C.LM_F64 then return C.LM_F64 end
  return C.LM_F32
end

-- A 0-dim tensor for a Lua number mixed with tensor `like`.
local function scalar_for(v, like)
  local t = wrap(C.lm_empty(0, nil, number_dtype(like.dtype_, v, true), like.device_))
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
  local s = C.lm_empty(0, nil, number_dtype(x.dtype_, v, false), x.device_)
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
function props.shape(x) return x:size() end   -- a loom.Size, as x:size(); x:shape() calls it (size.lua)
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

-- A DTensor's sizes are global, as in PyTorch (its spec's; the storage
-- holds the local shard): the shape read from the spec, else the tensor's
local gshape = ffi.new("int64_t[?]", C.LM_MAX_DIMS)
local function shape_of(x)
  if x.dist == nil then return x.shape_ end
  C.lm_dtensor_spec(x, nil, gshape, nil)
  return gshape
end

-- shard_block(x) -> global shape, offset and size (0-based, int64_t[] of
-- x:dim() entries, valid until the next call) of the block of DTensor x
-- this rank holds: the one reading of a spec's layout (RNG fills and
-- checkpoints use it)
local bpl, bmesh = ffi.new("lm_placement[?]", C.LM_MAX_MESH), ffi.new("lm_mesh*[1]")
local bshape, boff, bsize = ffi.new("int64_t[?]", C.LM_MAX_DIMS), ffi.new("int64_t[?]", C.LM_MAX_DIMS),
                            ffi.new("int64_t[?]", C.LM_MAX_DIMS)
function M.shard_block(x)
  C.lm_dtensor_spec(x, bpl, bshape, bmesh)
  C.lm_shard_layout(bmesh[0], x.ndim, bshape, bpl, nil, bsize, boff)
  return bshape, boff, bsize
end

function Tensor.dim(x) return x.ndim end
function Tensor.numel(x)
  if x.dist == nil then return tonumber(x.numel_) end
  local sh, n = shape_of(x), 1
  for k = 0, x.ndim - 1 do n = n * tonumber(sh[k]) end
  return n
end
Tensor.nelement = Tensor.numel

function Tensor.size(x, d)
  local sh = shape_of(x)
  if d == nil then
    local s = {}
    for k = 0, x.ndim - 1 do s[k + 1] = tonumber(sh[k]) end
    return Size.new(s)
  end
  return tonumber(sh[dim_index("size", d, x.ndim)])
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
  if x.dist ~= nil and v ~= 0 and v ~= false then   -- a Partial sum of v on every rank is not v
    for _, p in ipairs(x.placements) do
      if p:is_partial() then error("fill_: a Partial DTensor holds terms of a sum: only zero_() fills it", 2) end
    end
  end
  if C.lm_fill_(x, v == true and 1 or v == false and 0 or v) < 0 then c_error() end
  return x
end
function Tensor.zero_(x) return Tensor.fill_(x, 0) end
function Tensor.copy_(x, src)
  check_tensor(src, "copy_", "src")
  check_inplace(x, "copy_")
  if x.dist ~= nil or src.dist ~= nil then src = M.laid_out_as(x, src, "copy_", 3) end   -- tensor_inplace.lua
  if C.lm_copy_(x, src) < 0 then c_error() end
  return x
end
-- the version of x's storage, incremented by every in-place change
function Tensor._version(x) return tonumber(C.lm_tensor_version(x)) end

-- values as Lua numbers, through an f64 copy
-- (on the CPU, whatever loom.device(d):use says)
local function values(x)
  local c = wrap(C.lm_empty(x.ndim, x.shape_, DTYPE_ID.f64, 0), 3)
  if C.lm_copy_(c, x) < 0 then c_error(3) end
  return ffi.cast("double*", C.lm_data(c)), c
end
M.values = values

function Tensor.item(x)
  if x.numel_ ~= 1 then
    argerror("item", "self", "a tensor with one element", tonumber(x.numel_) .. " elements")
  end
  local p, keep = values(x)
  local v = p[0]
  if x.dtype_ == C.LM_BOOL then v = v ~= 0 end
  local _ = keep
  return v
end

function Tensor.totable(x)
  local p, keep = values(x)
  local size, i = x:size(), 0
  local isbool = x.dtype_ == C.LM_BOOL
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
-- the metatype: methods first, then computed fields

local mt = {
  __index = function(x, k)
    if x.freed ~= 0 and k ~= "free" then error("tensor: this tensor was freed (t:free()); it cannot be used any more", 2) end
    local m = Tensor[k]
    if m ~= nil then return m end
    local p = props[k]
    if p then return p(x) end
    if type(k) == "number" then return M.getitem(x, k) end   -- t[i]: tensor_inplace.lua
    return nil
  end,
  __newindex = function(x, k, v)
    local s = setters[k]
    if s then return s(x, v) end
    if type(k) == "number" then return M.setitem(x, k, v) end   -- t[i] = v
    error("tensor: cannot set field " .. tostring(k), 2)
  end,
  __tostring = function(x) return M.format(x) end,   -- tensor_print.lua
  __len = function(x) return x.ndim > 0 and tonumber(x.shape_[0]) or 0 end,
}
M.metatable = mt
function M.format(x) return require("loom.tensor_print").format(x) end

function M.install()
  ffi.metatype(tensor_ct, mt)
end

return M
