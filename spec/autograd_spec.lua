-- autograd_spec.lua: every differentiable op's backward against central
-- finite differences in f64 (relative error < 1e-6; see ref.gradcheck),
-- including broadcasting and non-contiguous inputs; and the semantics of
-- requires_grad, detach, retain_grad, no_grad, accumulation and errors.
local loom = require("loom")
local R = require("support.ref")

R.seed(2718)

local function leaf(shape, lo, hi)
  return loom.tensor(R.rand(shape, lo or -1, hi or 1), { dtype = "f64", requires_grad = true })
end
local function leaf_away(shape, lo, hi, margin)
  return loom.tensor(R.rand_away(shape, lo, hi, margin), { dtype = "f64", requires_grad = true })
end
local function const(shape, lo, hi)
  return loom.tensor(R.rand(shape, lo or -1, hi or 1), { dtype = "f64" })
end

-- runs gradcheck and asserts the worst error is small
local function gc(fn, inputs, opts)
  local worst = R.gradcheck(fn, inputs, opts)
  assert.is_true(worst < 1e-6)
end

describe("gradcheck itself", function()
  it("detects a wrong gradient", function()
    -- d/dx (x * stop(x)) is x for loom, 2x for finite differences
    local x = leaf({ 4 }, 0.5, 1)
    local ok, err = pcall(R.gradcheck, function(a) return a * a:detach() end, { x })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("finite differences"))
  end)
end)

describe("gradcheck: unary ops", function()
  local cases = {
    { "neg", function(x) return -x end },
    { "abs", function(x) return x:abs() end, "away" },
    { "sqrt", function(x) return x:sqrt() end, "pos" },
    { "rsqrt", function(x) return x:rsqrt() end, "pos" },
    { "exp", function(x) return x:exp() end },
    { "log", function(x) return x:log() end, "pos" },
    { "tanh", function(x) return x:tanh() end },
    { "sigmoid", function(x) return x:sigmoid() end },
    { "relu", function(x) return x:relu() end, "away" },
    { "gelu", function(x) return x:gelu() end, "wide" },
    { "gelu tanh", function(x) return x:gelu({ approximate = "tanh" }) end, "wide" },
    { "silu", function(x) return x:silu() end, "wide" },
    { "sin", function(x) return x:sin() end, "wide" },
    { "cos", function(x) return x:cos() end, "wide" },
    { "pow 2", function(x) return x:pow(2) end },
    { "pow 3", function(x) return x:pow(3) end },
    { "pow 0.5", function(x) return x:pow(0.5) end, "pos" },
    { "pow -1.5", function(x) return x:pow(-1.5) end, "pos" },
    { "x ^ 2", function(x) return x ^ 2 end },
    { "clamp", function(x) return x:clamp(-0.5, 0.5) end, "clamp" },
    { "clamp min only", function(x) return x:clamp(0.1) end, "clamp" },
  }
  for _, c in ipairs(cases) do
    it(c[1], function()
      local x
      if c[3] == "pos" then x = leaf({ 3, 4 }, 0.2, 3)
      elseif c[3] == "away" then x = leaf_away({ 3, 4 }, -2, 2, 0.1)
      elseif c[3] == "wide" then x = leaf({ 3, 4 }, -3, 3)
      elseif c[3] == "clamp" then
        local vals = { -1.2, -0.8, -0.3, -0.05, 0.25, 0.4, 0.7, 1.3, -0.45, 0.15, 0.05, 0.9 }
        x = loom.tensor(vals, { dtype = "f64", requires_grad = true })
      else x = leaf({ 3, 4 }) end
      gc(c[2], { x })
    end)
  end

  it("on a transposed, a narrowed and an expanded input", function()
    local x = leaf({ 4, 3 }, 0.2, 2)
    gc(function(a) return a:t():log() end, { x })
    gc(function(a) return a:narrow(2, 2, 2):sqrt() end, { x })
    local v = leaf({ 3, 1 })
    gc(function(a) return a:expand(3, 5):tanh() end, { v })
  end)
end)

describe("gradcheck: binary ops", function()
  local cases = {
    { "add", function(a, b) return a + b end },
    { "sub", function(a, b) return a - b end },
    { "mul", function(a, b) return a * b end },
    { "div", function(a, b) return a / b end },
    { "pow", function(a, b) return a:pow(b) end },
    { "maximum", function(a, b) return a:maximum(b) end },
    { "minimum", function(a, b) return a:minimum(b) end },
  }
  local shapes = {
    { "same shape", { 3, 4 }, { 3, 4 } },
    { "column with row", { 3, 1 }, { 1, 4 } },
    { "3-D with a trailing vector", { 2, 3, 4 }, { 4 } },
    { "vector with 3-D", { 4 }, { 2, 1, 4 } },
    { "0-dim with a matrix", {}, { 2, 3 } },
  }
  for _, c in ipairs(cases) do
    for _, s in ipairs(shapes) do
      it(c[1] .. ", " .. s[1], function()
        local a, b
        if c[1] == "pow" then a, b = leaf(s[2], 0.5, 2), leaf(s[3], -1.5, 1.5)
        elseif c[1] == "div" then a, b = leaf(s[2]), leaf_away(s[3], -2, 2, 0.3)
        else a, b = leaf(s[2]), leaf(s[3]) end
        gc(c[2], { a, b })
        local ga, gb = a.grad, b.grad
        assert.same(a:size(), ga:size())
        assert.same(b:size(), gb:size())
      end)
    end
  end

  it("with Lua numbers on either side", function()
    local x = leaf({ 2, 3 }, 0.5, 2)
    gc(function(a) return 3 - a end, { x })
    gc(function(a) return 2 / a end, { x })
    gc(function(a) return a / 4 + 1 end, { x })
    gc(function(a) return 2 ^ a end, { x })
    gc(function(a) return a:maximum(1) end, { loom.tensor({ 0.2, 0.7, 1.4, 1.9 }, { dtype = "f64", requires_grad = true }) })
  end)

  it("only one side requiring grad", function()
    local a, b = leaf({ 3, 4 }), const({ 4 })
    gc(function(x, y) return x * y end, { a, b })
    assert.is_nil(b.grad)
  end)

  it("the same tensor on both sides", function()
    local a = leaf({ 5 })
    gc(function(x) return x * x + x end, { a })
  end)

  it("non-contiguous operands", function()
    local a, b = leaf({ 4, 3 }), leaf({ 3, 6 })
    gc(function(x, y) return x:t() * y:narrow(2, 2, 4) end, { a, b })
    local c = leaf({ 2, 3, 4 })
    gc(function(x) return x:permute(3, 1, 2) / (x:permute(3, 1, 2):exp() + 1) end, { c })
  end)

  it("where and masked_fill", function()
    local cond = loom.tensor({ { true, false, true }, { false, false, true } })
    local a, b = leaf({ 2, 3 }), leaf({ 3 })
    gc(function(x, y) return loom.where(cond, x, y) end, { a, b })
    gc(function(x) return loom.where(cond, x, 0) end, { a })
    gc(function(x) return x:masked_fill(cond, -2) end, { a })
    local col = loom.tensor({ { true }, { false } })
    gc(function(x, y) return loom.where(col, x, y) end, { a, b })
  end)
end)

describe("gradcheck: views and shape ops", function()
  local x
  before_each(function() x = leaf({ 2, 3, 4 }) end)

  it("view and reshape", function()
    gc(function(a) return a:view(6, 4) * 1 end, { x })
    gc(function(a) return a:view(-1):sin() end, { x })
    gc(function(a) return a:transpose(1, 3):reshape(4, 6):sin() end, { x }) -- the copy case
  end)
  it("transpose, t and permute", function()
    gc(function(a) return a:transpose(1, 2):sin() end, { x })
    gc(function(a) return a:permute(3, 1, 2):cos() end, { x })
    gc(function(a) return a:select(1, 2):t():exp() end, { x })
  end)
  it("narrow and select", function()
    gc(function(a) return a:narrow(3, 2, 2):sin() end, { x })
    gc(function(a) return a:narrow(-2, 1, 1) * 2 end, { x })
    gc(function(a) return a:select(2, 3):exp() end, { x })
  end)
  it("expand", function()
    local v = leaf({ 3, 1 })
    gc(function(a) return a:expand(2, 3, 5):sin() end, { v })
  end)
  it("contiguous and clone", function()
    gc(function(a) return a:transpose(2, 3):contiguous():sin() end, { x })
    gc(function(a) return a:clone():exp() end, { x })
  end)
  it("squeeze and unsqueeze", function()
    local y = leaf({ 3, 1, 2 })
    gc(function(a) return a:squeeze():exp() end, { y })
    gc(function(a) return a:squeeze(2):exp() end, { y })
    gc(function(a) return a:unsqueeze(1):unsqueeze(-1):sin() end, { y })
  end)
  it("cat", function()
    local a, b = leaf({ 2, 3 }), leaf({ 2, 5 })
    gc(function(p, q) return loom.cat({ p, q }, 2):sin() end, { a, b })
    local c = leaf({ 4, 3 })
    gc(function(p, q) return loom.cat({ p, q:t(), p }, -1):exp() end, { a, leaf({ 3, 2 }) })
    gc(function(p, q) return loom.cat({ p, q }, 1) * 3 end, { a, c:narrow(1, 1, 2):contiguous():detach():requires_grad_() })
  end)
  it("split and chunk", function()
    gc(function(a)
      local parts = a:split(3, 3)
      return parts[1]:sin() * parts[2]:narrow(3, 1, 1)
    end, { x })
    gc(function(a)
      local c = a:chunk(2, 2)
      return c[1] * c[2]:narrow(2, 1, 1)
    end, { x })
  end)
  it("to() passes the gradient back in the input's dtype", function()
    local y = loom.tensor({ 1, 2, 3 }, { dtype = "f64", requires_grad = true })
    local z = y:to("f32") * loom.tensor({ 2, 4, 8 })
    z:sum():backward()
    assert.equal("f64", y.grad.dtype)
    assert.same({ 2, 4, 8 }, y.grad:totable())
    local b = loom.tensor({ 1, 2 }, { dtype = "bf16", requires_grad = true })
    ;(b:to("f32") * 3):sum():backward()
    assert.equal("bf16", b.grad.dtype)
    assert.same({ 3, 3 }, b.grad:totable())
  end)
end)

describe("gradcheck: reductions", function()
  local x
  before_each(function() x = leaf({ 2, 3, 4 }) end)
  it("sum over everything, each dim and keepdim", function()
    gc(function(a) return a:sum() end, { x })
    for _, d in ipairs { 1, 2, 3, -1 } do
      gc(function(a) return a:sum(d) end, { x })
      gc(function(a) return a:sum(d, true) * a end, { x })
    end
  end)
  it("mean over everything, each dim and keepdim", function()
    gc(function(a) return a:mean() end, { x })
    for _, d in ipairs { 1, 2, 3, -2 } do
      gc(function(a) return a:mean(d) end, { x })
      gc(function(a) return a - a:mean(d, true) end, { x })
    end
  end)
  it("max and min values", function()
    for _, d in ipairs { 1, 2, 3, -1 } do
      gc(function(a) return (a:max(d)) end, { x })
      gc(function(a) local v = a:min(d, true) return v * a end, { x })
    end
    gc(function(a) return a:max() end, { x })
    gc(function(a) return a:min() end, { x })
  end)
  it("on non-contiguous input", function()
    gc(function(a) return a:transpose(1, 3):sum(2) end, { x })
    gc(function(a) return a:permute(2, 3, 1):mean(1) end, { x })
    gc(function(a) return (a:t():max(1)) end, { leaf({ 3, 5 }) })
  end)
end)

describe("gradcheck: matmul", function()
  local cases = {
    { "2-D", { 3, 4 }, { 4, 5 } },
    { "vector @ vector", { 4 }, { 4 } },
    { "vector @ matrix", { 4 }, { 4, 3 } },
    { "matrix @ vector", { 3, 4 }, { 4 } },
    { "batched", { 2, 3, 4 }, { 2, 4, 5 } },
    { "batched @ matrix (broadcast)", { 2, 3, 4 }, { 4, 5 } },
    { "matrix @ batched (broadcast)", { 3, 4 }, { 2, 4, 5 } },
    { "broadcast batch dims", { 2, 1, 3, 4 }, { 3, 4, 2 } },
    { "batched @ vector", { 2, 3, 4 }, { 4 } },
    { "vector @ batched", { 4 }, { 2, 4, 3 } },
  }
  for _, c in ipairs(cases) do
    it(c[1], function()
      gc(function(a, b) return a:matmul(b) end, { leaf(c[2]), leaf(c[3]) })
    end)
  end
  it("transposed operands", function()
    gc(function(a, b) return a:t():matmul(b:t()) end, { leaf({ 4, 3 }), leaf({ 5, 4 }) })
    gc(function(a, b) return a:transpose(-1, -2):matmul(b) end, { leaf({ 2, 4, 3 }), leaf({ 4, 2 }) })
  end)
  it("an MLP: linear, gelu, linear, mean", function()
    local w1, b1, w2 = leaf({ 6, 4 }), leaf({ 6 }), leaf({ 2, 6 })
    local inp = const({ 5, 4 })
    gc(function(a, b, c) return ((inp:matmul(a:t()) + b):gelu():matmul(c:t())):mean() end, { w1, b1, w2 })
  end)
end)

describe("gradcheck: nn ops", function()
  local F = loom.F

  it("softmax and log_softmax over each dim", function()
    local x = leaf({ 2, 3, 4 }, -2, 2)
    for _, d in ipairs { 1, 2, 3, -1 } do
      gc(function(a) return a:softmax(d) end, { x })
      gc(function(a) return a:log_softmax(d) end, { x })
      gc(function(a) return F.softmax(a:transpose(1, 3), d) end, { x })
    end
  end)

  it("layer_norm with and without affine parameters", function()
    local x, w, b = leaf({ 3, 5 }, -2, 2), leaf({ 5 }), leaf({ 5 })
    gc(function(p, q, r) return F.layer_norm(p, { 5 }, q, r, 1e-5) end, { x, w, b })
    gc(function(p) return F.layer_norm(p, { 5 }, nil, nil, 1e-5) end, { x })
    local y, w2 = leaf({ 2, 3, 4 }, -2, 2), leaf({ 3, 4 })
    gc(function(p, q) return F.layer_norm(p, { 3, 4 }, q, nil, 1e-5) end, { y, w2 })
    gc(function(p) return F.layer_norm(p:t(), { 3 }, nil, nil, 1e-5) end, { x })
  end)

  it("rms_norm with and without weight", function()
    local x, w = leaf({ 3, 5 }, -2, 2), leaf({ 5 })
    gc(function(p, q) return F.rms_norm(p, { 5 }, q, 1e-6) end, { x, w })
    gc(function(p) return F.rms_norm(p, { 5 }, nil, 1e-6) end, { x })
    gc(function(p) return F.rms_norm(p:t(), { 3 }, nil, 1e-6) end, { x })
  end)

  it("embedding (gradient of the weight, repeated ids)", function()
    local w = leaf({ 5, 3 })
    local ids = loom.tensor({ { 1, 5, 2 }, { 5, 5, 3 } }, { dtype = "i64" })
    gc(function(p) return F.embedding(ids, p) end, { w })
    -- rows never used get zero gradient
    assert.same({ 0, 0, 0 }, w.grad:totable()[4])
  end)

  it("cross_entropy: class ids, reductions, weights, ignore_index, smoothing", function()
    local logits = leaf({ 4, 5 }, -2, 2)
    local target = loom.tensor({ 2, 5, 1, 3 }, { dtype = "i64" })
    local weight = loom.tensor({ 0.5, 1, 2, 1, 0.25 }, { dtype = "f64" })
    gc(function(p) return F.cross_entropy(p, target) end, { logits })
    gc(function(p) return F.cross_entropy(p, target, { reduction = "sum" }) end, { logits })
    gc(function(p) return F.cross_entropy(p, target, { reduction = "none" }) end, { logits })
    gc(function(p) return F.cross_entropy(p, target, { weight = weight }) end, { logits })
    gc(function(p) return F.cross_entropy(p, loom.tensor({ 2, -100, 1, 3 }, { dtype = "i64" })) end, { logits })
    gc(function(p) return F.cross_entropy(p, target, { label_smoothing = 0.1 }) end, { logits })
    gc(function(p) return F.cross_entropy(p, target, { weight = weight, label_smoothing = 0.2, reduction = "sum" }) end, { logits })
    local probs = loom.tensor(R.rand({ 4, 5 }, 0, 1), { dtype = "f64" })
    probs = probs / probs:sum(2, true)
    gc(function(p) return F.cross_entropy(p, probs) end, { logits })
    local l3 = leaf({ 2, 3, 5 }, -2, 2)
    gc(function(p) return F.cross_entropy(p, loom.tensor({ { 1, 2, 3 }, { 4, 5, 1 } }, { dtype = "i64" })) end, { l3 })
  end)

  it("cross_entropy value equals -log softmax at the target", function()
    local data = { { 1, 2, 3 }, { 0.5, -1, 2 } }
    local l = loom.tensor(data, { dtype = "f64" })
    local loss = F.cross_entropy(l, loom.tensor({ 3, 1 }, { dtype = "i64" })):item()
    local function lse(r) local s = 0 for _, v in ipairs(r) do s = s + math.exp(v) end return math.log(s) end
    local want = ((lse(data[1]) - 3) + (lse(data[2]) - 0.5)) / 2
    assert.near(want, loss, 1e-12)
  end)

  it("triu and tril", function()
    local x = leaf({ 2, 4, 4 })
    gc(function(p) return p:triu() end, { x })
    gc(function(p) return p:tril(-1) end, { x })
    gc(function(p) return p:triu(1) end, { x })
  end)

  it("scaled_dot_product_attention, plain and causal", function()
    local q, k, v = leaf({ 1, 2, 3, 4 }), leaf({ 1, 2, 3, 4 }), leaf({ 1, 2, 3, 4 })
    gc(function(a, b, c) return F.scaled_dot_product_attention(a, b, c) end, { q, k, v })
    gc(function(a, b, c) return F.scaled_dot_product_attention(a, b, c, { is_causal = true }) end, { q, k, v })
  end)

  it("rotary embedding", function()
    local x = leaf({ 1, 3, 2, 4 })
    local cos, sin = F.rope_tables(3, 4, { dtype = "f64" })
    gc(function(a) return F.apply_rotary_emb(a, cos, sin) end, { x })
  end)
end)

describe("autograd semantics", function()
  it("requires_grad propagates to results and not to detached tensors", function()
    local x = loom.tensor({ 1, 2 }, { requires_grad = true })
    local c = loom.tensor({ 3, 4 })
    local y = x * c
    assert.is_true(y.requires_grad)
    assert.is_false(y.is_leaf)
    assert.is_false((c * c).requires_grad)
    local d = y:detach()
    assert.is_false(d.requires_grad)
    assert.is_true(d.is_leaf)
    assert.same({ 3, 8 }, d:totable())
    x.requires_grad = false
    assert.is_false((x * c).requires_grad)
  end)

  it("x.grad is a tensor, or nil before any backward", function()
    local x = loom.tensor({ 1, 2, 3 }, { requires_grad = true })
    assert.is_nil(x.grad)
    ;(x * x):sum():backward()
    local g = x.grad
    assert.is_true(loom.is_tensor(g))
    assert.same({ 2, 4, 6 }, g:totable())
    assert.same({ 3, 5, 7 }, (g + 1):totable())
    assert.same({ 3 }, g:size())
    x:zero_grad()
    assert.is_nil(x.grad)
  end)

  it("detach shares storage but cuts the graph", function()
    local x = loom.tensor({ 1, 2 }, { requires_grad = true })
    local y = x * 2
    local z = y:detach() * x
    z:sum():backward()
    assert.same({ 2, 4 }, x.grad:totable())   -- d/dx (stop(2x) * x) = 2x
  end)

  it("gradients accumulate over two backward calls", function()
    local x = loom.tensor({ 1, 2, 3 }, { dtype = "f64", requires_grad = true })
    ;(x * x):sum():backward()
    ;(x * 3):sum():backward()
    assert.same({ 5, 7, 9 }, x.grad:totable())
    x:zero_grad()
    ;(x * 3):sum():backward()
    assert.same({ 3, 3, 3 }, x.grad:totable())
  end)

  it("the same graph can run backward twice", function()
    local x = loom.tensor({ 1, 2 }, { dtype = "f64", requires_grad = true })
    local y = (x * x):sum()
    y:backward()
    y:backward()
    assert.same({ 4, 8 }, x.grad:totable())
  end)

  it("backward of a non-scalar needs an explicit gradient", function()
    local x = loom.tensor({ 1, 2, 3 }, { dtype = "f64", requires_grad = true })
    local y = x * x
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.truthy(err:find("scalar"), err)
    y:backward(loom.tensor({ 1, 0.5, -1 }, { dtype = "f64" }))
    assert.same({ 2, 2, -6 }, x.grad:totable())
  end)

  it("backward with a gradient of the wrong shape is an error", function()
    local x = loom.tensor({ 1, 2, 3 }, { requires_grad = true })
    local y = x * 2
    local ok, err = pcall(function() y:backward(loom.ones(2)) end)
    assert.is_false(ok)
    assert.truthy(err:find("shape"), err)
  end)

  it("backward on a tensor that does not require grad is an error", function()
    local ok, err = pcall(function() loom.tensor({ 1 }):sum():backward() end)
    assert.is_false(ok)
    assert.truthy(err:find("does not require grad"), err)
  end)

  it("retain_grad keeps the gradient of a non-leaf", function()
    local x = loom.tensor({ 1, 2 }, { dtype = "f64", requires_grad = true })
    local y = x * 3
    local z = x * 5
    y:retain_grad()
    ;(y * y + z):sum():backward()
    assert.same({ 6, 12 }, y.grad:totable())     -- 2y
    assert.is_nil(z.grad)
    assert.same({ 18 + 5, 36 + 5 }, x.grad:totable())
  end)

  it("no_grad records nothing and restores the mode, even after an error", function()
    local x = loom.tensor({ 1, 2 }, { requires_grad = true })
    assert.is_true(loom.is_grad_enabled())
    local y, extra = loom.no_grad(function()
      assert.is_false(loom.is_grad_enabled())
      return x * 2, "second"
    end)
    assert.equal("second", extra)
    assert.is_false(y.requires_grad)
    assert.is_true(loom.is_grad_enabled())
    local ok = pcall(loom.no_grad, function() error("boom") end)
    assert.is_false(ok)
    assert.is_true(loom.is_grad_enabled())
    assert.is_true((x * 2).requires_grad)
  end)

  it("only floating point leaves can require grad, only leaves can change it", function()
    local ok, err = pcall(function() return loom.tensor({ 1 }, { dtype = "i64", requires_grad = true }) end)
    assert.is_false(ok)
    assert.truthy(err:find("floating point"), err)
    local x = loom.tensor({ 1 }, { requires_grad = true })
    local y = x * 2
    ok, err = pcall(function() y.requires_grad = false end)
    assert.is_false(ok)
    assert.truthy(err:find("leaves"), err)
    assert.equal(x, x:requires_grad_(false))
    assert.is_false(x.requires_grad)
  end)

  it("comparisons and argmax do not require grad", function()
    local x = loom.tensor({ 1, 2 }, { requires_grad = true })
    assert.is_false(x:gt(1).requires_grad)
    assert.is_false(x:argmax(1).requires_grad)
    local _, idx = x:max(1)
    assert.is_false(idx.requires_grad)
  end)

  it("gradients through views reach the base", function()
    local x = loom.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, { dtype = "f64", requires_grad = true })
    local y = x:t():narrow(1, 2, 2):reshape(-1) * loom.tensor({ 1, 2, 3, 4 }, { dtype = "f64" })
    y:sum():backward()
    -- y = {x12*1, x22*2, x13*3, x23*4}
    assert.same({ { 0, 1, 3 }, { 0, 2, 4 } }, x.grad:totable())
  end)

  it("broadcast gradients are summed back to the input's shape", function()
    local b = loom.tensor({ 1, 2, 3 }, { dtype = "f64", requires_grad = true })
    local s = loom.tensor(2, { dtype = "f64", requires_grad = true })
    local x = loom.ones({ 4, 3 }, { dtype = "f64" })
    ;((x + b) * s):sum():backward()
    assert.same({ 8, 8, 8 }, b.grad:totable())
    assert.equal(0, s.grad:dim())
    assert.equal(4 * (3 + 6), s.grad:item())   -- sum of (1 + b) over 4 rows
  end)

  -- an op that answers its own input (contiguous of a contiguous tensor,
  -- a cast to the same dtype) must not take over the input's history
  it("reaches the input through contiguous and to of a tensor that needs no change", function()
    for _, f in ipairs({ function(x) return loom.op("contiguous", { x }) end,
                         function(x) return loom.op("to", { x }, { loom.C.LM_F64 }) end }) do
      local x = loom.tensor({ 1, 2, 3 }, { dtype = "f64", requires_grad = true })
      local y = f(x)
      assert.is_true(x.is_leaf)
      ;(y * y):sum():backward()
      assert.same({ 2, 4, 6 }, x.grad:totable())
    end
  end)

  it("leaf gradient dtype follows the leaf", function()
    local x = loom.tensor({ 1, 2 }, { dtype = "bf16", requires_grad = true })
    ;(x * x):sum():backward()
    assert.equal("bf16", x.grad.dtype)
    assert.same({ 2, 4 }, x.grad:totable())
  end)
end)
