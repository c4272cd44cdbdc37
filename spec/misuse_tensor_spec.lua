-- misuse_tensor_spec.lua: bad calls of the tensor API (creation, sizes,
-- strides, views, dtype conversion, in-place changes, autograd, freed
-- tensors, files), each a Lua error naming the argument and what was
-- expected. Calls that could crash the process run in a child luajit
-- (support.misuse). More misuse: misuse_ops_spec (ops, loom.F),
-- misuse_nn_optim_spec, dist/misuse_dist_spec.
local loom = require("loom")
local X = require("support.misuse")
local sys = require("support.sys")

local m23 = function() return loom.zeros(2, 3) end
local i32 = function(t) return loom.tensor(t, { dtype = "i32" }) end
local i64 = function(t) return loom.tensor(t, { dtype = "i64" }) end
local leaf = function() return loom.ones(2, { requires_grad = true }) end

local creation = {
  title = "creation",
  { "zeros with a negative size", function() loom.zeros(2, -1) end, "zeros", "size", "non-negative" },
  { "zeros with a NaN size", function() loom.zeros(0 / 0) end, "zeros", "size", "nan" },
  { "zeros with an infinite size", function() loom.zeros(math.huge) end, "zeros", "size", "inf" },
  { "zeros with a fractional size", function() loom.zeros(2.5) end, "zeros", "size", "2.5" },
  { "ones with a string size", function() loom.ones("3") end, "ones", "size", "integers" },
  { "zeros with a boolean in the size table", function() loom.zeros({ 2, true }) end, "zeros", "size", "dim 2" },
  { "zeros with 9 dims", function() loom.zeros(1, 1, 1, 1, 1, 1, 1, 1, 1) end, "zeros", "at most 8 dims" },
  { "zeros with a misspelt option", function() loom.zeros(2, { dtyp = "i64" }) end, "zeros", "options", "dtyp" },
  { "zeros with a string after the sizes", function() loom.zeros(2, "f32") end, "zeros", "size", "dim 2" },
  { "zeros with an unknown dtype", function() loom.zeros({ 2 }, { dtype = "f8" }) end, "dtype", "f8" },
  { "zeros with an unknown device", function() loom.zeros({ 2 }, { device = "tpu" }) end, "device", "tpu" },
  { "zeros with a malformed cuda device", function() loom.zeros({ 2 }, { device = "cuda:x" }) end, "device", "cuda:x" },
  { "zeros with a size table with a named key", function() loom.zeros({ 2, x = 3 }) end, "zeros", "size", "list" },
  { "ones past the element limit", function() loom.ones(2 ^ 30, 2 ^ 30) end, "elements" },
  -- (sizes whose strides would overflow int64, emptied by a zero size)
  { "empty with huge sizes besides a zero", function() loom.empty(2 ^ 62, 2 ^ 61, 0) end, "empty", "but for its zero sizes" },
  { "empty with a negative size in a table", function() loom.empty({ -3 }) end, "empty", "size" },
  { "empty with a numeric device", function() loom.empty(2, { device = 0 }) end, "empty", "device" },
  { "full with a string value", function() loom.full({ 2 }, "x") end, "full", "value", "number" },
  { "full with a value past i32", function() loom.full({ 2 }, 2 ^ 40, { dtype = "i32" }) end, "full", "value", "fits i32" },
  { "full with NaN into i64", function() loom.full({ 2 }, 0 / 0, { dtype = "i64" }) end, "full", "value", "fits i64" },
  { "full with inf into i32", function() loom.full({ 2 }, math.huge, { dtype = "i32" }) end, "full", "value", "fits i32" },
  { "full with 2^63 into i64", function() loom.full({ 1 }, 2 ^ 63, { dtype = "i64" }) end, "full", "value", "fits i64" },
  { "full with a string size", function() loom.full("2", 1) end, "full", "size", "table" },
  { "full with a misspelt option", function() loom.full({ 2 }, 1, { device_ = "cpu" }) end, "full", "options", "device_" },
  { "arange with a string", function() loom.arange("10") end, "arange", "end", "number" },
  { "arange with a zero step", function() loom.arange(0, 10, 0) end, "arange", "step" },
  { "arange with the step's sign wrong", function() loom.arange(0, 10, -1) end, "arange", "step" },
  { "arange to NaN", function() loom.arange(0, 0 / 0) end, "arange", "end", "finite" },
  { "arange from -inf", function() loom.arange(-math.huge, 3) end, "arange", "start", "finite" },
  { "arange of 2^60 elements", function() loom.arange(0, 2 ^ 60) end, "arange", "end", "2^53" },
  { "arange past i32", function() loom.arange(0, 3e9, 1, { dtype = "i32" }) end, "arange", "end", "fits i32" },
  { "arange with a misspelt option", function() loom.arange(3, { dtpye = "f64" }) end, "arange", "options", "dtpye" },
  { "rand with an integer dtype", function() loom.rand(3, { dtype = "i64" }) end, "rand", "dtype", "floating-point" },
  { "randn with an integer dtype", function() loom.randn({ 3 }, { dtype = "i32" }) end, "randn", "dtype", "floating-point" },
  { "rand with a bool dtype", function() loom.rand(3, { dtype = "bool" }) end, "rand", "dtype", "floating-point" },
  { "rand with a negative size", function() loom.rand(-1) end, "rand", "size" },
  { "randint with low >= high", function() loom.randint(5, 5, { 3 }) end, "randint", "low", "less than high" },
  { "randint with a fractional bound", function() loom.randint(0.5, 5, { 3 }) end, "randint", "low", "integer" },
  { "randint with high past i32", function() loom.randint(0, 2 ^ 40, { 3 }, { dtype = "i32" }) end, "randint", "high", "fits i32" },
  { "randint with an infinite high", function() loom.randint(0, math.huge, { 3 }) end, "randint", "high", "integer" },
  { "randint with a negative size", function() loom.randint(0, 5, { -3 }) end, "randint", "size" },
  { "randint with a misspelt option", function() loom.randint(0, 5, { 3 }, { dtype = "i32", grad = true }) end, "randint", "options", "grad" },
  { "manual_seed with a string", function() loom.manual_seed("x") end, "manual_seed", "seed" },
  { "manual_seed with a fraction", function() loom.manual_seed(1.5) end, "manual_seed", "seed", "integer" },
  { "manual_seed past 2^64", function() loom.manual_seed(2 ^ 70) end, "manual_seed", "seed", "2^64" },
  { "manual_seed with NaN", function() loom.manual_seed(0 / 0) end, "manual_seed", "seed" },
  { "set_rng_state with a number", function() loom.set_rng_state(3) end, "set_rng_state", "state", "table" },
  { "set_rng_state with a negative seed", function() loom.set_rng_state({ seed = -1, offset = 0 }) end, "set_rng_state", "seed", "non-negative" },
  { "set_rng_state without an offset", function() loom.set_rng_state({ seed = 1 }) end, "set_rng_state", "offset" },
  { "tensor of a string", function() loom.tensor("abc") end, "tensor", "data" },
  { "tensor with a string inside", function() loom.tensor({ 1, "x" }) end, "tensor", "data" },
  { "tensor of a ragged table", function() loom.tensor({ { 1, 2 }, { 3 } }) end, "tensor", "rectangular" },
  { "tensor of a table with named keys", function() loom.tensor({ a = 1 }) end, "tensor", "data", "nested array" },
  { "tensor with a value past i32", function() loom.tensor({ 1, 2 ^ 31 }, { dtype = "i32" }) end, "tensor", "data[2]", "fits i32" },
  { "tensor with NaN into i64", function() loom.tensor({ 0 / 0 }, { dtype = "i64" }) end, "tensor", "data[1]", "fits i64" },
  { "tensor with -inf into i32", function() loom.tensor({ { 1 }, { -math.huge } }, { dtype = "i32" }) end, "tensor", "data[2]", "fits i32" },
  { "tensor with an unknown dtype", function() loom.tensor({ 1 }, { dtype = "int" }) end, "tensor", "dtype", "int" },
  { "tensor with string options", function() loom.tensor({ 1 }, "f64") end, "tensor", "options", "table" },
  { "tensor with a misspelt option", function() loom.tensor({ 1 }, { requires_grad = true, dtypes = "f64" }) end, "tensor", "options", "dtypes" },
}

local layout = {
  title = "sizes, strides and views",
  { "size(0)", function() m23():size(0) end, "size", "dim", "[1, 2]" },
  { "size with a fractional dim", function() m23():size(1.5) end, "size", "dim", "1.5" },
  { "size past the last dim", function() m23():size(3) end, "size", "dim", "got 3" },
  { "size before the first dim", function() m23():size(-3) end, "size", "dim", "got -3" },
  { "size with a string dim", function() m23():size("1") end, "size", "dim", '"1"' },
  { "size of a 0-dim tensor", function() loom.tensor(1):size(1) end, "size", "dim", "0-dim" },
  { "stride(0)", function() m23():stride(0) end, "stride", "dim", "[1, 2]" },
  { "stride past the last dim", function() m23():stride(3) end, "stride", "dim", "got 3" },
  { "stride with a fractional dim", function() m23():stride(1.5) end, "stride", "dim", "1.5" },
  { "stride with an infinite dim", function() m23():stride(math.huge) end, "stride", "dim", "inf" },
  { "stride of a 0-dim tensor", function() loom.tensor(1):stride(1) end, "stride", "dim", "0-dim" },
  { "view with a string", function() m23():view("a", 3) end, "view", "size #1", "integer" },
  { "view with two -1", function() m23():view(-1, -1) end, "view", "-1" },
  { "view of the wrong element count", function() m23():view(4, 2) end, "view", "elements" },
  { "view of a non-contiguous tensor", function() m23():t():view(6) end, "view", "contiguous" },
  { "view with -2", function() m23():view(-2, -3) end, "view", "size #1", ">= 0" },
  { "view with 9 sizes", function() loom.zeros(2):view(1, 1, 1, 1, 1, 1, 1, 1, 2) end, "view", "at most 8 sizes" },
  { "view with a fractional size", function() m23():view(1.5, 4) end, "view", "size #1", "integer" },
  { "view with an infinite size", function() m23():view(math.huge) end, "view", "size #1", "integer" },
  { "view with a named key", function() m23():view({ 6, x = 1 }) end, "view", "sizes", "list" },
  { "view whose element count overflows int64", function() loom.zeros(0):view(2 ^ 61, 8, 0) end, "view", "size", "2^62" },
  { "reshape that cannot infer -1", function() m23():reshape(4, -1) end, "reshape", "infer" },
  { "expand of a non-1 dim", function() m23():expand(4, 3) end, "expand", "size" },
  { "expand with -2", function() m23():expand(-2, 3) end, "expand", "size #1" },
  { "expand past 2^62 elements", function() loom.ones(1):expand(2 ^ 40, 2 ^ 30) end, "expand", "size", "2^62" },
  { "expand_as a number", function() m23():expand_as(3) end, "expand_as", "other", "tensor" },
  { "view_as a table", function() m23():view_as({ 3, 2 }) end, "view_as", "other", "tensor" },
  { "transpose dim 0", function() m23():transpose(0, 1) end, "transpose", "dim1" },
  { "transpose past the last dim", function() m23():transpose(1, 5) end, "transpose", "dim" },
  { "transpose with a fractional dim", function() m23():transpose(1, 1.5) end, "transpose", "dim2", "1.5" },
  { "permute with a repeated dim", function() loom.zeros(2, 3, 4):permute(1, 1, 2) end, "permute", "twice" },
  { "permute with too few dims", function() loom.zeros(2, 3, 4):permute(2, 1) end, "permute", "dims" },
  { "permute with a fractional dim", function() m23():permute(1, 2.5) end, "permute", "dim #2", "integer" },
  { "narrow from 0", function() m23():narrow(2, 0, 1) end, "narrow", "start", ">= 1" },
  { "narrow with a negative length", function() m23():narrow(2, 1, -1) end, "narrow", "length", ">= 0" },
  { "narrow past the end", function() m23():narrow(2, 3, 2) end, "narrow", "fit" },
  { "narrow without a start", function() m23():narrow(1, nil, 1) end, "narrow", "start", "integer" },
  { "narrow dim 0", function() m23():narrow(0, 1, 1) end, "narrow", "dim" },
  { "select index 0", function() m23():select(1, 0) end, "select", "index", "[1, 2]" },
  { "select past the end", function() m23():select(2, 4) end, "select", "index", "[1, 3]" },
  { "select with a fractional index", function() m23():select(1, 1.5) end, "select", "index", "1.5" },
  { "select dim out of range", function() m23():select(3, 1) end, "size", "dim" },
  { "unsqueeze past the end", function() m23():unsqueeze(4) end, "unsqueeze", "dim", "[1, 3]" },
  { "unsqueeze(0)", function() m23():unsqueeze(0) end, "unsqueeze", "dim" },
  { "squeeze past the end", function() m23():squeeze(3) end, "squeeze", "dim" },
  { "t of a 3-D tensor", function() loom.zeros(2, 3, 4):t() end, "t", "2 dims" },
  { "to a number", function() m23():to(3) end, "to", "argument #1", "dtype" },
  { "to an unknown dtype", function() m23():to("float128") end, "float128" },
  { "to with a misspelt option", function() m23():to({ dtyp = "f64" }) end, "to", "options", "dtyp" },
  { "to with an unknown device in a table", function() m23():to({ device = "gpu" }) end, "device", "gpu" },
  { "item of many elements", function() m23():item() end, "item", "one element" },
}

local values = {
  title = "values, in-place changes, autograd",
  { "fill_ with a string", function() m23():fill_("x") end, "fill_", "value", "number" },
  { "fill_ past i32", function() i32({ 1 }):fill_(2 ^ 31) end, "fill_", "value", "fits i32" },
  { "fill_ with NaN into i64", function() i64({ 1 }):fill_(0 / 0) end, "fill_", "value", "fits i64" },
  { "fill_ of a leaf that requires grad", function() leaf():fill_(1) end, "fill_", "requires grad", "no_grad" },
  { "zero_ of a leaf that requires grad", function() leaf():zero_() end, "fill_", "requires grad" },
  { "copy_ from another shape", function() m23():copy_(loom.zeros(3, 2)) end, "copy", "shapes" },
  { "copy_ from a table", function() m23():copy_({ 1, 2 }) end, "copy_", "src", "tensor" },
  { "copy_ into a leaf that requires grad", function() leaf():copy_(loom.zeros(2)) end, "copy_", "requires grad" },
  { "setting an unknown field", function() local x = m23() x.foo = 1 end, "cannot set", "foo" },
  { "setting grad to a table", function() local x = leaf() x.grad = { 1, 2 } end, "grad", "value", "tensor" },
  { "setting grad of another shape", function() local x = leaf() x.grad = loom.zeros(3) end, "grad", "shape" },
  { "requires_grad on an integer tensor", function() loom.zeros({ 2 }, { dtype = "i64", requires_grad = true }) end, "requires_grad", "floating point" },
  { "requires_grad = false on a non-leaf", function() local y = leaf() * 2 y.requires_grad = false end, "requires_grad", "leaves" },
  { "backward of what needs no grad", function() loom.ones(2):sum():backward() end, "backward", "does not require grad" },
  { "backward of a non-scalar", function() (leaf() * 2):backward() end, "backward", "scalar" },
  { "backward with a gradient of another shape", function() (leaf() * 2):backward(loom.ones(3)) end, "backward", "shape" },
  { "backward with a table gradient", function() (leaf() * 2):backward({ 1 }) end, "backward", "gradient", "tensor" },
  { "retain_grad without grad", function() loom.ones(2):retain_grad() end, "retain_grad", "require grad" },
  { "a freed tensor in an operator", function() local x = loom.ones(2) x:free() return x + 1 end, "freed" },
  { "a method of a freed tensor", function() local x = loom.ones(2) x:free() return x:sum() end, "freed" },
  { "loom.op with a freed input", function() local x = loom.ones(2) x:free() return loom.op("neg", { x }) end, "neg", "argument #1", "freed" },
  { "set_num_threads(0)", function() loom.set_num_threads(0) end, "set_num_threads", "n", "[1, 4096]" },
  { "set_num_threads with a fraction", function() loom.set_num_threads(1.5) end, "set_num_threads", "n", "1.5" },
  { "set_num_threads with a string", function() loom.set_num_threads("4") end, "set_num_threads", "n", '"4"' },
  { "device_available of a bad name", function() loom.device_available(7) end, "device_available", "device" },
}

local files = {
  title = "files",
  { "save to a number", function() loom.save({}, 3) end, "save", "path", "file name" },
  { "save of a function", function() loom.save(print, os.tmpname()) end, "save", "cannot save a function" },
  { "save of a table key", function() loom.save({ [{}] = 1 }, os.tmpname()) end, "save", "keys must be strings or numbers" },
  { "save over a directory", function() loom.save({}, "/tmp") end, "save", "directory" },
  { "load of a number", function() loom.load(3) end, "load", "path", "file name" },
  { "load of a missing file", function() loom.load("/nonexistent/x.loom") end, "load", "cannot open" },
  { "load of a file that is not loom's", function()
      local p = os.tmpname()
      sys.write(p, "hello, world: not a loom file")
      local ok, err = pcall(loom.load, p)
      os.remove(p)
      if not ok then error(err, 0) end
    end, "load", "not a loom file" },
}

-- calls that could crash the process, each in a child luajit
local crashers = {
  title = "crash-type calls in a child process",
  { "writing a tensor's ndim through the FFI", child = "local x = loom.ones(4) x.ndim = 5", "constant" },
  { "writing a tensor's shape through the FFI", child = "local x = loom.ones(4) x.shape_[0] = 100", "constant" },
  { "writing a tensor's numel through the FFI", child = "local x = loom.ones(4) x.numel_ = 100", "constant" },
  { "the data pointer of a freed tensor", child = "local x = loom.ones(4) x:free() local p = x:data_ptr()", "freed" },
  { "a 4 TiB tensor", child = "loom.empty({ 2 ^ 40 })", "empty", "out of memory" },
  { "a tensor of 2^93 elements", child = "loom.empty({ 2 ^ 31, 2 ^ 31, 2 ^ 31 })", "empty", "elements" },
  { "loom.op view to 2^62 x 2^62", child = "loom.op('view', { loom.ones(4) }, { 2 ^ 62, 2 ^ 62 })", "view" },
  { "loom.op narrow at 2^62", child = "loom.op('narrow', { loom.ones(4) }, { 0, 2 ^ 62, 2 ^ 62 })", "narrow", "fit" },
  { "loom.op to dtype 99", child = "loom.op('to', { loom.ones(4) }, { 99 })", "to", "dtype 99" },
  { "loom.op to dtype -1", child = "loom.op('to', { loom.ones(4) }, { -1 })", "to", "dtype -1" },
  { "loom.op embedding with id 0", child = "loom.op('embedding', { loom.ones(4, 2), loom.tensor({ -1 }, { dtype = 'i64' }) })", "embedding", "outside [1, 4]" },
  { "loom.op cross_entropy with class 6 of 3", child = "loom.op('cross_entropy', { loom.ones(2, 3), loom.tensor({ 5, -7 }, { dtype = 'i64' }) }, { -101, 1 }, { 0 })", "cross_entropy", "outside [1, 3]" },
  { "loom.op layer_norm over 5 dims of 2", child = "loom.op('layer_norm', { loom.ones(2, 3) }, { 5, 0, 0 }, { 1e-5 })", "layer_norm", "dims" },
  { "loom.op _adamw_ with a short gradient", child = "local p = loom.ones(4) loom.op('_adamw_', { p, loom.ones(2), loom.zeros(4), loom.zeros(4) }, nil, { 0.1, 0.9, 0.99, 1e-8, 0, 0.1, 0.01 })", "_adamw_", "grad" },
  { "loom.op _adamw_ with a short moment", child = "local p = loom.ones(4) loom.op('_adamw_', { p, loom.ones(4), loom.zeros(1), loom.zeros(4) }, nil, { 0.1, 0.9, 0.99, 1e-8, 0, 0.1, 0.01 })", "_adamw_", "exp_avg" },
  { "loom.op _adamw_ with one hyperparameter", child = "local p = loom.ones(4) loom.op('_adamw_', { p, loom.ones(4), loom.zeros(4), loom.zeros(4) }, nil, { 0.1 })", "_adamw_", "7 hyperparameters" },
  { "loom.op _adamw_ on an expanded parameter", child = "local p = loom.ones(4):expand(2, 4) loom.op('_adamw_', { p, loom.ones(2, 4), loom.zeros(2, 4), loom.zeros(2, 4) }, nil, { 0.1, 0.9, 0.99, 1e-8, 0, 0.1, 0.01 })", "_adamw_", "contiguous" },
  { "loom.op with no such id", child = "loom.op(9999, { loom.ones(2) })", "no such op" },
  { "loom.op with a negative id", child = "loom.op(-1, { loom.ones(2) })", "no such op" },
  { "loom.op with no such name", child = "loom.op('frobnicate', { loom.ones(2) })", "no op named", "frobnicate" },
  { "loom.op add of one tensor", child = "loom.op('add', { loom.ones(2) })", "add", "got 1" },
  { "loom.op add of three tensors", child = "loom.op('add', { loom.ones(2), loom.ones(2), loom.ones(2) })", "add", "got 3" },
  { "loom.op of 300 tensors", child = "local t = {} for i = 1, 300 do t[i] = loom.ones(1) end loom.op('cat', t, { 0 })", "at most 256" },
  { "loom.op with 30 integer attrs", child = "local a = {} for i = 1, 30 do a[i] = 1 end loom.op('reshape', { loom.zeros(2) }, a)", "at most 24 integer" },
  { "loom.op with a string input", child = "loom.op('neg', { 'x' })", "neg", "argument #1", "tensor" },
}

describe("tensor misuse", function()
  X.groups(describe, it, { creation, layout, values, files, crashers }, 150)

  it("the process goes on: tensors still work after every error", function()
    for _, list in ipairs { creation, layout, values, files } do
      for _, c in ipairs(list) do pcall(c[2]) end
    end
    X.still_works()
  end)
end)

describe("conversion to integer dtypes", function()
  it("casts of tensors are defined: NaN to 0, past int64 saturated, i32 the low 32 bits (as numpy)", function()
    local big = loom.tensor({ 2 ^ 32 + 5, 3e9, -2 ^ 40, 0 / 0, 3.9, -3.9, math.huge, -math.huge }, { dtype = "f64" })
    assert.same({ 5, 3e9 - 2 ^ 32, 0, 0, 3, -3, 2147483647, -2147483648 }, big:to("i32"):totable())
    local i = big:to("i64"):totable()
    assert.same({ 2 ^ 32 + 5, 3e9, -2 ^ 40, 0, 3, -3 }, { i[1], i[2], i[3], i[4], i[5], i[6] })
    assert.equal(2 ^ 63, i[7])   -- INT64_MAX reads back as the nearest double
    assert.equal(-2 ^ 63, i[8])
  end)

  it("i32 arithmetic wraps, as int32 does in PyTorch", function()
    local a = loom.tensor({ 2147483647, -2147483648 }, { dtype = "i32" })
    assert.same({ -2147483648, 2147483647 }, (a + loom.tensor({ 1, -1 }, { dtype = "i32" })):totable())
    assert.same({ -2, 0 }, (a * 2):totable())
    assert.same({ -2147483647, -2147483648 }, (-a):totable())
  end)

  it("values at the ends of i32 and i64 are accepted", function()
    assert.same({ 2147483647, -2147483648 }, loom.tensor({ 2147483647, -2147483648 }, { dtype = "i32" }):totable())
    assert.equal(-2 ^ 63, loom.full({ 1 }, -2 ^ 63, { dtype = "i64" }):item())
    assert.equal(2147483647, loom.full({ 1 }, 2147483647.5, { dtype = "i32" }):item())   -- truncation fits
    assert.same({ 2147483646 }, loom.arange(2147483646, 2147483647, 1, { dtype = "i32" }):totable())
  end)
end)
