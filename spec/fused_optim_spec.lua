-- fused_optim_spec.lua: AdamW over all parameters in one call. The
-- _adamw_multi_ op (4 tensors per parameter) against one _adamw_ call per
-- parameter (the same kernel: equal bits) and against torch's rule written
-- with basic ops in f64 (tolerance 1e-12); AdamW:step() makes one call per
-- 64 parameters and per step count, keeps bf16 master weights, and gets
-- the same result as per-parameter updates; argument errors name the
-- parameter. (optim_spec checks AdamW's rule over several steps.)
local loom, X = require("loom"), require("support.fused")
local R = require("support.ref")

local H = { 1e-2, 0.9, 0.95, 1e-8, 0.1 }

-- hyperparameters of step t
local function hyper(t) return { H[1], H[2], H[3], H[4], H[5], 1 - H[2] ^ t, 1 - H[3] ^ t } end

-- param, grad, exp_avg, exp_avg_sq of shape in dtype (moments from an earlier step)
local function quad(seed, shape, dtype)
  local p, g = X.rand(seed, shape, dtype), X.rand(seed + 1, shape, dtype)
  local m, v = X.rand(seed + 2, shape, dtype, 0.1), X.rand(seed + 3, shape, dtype, 0.1):abs()
  return { p, g, m, v }
end

local function clones(list)
  local c = {}
  for i, t in ipairs(list) do c[i] = t:clone() end
  return c
end

describe("_adamw_multi_", function()
  local shapes = { { 7, 13 }, { 300 }, { 3, 5, 2 }, { 1 }, { 257, 300 } }

  it("updates every parameter as _adamw_ does, one call, f32 and f64 parameters mixed", function()
    local list = {}
    for k, s in ipairs(shapes) do
      for _, t in ipairs(quad(10 * k, s, k % 2 == 0 and "f32" or "f64")) do list[#list + 1] = t end
    end
    local each = clones(list)
    local n = X.calls({ "_adamw_multi_", "_adamw_" }, function() loom.op("_adamw_multi_", list, nil, hyper(3)) end)
    assert.are.same({ _adamw_multi_ = 1, _adamw_ = 0 }, n)
    for k = 1, #each, 4 do loom.op("_adamw_", { each[k], each[k + 1], each[k + 2], each[k + 3] }, nil, hyper(3)) end
    for i = 1, #list do assert.are.same(each[i]:totable(), list[i]:totable(), "tensor " .. i) end
  end)

  it("follows torch's AdamW rule (basic ops, f64)", function()
    local list = quad(60, { 4, 9 }, "f64")
    local p, g, m, v = list[1]:clone(), list[2], list[3]:clone(), list[4]:clone()
    loom.op("_adamw_multi_", list, nil, hyper(5))
    local h = hyper(5)
    m = m * H[2] + g * (1 - H[2])
    v = v * H[3] + g * g * (1 - H[3])
    p = p * (1 - H[1] * H[5]) - m / h[6] * H[1] / ((v / h[7]):sqrt() + H[4])
    X.close(list[1], p, 1e-12, "param")
    X.close(list[3], m, 1e-12, "exp_avg")
    X.close(list[4], v, 1e-12, "exp_avg_sq")
  end)

  it("checks every group before updating any, naming the parameter", function()
    local a, b = quad(70, { 3 }, "f32"), quad(80, { 4 }, "f32")
    local before = a[1]:totable()
    b[2] = X.rand(90, { 5 }, "f32")
    local msg = R.errmsg(function() loom.op("_adamw_multi_", { a[1], a[2], a[3], a[4], b[1], b[2], b[3], b[4] }, nil, hyper(1)) end)
    assert.is_truthy(msg:find("_adamw_multi_: argument #6 (grad of parameter 2) expected the parameter's shape", 1, true), msg)
    assert.are.same(before, a[1]:totable())
    msg = R.errmsg(function() loom.op("_adamw_multi_", { a[1], a[2], a[3] }, nil, hyper(1)) end)
    assert.is_truthy(msg:find("expected 4 tensors per parameter", 1, true), msg)
    msg = R.errmsg(function() loom.op("_adamw_multi_", { a[1]:to("bf16"), a[2], a[3], a[4] }, nil, hyper(1)) end)
    assert.is_truthy(msg:find("argument #1 (param of parameter 1) expected f32 or f64, got bf16", 1, true), msg)
  end)
end)

describe("AdamW:step() in one call", function()
  -- n parameters of varied shapes and dtype, gradients set
  local function model(n, dtype, seed)
    local ps = {}
    for i = 1, n do
      ps[i] = X.leaf(seed + i, { 1 + i % 5, 3 + i % 7 }, dtype)
      ps[i].grad = X.rand(seed + 1000 + i, ps[i]:size(), dtype)
    end
    return ps
  end

  local function per_param(ps, opt)   -- the old way: one _adamw_ per parameter
    loom.no_grad(function()
      for i, p in ipairs(ps) do
        local s = opt:_state(i, p)
        s.step = s.step + 1
        local master = s.master or p
        loom.op("_adamw_", { master, p.grad:to(master.dtype):contiguous(), s.exp_avg, s.exp_avg_sq }, nil,
                { 1e-3, 0.9, 0.999, 1e-8, 1e-2, 1 - 0.9 ^ s.step, 1 - 0.999 ^ s.step })
        if s.master then p:copy_(s.master) end
      end
    end)
  end

  for _, case in ipairs { { 39, 1 }, { 70, 2 } } do
    local n, calls = case[1], case[2]
    it(n .. " parameters: " .. calls .. " call(s), equal to per-parameter updates, over 2 steps", function()
      local ps, qs = model(n, "f32", 0), model(n, "f32", 0)
      local opt, ref = loom.optim.AdamW(ps), loom.optim.AdamW(qs)
      for _ = 1, 2 do
        local k = X.calls({ "_adamw_multi_", "_adamw_" }, function() opt:step() end)
        assert.are.same({ _adamw_multi_ = calls, _adamw_ = 0 }, k)
        per_param(qs, ref)
      end
      for i = 1, n do assert.are.same(qs[i]:totable(), ps[i]:totable(), "parameter " .. i) end
    end)
  end

  it("groups parameters by their step count; bf16 parameters keep an f32 master", function()
    local ps, qs = model(5, "bf16", 200), model(5, "bf16", 200)
    local opt, ref = loom.optim.AdamW(ps), loom.optim.AdamW(qs)
    opt:step()
    per_param(qs, ref)
    local g3 = ps[3].grad
    ps[3].grad, qs[3].grad = nil, nil   -- parameter 3 misses step 2
    opt:step()
    local q = { qs[1], qs[2], qs[4], qs[5] }
    local r2 = loom.optim.AdamW(q)
    r2.state = { ref.state[1], ref.state[2], ref.state[4], ref.state[5] }
    per_param(q, r2)
    ps[3].grad, qs[3].grad = g3, g3
    local k = X.calls({ "_adamw_multi_" }, function() opt:step() end)
    assert.are.equal(2, k._adamw_multi_)   -- step counts 3 and 2
    r2.state = { ref.state[1], ref.state[2], ref.state[4], ref.state[5] }
    per_param(q, r2)
    per_param({ qs[3] }, setmetatable({ state = { ref.state[3] } }, { __index = ref }))
    for i = 1, 5 do
      assert.are.equal("bf16", ps[i].dtype)
      assert.are.same(qs[i]:totable(), ps[i]:totable(), "parameter " .. i)
      assert.are.same(ref.state[i].master:totable(), opt.state[i].master:totable(), "master " .. i)
    end
    assert.are.same({ 3, 3, 2, 3, 3 }, { opt.state[1].step, opt.state[2].step, opt.state[3].step,
                                         opt.state[4].step, opt.state[5].step })
  end)
end)
