-- tensor_ops.lua: the math methods of Tensor and its Lua operators, each a
-- thin call of one op of the table, by id (C.LM_OP_<ID>).
local T = require("loom.tensor")
local C = require("loom.lib").C
local Tensor, op, op1, op2, cdim = T.Tensor, T.op, T.op1, T.op2, T.cdim
local as_tensor, check_tensor = T.as_tensor, T.check_tensor
local TC = require("loom.tensor_create")

local M = {}

-- binary ops take tensors or Lua numbers (or booleans) on either side
local is_tensor, op2n, fits = T.is_tensor, T.op2n, T.fits

-- A whole number mixed with an integer tensor computes in its dtype (bool
-- in i64): it must fit it, as in PyTorch. Fractional numbers compute in f64.
local function scalar_dtype(x) return x.dtype_ == C.LM_BOOL and C.LM_I64 or x.dtype_ end
local function check_scalar(v, x, name, argname)
  if type(v) == "number" and x.dtype_ >= C.LM_I32 and (v ~= v or v == math.floor(v)) and not fits(v, scalar_dtype(x)) then
    T.check_fits(v, scalar_dtype(x), name, argname, 3)
  end
end

-- A float tensor (not a DTensor) and a Lua number: the number is the
-- attribute of a *_scalar op (x - v as x + (-v), the same in IEEE
-- arithmetic), computed in the tensor's dtype as the 0-dim tensor of
-- op2n would be. Integer tensors, booleans and DTensors (a Partial plus a
-- number adds it on one rank) take op2n. [name] = {x op v, v op x}
local op1f = T.op1f
local SCALAR_OPS = {
  add = { C.LM_OP_ADD_SCALAR, C.LM_OP_ADD_SCALAR }, sub = { C.LM_OP_ADD_SCALAR, C.LM_OP_RSUB_SCALAR },
  mul = { C.LM_OP_MUL_SCALAR, C.LM_OP_MUL_SCALAR }, div = { C.LM_OP_DIV_SCALAR },
}
local LAST_FLOAT = C.LM_F16

local function binary(name)
  local id = C["LM_OP_" .. name:upper()]
  local sc = SCALAR_OPS[name] or {}
  local right, left, negate = sc[1], sc[2], name == "sub"
  return function(a, b)
    local tb = type(b)
    if tb == "number" and right and is_tensor(a) and a.dtype_ <= LAST_FLOAT and a.dist == nil then
      return op1f(right, a, negate and -b or b)
    end
    if is_tensor(a) then
      if is_tensor(b) then return op2(id, a, b) end
      if tb == "number" or tb == "boolean" then
        check_scalar(b, a, name, "argument #2")
        return op2n(id, a, b, false)
      end
    end
    check_tensor(b, name, "argument #2")
    local ta = type(a)
    if ta == "number" and left and b.dtype_ <= LAST_FLOAT and b.dist == nil then
      return op1f(left, b, a)
    end
    if ta == "number" or ta == "boolean" then
      check_scalar(a, b, name, "argument #1")
      return op2n(id, b, a, true)
    end
    check_tensor(a, name, "argument #1")
  end
end

for _, name in ipairs { "add", "sub", "mul", "div", "pow", "maximum", "minimum",
                        "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or" } do
  Tensor[name] = binary(name)
  M[name] = Tensor[name]
end

for _, name in ipairs { "neg", "abs", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "relu",
                        "silu", "sin", "cos", "sign", "logical_not" } do
  local id = C["LM_OP_" .. name:upper()]
  Tensor[name] = function(x) return op1(id, check_tensor(x, name, "self")) end
  M[name] = Tensor[name]
end

-- x:pow(p) with a number uses the scalar kernel (x*x for p == 2)
function Tensor.pow(x, p)
  if type(p) == "number" and T.is_tensor(x) then return op1(C.LM_OP_POW_SCALAR, x, nil, { p }) end
  return binary("pow")(x, p)
end
M.pow = Tensor.pow

-- gelu(x), gelu(x, "tanh"), gelu(x, {approximate = "none" | "tanh"})
function Tensor.gelu(x, opts)
  local approx = "none"
  if type(opts) == "string" then approx = opts
  elseif type(opts) == "table" and not is_tensor(opts) then
    T.check_opts("gelu", opts, { approximate = true })
    approx = opts.approximate == nil and "none" or opts.approximate
  elseif opts ~= nil then
    T.argerror("gelu", "approximate", "\"none\", \"tanh\" or {approximate = ...}", T.describe(opts))
  end
  if approx ~= "none" and approx ~= "tanh" then
    T.argerror("gelu", "approximate", "\"none\" or \"tanh\"", T.describe(approx))
  end
  return op1(approx == "tanh" and C.LM_OP_GELU_TANH or C.LM_OP_GELU, x)
end

-- clamp(min, max): nil leaves a side open
function Tensor.clamp(x, lo, hi)
  check_tensor(x, "clamp", "self")
  for _, kv in ipairs { { "min", lo }, { "max", hi } } do
    local v = kv[2]
    if v ~= nil and (type(v) ~= "number" or v ~= v) then
      T.argerror("clamp", kv[1], "a number or nil", T.describe(v))
    end
    if v ~= nil and x.dtype_ >= C.LM_I32 then check_scalar(math.floor(v), x, "clamp", kv[1]) end
  end
  if lo == nil and hi == nil then T.argerror("clamp", "min", "at least one of min and max", "neither") end
  -- an integer kernel cannot take the open side's NaN: one side is a maximum/minimum
  if x.dtype_ >= C.LM_I32 and (lo == nil or hi == nil) then
    if lo == nil then return x:minimum(math.floor(hi)) end
    return x:maximum(math.ceil(lo))
  end
  return op1(C.LM_OP_CLAMP, x, nil, { lo or 0 / 0, hi or 0 / 0 })
end

-- hardtanh(min_val, max_val): clamp's values (defaults -1, 1); its
-- gradient, like clamp's, is 1 strictly between the bounds
function Tensor.hardtanh(x, lo, hi)
  lo, hi = lo == nil and -1 or lo, hi == nil and 1 or hi
  for name, v in pairs { min_val = lo, max_val = hi } do
    if type(v) ~= "number" or v ~= v then T.argerror("hardtanh", name, "a number", T.describe(v)) end
  end
  if lo > hi then T.argerror("hardtanh", "max_val", "a number >= min_val (" .. lo .. ")", tostring(hi)) end
  return op1(C.LM_OP_HARDTANH, check_tensor(x, "hardtanh", "self"), nil, { lo, hi })
end
M.hardtanh = Tensor.hardtanh

function M.where(cond, a, b)
  check_tensor(cond, "where", "condition")
  local like = T.is_tensor(a) and a or T.is_tensor(b) and b or cond:to("f32")
  check_scalar(a, like, "where", "argument #2")
  check_scalar(b, like, "where", "argument #3")
  return op(C.LM_OP_WHERE, { cond, as_tensor(a, like, "where", "argument #2"), as_tensor(b, like, "where", "argument #3") })
end
Tensor.where = function(x, cond, other) return M.where(cond, x, other) end

function Tensor.masked_fill(x, mask, value)
  check_tensor(mask, "masked_fill", "mask")
  if type(value) ~= "number" then T.argerror("masked_fill", "value", "a number", T.describe(value)) end
  check_scalar(value, x, "masked_fill", "value")
  return M.where(mask, value, x)
end

function Tensor.matmul(a, b) return op(C.LM_OP_MATMUL, { a, b }) end
Tensor.mm, Tensor.bmm = Tensor.matmul, Tensor.matmul
M.matmul = Tensor.matmul

---------------------------------------------------------------------------
-- reductions: x:sum() over everything, x:sum(dim, keepdim)

local function reduce_attrs(name, d, keepdim)
  if keepdim ~= nil and type(keepdim) ~= "boolean" then
    T.argerror(name, "keepdim", "a boolean", T.describe(keepdim), 3)
  end
  if d == nil then
    if keepdim ~= nil then T.argerror(name, "dim", "a dim when keepdim is given", "nil", 3) end
    return nil
  end
  return { cdim(d, name), keepdim and 1 or 0 }
end

function Tensor.sum(x, d, keepdim) return op1(C.LM_OP_SUM, x, reduce_attrs("sum", d, keepdim)) end
function Tensor.mean(x, d, keepdim) return op1(C.LM_OP_MEAN, x, reduce_attrs("mean", d, keepdim)) end

-- max/min: over everything, the value; over a dim, values and 1-based indices
local function minmax(name)
  return function(x, d, keepdim)
    if type(d) ~= "number" and d ~= nil then return binary(name == "max" and "maximum" or "minimum")(x, d) end
    local v, i = op(C["LM_OP_" .. name:upper()], { x }, reduce_attrs(name, d, keepdim))
    if d == nil then return v end
    return v, i + 1
  end
end
Tensor.max, Tensor.min = minmax("max"), minmax("min")

function Tensor.argmax(x, d, keepdim) return op1(C.LM_OP_ARGMAX, x, reduce_attrs("argmax", d, keepdim)) + 1 end
function Tensor.argmin(x, d, keepdim) return op1(C.LM_OP_ARGMIN, x, reduce_attrs("argmin", d, keepdim)) + 1 end

-- grouped_mm(x (N, K), w (E, K, M), group_sizes, {trans_w = false}) -> (N, M):
-- the GEMM of a mixture of experts as one op: x's rows in E consecutive
-- groups (group_sizes[e] rows each, in order), group e times w[e].
-- trans_w: w is (E, M, K), nn.Linear's layout per group, read transposed
-- without a copy. group_sizes: an i64 tensor or a Lua list of E counts.
function M.grouped_mm(x, w, group_sizes, opts)
  local f = "grouped_mm"
  T.check_tensor(x, f, "input")
  T.check_tensor(w, f, "weight")
  opts = T.check_opts(f, opts, { trans_w = true })
  if type(group_sizes) == "table" then
    for e = 1, #group_sizes do
      if not T.is_int(group_sizes[e]) then
        T.argerror(f, "group_sizes[" .. e .. "]", "an integer row count", T.describe(group_sizes[e]))
      end
    end
    group_sizes = TC.tensor(group_sizes, { dtype = "i64", device = x.device })
  elseif not T.is_tensor(group_sizes) then
    T.argerror(f, "group_sizes", "an i64 tensor or a list of row counts", T.describe(group_sizes))
  end
  if opts.trans_w then
    if w:dim() ~= 3 then T.argerror(f, "weight", "3 dims (groups, M, K) with trans_w", w:dim() .. " dims") end
    w = w:transpose(2, 3)
  end
  return op(C.LM_OP_GROUPED_MM, { x, w, group_sizes })
end

---------------------------------------------------------------------------
-- joining and splitting

function M.cat(list, d)
  if type(list) ~= "table" or T.is_tensor(list) then T.argerror("cat", "tensors", "a table of tensors", T.describe(list)) end
  if #list == 0 then T.argerror("cat", "tensors", "at least one tensor", "an empty table") end
  return op(C.LM_OP_CAT, { unpack(list) }, { cdim(d or 1, "cat") })
end

-- split(size, dim): pieces of `size` along dim, the last may be smaller
function Tensor.split(x, size, d)
  d = d or 1
  local sz = x:size()   -- global sizes for a DTensor
  local n = sz[T.dim_index("split", d, #sz) + 1]
  if not T.is_int(size) or size < 1 then
    T.argerror("split", "split_size", "a positive integer", T.describe(size))
  end
  local parts = {}
  for start = 1, math.max(n, 1), size do
    if n == 0 then break end
    parts[#parts + 1] = x:narrow(d, start, math.min(size, n - start + 1))
  end
  return parts
end

-- chunk(n, dim): torch.chunk: ceil-sized pieces, possibly fewer than n
function Tensor.chunk(x, chunks, d)
  if not T.is_int(chunks) or chunks < 1 then
    T.argerror("chunk", "chunks", "a positive integer", T.describe(chunks))
  end
  local sz = x:size()
  local n = sz[T.dim_index("chunk", d or 1, #sz) + 1]
  return x:split(math.max(1, math.ceil(n / chunks)), d)
end

function Tensor.softmax(x, d) return op1(C.LM_OP_SOFTMAX, x, { cdim(d, "softmax") }) end
function Tensor.log_softmax(x, d) return op1(C.LM_OP_LOG_SOFTMAX, x, { cdim(d, "log_softmax") }) end
local function diagonal(name, k)
  if k ~= nil and (not T.is_int(k) or math.abs(k) >= 2 ^ 62) then
    T.argerror(name, "diagonal", "an integer", T.describe(k), 3)
  end
  return { k or 0 }
end
function Tensor.triu(x, k) return op1(C.LM_OP_TRIU, x, diagonal("triu", k)) end
function Tensor.tril(x, k) return op1(C.LM_OP_TRIL, x, diagonal("tril", k)) end

---------------------------------------------------------------------------
-- operators

local mt = T.metatable
mt.__add = binary("add")
mt.__sub = binary("sub")
mt.__mul = binary("mul")
mt.__div = binary("div")
mt.__pow = function(a, b) return Tensor.pow(a, b) end
mt.__unm = function(a) return op1(C.LM_OP_NEG, a) end

require("loom.tensor_inplace")   -- t[i], t[i] = v and add_, mul_, ... (from the methods above)

return M
