-- nn_spec.lua: loom.nn, the module system (registration, FQNs, state_dict,
-- hooks, modes, printing) and the layers, whose forward passes are checked
-- against plain-Lua f64 computations on the same numbers.
local loom = require("loom")
local R = require("support.ref")
local nn = loom.nn

R.seed(4242)

local function f64(t) return loom.tensor(t, { dtype = "f64" }) end
local function names(list)
  local out = {}
  for i, kv in ipairs(list) do out[i] = kv[1] end
  return out
end
local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end
local errmsg = R.errmsg

-- A Llama-shaped toy: Net{ embed, layers = ModuleList{ Block{ attention{wq, wo}, norm } }, head }
local Attn = nn.Module:extend("Attn")
function Attn:__init(d)
  self.wq = nn.Linear(d, d, { bias = false })
  self.wo = nn.Linear(d, d)
end
function Attn:forward(x) return self.wo(self.wq(x)) end

local Block = nn.Module:extend("Block")
function Block:__init(d)
  self.attention = Attn(d)
  self.norm = nn.RMSNorm(d)
end
function Block:forward(x) return x + self.attention(self.norm(x)) end

local Net = nn.Module:extend("Net")
function Net:__init(d, n)
  self.embed = nn.Embedding(5, d)
  local blocks = {}
  for i = 1, n do blocks[i] = Block(d) end
  self.layers = nn.ModuleList(blocks)
  self.scale = nn.Parameter(loom.ones({ d }))
  self.head = nn.Linear(d, 3)
  self.width = d                       -- a plain field: not registered
  self.frozen = loom.zeros({ d })      -- a tensor without grad: a plain field too
end
function Net:forward(ids)
  local h = self.embed(ids)
  for _, b in self.layers:ipairs() do h = b(h) end
  return self.head(h * self.scale)
end

describe("nn.Module", function()
  it("extend, __init, forward and call syntax", function()
    local Double = nn.Module:extend("Double")
    local inits = 0
    function Double:__init(k) inits = inits + 1 self.k = k end
    function Double:forward(x, y) return x * self.k + y end
    local m = Double(2)
    assert.equal(1, inits)
    assert.equal(2, m.k)
    assert.is_true(nn.Module.is_module(m))
    local out = m(loom.tensor({ 1, 2 }), loom.tensor({ 10, 20 }))
    assert.same({ 12, 24 }, out:totable())
    assert.same({ 12, 24 }, m:forward(loom.tensor({ 1, 2 }), loom.tensor({ 10, 20 })):totable())
    -- a subclass of a subclass inherits forward
    local Triple = Double:extend("Triple")
    local t = Triple(3)
    assert.same({ 13 }, t(loom.tensor({ 1 }), loom.tensor({ 10 })):totable())
    -- no forward: a clear error
    local Empty = nn.Module:extend("Empty")
    assert.truthy(errmsg(function() return Empty()(loom.ones(1)) end):find("Empty: forward is not implemented", 1, true))
  end)

  it("field assignment registers modules and parameters, nothing else", function()
    local m = Net(4, 2)
    assert.same({ "embed", "layers", "head" }, names(m:named_children()))
    local params = m:named_parameters()
    local top = {}
    for _, kv in ipairs(params) do if not kv[1]:find("%.") then top[#top + 1] = kv[1] end end
    assert.same({ "scale" }, top)
    assert.equal(4, m.width)
    assert.is_nil(m:state_dict().frozen)
    assert.truthy(loom.is_tensor(m.frozen))
    -- register_parameter / register_buffer / register_module by name
    m:register_buffer("steps", loom.zeros({ 1 }))
    assert.same({ "steps" }, names(m:named_buffers()))
    assert.truthy(m:state_dict().steps)
    assert.truthy(errmsg(function() m:register_module("x", 3) end):find("register_module: module expected a module", 1, true))
    -- reassigning a registered parameter replaces it in place in the order
    local new = nn.Parameter(loom.full({ 4 }, 2))
    m.scale = new
    assert.equal(2, m.scale:totable()[1])
    assert.equal("scale", m:named_parameters()[1][1])
  end)

  -- as PyTorch: modules depth-first, each module's own parameters in the
  -- order they were assigned (so the root's "scale" comes first)
  it("named_modules and named_parameters give 1-based FQNs in registration order", function()
    local m = Net(4, 2)
    assert.same({ "", "embed", "layers", "layers.1", "layers.1.attention", "layers.1.attention.wq",
                  "layers.1.attention.wo", "layers.1.norm", "layers.2", "layers.2.attention",
                  "layers.2.attention.wq", "layers.2.attention.wo", "layers.2.norm", "head" },
                names(m:named_modules()))
    assert.same({ "scale", "embed.weight", "layers.1.attention.wq.weight", "layers.1.attention.wo.weight",
                  "layers.1.attention.wo.bias", "layers.1.norm.weight", "layers.2.attention.wq.weight",
                  "layers.2.attention.wo.weight", "layers.2.attention.wo.bias", "layers.2.norm.weight",
                  "head.weight", "head.bias" },
                names(m:named_parameters()))
    local ps = m:parameters()
    assert.equal(12, #ps)
    for i, kv in ipairs(m:named_parameters()) do
      assert.is_true(rawequal(ps[i], kv[2]) or ps[i] == kv[2])
      assert.is_true(kv[2].requires_grad and kv[2].is_leaf)
    end
    -- the module's own tensor objects, not copies
    assert.equal(tostring(require("ffi").cast("void*", m.layers[2].attention.wq.weight)),
                 tostring(require("ffi").cast("void*", m:named_parameters()[7][2])))
  end)

  it("get_submodule follows FQNs and names what is missing", function()
    local m = Net(4, 2)
    assert.equal(m.layers[2].attention.wo, m:get_submodule("layers.2.attention.wo"))
    assert.equal(m, m:get_submodule(""))
    local e = errmsg(m.get_submodule, m, "layers.3.attention")
    assert.truthy(e:find('ModuleList has no submodule "3"', 1, true), e)
    assert.truthy(e:find('"layers.3.attention"', 1, true), e)
    e = errmsg(m.get_submodule, m, "layers.1.mlp")
    assert.truthy(e:find('Block has no submodule "mlp"', 1, true), e)
  end)

  it("state_dict shares storage; load_state_dict copies in place", function()
    local a, b = Net(4, 1), Net(4, 1)
    local sd = a:state_dict()
    assert.same({ "embed.weight", "head.bias", "head.weight", "layers.1.attention.wo.bias",
                  "layers.1.attention.wo.weight", "layers.1.attention.wq.weight", "layers.1.norm.weight",
                  "scale" }, sorted_keys(sd))
    assert.is_false(sd["head.weight"].requires_grad)
    loom.no_grad(function() a.head.bias:fill_(7) end)
    assert.same({ 7, 7, 7 }, sd["head.bias"]:totable())   -- a view of the parameter
    local target = b.head.weight
    local res = b:load_state_dict(a:state_dict())
    assert.same({}, res.missing_keys)
    assert.same({}, res.unexpected_keys)
    for k, v in pairs(a:state_dict()) do R.assert_equal(b:state_dict()[k]:totable(), v:totable()) end
    assert.equal(target, b.head.weight)          -- same tensor object, new values
    assert.is_true(b.head.weight.requires_grad)
  end)

  it("load_state_dict strict errors name missing, unexpected and mis-shaped keys", function()
    local m = Net(4, 1)
    local sd = m:state_dict()
    sd["head.bias"] = nil
    sd["layers.1.norm.weight"] = nil
    sd["head.extra"] = loom.zeros({ 1 })
    local e = errmsg(m.load_state_dict, m, sd)
    assert.truthy(e:find("missing keys: head.bias, layers.1.norm.weight", 1, true), e)
    assert.truthy(e:find("unexpected keys: head.extra", 1, true), e)
    sd = m:state_dict()
    sd["head.weight"] = loom.zeros({ 4, 3 })
    e = errmsg(m.load_state_dict, m, sd)
    assert.truthy(e:find("size mismatch for head.weight (expected size 3x4, got 4x3)", 1, true), e)
    e = errmsg(m.load_state_dict, m, 42)
    assert.truthy(e:find("state_dict expected a table", 1, true), e)
    -- nothing was copied by a failed load
    local before = m.head.weight:totable()
    sd = m:state_dict()
    local z = {}
    for k, v in pairs(sd) do z[k] = loom.zeros(v:size()) end
    z["head.bias"] = loom.zeros({ 2 })
    errmsg(m.load_state_dict, m, z)
    R.assert_equal(m.head.weight:totable(), before)
  end)

  it("load_state_dict non-strict loads what matches and reports the rest", function()
    local m = Net(4, 1)
    local res = m:load_state_dict({ ["head.bias"] = loom.tensor({ 1, 2, 3 }), ["nope"] = loom.zeros({ 1 }) },
                                  { strict = false })
    assert.same({ 1, 2, 3 }, m.head.bias:totable())
    assert.same({ "nope" }, res.unexpected_keys)
    assert.equal(7, #res.missing_keys)
    assert.equal("embed.weight", res.missing_keys[1])
    -- shapes are still checked
    local e = errmsg(m.load_state_dict, m, { ["head.bias"] = loom.zeros({ 2 }) }, { strict = false })
    assert.truthy(e:find("size mismatch for head.bias", 1, true), e)
  end)

  it("train() and eval() reach every submodule", function()
    local m = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout(0.5), nn.ReLU()))
    for _, mm in ipairs(m:named_modules()) do assert.is_true(mm[2].training) end
    assert.equal(m, m:eval())
    for _, mm in ipairs(m:named_modules()) do assert.is_false(mm[2].training) end
    m:train()
    for _, mm in ipairs(m:named_modules()) do assert.is_true(mm[2].training) end
    m:train(false)
    assert.is_false(m[2][1].training)
  end)

  it("zero_grad clears every parameter's gradient", function()
    local m = Net(4, 1)
    local loss = m(loom.tensor({ { 1, 2, 3 } }, { dtype = "i64" })):sum()
    loss:backward()
    for _, kv in ipairs(m:named_parameters()) do assert.is_not_nil(kv[2].grad, kv[1]) end
    m:zero_grad()
    for _, kv in ipairs(m:named_parameters()) do assert.is_nil(kv[2].grad, kv[1]) end
  end)

  it("forward pre-hooks replace inputs, forward hooks replace outputs, handles remove them", function()
    local lin = nn.Linear(2, 2, { dtype = "f64" })
    loom.no_grad(function()
      lin.weight:copy_(f64({ { 1, 2 }, { 3, 4 } }))
      lin.bias:copy_(f64({ 0.5, -0.5 }))
    end)
    local x = f64({ { 1, 1 } })
    assert.same({ { 3.5, 6.5 } }, lin(x):totable())
    local seen = {}
    local h1 = lin:register_forward_pre_hook(function(mod, args)
      seen[#seen + 1] = { mod = mod, n = args.n, x = args[1] }
      return args[1] * 2                          -- a single tensor: the new input
    end)
    assert.same({ { 6.5, 13.5 } }, lin(x):totable())
    assert.equal(lin, seen[1].mod)
    assert.equal(1, seen[1].n)
    assert.same({ { 1, 1 } }, seen[1].x:totable())
    local got_args
    local h2 = lin:register_forward_hook(function(mod, args, out)
      got_args = args[1]
      return out + 100
    end)
    assert.same({ { 106.5, 113.5 } }, lin(x):totable())
    assert.same({ { 2, 2 } }, got_args:totable())   -- the hook sees the replaced input
    h1:remove()
    assert.same({ { 103.5, 106.5 } }, lin(x):totable())
    h2:remove()
    h2:remove()                                    -- removing twice is harmless
    assert.same({ { 3.5, 6.5 } }, lin(x):totable())
    -- a pre-hook may return a table of several arguments; hooks run in order
    local Add = nn.Module:extend("Add")
    function Add:forward(a, b) return a + b end
    local add = Add()
    add:register_forward_pre_hook(function(_, args) return { n = 2, args[2], args[1] * 10 } end)
    add:register_forward_hook(function(_, _, out) return out * 2 end)
    add:register_forward_hook(function(_, _, out) return out + 1 end)
    assert.same({ 2 * (2 + 10) + 1 }, add(loom.tensor({ 1 }), loom.tensor({ 2 })):totable())
    -- the same function registered twice is removed once per handle
    local calls = 0
    local function count() calls = calls + 1 end
    local c1 = add:register_forward_pre_hook(count)
    add:register_forward_pre_hook(count)
    add(loom.tensor({ 1 }), loom.tensor({ 2 }))
    assert.equal(2, calls)
    c1:remove()
    add(loom.tensor({ 1 }), loom.tensor({ 2 }))
    assert.equal(3, calls)
    assert.truthy(errmsg(function() add:register_forward_hook(5) end):find("fn expected a function", 1, true))
  end)

  it("prints the module tree", function()
    local m = Net(4, 1)
    local expected = table.concat({
      "Net(",
      "  (embed): Embedding(5, 4)",
      "  (layers): ModuleList(",
      "    (1): Block(",
      "      (attention): Attn(",
      "        (wq): Linear(in_features=4, out_features=4, bias=false)",
      "        (wo): Linear(in_features=4, out_features=4, bias=true)",
      "      )",
      "      (norm): RMSNorm((4), eps=1e-06)",
      "    )",
      "  )",
      "  (head): Linear(in_features=4, out_features=3, bias=true)",
      ")" }, "\n")
    assert.equal(expected, tostring(m))
  end)

  it("lists a tied parameter once, and state_dict keeps both names", function()
    local m = nn.Sequential(nn.Linear(3, 3, { bias = false }), nn.Linear(3, 3, { bias = false }))
    m[2].weight = m[1].weight
    assert.same({ "1.weight" }, names(m:named_parameters()))
    assert.equal(1, #m:parameters())
    local sd = m:state_dict()
    assert.same({ "1.weight", "2.weight" }, sorted_keys(sd))
    m:load_state_dict(sd)
    -- a gradient through both uses accumulates into the one tensor
    local x = loom.tensor({ { 1, 0, 0 } })
    m(x):sum():backward()
    assert.is_not_nil(m[1].weight.grad)
    assert.equal(m[1].weight, m[2].weight)
  end)
end)

describe("nn layers", function()
  it("Linear: weight (out, in), bias, kaiming-uniform bound 1/sqrt(in)", function()
    loom.manual_seed(1)
    local lin = nn.Linear(16, 64)
    assert.same({ 64, 16 }, lin.weight:size())
    assert.same({ 64 }, lin.bias:size())
    assert.equal("f32", lin.weight.dtype)
    local bound = 1 / math.sqrt(16)
    for _, t in ipairs { lin.weight, lin.bias } do
      local flat = R.flat(t:totable())
      local lo, hi, sum = math.huge, -math.huge, 0
      for _, v in ipairs(flat) do lo, hi, sum = math.min(lo, v), math.max(hi, v), sum + v end
      assert.is_true(lo >= -bound and hi <= bound, "outside the bound")
      -- spread over the whole interval, centred
      assert.is_true(hi > 0.8 * bound and lo < -0.8 * bound)
      assert.is_true(math.abs(sum / #flat) < 0.25 * bound)
    end
    assert.is_nil(nn.Linear(3, 2, { bias = false }).bias)
    assert.equal(1, #nn.Linear(3, 2, { bias = false }):parameters())
    assert.equal("bf16", nn.Linear(3, 2, { dtype = "bf16" }).weight.dtype)
    assert.truthy(errmsg(nn.Linear, 0, 2):find("in_features expected a positive integer", 1, true))
  end)

  it("Linear forward is x W^T + b", function()
    local lin = nn.Linear(4, 3, { dtype = "f64" })
    local x = R.rand({ 2, 5, 4 })
    local y = lin(f64(x)):totable()
    local W, b = lin.weight:totable(), lin.bias:totable()
    local expected = {}
    for i = 1, 2 do
      expected[i] = {}
      for t = 1, 5 do
        expected[i][t] = {}
        for j = 1, 3 do
          local s = b[j]
          for k = 1, 4 do s = s + x[i][t][k] * W[j][k] end
          expected[i][t][j] = s
        end
      end
    end
    R.assert_close(y, expected, 1e-12, 1e-12)
    -- f32 agrees to f32 precision
    local l32 = nn.Linear(4, 3)
    l32:load_state_dict({ weight = lin.weight:to("f32"), bias = lin.bias:to("f32") })
    R.assert_close(l32(loom.tensor(x)):totable(), expected, 1e-5, 1e-5)
  end)

  it("Linear backward by hand, on one row and on a batch", function()
    -- loss = sum(x W^T + b): dW[j][k] = sum over rows of x[k], db[j] = rows,
    -- dx[k] = sum_j W[j][k]
    for _, rows in ipairs { 1, 3 } do
      local lin = nn.Linear(3, 2, { dtype = "f64" })
      local xt = R.rand({ rows, 3 })
      local x = loom.tensor(xt, { dtype = "f64", requires_grad = true })
      lin(x):sum():backward()
      local W = lin.weight:totable()
      local dW, dx = {}, {}
      for j = 1, 2 do
        dW[j] = {}
        for k = 1, 3 do
          local s = 0
          for r = 1, rows do s = s + xt[r][k] end
          dW[j][k] = s
        end
      end
      for r = 1, rows do dx[r] = {} for k = 1, 3 do dx[r][k] = W[1][k] + W[2][k] end end
      R.assert_close(lin.weight.grad:totable(), dW, 1e-14, 1e-14)
      R.assert_close(lin.bias.grad:totable(), { rows, rows }, 1e-14, 1e-14)
      R.assert_close(x.grad:totable(), dx, 1e-14, 1e-14)
    end
  end)

  it("Embedding looks up 1-based ids", function()
    local e = nn.Embedding(4, 3)
    assert.same({ 4, 3 }, e.weight:size())
    local W = e.weight:totable()
    local out = e(loom.tensor({ { 1, 4 }, { 2, 1 } }, { dtype = "i64" })):totable()
    assert.same({ { W[1], W[4] }, { W[2], W[1] } }, out)
    assert.truthy(not pcall(e, loom.tensor({ 5 }, { dtype = "i64" })))
    assert.truthy(errmsg(e, loom.tensor({ 1 })):find("integer ids", 1, true))
  end)

  it("LayerNorm and RMSNorm against f64 loops", function()
    local x = R.rand({ 3, 6 }, -2, 2)
    local w, b = R.rand({ 6 }), R.rand({ 6 })
    local ln = nn.LayerNorm(6, { dtype = "f64", eps = 1e-5 })
    ln:load_state_dict({ weight = f64(w), bias = f64(b) })
    local rms = nn.RMSNorm(6, { dtype = "f64", eps = 1e-6 })
    rms:load_state_dict({ weight = f64(w) })
    local el, er = {}, {}
    for i = 1, 3 do
      local mean, sq = 0, 0
      for j = 1, 6 do mean, sq = mean + x[i][j] / 6, sq + x[i][j] ^ 2 / 6 end
      local var = 0
      for j = 1, 6 do var = var + (x[i][j] - mean) ^ 2 / 6 end
      el[i], er[i] = {}, {}
      for j = 1, 6 do
        el[i][j] = (x[i][j] - mean) / math.sqrt(var + 1e-5) * w[j] + b[j]
        er[i][j] = x[i][j] / math.sqrt(sq + 1e-6) * w[j]
      end
    end
    R.assert_close(ln(f64(x)):totable(), el, 1e-10, 1e-10)
    R.assert_close(rms(f64(x)):totable(), er, 1e-10, 1e-10)
    -- defaults: LayerNorm weight 1 bias 0, RMSNorm weight 1
    assert.same({ 1, 1 }, nn.LayerNorm(2).weight:totable())
    assert.same({ 0, 0 }, nn.LayerNorm(2).bias:totable())
    assert.is_nil(nn.LayerNorm(2, { bias = false }).bias)
    assert.same({ 1, 1 }, nn.RMSNorm(2).weight:totable())
  end)

  it("Dropout: zeroes a fraction p in training, scales by 1/(1-p), identity in eval", function()
    loom.manual_seed(3)
    local p = 0.3
    local d = nn.Dropout(p)
    local x = loom.full({ 100, 100 }, 2)
    local y = R.flat(d(x):totable())
    local kept = 0
    local scaled = R.f32(2 * R.f32(1 / (1 - p)))
    for _, v in ipairs(y) do
      if v ~= 0 then
        kept = kept + 1
        assert.is_true(math.abs(v - scaled) <= 1e-6 * scaled, "kept value " .. v)
      end
    end
    -- 10000 Bernoulli(0.7) draws: 7000 +- 46 (sd); allow 5 sd
    assert.is_true(math.abs(kept - 7000) < 230, "kept " .. kept)
    -- the mean is preserved in expectation
    d:eval()
    assert.same(x:totable(), d(x):totable())
    assert.same({ 0, 0 }, nn.Dropout(1)(loom.ones(2)):totable())
    assert.same({ 1, 1 }, nn.Dropout(0)(loom.ones(2)):totable())
    assert.truthy(errmsg(nn.Dropout, 1.5):find("p expected a probability", 1, true))
  end)

  it("ReLU, GELU and SiLU modules", function()
    local x = { -2, -0.5, 0, 0.7, 3 }
    local function ref(f) local o = {} for i, v in ipairs(x) do o[i] = f(v) end return o end
    R.assert_close(nn.ReLU()(f64(x)):totable(), ref(function(v) return math.max(v, 0) end), 0, 0)
    R.assert_close(nn.GELU()(f64(x)):totable(), ref(R.gelu), 1e-12, 1e-12)
    R.assert_close(nn.GELU({ approximate = "tanh" })(f64(x)):totable(), ref(R.gelu_tanh), 1e-12, 1e-12)
    R.assert_close(nn.SiLU()(f64(x)):totable(), ref(R.silu), 1e-12, 1e-12)
  end)

  it("Sequential chains its children, named 1, 2, ...", function()
    local s = nn.Sequential(nn.Linear(3, 4, { dtype = "f64" }), nn.ReLU(), nn.Linear(4, 2, { dtype = "f64" }))
    assert.equal(3, s:len())
    assert.same({ "1", "2", "3" }, names(s:named_children()))
    assert.same({ "1.weight", "1.bias", "3.weight", "3.bias" }, names(s:named_parameters()))
    local x = f64(R.rand({ 2, 3 }))
    R.assert_equal(s(x):totable(), s[3](s[2](s[1](x))):totable())
  end)

  it("ModuleList indexes 1-based and appends", function()
    local l = nn.ModuleList({ nn.ReLU(), nn.SiLU() })
    assert.equal(2, l:len())
    assert.equal("SiLU", l[2].__name)
    assert.equal(l[1], l:at(1))
    l:append(nn.GELU())
    assert.equal(3, l:len())
    local seen = {}
    for i, m in l:ipairs() do seen[i] = m.__name end
    assert.same({ "ReLU", "SiLU", "GELU" }, seen)
    assert.same({ "", "1", "2", "3" }, names(l:named_modules()))
    assert.is_nil(l[4])
  end)
end)
