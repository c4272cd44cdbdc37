-- tensor_inplace.lua: Torch habits on tensors. t[i] is row i along the
-- first dim (a view; a Lua number for a 1-D tensor, so t[i][j] reads an
-- element of a matrix), negative i from the end; t[i] = v writes it (a
-- number, or a tensor broadcast to the row). In-place arithmetic (add_,
-- sub_, mul_, div_, clamp_, pow_, neg_, exp_, log_, sqrt_, abs_, ...)
-- computes the new values with the op of the same name and writes them
-- into the tensor, so autograd's version counter sees each change (a
-- tensor autograd saved, changed in place, fails the backward) and a
-- tensor that requires grad is refused while autograd records, as fill_
-- and copy_ are. On a DTensor the values are laid out as the tensor is
-- before they are written; t[i] = v is refused there (the row may not be
-- a view of the shards).
local T = require("loom.tensor")
local C = require("loom.lib").C
local Tensor = T.Tensor
local argerror, describe = T.argerror, T.describe

local M = {}

local function sizes_text(s) return "{" .. table.concat(s, ", ") .. "}" end

-- (t[i] and t[i] = v are tail calls of the metamethods: level 2 of the
-- functions below is the user's line)

-- i as a 1-based row of a first dim of n rows, or an error naming both
local function row_of(fname, i, n)
  if not T.is_int(i) then argerror(fname, "index", "an integer (1-based, negative from the end)", describe(i), 3) end
  local r = i > 0 and i or n + i + 1
  if i == 0 or r < 1 or r > n then
    error(string.format("%s: index %d is out of range for dim 1 of size %d (1-based: 1..%d, or -%d..-1)",
                        fname, i, n, n, n), 3)
  end
  return r
end

local function no_scalar(fname, x)
  if x:dim() == 0 then error(fname .. ": a 0-dim tensor has no rows to index (x:item() reads its value)", 3) end
end

-- t[i]: the view of row i, or its value for a 1-D tensor
function T.getitem(x, i)
  no_scalar("t[i]", x)
  local row = Tensor.select(x, 1, row_of("t[i]", i, x:size(1)))
  if row:dim() > 0 then return row end
  if x.dist ~= nil then row = row:full_tensor() end
  return row:item()
end

-- refuses an in-place change autograd could not follow: the tensor
-- requires grad (as fill_ does), or the new values would (their gradient
-- would be lost); level: as error()'s, seen from the caller
local function check_grad(x, fname, v, level)
  if C.lm_is_grad_enabled() ~= 1 then return end
  if x.needs_grad ~= 0 then
    error(string.format("%s: a tensor that requires grad cannot be changed in place while autograd "
                        .. "records (its gradient would be wrong); do it inside loom.no_grad(function() ... end) "
                        .. "or on x:detach()", fname), level + 1)
  end
  if T.is_tensor(v) and v.needs_grad ~= 0 then
    error(string.format("%s: the value requires grad, and an in-place change is not recorded by autograd "
                        .. "(its gradient would be lost): write x = x + v, or detach the value", fname), level + 1)
  end
end

-- t[i] = v
function T.setitem(x, i, v)
  no_scalar("t[i] = v", x)
  if x.dist ~= nil or (T.is_tensor(v) and v.dist ~= nil) then
    error("t[i] = v: not on a DTensor (write its shard: t:to_local()[i] = v, or build the tensor whole)", 2)
  end
  check_grad(x, "t[i] = v", v, 2)
  local row = Tensor.select(x, 1, row_of("t[i] = v", i, x:size(1)))
  if type(v) == "number" or type(v) == "boolean" then
    T.check_fits(v == true and 1 or v == false and 0 or v, x.dtype_, "t[i] = v", "value", 2)
    if C.lm_fill_(row, v == true and 1 or v == false and 0 or v) < 0 then T.c_error(2) end
    return
  end
  if not T.is_tensor(v) then argerror("t[i] = v", "value", "a number or a tensor", describe(v), 2) end
  local want, have = row:size(), v:size()
  while #have > #want and have[1] == 1 do   -- leading dims of size 1 go (t[i] = u of size {1, n})
    v = v:squeeze(1)
    have = v:size()
  end
  local fits = #have <= #want
  for k = 1, #have do
    local a, b = have[#have - k + 1], want[#want - k + 1]
    if b == nil or (a ~= b and a ~= 1) then fits = false end
  end
  if not fits then
    error(string.format("t[i] = v: a value of size %s cannot be broadcast to the row's size %s",
                        sizes_text(have), sizes_text(want)), 2)
  end
  if #have < #want or not (have == want) then v = v:expand(want) end
  if C.lm_copy_(row, v) < 0 then T.c_error(2) end
end

---------------------------------------------------------------------------
-- in-place arithmetic: x:name_(...) is x:copy_(x:name(...)), checked

local function same_placements(a, b)
  if #a ~= #b then return false end
  for k = 1, #a do
    if a[k] ~= b[k] then return false end
  end
  return true
end

-- laid_out_as(x, y): the values y as x holds them, to be copied into x's
-- storage: a DTensor y moved to x's placements (on x's mesh); a plain y
-- with x's global size taken as the whole tensor, every rank cutting its
-- own part (as load_state_dict gives every rank the whole state); into a
-- plain x, a DTensor y whole (a collective). Anything else is an error at
-- level (error()'s, seen from the caller).
function T.laid_out_as(x, y, fname, level)
  level = level + 1
  if x.dist ~= nil and y.dist ~= nil then
    if same_placements(x.placements, y.placements) then return y end
    return y:redistribute(x.placements)
  end
  if not (x:size() == y:size()) then
    error(string.format("%s: a %s of size %s and a %s of size %s: a plain tensor stands for the whole DTensor "
                        .. "(its size is the global size); to_local() gives a shard", fname,
                        x.dist ~= nil and "DTensor" or "plain tensor", sizes_text(x:size()),
                        y.dist ~= nil and "DTensor" or "plain tensor", sizes_text(y:size())), level)
  end
  if y.dist ~= nil then return y:full_tensor() end
  for _, p in ipairs(x.placements) do
    if p:is_partial() then
      error(fname .. ": a Partial DTensor cannot take a plain tensor's values (copy a DTensor into it)", level)
    end
  end
  local D = require("loom.distributed")
  return D.distribute_tensor(y, x.device_mesh, x.placements, { src_data_rank = false })
end

-- writes y (the new values) into x
local function write(x, y, fname)
  if y.dist ~= nil or x.dist ~= nil then
    if x.dist == nil or y.dist == nil then
      error(fname .. ": a plain tensor and a DTensor cannot be mixed in place (distribute the other one too)", 3)
    end
    y = T.laid_out_as(x, y, fname, 2)
  end
  local want, have = x:size(), y:size()
  if not (want == have) then
    error(string.format("%s: the result has size %s, but the tensor changed in place has size %s "
                        .. "(the other operand broadcasts beyond it)", fname, sizes_text(have), sizes_text(want)), 3)
  end
  if T.is_float_dtype(y.dtype) and not T.is_float_dtype(x.dtype) then
    error(string.format("%s: the result is %s, which cannot be written into a %s tensor in place "
                        .. "(use x = x:%s(...), or x:float() first)", fname, y.dtype, x.dtype, fname:sub(1, -2)), 3)
  end
  if C.lm_copy_(x, y) < 0 then T.c_error(3) end
end

-- name_(x, ...) from the out-of-place method name
local function inplace(name)
  local out_of_place = Tensor[name]
  local fname = name .. "_"
  return function(x, a, b)
    T.check_tensor(x, fname, "self")
    check_grad(x, fname, a, 2)
    write(x, out_of_place(x, a, b), fname)   -- not a tail call: write's errors name the user's line
    return x
  end
end

M.NAMES = { "add", "sub", "mul", "div", "pow", "clamp", "neg", "abs", "sqrt", "rsqrt", "exp", "log", "tanh",
            "sigmoid", "relu", "sin", "cos", "sign", "maximum", "minimum", "hardtanh" }
for _, name in ipairs(M.NAMES) do
  Tensor[name .. "_"] = inplace(name)
end

return M
