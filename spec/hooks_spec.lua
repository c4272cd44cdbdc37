-- hooks_spec.lua: p:register_grad_ready_hook(fn), the hook data parallelism
-- uses to start a gradient's all-reduce while backward goes on: called
-- once per leaf per backward, when that leaf's gradient is complete, in the
-- order the backward pass finishes the leaves.
local loom = require("loom")
local R = require("support.ref")
local hooks = require("loom.autograd_hooks")

local function f64(t, rg) return loom.tensor(t, { dtype = "f64", requires_grad = rg }) end

describe("register_grad_ready_hook", function()
  after_each(function() assert.equal(0, hooks.count()) end)

  it("fires once per backward, with the leaf's complete gradient", function()
    -- w is used by two branches, so its gradient is the sum of two parts
    local w = f64({ 1, 2, 3 }, true)
    local a, b = f64({ 0.5, -1, 2 }), f64({ 4, 0.25, -3 })
    local calls, seen = 0, nil
    local h = w:register_grad_ready_hook(function(p)
      calls = calls + 1
      assert.equal(w, p)
      seen = p.grad:totable()
    end)
    local loss = (w * a):sum() + ((w * b) * 2):sum()
    loss:backward()
    assert.equal(1, calls)
    -- d/dw = a + 2 b, by hand
    assert.same({ 0.5 + 8, -1 + 0.5, 2 - 6 }, seen)
    -- a second backward accumulates; the hook sees the accumulated value
    ;((w * a):sum()):backward()
    assert.equal(2, calls)
    assert.same({ 0.5 + 8 + 0.5, -1 + 0.5 - 1, 2 - 6 + 2 }, seen)
    h:remove()
    ;((w * a):sum()):backward()
    assert.equal(2, calls)
  end)

  it("lives as long as its tensor: a dropped parameter with a hook is freed, and the hook with it", function()
    -- (the registry held the tensor: replicate()'s hooks kept a dropped model alive)
    local alive = setmetatable({}, { __mode = "v" })
    do
      local w = f64({ 1, 2, 3 }, true)
      alive[1] = w
      w:register_grad_ready_hook(function() end)   -- never removed
      assert.equal(1, hooks.count())
    end
    collectgarbage() collectgarbage()
    assert.is_nil(alive[1])
    -- the entry goes at the next backward; a new tensor (perhaps at the same
    -- address) gets no stale hook
    local calls = 0
    local v = f64({ 1, 2, 3 }, true)
    v:register_grad_ready_hook(function() calls = calls + 1 end):remove()
    ;(v * 2):sum():backward()
    assert.equal(0, calls)
    assert.equal(0, hooks.count())
  end)

  it("follows the backward pass: later layers' leaves are ready first", function()
    local x = f64(R.rand({ 2, 3 }))
    local w1, b1 = f64(R.rand({ 3, 4 }), true), f64(R.rand({ 4 }), true)
    local w2, b2 = f64(R.rand({ 4, 2 }), true), f64(R.rand({ 2 }), true)
    local order, handles = {}, {}
    local grads_at_call = {}
    for name, p in pairs { w1 = w1, b1 = b1, w2 = w2, b2 = b2 } do
      handles[#handles + 1] = p:register_grad_ready_hook(function(t)
        order[#order + 1] = name
        grads_at_call[name] = t.grad:totable()
      end)
    end
    local h = (x:matmul(w1) + b1):tanh()
    local y = h:matmul(w2) + b2
    y:sum():backward()
    assert.equal(4, #order)
    -- layer 2's parameters both come before layer 1's
    local pos = {}
    for i, n in ipairs(order) do pos[n] = i end
    assert.is_true(math.max(pos.w2, pos.b2) < math.min(pos.w1, pos.b1), table.concat(order, " "))
    -- and each saw its final gradient
    for name, p in pairs { w1 = w1, b1 = b1, w2 = w2, b2 = b2 } do
      R.assert_equal(grads_at_call[name], p.grad:totable())
    end
    -- b2's gradient is, by hand, the column sums of ones: {2, 2}
    assert.same({ 2, 2 }, grads_at_call.b2)
    for _, hd in ipairs(handles) do hd:remove() end
  end)

  it("runs every hook of a leaf in registration order; removal is per handle", function()
    local w = f64({ 1, 2 }, true)
    local log = {}
    local h1 = w:register_grad_ready_hook(function() log[#log + 1] = "a" end)
    local h2 = w:register_grad_ready_hook(function() log[#log + 1] = "b" end)
    assert.equal(2, hooks.count())
    ;(w * w):sum():backward()
    assert.same({ "a", "b" }, log)
    h1:remove()
    h1:remove()
    assert.equal(1, hooks.count())
    ;(w * w):sum():backward()
    assert.same({ "a", "b", "b" }, log)
    h2:remove()
  end)

  it("fires for a leaf that is the root of backward, and not for other tensors", function()
    local w = f64({ 1, 2 }, true)
    local other = f64({ 3 }, true)
    local calls = 0
    local h = w:register_grad_ready_hook(function() calls = calls + 1 end)
    w:backward(f64({ 1, 1 }))
    assert.equal(1, calls)
    ;(other * 2):sum():backward()
    assert.equal(1, calls)
    h:remove()
  end)

  it("re-raises a hook's error from backward, and backward works afterwards", function()
    local w = f64({ 1, 2 }, true)
    local h = w:register_grad_ready_hook(function() error("hook failed on purpose") end)
    local ok, err = pcall(function() (w * 3):sum():backward() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("hook failed on purpose", 1, true))
    assert.same({ 3, 3 }, w.grad:totable())   -- the pass itself completed
    h:remove()
    w:zero_grad()
    ;(w * 3):sum():backward()
    assert.same({ 3, 3 }, w.grad:totable())
  end)

  it("checks its arguments", function()
    local w = f64({ 1 }, true)
    local ok, err = pcall(w.register_grad_ready_hook, w, 42)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("fn expected a function", 1, true))
    ok, err = pcall(function() return (w * 2):register_grad_ready_hook(function() end) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("a non-leaf tensor", 1, true))
    ok, err = pcall(function() return f64({ 1 }):register_grad_ready_hook(function() end) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("does not require grad", 1, true))
  end)

  it("sees module parameters through a training step", function()
    local nn = loom.nn
    local m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    local ready, handles = {}, {}
    for _, kv in ipairs(m:named_parameters()) do
      handles[#handles + 1] = kv[2]:register_grad_ready_hook(function() ready[#ready + 1] = kv[1] end)
    end
    m(loom.randn({ 5, 3 })):sum():backward()
    table.sort(ready)
    assert.same({ "1.bias", "1.weight", "3.bias", "3.weight" }, ready)
    for _, hd in ipairs(handles) do hd:remove() end
  end)
end)
