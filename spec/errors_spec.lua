-- errors_spec.lua: misuses of the tensor API. Each raises a Lua error whose
-- message names the problem, and the process goes on afterwards.
local loom = require("loom")
local X = require("support.misuse")

-- asserts fn raises an error matching every pattern (plain find, any case)
local function fails(fn, ...)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error")
  err = tostring(err):lower()
  for _, p in ipairs { ... } do
    assert(err:find(p:lower(), 1, true), string.format("message %q lacks %q", err, p))
  end
  assert.has_error(fn)
  return err
end

local m23 = function() return loom.zeros(2, 3) end

local cases = {
  -- shapes
  { "matmul inner sizes", function() m23():matmul(loom.zeros(4, 2)) end, "matmul", "3", "4" },
  { "matmul batch dims", function() loom.zeros(2, 2, 3):matmul(loom.zeros(3, 3, 2)) end, "matmul", "batch" },
  { "matmul of a scalar", function() loom.tensor(1):matmul(loom.zeros(2)) end, "matmul", "dim" },
  { "broadcast add", function() return m23() + loom.zeros(4) end, "add", "broadcast" },
  { "broadcast mul in the leading dim", function() return loom.zeros(2, 3) * loom.zeros(3, 3) end, "mul", "broadcast" },
  { "broadcast where", function() loom.where(loom.tensor({ true, false, true }), loom.zeros(2), 1) end, "where", "broadcast" },
  { "cat sizes", function() loom.cat({ m23(), loom.zeros(2, 4) }, 1) end, "cat", "size" },
  { "cat ranks", function() loom.cat({ m23(), loom.zeros(3) }, 1) end, "cat", "dims" },
  { "cat of nothing", function() loom.cat({}, 1) end, "cat", "at least one" },
  { "cat of a non-table", function() loom.cat(m23(), 1) end, "cat", "table" },
  { "view size mismatch", function() m23():view(4, 2) end, "view", "elements" },
  { "view of a non-contiguous tensor", function() m23():t():view(6) end, "view", "contiguous" },
  { "view with two -1", function() loom.zeros(2, 3):view(-1, -1) end, "view", "-1" },
  { "reshape that cannot infer -1", function() m23():reshape(4, -1) end, "reshape", "infer" },
  { "expand a non-1 dim", function() m23():expand(4, 3) end, "expand", "size" },
  { "narrow beyond the end", function() m23():narrow(2, 3, 2) end, "narrow", "fit" },
  { "narrow start 0", function() m23():narrow(2, 0, 1) end, "narrow", "start" },
  { "permute with a repeated dim", function() loom.zeros(2, 3, 4):permute(1, 1, 2) end, "permute", "twice" },
  { "permute with too few dims", function() loom.zeros(2, 3, 4):permute(2, 1) end, "permute", "dims" },
  { "t of a 3-D tensor", function() loom.zeros(2, 3, 4):t() end, "t", "2 dims" },
  { "item of many elements", function() m23():item() end, "item", "one element" },
  { "backward gradient shape", function() local x = loom.ones(3, { requires_grad = true }); (x * 2):backward(loom.ones(2)) end, "backward", "shape" },
  -- dims
  { "dim 0 in sum", function() m23():sum(0) end, "sum", "dim" },
  { "dim out of range in sum", function() m23():sum(3) end, "sum", "dim" },
  { "negative dim out of range in max", function() m23():max(-3) end, "max", "dim" },
  { "dim 0 in transpose", function() m23():transpose(0, 1) end, "transpose", "dim" },
  { "dim out of range in transpose", function() m23():transpose(1, 5) end, "transpose", "dim" },
  { "dim 0 in narrow", function() m23():narrow(0, 1, 1) end, "narrow", "dim" },
  { "dim out of range in cat", function() loom.cat({ m23(), m23() }, 3) end, "cat", "dim" },
  { "dim out of range in softmax", function() m23():softmax(3) end, "softmax", "dim" },
  { "dim 0 in size", function() m23():size(0) end, "size", "dim" },
  { "dim out of range in unsqueeze", function() m23():unsqueeze(4) end, "unsqueeze", "dim" },
  { "dim out of range in squeeze", function() m23():squeeze(3) end, "squeeze", "dim" },
  { "dim out of range in argmax", function() m23():argmax(-4) end, "argmax", "dim" },
  { "fractional dim", function() m23():sum(1.5) end, "sum", "dim" },
  -- names
  { "unknown dtype", function() loom.zeros({ 2 }, { dtype = "f8" }) end, "dtype", "f8" },
  { "unknown dtype in to", function() m23():to("float128") end, "float128" },
  { "unknown dtype in tensor", function() loom.tensor({ 1 }, { dtype = "int" }) end, "dtype" },
  { "unknown device", function() loom.zeros({ 2 }, { device = "tpu" }) end, "device", "tpu" },
  { "malformed cuda device", function() loom.zeros({ 2 }, { device = "cuda:x" }) end, "device", "cuda:x" },
  { "gelu approximate", function() m23():gelu({ approximate = "fast" }) end, "gelu", "approximate" },
  -- wrong types
  { "tensor of a string", function() loom.tensor("abc") end, "tensor", "data" },
  { "tensor with a string inside", function() loom.tensor({ 1, "x" }) end, "tensor", "data" },
  { "ragged table", function() loom.tensor({ { 1, 2 }, { 3 } }) end, "tensor", "rectangular" },
  { "nil operand of add", function() return loom.add(m23(), nil) end, "add", "argument #2" },
  { "string operand of mul", function() return m23() * "x" end, "mul", "tensor" },
  { "table operand of matmul", function() return m23():matmul({ 1, 2, 3 }) end, "matmul", "tensor" },
  { "boolean in a size table", function() loom.zeros({ 2, true }) end, "zeros", "size" },
  { "nil narrow start", function() m23():narrow(1, nil, 1) end, "narrow", "start" },
  { "string size", function() loom.ones("3") end, "ones", "size" },
  { "fractional size", function() loom.zeros(2.5) end, "zeros", "size" },
  { "full with a string value", function() loom.full({ 2 }, "x") end, "full", "value" },
  { "arange with a string", function() loom.arange("10") end, "arange", "number" },
  { "arange with a zero step", function() loom.arange(0, 10, 0) end, "arange", "step" },
  { "arange with the wrong sign", function() loom.arange(0, 10, -1) end, "arange", "step" },
  { "manual_seed with a string", function() loom.manual_seed("x") end, "manual_seed", "seed" },
  { "clamp with a string bound", function() m23():clamp("a") end, "clamp", "min" },
  { "masked_fill with a table value", function() m23():masked_fill(loom.tensor({ true, false, true }), {}) end, "masked_fill", "value" },
  { "where with a float condition", function() loom.where(m23(), 1, 2) end, "where", "bool" },
  { "view with a string", function() m23():view("a", 3) end, "view", "integer" },
  { "to with a number", function() m23():to(3) end, "to", "dtype" },
  { "backward with a table gradient", function() local x = loom.ones(1, { requires_grad = true }); (x * 2):backward({ 1 }) end, "backward", "tensor" },
  { "setting an unknown field", function() local x = m23() x.foo = 1 end, "cannot set", "foo" },
  -- sizes
  { "negative size", function() loom.zeros(2, -1) end, "zeros", "size" },
  { "negative size in a table", function() loom.empty({ -3 }) end, "empty", "size" },
  { "huge size", function() loom.zeros(2 ^ 30, 2 ^ 30) end, "elements" },
  { "too many dims", function() loom.zeros(1, 1, 1, 1, 1, 1, 1, 1, 1) end, "8 dims" },
  { "randint with low >= high", function() loom.randint(5, 5, { 3 }) end, "randint", "low" },
  { "randint with a fractional bound", function() loom.randint(0.5, 5, { 3 }) end, "randint", "low" },
  { "negative view size", function() m23():view(-2, -3) end, "view", "size" },
  -- dtypes
  { "sqrt of an integer tensor", function() loom.tensor({ 4 }, { dtype = "i64" }):sqrt() end, "sqrt", "floating point" },
  { "exp of an integer tensor", function() loom.tensor({ 1 }, { dtype = "i32" }):exp() end, "exp", "floating point" },
  { "mean of an integer tensor", function() loom.tensor({ 1, 2 }, { dtype = "i32" }):mean() end, "mean", "floating point" },
  { "matmul of integer tensors", function() loom.zeros({ 2, 2 }, { dtype = "i32" }):matmul(loom.zeros({ 2, 2 }, { dtype = "i32" })) end, "matmul", "floating point" },
  { "softmax of an integer tensor", function() loom.zeros({ 2, 2 }, { dtype = "i64" }):softmax(1) end, "softmax", "floating point" },
  { "requires_grad on an integer tensor", function() loom.zeros({ 2 }, { dtype = "i64", requires_grad = true }) end, "requires_grad", "floating point" },
  { "requires_grad on a non-leaf", function() local x = loom.ones(2, { requires_grad = true }) local y = x * 2 y.requires_grad = false end, "requires_grad", "leaves" },
  -- autograd
  { "backward without grad", function() loom.ones(2):sum():backward() end, "backward", "does not require grad" },
  { "backward of a non-scalar", function() local x = loom.ones(2, { requires_grad = true }); (x * 2):backward() end, "backward", "scalar" },
  { "retain_grad without grad", function() loom.ones(2):retain_grad() end, "retain_grad", "require grad" },
  -- nn
  { "embedding id too large", function() loom.F.embedding(loom.tensor({ 1, 6 }, { dtype = "i64" }), loom.zeros(5, 3)) end, "embedding", "6" },
  { "embedding id 0", function() loom.F.embedding(loom.tensor({ 0 }, { dtype = "i64" }), loom.zeros(5, 3)) end, "embedding" },
  { "embedding with float ids", function() loom.F.embedding(loom.tensor({ 1 }), loom.zeros(5, 3)) end, "embedding", "integer" },
  { "cross_entropy class out of range", function() loom.F.cross_entropy(loom.zeros(2, 3), loom.tensor({ 1, 4 }, { dtype = "i64" })) end, "cross_entropy" },
  { "cross_entropy unknown reduction", function() loom.F.cross_entropy(loom.zeros(2, 3), loom.tensor({ 1, 2 }, { dtype = "i64" }), { reduction = "avg" }) end, "cross_entropy", "reduction" },
  { "layer_norm weight shape", function() loom.F.layer_norm(loom.zeros(2, 3), { 3 }, loom.ones(4)) end, "layer_norm" },
}

describe("misuse raises a clear Lua error", function()
  for _, c in ipairs(cases) do
    it(c[1], function() fails(c[2], unpack(c, 3)) end)
  end

  it("covers at least 40 distinct misuses", function()
    assert.is_true(#cases >= 40)
  end)

  it("the process goes on: tensors still work after every error", function()
    for _, c in ipairs(cases) do pcall(c[2]) end
    X.still_works()
  end)

  it("error messages come from the failing call, not a stale one", function()
    local _, e1 = pcall(function() return m23():sum(5) end)
    local _, e2 = pcall(function() return m23():matmul(loom.zeros(4, 2)) end)
    assert.truthy(e1:find("sum"))
    assert.truthy(e2:find("matmul"))
    assert.falsy(e2:find("sum"))
  end)
end)
