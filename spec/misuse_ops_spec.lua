-- misuse_ops_spec.lua: bad calls of the tensor ops (pointwise, numbers
-- mixed with integer tensors, reductions, joins and splits, matmul) and of
-- loom.F, each a Lua error naming the argument and what was expected; and
-- the integer edge cases the sanitizer job checks (scripts/sanitize.sh).
local loom = require("loom")
local X = require("support.misuse")
local F = loom.F

local m23 = function() return loom.zeros(2, 3) end
local i32 = function(t) return loom.tensor(t, { dtype = "i32" }) end
local i64 = function(t) return loom.tensor(t, { dtype = "i64" }) end
local ids = function(t) return loom.tensor(t, { dtype = "i64" }) end
local qkv = function() return loom.ones(1, 1, 2, 4) end

local pointwise = {
  title = "pointwise ops and numbers",
  { "add of mismatched shapes", function() return m23() + loom.zeros(4) end, "add", "broadcast" },
  { "mul of mismatched leading dims", function() return loom.zeros(2, 3) * loom.zeros(3, 3) end, "mul", "broadcast" },
  { "add with nil", function() return loom.add(m23(), nil) end, "add", "argument #2", "tensor" },
  { "mul with a string", function() return m23() * "x" end, "mul", "tensor" },
  { "sub with a table on the left", function() return loom.sub({ 1 }, m23()) end, "sub", "argument #1", "tensor" },
  { "pow with a string exponent", function() return m23():pow("x") end, "pow", "argument #2" },
  { "maximum with a string", function() return m23():max("x") end, "maximum", "argument #2" },
  { "i32 plus a number past i32", function() return i32({ 1 }) + 2 ^ 31 end, "add", "argument #2", "fits i32" },
  { "a number past i32 minus i32", function() return 2 ^ 40 - i32({ 1 }) end, "sub", "argument #1", "fits i32" },
  { "i64 plus 2^63", function() return i64({ 1 }) + 2 ^ 63 end, "add", "argument #2", "fits i64" },
  { "i64 times inf", function() return i64({ 1 }) * math.huge end, "mul", "argument #2", "fits i64" },
  { "i32 compared with 2^33", function() return i32({ 1 }):eq(2 ^ 33) end, "eq", "argument #2", "fits i32" },
  { "bool plus 2^63", function() return loom.tensor({ true }):add(2 ^ 63) end, "add", "argument #2", "fits i64" },
  { "where with a number past i32", function() return loom.where(loom.tensor({ true }), i32({ 1 }), 2 ^ 40) end, "where", "argument #3", "fits i32" },
  { "where with a float condition", function() return loom.where(m23(), 1, 2) end, "where", "bool" },
  { "where of mismatched shapes", function() return loom.where(loom.tensor({ true, false, true }), loom.zeros(2), 1) end, "where", "broadcast" },
  { "masked_fill with a table value", function() return m23():masked_fill(loom.tensor({ true, false, true }), {}) end, "masked_fill", "value", "number" },
  { "masked_fill past i32", function() return i32({ 1 }):masked_fill(loom.tensor({ true }), 2 ^ 40) end, "masked_fill", "value", "fits i32" },
  { "masked_fill with a number mask", function() return m23():masked_fill(1, 0) end, "masked_fill", "mask", "tensor" },
  { "clamp with a string bound", function() return m23():clamp("a") end, "clamp", "min", "number" },
  { "clamp with a NaN bound", function() return m23():clamp(0 / 0) end, "clamp", "min", "nan" },
  { "clamp with no bounds", function() return m23():clamp() end, "clamp", "at least one of min and max" },
  { "clamp of i32 past i32", function() return i32({ 1 }):clamp(0, 2 ^ 40) end, "clamp", "max", "fits i32" },
  { "sqrt of an integer tensor", function() return i64({ 4 }):sqrt() end, "sqrt", "floating point" },
  { "exp of a bool tensor", function() return loom.tensor({ true }):exp() end, "exp", "floating point" },
  { "triu with a fractional diagonal", function() return m23():triu(0.5) end, "triu", "diagonal", "integer" },
  { "tril with a string diagonal", function() return m23():tril("1") end, "tril", "diagonal" },
  { "triu of a 1-D tensor", function() return loom.zeros(3):triu() end, "triu", "2 dims" },
  { "gelu with an unknown approximation", function() return m23():gelu({ approximate = "fast" }) end, "gelu", "approximate", "tanh" },
  { "gelu with an unknown string", function() return m23():gelu("fast") end, "gelu", "approximate", '"fast"' },
  { "gelu with a number", function() return m23():gelu(3) end, "gelu", "approximate", "got 3" },
  { "gelu with a misspelt option", function() return m23():gelu({ approx = "tanh" }) end, "gelu", "options", "approx" },
}

local reductions = {
  title = "reductions",
  { "sum over dim 0", function() return m23():sum(0) end, "sum", "dim" },
  { "sum past the last dim", function() return m23():sum(3) end, "sum", "dim" },
  { "sum over a fractional dim", function() return m23():sum(1.5) end, "sum", "dim", "1.5" },
  { "sum with a number keepdim", function() return m23():sum(1, 1) end, "sum", "keepdim", "boolean" },
  { "mean with keepdim but no dim", function() return m23():mean(nil, true) end, "mean", "dim", "keepdim" },
  { "mean of an integer tensor", function() return i32({ 1, 2 }):mean() end, "mean", "floating point" },
  { "max before the first dim", function() return m23():max(-3) end, "max", "dim" },
  { "max with a string keepdim", function() return m23():max(1, "yes") end, "max", "keepdim", "boolean" },
  { "argmax past the last dim", function() return m23():argmax(-4) end, "argmax", "dim" },
  { "argmin over dim 0", function() return m23():argmin(0) end, "argmin", "dim" },
  { "softmax without a dim", function() return m23():softmax() end, "softmax", "dim", "nil" },
  { "softmax past the last dim", function() return m23():softmax(3) end, "softmax", "dim" },
  { "softmax of an integer tensor", function() return loom.zeros({ 2, 2 }, { dtype = "i64" }):softmax(1) end, "softmax", "floating point" },
  { "log_softmax over a fractional dim", function() return m23():log_softmax(1.5) end, "log_softmax", "dim" },
}

local joins = {
  title = "joins, splits, matmul",
  { "cat of mismatched sizes", function() return loom.cat({ m23(), loom.zeros(2, 4) }, 1) end, "cat", "size" },
  { "cat of mismatched ranks", function() return loom.cat({ m23(), loom.zeros(3) }, 1) end, "cat", "dims" },
  { "cat of nothing", function() return loom.cat({}, 1) end, "cat", "at least one" },
  { "cat of a tensor", function() return loom.cat(m23(), 1) end, "cat", "tensors", "table" },
  { "cat with a number inside", function() return loom.cat({ loom.zeros(2), 3 }) end, "cat", "argument #2", "tensor" },
  { "cat past the last dim", function() return loom.cat({ m23(), m23() }, 3) end, "cat", "dim" },
  { "cat over a fractional dim", function() return loom.cat({ m23() }, 1.5) end, "cat", "dim", "1.5" },
  { "split into pieces of 0", function() return m23():split(0) end, "split", "split_size", "positive" },
  { "split over a missing dim", function() return m23():split(1, 3) end, "split", "dim", "got 3" },
  { "split with a fractional size", function() return m23():split(1.5) end, "split", "split_size", "1.5" },
  { "chunk into 0 pieces", function() return m23():chunk(0) end, "chunk", "chunks", "positive" },
  { "chunk over a missing dim", function() return m23():chunk(2, 5) end, "chunk", "dim", "got 5" },
  { "matmul of mismatched inner sizes", function() return m23():matmul(loom.zeros(4, 2)) end, "matmul", "3", "4" },
  { "matmul of mismatched batch dims", function() return loom.zeros(2, 2, 3):matmul(loom.zeros(3, 3, 2)) end, "matmul", "batch" },
  { "matmul of a 0-dim tensor", function() return loom.tensor(1):matmul(loom.zeros(2)) end, "matmul", "dim" },
  { "matmul of integer tensors", function() return loom.zeros({ 2, 2 }, { dtype = "i32" }):matmul(loom.zeros({ 2, 2 }, { dtype = "i32" })) end, "matmul", "floating point" },
  { "matmul with a table", function() return m23():matmul({ 1, 2, 3 }) end, "matmul", "tensor" },
}

local functional = {
  title = "loom.F",
  { "F.relu of a string", function() return F.relu("x") end, "relu", "input", "tensor" },
  { "F.silu of nil", function() return F.silu(nil) end, "silu", "input", "nil" },
  { "F.gelu of a table", function() return F.gelu({ 1 }) end, "gelu", "input", "tensor" },
  { "F.gelu with an unknown string", function() return F.gelu(m23(), "exact") end, "gelu", "approximate", '"exact"' },
  { "F.linear with a string weight", function() return F.linear(m23(), "w") end, "linear", "weight", "tensor" },
  { "F.linear with a weight of the wrong width", function() return F.linear(m23(), loom.ones(4, 2)) end, "matmul", "columns" },
  { "F.linear with a bias of the wrong size", function() return F.linear(m23(), loom.ones(4, 3), loom.ones(5)) end, "add", "broadcast" },
  { "F.softmax past the last dim", function() return F.softmax(m23(), 3) end, "softmax", "dim" },
  { "F.dropout with NaN", function() return F.dropout(m23(), 0 / 0) end, "dropout", "p", "[0, 1]" },
  { "F.dropout with p > 1", function() return F.dropout(m23(), 1.5) end, "dropout", "p", "1.5" },
  { "F.dropout with a string training flag", function() return F.dropout(m23(), 0.5, "yes") end, "dropout", "training", "boolean" },
  { "F.layer_norm over a shape the input lacks", function() return F.layer_norm(m23(), { 4 }) end, "layer_norm", "normalized_shape", "{3}" },
  { "F.layer_norm over more dims than the input", function() return F.layer_norm(m23(), { 1, 2, 3 }) end, "layer_norm", "normalized_shape", "at most the input's 2 dims" },
  { "F.layer_norm over a transposed shape", function() return F.layer_norm(m23(), { 3, 2 }) end, "layer_norm", "normalized_shape", "{2, 3}" },
  { "F.layer_norm over a string", function() return F.layer_norm(m23(), "3") end, "layer_norm", "normalized_shape", "sizes" },
  { "F.layer_norm over nothing", function() return F.layer_norm(m23(), {}) end, "layer_norm", "normalized_shape", "non-empty" },
  { "F.layer_norm with a negative eps", function() return F.layer_norm(m23(), { 3 }, nil, nil, -1) end, "layer_norm", "eps", ">= 0" },
  { "F.layer_norm with a weight of the wrong shape", function() return F.layer_norm(m23(), { 3 }, loom.ones(4)) end, "layer_norm", "weight" },
  { "F.layer_norm with a string bias", function() return F.layer_norm(m23(), { 3 }, loom.ones(3), "b") end, "layer_norm", "bias", "tensor" },
  { "F.rms_norm over a size the input lacks", function() return F.rms_norm(m23(), 4) end, "rms_norm", "normalized_shape", "{4}" },
  { "F.rms_norm over three dims of two", function() return F.rms_norm(m23(), { 2, 3, 4 }) end, "rms_norm", "normalized_shape", "at most" },
  { "F.rms_norm with a NaN eps", function() return F.rms_norm(m23(), 3, nil, 0 / 0) end, "rms_norm", "eps", "nan" },
  { "F.rms_norm with a weight of the wrong shape", function() return F.rms_norm(m23(), 3, loom.ones(4)) end, "rms_norm", "weight" },
  { "F.embedding with float ids", function() return F.embedding(loom.tensor({ 1 }), loom.zeros(5, 3)) end, "embedding", "input", "integer" },
  { "F.embedding with an id past the vocabulary", function() return F.embedding(ids({ 1, 6 }), loom.zeros(5, 3)) end, "embedding", "6", "[1, 5]" },
  { "F.embedding with id 0", function() return F.embedding(ids({ 0 }), loom.zeros(5, 3)) end, "embedding", "0", "[1, 5]" },
  { "F.embedding with a 1-D weight", function() return F.embedding(ids({ 1 }), loom.ones(3)) end, "embedding", "weight", "2 dims" },
  { "F.cross_entropy with a class past C", function() return F.cross_entropy(m23(), ids({ 1, 4 })) end, "cross_entropy", "target", "[1, 3]" },
  { "F.cross_entropy with class 0", function() return F.cross_entropy(m23(), ids({ 0, 1 })) end, "cross_entropy", "target", "class 0" },
  { "F.cross_entropy with an unknown reduction", function() return F.cross_entropy(m23(), ids({ 1, 2 }), { reduction = "avg" }) end, "cross_entropy", "reduction", '"avg"' },
  { "F.cross_entropy with a misspelt option", function() return F.cross_entropy(m23(), ids({ 1, 2 }), { reductio = "sum" }) end, "cross_entropy", "options", "reductio" },
  { "F.cross_entropy with a fractional ignore_index", function() return F.cross_entropy(m23(), ids({ 1, 2 }), { ignore_index = 0.5 }) end, "cross_entropy", "ignore_index", "integer" },
  { "F.cross_entropy with NaN label_smoothing", function() return F.cross_entropy(m23(), ids({ 1, 2 }), { label_smoothing = 0 / 0 }) end, "cross_entropy", "label_smoothing", "[0, 1]" },
  { "F.cross_entropy with label_smoothing 2", function() return F.cross_entropy(m23(), ids({ 1, 2 }), { label_smoothing = 2 }) end, "cross_entropy", "label_smoothing", "got 2" },
  { "F.cross_entropy with a weight per wrong class count", function() return F.cross_entropy(m23(), ids({ 1, 2 }), { weight = loom.ones(4) }) end, "cross_entropy", "weight", "one weight per class" },
  { "F.cross_entropy with more targets than rows", function() return F.cross_entropy(m23(), ids({ 1, 2, 3 })) end, "cross_entropy", "target" },
  { "F.cross_entropy with probabilities of another shape", function() return F.cross_entropy(m23(), loom.ones(2, 4)) end, "cross_entropy", "target", "shape" },
  { "F.cross_entropy with string options", function() return F.cross_entropy(m23(), ids({ 1, 2 }), "mean") end, "cross_entropy", "options", "table" },
  { "sdpa with a number is_causal", function() return F.scaled_dot_product_attention(qkv(), qkv(), qkv(), { is_causal = 1 }) end, "scaled_dot_product_attention", "is_causal", "boolean" },
  { "sdpa with a negative scale", function() return F.scaled_dot_product_attention(qkv(), qkv(), qkv(), { scale = -1 }) end, "scaled_dot_product_attention", "scale", "> 0" },
  { "sdpa with a misspelt option", function() return F.scaled_dot_product_attention(qkv(), qkv(), qkv(), { causal = true }) end, "scaled_dot_product_attention", "options", "causal" },
  { "sdpa with a key of another width", function() return F.scaled_dot_product_attention(qkv(), loom.ones(1, 1, 2, 5), qkv()) end, "scaled_dot_product_attention", "key", "4" },
  { "sdpa with a mask that does not broadcast", function() return F.scaled_dot_product_attention(qkv(), qkv(), qkv(), { attn_mask = loom.ones(3, 3) }) end, "scaled_dot_product_attention", "attn_mask" },
  { "sdpa with a string value", function() return F.scaled_dot_product_attention(qkv(), qkv(), "v") end, "scaled_dot_product_attention", "value", "tensor" },
  { "rope_tables of a negative length", function() return F.rope_tables(-1, 4) end, "rope_tables", "seq_len", ">= 0" },
  { "rope_tables of an odd head_dim", function() return F.rope_tables(4, 3) end, "rope_tables", "head_dim", "even" },
  { "rope_tables with theta 0", function() return F.rope_tables(4, 4, { theta = 0 }) end, "rope_tables", "theta", "> 0" },
  { "apply_rotary_emb with short tables", function() return F.apply_rotary_emb(loom.ones(1, 4, 1, 4), loom.ones(2, 2), loom.ones(2, 2)) end, "rope", "cos", "(4, 2)" },
  { "apply_rotary_emb with a string table", function() return F.apply_rotary_emb(loom.ones(1, 4, 1, 4), "c", loom.ones(2, 2)) end, "rope", "argument #2", "tensor" },
}

-- calls into the op table by name that could crash the process
local crashers = {
  title = "crash-type calls in a child process",
  { "loom.op transpose past the dims", child = "loom.op('transpose', { loom.ones(2, 2) }, { 0, 7 })", "transpose", "dim" },
  { "loom.op permute with one dim of two", child = "loom.op('permute', { loom.ones(2, 2) }, { 0 })", "permute", "got 1" },
  { "loom.op sum over dim 7", child = "loom.op('sum', { loom.ones(4) }, { 7, 0 })", "sum", "dim" },
  { "loom.op max over dim 3", child = "loom.op('max', { loom.ones(3) }, { 3, 0 })", "max", "dim" },
  { "loom.op cat over dim 9", child = "loom.op('cat', { loom.ones(4), loom.ones(4) }, { 9 })", "cat", "dim" },
  { "loom.op softmax over dim 5", child = "loom.op('softmax', { loom.ones(4) }, { 5 })", "softmax", "dim" },
  { "loom.op rope with short tables", child = "loom.op('rope', { loom.ones(1, 4, 1, 4), loom.ones(2, 2), loom.ones(2, 2) })", "rope", "cos" },
  { "loom.op sdpa with a short value", child = "loom.op('scaled_dot_product_attention', { loom.ones(1, 1, 4, 8), loom.ones(1, 1, 2, 8), loom.ones(1, 1, 4, 8) })", "scaled_dot_product_attention", "value" },
  { "loom.op layer_norm with a short weight", child = "loom.op('layer_norm', { loom.ones(2, 3), loom.ones(2) }, { 1, 1, 0 }, { 1e-5 })", "layer_norm", "weight" },
  { "loom.op where with a float condition", child = "loom.op('where', { loom.ones(3), loom.ones(3), loom.ones(3) })", "where", "condition" },
  { "loom.op triu of a 1-D tensor", child = "loom.op('triu', { loom.ones(3) }, { 2 ^ 62 })", "triu", "2 dims" },
  { "loom.op transpose with one dim", child = "loom.op('transpose', { loom.ones(2, 3) }, { 0 })", "transpose", "2 integer attrs" },
  { "loom.op narrow without start and length", child = "loom.op('narrow', { loom.ones(4) }, { 0 })", "narrow", "3 integer attrs" },
  { "loom.op unsqueeze without a dim", child = "loom.op('unsqueeze', { loom.ones(4) })", "unsqueeze", "1 integer attrs" },
  { "loom.op cat without a dim", child = "loom.op('cat', { loom.ones(4), loom.ones(4) })", "cat", "1 integer attrs" },
  { "loom.op view to sizes past 2^63", child = "loom.op('view', { loom.ones(0) }, { 2 ^ 40, 2 ^ 40, 0 })", "view", "2^63" },
  { "loom.op expand to 2^62 x 2^62 then sum", child = "loom.op('expand', { loom.ones(1) }, { 2 ^ 62, 2 ^ 62 }):sum()", "elements" },
}

-- collective ops given wrong handles or attrs, in a world of one (a child
-- of an mpirun rank would join its job: these live in this spec, not in
-- dist/misuse_dist_spec)
local comm = "local dist = require('loom.distributed') dist.init() "
    .. "local g = dist.init_device_mesh('cpu', { 1 }):get_group(1).comm "
local collectives = {
  title = "collective ops with wrong handles, in a child process",
  { "_dist_all_reduce with a tensor as its communicator", child = comm .. "loom.op('_dist_all_reduce', { loom.ones(2) }, { 0 }, nil, { loom.ones(1) })", "_dist_all_reduce", "handle 1 expected a communicator" },
  { "_dist_all_reduce with a buffer as its communicator", child = comm .. "loom.op('_dist_all_reduce', { loom.ones(2) }, { 0 }, nil, { ffi.new('char[64]') })", "_dist_all_reduce", "handle 1 expected a communicator" },
  { "_dist_all_reduce with a number as its communicator", child = comm .. "loom.op('_dist_all_reduce', { loom.ones(2) }, { 0 }, nil, { 12345 })", "_dist_all_reduce", "handle 1 expected a communicator", "12345" },
  { "_dist_all_reduce with a string as its communicator", child = comm .. "loom.op('_dist_all_reduce', { loom.ones(2) }, { 0 }, nil, { 'world' })", "_dist_all_reduce", "handle 1 expected a communicator", "world" },
  { "_dist_all_reduce without a communicator", child = comm .. "loom.op('_dist_all_reduce', { loom.ones(2) }, { 0 })", "_dist_all_reduce", "got none" },
  { "_dist_all_reduce with three handles", child = comm .. "loom.op('_dist_all_reduce', { loom.ones(2) }, { 0 }, nil, { g, g, g })", "_dist_all_reduce", "at most 2 handles" },
  { "_dist_all_reduce with a raw pointer as its communicator", child = comm .. "loom.op('_dist_all_reduce', { loom.ones(2) }, { 0 }, nil, { ffi.cast('void *', 12345) })", "_dist_all_reduce", "handle 1 expected a communicator" },
  { "_dist_all_reduce with 5000 handles", child = comm .. "local h = {} for k = 1, 5000 do h[k] = g end loom.op('_dist_all_reduce', { loom.ones(2) }, { 0 }, nil, h)", "_dist_all_reduce", "at most 2 handles" },
  { "_dist_all_reduce with reduce op 99", child = comm .. "loom.op('_dist_all_reduce', { loom.ones(2) }, { 99 }, nil, { g })", "all_reduce", "got 99" },
  { "_dist_all_gather over dim 5 of 1", child = comm .. "loom.op('_dist_all_gather', { loom.ones(2) }, { 5, 1 }, nil, { g })", "all_gather", "dim" },
  { "_dist_slice over dim 9 of 1", child = comm .. "loom.op('_dist_slice', { loom.ones(2) }, { 9 }, nil, { g })", "dim" },
  { "_dist_pad over dim 7 of 1", child = comm .. "loom.op('_dist_pad', { loom.ones(2) }, { 7 }, nil, { g })", "_dist_pad", "dim 7 is out of range" },
  { "_dist_all_to_all split over dim 4 of 1", child = comm .. "loom.op('_dist_all_to_all', { loom.ones(2) }, { 4, 0, -1 }, nil, { g })", "all_to_all", "split_dim" },
  { "_dist_reduce_scatter over dim 6 of 1", child = comm .. "loom.op('_dist_reduce_scatter', { loom.ones(2) }, { 0, 6 }, nil, { g })", "reduce_scatter", "dim" },
}

describe("op misuse", function()
  X.groups(describe, it, { pointwise, reductions, joins, functional, crashers, collectives }, 120)
end)

describe("what misuse once got through", function()
  it("gelu takes the approximation as a string, as an option, or none", function()
    local x = loom.tensor({ -1, 0.5, 2 }, { dtype = "f64" })
    local tanh = x:gelu({ approximate = "tanh" }):totable()
    assert.same(tanh, F.gelu(x, "tanh"):totable())
    assert.same(x:gelu():totable(), F.gelu(x, "none"):totable())
    assert.are_not.same(tanh, x:gelu():totable())
    assert.same(tanh, loom.nn.GELU("tanh")(x):totable())
  end)

  it("clamp of integer tensors with one side open keeps the other side as it is", function()
    local x = loom.tensor({ 1, 5, -7 }, { dtype = "i64" })
    assert.same({ 2, 5, 2 }, x:clamp(2):totable())
    assert.same({ 1, 3, -7 }, x:clamp(nil, 3):totable())
    assert.same({ 1, 3, -2 }, x:clamp(-2, 3):totable())
    assert.same({ 2, 5, 2 }, loom.tensor({ 1, 5, -7 }, { dtype = "i32" }):clamp(1.5):totable())
  end)

  it("layer_norm and rms_norm over the right shape still work", function()
    local x = loom.tensor({ { 1, 2, 3 }, { 4, 5, 7 } }, { dtype = "f64" })
    assert.same(F.layer_norm(x, 3):totable(), F.layer_norm(x, { 3 }):totable())
    local y = F.layer_norm(x, { 2, 3 }):totable()
    local s = 0
    for _, r in ipairs(y) do for _, v in ipairs(r) do s = s + v end end
    assert.is_true(math.abs(s) < 1e-12)
    assert.same({ 2, 3 }, F.rms_norm(x, { 3 }):size())
  end)

  it("neg and abs of the smallest int64 wrap to itself, as in PyTorch (no signed overflow under UBSan)", function()
    local m = loom.tensor({ -2 ^ 63, 5 }, { dtype = "i64" })
    assert.same({ -2 ^ 63, -5 }, (-m):totable())
    assert.same({ -2 ^ 63, 5 }, m:abs():totable())
  end)

  it("int64 add, sub and mul that overflow wrap modulo 2^64, as in PyTorch", function()
    local m = loom.tensor({ -2 ^ 63, 2 ^ 62 }, { dtype = "i64" })
    assert.same({ 0, -2 ^ 63 }, (m + m):totable())
    assert.same({ 0, 0 }, (m * 4):totable())
    assert.same({ 0, 2 ^ 62 }, (m - m:neg():neg()):add(loom.tensor({ 0, 2 ^ 62 }, { dtype = "i64" })):totable())
  end)
end)
