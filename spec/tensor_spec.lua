-- tensor_spec.lua: creation, dtypes, views, item/totable, printing,
-- lifetime and the counter-based RNG, checked against hand-computed values.
local loom = require("loom")
local R = require("support.ref")
local sys = require("support.sys")

local function same_storage(a, b) return a.storage == b.storage end
-- strides in elements, read from the lm_tensor fields
local function strides(x)
  local s = {}
  for k = 0, x.ndim - 1 do s[k + 1] = tonumber(x.stride_[k]) end
  return s
end

describe("tensor creation", function()
  it("builds a tensor from a nested table", function()
    local x = loom.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.same({ 2, 3 }, x:size())
    assert.equal(2, x:dim())
    assert.equal(6, x:numel())
    assert.equal("f32", x.dtype)
    assert.equal("cpu", x.device)
    assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, x:totable())
    assert.same({ 3, 1 }, strides(x))
    assert.is_true(x:is_contiguous())
  end)

  it("builds 1-D, 3-D and 0-dim tensors", function()
    assert.same({ 3 }, loom.tensor({ 1, 2, 3 }):size())
    local t3 = loom.tensor({ { { 1 }, { 2 } }, { { 3 }, { 4 } } })
    assert.same({ 2, 2, 1 }, t3:size())
    assert.same({ { { 1 }, { 2 } }, { { 3 }, { 4 } } }, t3:totable())
    local s = loom.tensor(3.5)
    assert.equal(0, s:dim())
    assert.same({}, s:size())
    assert.equal(1, s:numel())
    assert.equal(3.5, s:item())
  end)

  it("builds a bool tensor from booleans", function()
    local b = loom.tensor({ { true, false }, { false, true } })
    assert.equal("bool", b.dtype)
    assert.same({ { true, false }, { false, true } }, b:totable())
    assert.equal(true, b:narrow(1, 1, 1):narrow(2, 1, 1):item())
  end)

  it("honours dtype, device and requires_grad options", function()
    local x = loom.tensor({ 1, 2 }, { dtype = "f64", device = "cpu", requires_grad = true })
    assert.equal("f64", x.dtype)
    assert.equal("cpu", x.device)
    assert.is_true(x.requires_grad)
    assert.is_true(x.is_leaf)
    local y = loom.tensor({ 1, 2 })
    assert.is_false(y.requires_grad)
    local z = loom.zeros({ 2, 2 }, { dtype = "i32" })
    assert.equal("i32", z.dtype)
    local w = loom.ones(3, { requires_grad = true })
    assert.is_true(w.requires_grad)
  end)

  it("rejects a ragged table", function()
    local ok, err = pcall(loom.tensor, { { 1, 2 }, { 3 } })
    assert.is_false(ok)
    assert.truthy(err:find("rectangular"))
  end)

  it("zeros, ones, full with sizes as varargs or a table", function()
    assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, loom.zeros(2, 3):totable())
    assert.same({ { 1, 1 }, { 1, 1 }, { 1, 1 } }, loom.ones({ 3, 2 }):totable())
    assert.same({ { 7.5, 7.5 } }, loom.full({ 1, 2 }, 7.5):totable())
    assert.same({ 4, 4 }, loom.full(2, 4):totable())
    assert.same({ true, true }, loom.full({ 2 }, true, { dtype = "bool" }):totable())
    assert.equal("bf16", loom.zeros({ 2, 3 }, { dtype = "bf16" }).dtype)
    assert.same({ 0, 5 }, loom.zeros(0, 5):size())
    assert.equal(0, loom.zeros(0, 5):numel())
  end)

  it("empty has the right shape and dtype", function()
    local e = loom.empty(4, 5, { dtype = "f64" })
    assert.same({ 4, 5 }, e:size())
    assert.equal("f64", e.dtype)
    assert.same({ 5, 1 }, strides(e))
  end)

  it("arange follows PyTorch (stop exclusive, fractional steps, negative steps)", function()
    assert.same({ 0, 1, 2, 3, 4 }, loom.arange(5):totable())
    assert.same({ 2, 3, 4 }, loom.arange(2, 5):totable())
    assert.same({ 1, 3, 5 }, loom.arange(1, 6, 2):totable())
    assert.same({ 1, 3 }, loom.arange(1, 5, 2):totable())
    assert.same({ 5, 4, 3 }, loom.arange(5, 2, -1):totable())
    R.assert_close(loom.arange(0, 1, 0.25, { dtype = "f64" }):totable(), { 0, 0.25, 0.5, 0.75 }, 0, 1e-15)
    assert.equal("i64", loom.arange(3, { dtype = "i64" }).dtype)
    assert.same({ 0 }, loom.arange(0, 0):size())
  end)

  it("rand, randn and randint have the requested shape, dtype and range", function()
    local u = loom.rand(50, 40)
    assert.same({ 50, 40 }, u:size())
    assert.equal("f32", u.dtype)
    for _, v in ipairs(R.flat(u:totable())) do assert.is_true(v >= 0 and v < 1) end
    local n = loom.randn({ 3, 4 }, { dtype = "f64" })
    assert.same({ 3, 4 }, n:size())
    assert.equal("f64", n.dtype)
    local r = loom.randint(-3, 4, { 2000 })
    assert.equal("i64", r.dtype)
    local seen = {}
    for _, v in ipairs(r:totable()) do
      assert.is_true(v >= -3 and v < 4 and v == math.floor(v))
      seen[v] = true
    end
    for v = -3, 3 do assert.is_true(seen[v], "randint never drew " .. v) end
    assert.equal("i32", loom.randint(0, 10, 5, { dtype = "i32" }).dtype)
  end)
end)

describe("dtypes", function()
  local ints = { 0, 1, -1, 7, -123, 250 }

  for _, dt in ipairs { "f32", "f64", "bf16", "f16", "i32", "i64" } do
    it("round trips small integers through " .. dt, function()
      local x = loom.tensor(ints, { dtype = dt })
      assert.equal(dt, x.dtype)
      assert.same(ints, x:totable())
      assert.same(ints, x:to("f64"):to(dt):totable())
    end)
  end

  it("f64 keeps full precision, f32 rounds to single", function()
    local v = 0.1
    assert.equal(0.1, loom.tensor({ v }, { dtype = "f64" }):totable()[1])
    local f = loom.tensor({ v }):totable()[1]
    assert.equal(0.100000001490116119384765625, f)
    assert.equal(16777216, loom.tensor({ 16777217 }):item()) -- 2^24 + 1 is not an f32
  end)

  it("bf16 rounds to nearest even with 8 significant bits", function()
    local x = loom.tensor({ 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, 3.14159, 0.1, -2.5, 1 + 2 ^ -7 }, { dtype = "bf16" })
    assert.same({ 1, 1 + 2 * 2 ^ -7, 3.140625, 0.10009765625, -2.5, 1 + 2 ^ -7 }, x:totable())
    assert.same({ 1, 1 + 2 * 2 ^ -7 }, loom.tensor({ 1 + 2 ^ -8, 1 + 3 * 2 ^ -8 }):to("bf16"):totable())
  end)

  it("f16 rounds to nearest even with 11 significant bits and overflows to inf", function()
    local x = loom.tensor({ 1 + 2 ^ -11, 1 / 3, 0.1, 65504, 65520, -70000, 2 ^ -24 }, { dtype = "f16" })
    assert.same({ 1, 0.333251953125, 0.0999755859375, 65504, math.huge, -math.huge, 2 ^ -24 }, x:totable())
  end)

  it("i32 and i64 hold their extremes", function()
    assert.same({ 2147483647, -2147483648 }, loom.tensor({ 2147483647, -2147483648 }, { dtype = "i32" }):totable())
    local big = 2 ^ 53
    assert.same({ big, -big }, loom.tensor({ big, -big }, { dtype = "i64" }):totable())
  end)

  it("to() converts floats to ints by truncation and anything to bool by != 0", function()
    local x = loom.tensor({ 2.7, -2.7, 0.5, 0, -0.0, 3 }, { dtype = "f64" })
    assert.same({ 2, -2, 0, 0, 0, 3 }, x:to("i32"):totable())
    assert.same({ 2, -2, 0, 0, 0, 3 }, x:to("i64"):totable())
    assert.same({ true, true, true, false, false, true }, x:to("bool"):totable())
    assert.same({ 1, 0 }, loom.tensor({ true, false }):to("f32"):totable())
    assert.equal("f64", x:to({ dtype = "f64" }).dtype)
    assert.equal("f64", loom.tensor({ 1 }):double().dtype)
    assert.equal("i64", loom.tensor({ 1 }):long().dtype)
  end)

  it("to() with the same dtype or the cpu device keeps the tensor", function()
    local x = loom.tensor({ 1, 2 })
    assert.is_true(same_storage(x:to("f32"), x))
    assert.is_true(same_storage(x:to("cpu"), x))
    assert.is_false(same_storage(x:to("f64"), x))
  end)
end)

describe("views", function()
  local function m34() return loom.arange(12):view(3, 4) end

  it("view shares storage and reshapes", function()
    local x = loom.arange(6)
    local v = x:view(2, 3)
    assert.same({ { 0, 1, 2 }, { 3, 4, 5 } }, v:totable())
    assert.is_true(same_storage(x, v))
    assert.same({ { 0, 1 }, { 2, 3 }, { 4, 5 } }, x:view({ 3, 2 }):totable())
    assert.same({ 2, 3 }, x:view(-1, 3):size())
    assert.same({ 6, 1 }, x:view(6, -1):size())
    v:fill_(9)
    assert.same({ 9, 9, 9, 9, 9, 9 }, x:totable())
  end)

  it("view of a transposed tensor fails, reshape copies it", function()
    local t = m34():t()
    assert.is_false(t:is_contiguous())
    local ok, err = pcall(t.view, t, 12)
    assert.is_false(ok)
    assert.truthy(err:find("contiguous"))
    local r = t:reshape(-1)
    assert.same({ 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11 }, r:totable())
    assert.is_false(same_storage(r, t))
    local r2 = m34():reshape(2, -1)
    assert.same({ 2, 6 }, r2:size())
  end)

  it("view of a narrowed tensor works when strides allow it", function()
    local x = loom.arange(24):view(4, 6):narrow(1, 2, 2) -- rows 2..3, contiguous block
    local v = x:view(3, 4)
    assert.same({ { 6, 7, 8, 9 }, { 10, 11, 12, 13 }, { 14, 15, 16, 17 } }, v:totable())
  end)

  it("transpose, t and permute swap sizes and strides", function()
    local x = m34()
    local t = x:t()
    assert.same({ 4, 3 }, t:size())
    assert.same({ 1, 4 }, strides(t))
    assert.same(R.transpose(x:totable()), t:totable())
    assert.same(t:totable(), x:transpose(1, 2):totable())
    assert.same(t:totable(), x:transpose(-1, -2):totable())
    local y = loom.arange(24):view(2, 3, 4)
    local p = y:permute(3, 1, 2)
    assert.same({ 4, 2, 3 }, p:size())
    local yt = y:totable()
    for i = 1, 4 do for j = 1, 2 do for k = 1, 3 do
      assert.equal(yt[j][k][i], p:totable()[i][j][k])
    end end end
    assert.same(p:totable(), y:permute({ -1, 1, 2 }):totable())
    assert.same({ 5 }, loom.arange(5):t():size())
  end)

  it("narrow is 1-based and shares storage", function()
    local x = m34()
    assert.same({ { 4, 5, 6, 7 }, { 8, 9, 10, 11 } }, x:narrow(1, 2, 2):totable())
    assert.same({ { 1, 2 }, { 5, 6 }, { 9, 10 } }, x:narrow(2, 2, 2):totable())
    assert.same({ { 3 }, { 7 }, { 11 } }, x:narrow(-1, 4, 1):totable())
    assert.same({ 3, 0 }, x:narrow(2, 5, 0):size())
    assert.is_true(same_storage(x, x:narrow(1, 2, 1)))
  end)

  it("select drops the dim", function()
    local x = m34()
    assert.same({ 4, 5, 6, 7 }, x:select(1, 2):totable())
    assert.same({ 2, 6, 10 }, x:select(2, 3):totable())
    assert.same({ 3, 7, 11 }, x:select(-1, 4):totable())
  end)

  it("expand repeats size-1 dims with stride 0 and adds leading dims", function()
    local c = loom.tensor({ { 1 }, { 2 } })
    local e = c:expand(2, 3)
    assert.same({ { 1, 1, 1 }, { 2, 2, 2 } }, e:totable())
    assert.same({ 1, 0 }, strides(e))
    local e2 = loom.tensor({ 1, 2, 3 }):expand(2, -1)
    assert.same({ { 1, 2, 3 }, { 1, 2, 3 } }, e2:totable())
    local e3 = c:expand({ 2, 2, 4 })
    assert.same({ 2, 2, 4 }, e3:size())
    assert.same({ 0, 1, 0 }, strides(e3))
    assert.same({ 2, 2, 2, 2 }, e3:totable()[2][2])
    local r = loom.tensor({ 1, 2, 3 })
    assert.same({ { 1, 2, 3 }, { 1, 2, 3 } }, r:expand_as(loom.zeros(2, 3)):totable())
  end)

  it("contiguous copies only non-contiguous tensors", function()
    local x = m34()
    assert.is_true(same_storage(x:contiguous(), x))
    local t = x:t()
    local c = t:contiguous()
    assert.is_true(c:is_contiguous())
    assert.is_false(same_storage(c, t))
    assert.same(t:totable(), c:totable())
    assert.same({ 3, 1 }, strides(c))
    local e = loom.tensor({ { 1 }, { 2 } }):expand(2, 3):contiguous()
    assert.same({ 3, 1 }, strides(e))
    assert.same({ { 1, 1, 1 }, { 2, 2, 2 } }, e:totable())
  end)

  it("clone is a deep copy", function()
    local x = m34()
    local c = x:clone()
    assert.is_false(same_storage(x, c))
    c:fill_(0)
    assert.equal(11, x:totable()[3][4])
    assert.same(x:t():totable(), x:t():clone():totable())
  end)

  it("squeeze and unsqueeze", function()
    local x = loom.zeros(1, 3, 1, 2)
    assert.same({ 3, 2 }, x:squeeze():size())
    assert.same({ 3, 1, 2 }, x:squeeze(1):size())
    assert.same({ 1, 3, 2 }, x:squeeze(-2):size())
    assert.same({ 1, 3, 1, 2 }, x:squeeze(2):size()) -- size 3: unchanged
    local v = loom.tensor({ 1, 2, 3 })
    assert.same({ { 1, 2, 3 } }, v:unsqueeze(1):totable())
    assert.same({ { 1 }, { 2 }, { 3 } }, v:unsqueeze(2):totable())
    assert.same({ 3, 1 }, v:unsqueeze(-1):size())
    assert.same({ 1, 3 }, v:unsqueeze(-2):size())
    assert.is_true(same_storage(v, v:unsqueeze(1)))
  end)

  it("views of views keep offsets right", function()
    local x = loom.arange(60):view(3, 4, 5)
    local v = x:narrow(1, 2, 2):transpose(2, 3):narrow(2, 3, 2):select(3, 4)
    -- v[i][j] = x[1 + i][4][2 + j] (1-based), as computed by hand
    local xt = x:totable()
    assert.same({ { xt[2][4][3], xt[2][4][4] }, { xt[3][4][3], xt[3][4][4] } }, v:totable())
  end)
end)

describe("item and totable", function()
  it("item returns a number or a boolean", function()
    assert.equal(42, loom.tensor({ { 42 } }):item())
    assert.equal(-7, loom.tensor({ -7 }, { dtype = "i64" }):item())
    assert.equal(false, loom.tensor({ false }):item())
    assert.equal(1.5, loom.tensor(1.5, { dtype = "bf16" }):item())
  end)

  it("item on several elements is an error", function()
    local ok, err = pcall(function() return loom.zeros(2):item() end)
    assert.is_false(ok)
    assert.truthy(err:find("one element"))
  end)

  it("totable of a non-contiguous tensor follows logical order", function()
    local x = loom.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.same({ { 1, 4 }, { 2, 5 }, { 3, 6 } }, x:t():totable())
    assert.same({ 4, 5, 6 }, x:select(1, 2):totable())
  end)
end)

describe("tostring", function()
  it("prints values and a Torch7-style footer", function()
    local s = tostring(loom.tensor({ { 1, 2 }, { 3, 4 } }))
    assert.truthy(s:find("[loom.Tensor f32 cpu of size 2x2]", 1, true))
    local lines = {}
    for l in s:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(3, #lines)
    assert.truthy(lines[1]:find("1") and lines[1]:find("2"))
    assert.truthy(lines[2]:find("3") and lines[2]:find("4"))
  end)

  it("names dtype, device and size for every dtype", function()
    for _, dt in ipairs { "f32", "f64", "bf16", "f16", "i32", "i64", "bool" } do
      local s = tostring(loom.zeros({ 2, 3, 4 }, { dtype = dt }))
      assert.truthy(s:find("[loom.Tensor " .. dt .. " cpu of size 2x3x4]", 1, true), s)
    end
  end)

  it("prints fractions, booleans, scalars and empty tensors", function()
    local s = tostring(loom.tensor({ 0.5, -1.25 }))
    assert.truthy(s:find("0.5000", 1, true) and s:find("-1.2500", 1, true), s)
    local b = tostring(loom.tensor({ true, false }))
    assert.truthy(b:find("true") and b:find("false"), b)
    local sc = tostring(loom.tensor(3))
    assert.truthy(sc:find("3") and sc:find("scalar"), sc)
    local e = tostring(loom.zeros(0, 3))
    assert.truthy(e:find("0x3", 1, true), e)
  end)

  it("prints 3-D tensors by matrix with Torch7 headers", function()
    local s = tostring(loom.arange(8):view(2, 2, 2))
    assert.truthy(s:find("(1,.,.)", 1, true), s)
    assert.truthy(s:find("(2,.,.)", 1, true), s)
  end)

  it("summarises large tensors", function()
    local x = loom.arange(200 * 300):view(200, 300)
    local s = tostring(x)
    local n = 0
    for _ in s:gmatch("\n") do n = n + 1 end
    assert.is_true(n < 20, "too many lines: " .. n)
    assert.truthy(s:find("...", 1, true))
    assert.truthy(s:find("59999", 1, true))  -- the last element is shown
    assert.truthy(s:find("[loom.Tensor f32 cpu of size 200x300]", 1, true))
    assert.is_true(#s < 2000)
  end)
end)

describe("lifetime", function()
  -- full collections until the live storage count stops moving (a tensor
  -- freed by an earlier spec's finalizer may take more than two cycles).
  -- Compiled traces go first: a trace keeps the closures it ran, and an
  -- earlier spec's closures hold its tensors until LuaJIT flushes its
  -- traces, which it does when it likes (mid-test, the count would drop).
  local function settle()
    jit.flush()
    return require("support.retention").settled_storages()
  end

  it("storages are released after the GC runs", function()
    local start = settle()
    local alive = setmetatable({}, { __mode = "v" })
    do
      local xs = {}
      for i = 1, 50 do xs[i] = loom.rand(10, 10) + i alive[i] = xs[i] end
      local y = xs[1]:t():contiguous():view(-1)
      alive[51] = y
      assert.equal(100, y:numel())
      assert.is_true(tonumber(loom.C.lm_storage_count()) >= start + 50)
      xs, y = nil, nil   -- luacheck: ignore 311 (the slots could keep them alive past the block)
    end
    -- every one of them collected, and their storages freed
    assert.equal(start, settle())
    assert.is_nil(next(alive))
  end)

  it("free releases at once; views keep the storage alive", function()
    local start = settle()
    local x = loom.zeros(100)
    assert.equal(start + 1, tonumber(loom.C.lm_storage_count()))
    x:free()
    assert.equal(start, tonumber(loom.C.lm_storage_count()))
    local y = loom.arange(10)
    local v = y:narrow(1, 3, 2)
    y:free()
    assert.equal(start + 1, tonumber(loom.C.lm_storage_count()))
    assert.same({ 2, 3 }, v:totable())
    collectgarbage() collectgarbage() -- the f64 copy totable made
    assert.equal(start + 1, tonumber(loom.C.lm_storage_count()))
    v:free()
    assert.equal(start, tonumber(loom.C.lm_storage_count()))
  end)

  it("autograd graphs are released with their tensors", function()
    local start = settle()
    -- in a function, so no dead stack slot of this frame still holds a tensor
    local function train_once()
      local w = loom.rand({ 4, 4 }, { requires_grad = true })
      local y = (w:matmul(w) * 2):tanh():sum()
      y:backward()
      assert.truthy(w.grad)
    end
    train_once()
    collectgarbage() collectgarbage()
    assert.equal(start, tonumber(loom.C.lm_storage_count()))
  end)

  it("dead tensors are collected before they pile up past LOOM_GC_CAP_MB over the live bytes", function()
    -- a child with a 64 MiB allowance keeps 512 MiB live (never touched, so
    -- never resident) and drops 32 MiB tensors; it prints the peak bytes held
    local code = [[
      local loom = require("loom")
      local keep, peak = loom.empty(2 ^ 27), 0
      for _ = 1, 64 do
        local _ = loom.empty(2 ^ 23)
        peak = math.max(peak, tonumber(loom.C.lm_allocated_bytes()))
      end
      io.write(string.format("%d", peak / 2 ^ 20))
      keep:free()
    ]]
    local rc, out = sys.luajit(code, "LOOM_GC_CAP_MB=64")
    assert.equal(0, rc, out)
    local peak = tonumber(out)
    assert(peak, out)
    -- live 512 + the allowance 64 + one new 32 (doubling alone would let 512 of garbage pile up)
    assert.is_true(peak >= 512 + 32 and peak <= 512 + 64 + 32, "peak " .. out .. " MiB")
  end)

  it("allocated bytes are tracked", function()
    collectgarbage() collectgarbage()
    local before = tonumber(loom.C.lm_allocated_bytes())
    local x = loom.zeros({ 1000 }, { dtype = "f64" })
    assert.equal(before + 8000, tonumber(loom.C.lm_allocated_bytes()))
    x:free()
    assert.equal(before, tonumber(loom.C.lm_allocated_bytes()))
  end)
end)

describe("random numbers", function()
  it("manual_seed makes draws reproducible", function()
    loom.manual_seed(1234)
    local a, b = loom.rand(5):totable(), loom.randn(2, 3):totable()
    local c = loom.randint(0, 100, { 7 }):totable()
    loom.manual_seed(1234)
    assert.same(a, loom.rand(5):totable())
    assert.same(b, loom.randn(2, 3):totable())
    assert.same(c, loom.randint(0, 100, { 7 }):totable())
    loom.manual_seed(1235)
    assert.are_not.same(a, loom.rand(5):totable())   -- another seed, other draws
  end)

  it("successive draws differ", function()
    loom.manual_seed(3)
    local a, b = loom.rand(6):totable(), loom.rand(6):totable()
    assert.are_not.same(a, b)
  end)

  it("a 2-D randn equals itself drawn again", function()
    loom.manual_seed(99)
    local a = loom.randn(7, 5):totable()
    loom.manual_seed(99)
    assert.same(a, loom.randn(7, 5):totable())
    loom.manual_seed(99)
    assert.same(R.flat(a), loom.randn(35):totable()) -- element i uses counter i
  end)

  it("counters: rand(4) then rand(4) equals rand(8) split", function()
    loom.manual_seed(42)
    local a, b = loom.rand(4):totable(), loom.rand(4):totable()
    loom.manual_seed(42)
    local c = loom.rand(8):totable()
    assert.same(a, { c[1], c[2], c[3], c[4] })
    assert.same(b, { c[5], c[6], c[7], c[8] })
  end)

  it("the rng state can be saved and restored", function()
    loom.manual_seed(5)
    loom.rand(3)
    local st = loom.get_rng_state()
    local a = loom.rand(4):totable()
    loom.set_rng_state(st)
    assert.same(a, loom.rand(4):totable())
  end)

  it("uniform and normal moments lie within statistical bounds", function()
    loom.manual_seed(2024)
    local n = 200000
    local u = R.flat(loom.rand({ n }, { dtype = "f64" }):totable())
    local s, s2 = 0, 0
    for i = 1, n do s = s + u[i] s2 = s2 + u[i] * u[i] end
    local mean, var = s / n, s2 / n - (s / n) ^ 2
    -- 6 standard errors: sd(mean) = sqrt(1/12/n), sd(var) ~ sqrt(1/180/n)
    assert.is_true(math.abs(mean - 0.5) < 6 * math.sqrt(1 / 12 / n), "mean " .. mean)
    assert.is_true(math.abs(var - 1 / 12) < 6 * math.sqrt(1 / 180 / n), "var " .. var)
    local z = R.flat(loom.randn({ n }):totable())
    s, s2 = 0, 0
    for i = 1, n do s = s + z[i] s2 = s2 + z[i] * z[i] end
    mean, var = s / n, s2 / n - (s / n) ^ 2
    assert.is_true(math.abs(mean) < 6 / math.sqrt(n), "normal mean " .. mean)
    assert.is_true(math.abs(var - 1) < 6 * math.sqrt(2 / n), "normal var " .. var)
    -- about 68.3% within one sd
    local inside = 0
    for i = 1, n do if math.abs(z[i]) < 1 then inside = inside + 1 end end
    assert.is_true(math.abs(inside / n - 0.6827) < 0.01)
  end)
end)
