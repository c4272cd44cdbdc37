-- optim_spec.lua: SGD and AdamW against their update rules run in plain
-- Lua f64 (torch.optim's definitions), state_dict round trips, f32 master
-- weights for bf16 parameters, the cosine schedule and clip_grad_norm_,
-- all against hand or f64 values.
local loom = require("loom")
local R = require("support.ref")
local optim = loom.optim

R.seed(99)

local errmsg = R.errmsg

-- fixed per-step gradients (from the LCG) for parameters of `shapes`
local function grad_schedule(shapes, steps)
  local gs = {}
  for s = 1, steps do
    gs[s] = {}
    for i, sh in ipairs(shapes) do gs[s][i] = R.flat(R.rand(sh, -2, 2)) end
  end
  return gs
end

-- runs `steps` steps of opt on params, feeding the scheduled gradients
local function run(opt, params, gs, from, to)
  for s = from, to do
    for i, p in ipairs(params) do
      p.grad = loom.tensor(R.build(gs[s][i], p:size()), { dtype = p.dtype })
    end
    opt:step()
  end
end

-- plain-Lua SGD (torch.optim.SGD's rule) on flat lists
local function sgd_ref(p0, gs, o, steps)
  local ps, bufs = {}, {}
  for i, p in ipairs(p0) do ps[i] = { unpack(p) } end
  for s = 1, steps do
    for i, p in ipairs(ps) do
      for j = 1, #p do
        local d = gs[s][i][j] + (o.weight_decay or 0) * p[j]
        if (o.momentum or 0) ~= 0 then
          local b = bufs[i] and bufs[i][j]
          if b == nil then b = d else b = o.momentum * b + (1 - (o.dampening or 0)) * d end
          bufs[i] = bufs[i] or {}
          bufs[i][j] = b
          if o.nesterov then d = d + o.momentum * b else d = b end
        end
        p[j] = p[j] - o.lr * d
      end
    end
  end
  return ps
end

-- plain-Lua AdamW (torch.optim.AdamW's rule)
local function adamw_ref(p0, gs, o, steps, first)
  local ps, m, v = {}, {}, {}
  for i, p in ipairs(p0) do
    ps[i] = { unpack(p) }
    m[i], v[i] = {}, {}
    for j = 1, #p do m[i][j], v[i][j] = 0, 0 end
  end
  local b1, b2 = o.betas[1], o.betas[2]
  for s = first or 1, steps do
    for i, p in ipairs(ps) do
      for j = 1, #p do
        local g = gs[s][i][j]
        p[j] = p[j] * (1 - o.lr * o.weight_decay)
        m[i][j] = b1 * m[i][j] + (1 - b1) * g
        v[i][j] = b2 * v[i][j] + (1 - b2) * g * g
        local bc1, bc2 = 1 - b1 ^ s, 1 - b2 ^ s
        p[j] = p[j] - o.lr / bc1 * m[i][j] / (math.sqrt(v[i][j]) / math.sqrt(bc2) + o.eps)
      end
    end
  end
  return ps, m, v
end

local shapes = { { 2, 3 }, { 4 } }
local function make_params(dtype)
  local out, flat = {}, {}
  for i, sh in ipairs(shapes) do
    local t = R.rand(sh, -1, 1)
    flat[i] = R.flat(t)
    out[i] = loom.tensor(t, { dtype = dtype, requires_grad = true })
  end
  return out, flat
end
local function flat_of(params)
  local out = {}
  for i, p in ipairs(params) do out[i] = R.flat(p:to("f64"):totable()) end
  return out
end

describe("SGD", function()
  local cases = {
    { "plain", { lr = 0.1 } },
    { "momentum", { lr = 0.05, momentum = 0.9 } },
    { "momentum with dampening", { lr = 0.05, momentum = 0.8, dampening = 0.3 } },
    { "nesterov", { lr = 0.05, momentum = 0.9, nesterov = true } },
    { "weight decay", { lr = 0.1, weight_decay = 0.01 } },
    { "everything", { lr = 0.02, momentum = 0.7, nesterov = true, weight_decay = 0.05 } },
  }
  for _, c in ipairs(cases) do
    it(c[1] .. " over 5 steps matches the f64 rule", function()
      local gs = grad_schedule(shapes, 5)
      local params, p0 = make_params("f64")
      local opt = optim.SGD(params, c[2])
      run(opt, params, gs, 1, 5)
      R.assert_close(flat_of(params), sgd_ref(p0, gs, c[2], 5), 1e-13, 1e-13)
      -- f32 parameters follow to f32 precision
      local p32 = make_params("f32")
      for i, p in ipairs(p32) do loom.no_grad(function() p:copy_(loom.tensor(R.build(p0[i], shapes[i]))) end) end
      run(optim.SGD(p32, c[2]), p32, gs, 1, 5)
      R.assert_close(flat_of(p32), sgd_ref(p0, gs, c[2], 5), 1e-5, 1e-5)
    end)
  end

  it("one step by hand", function()
    -- p = 1, g = 0.5, wd 0.1: d = 0.6; momentum buffer starts at d; p = 1 - 0.1 * 0.6
    local p = loom.tensor({ 1 }, { dtype = "f64", requires_grad = true })
    local opt = optim.SGD({ p }, { lr = 0.1, momentum = 0.9, weight_decay = 0.1 })
    p.grad = loom.tensor({ 0.5 }, { dtype = "f64" })
    opt:step()
    R.assert_close(p:totable(), { 0.94 }, 1e-15, 1e-15)
    -- second step: d = 0.5 + 0.094 = 0.594; buf = 0.9 * 0.6 + 0.594 = 1.134
    opt:step()
    R.assert_close(p:totable(), { 0.94 - 0.1 * 1.134 }, 1e-15, 1e-15)
  end)

  it("skips parameters without a gradient; zero_grad clears them", function()
    local a = loom.tensor({ 1 }, { dtype = "f64", requires_grad = true })
    local b = loom.tensor({ 2 }, { dtype = "f64", requires_grad = true })
    local opt = optim.SGD({ a, b }, { lr = 1 })
    a.grad = loom.tensor({ 0.25 }, { dtype = "f64" })
    opt:step()
    assert.same({ 0.75 }, a:totable())
    assert.same({ 2 }, b:totable())
    opt:zero_grad()
    assert.is_nil(a.grad)
  end)

  it("checks its options", function()
    local p = loom.tensor({ 1 }, { requires_grad = true })
    assert.truthy(errmsg(optim.SGD, { p }, { lr = 0.1, nesterov = true }):find("nesterov needs momentum", 1, true))
    assert.truthy(errmsg(optim.SGD, { p }, { lr = "x" }):find("lr expected a number", 1, true))
    assert.truthy(errmsg(optim.SGD, { p }, { lr = 0.1, mommentum = 0.9 }):find('unknown option "mommentum"', 1, true))
    assert.truthy(errmsg(optim.SGD, {}, {}):find("params expected a non-empty table", 1, true))
  end)

  it("state_dict round trip continues identically", function()
    local o = { lr = 0.05, momentum = 0.9, nesterov = true }
    local gs = grad_schedule(shapes, 6)
    local pa = make_params("f32")
    local oa = optim.SGD(pa, o)
    run(oa, pa, gs, 1, 3)
    local pb = {}
    for i, p in ipairs(pa) do pb[i] = p:detach():clone():requires_grad_(true) end
    local ob = optim.SGD(pb, { lr = 1 })
    local path = os.tmpname()
    loom.save(oa:state_dict(), path)
    ob:load_state_dict(loom.load(path))
    os.remove(path)
    assert.is_not_nil(ob.state[1].momentum_buffer)
    run(oa, pa, gs, 4, 6)
    run(ob, pb, gs, 4, 6)
    R.assert_equal(flat_of(pb), flat_of(pa))
  end)
end)

describe("AdamW", function()
  local cases = {
    { "defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, wd 1e-2)", {} },
    { "betas, eps, weight decay", { lr = 0.01, betas = { 0.8, 0.95 }, eps = 1e-6, weight_decay = 0.1 } },
    { "no weight decay", { lr = 0.05, weight_decay = 0 } },
  }
  for _, c in ipairs(cases) do
    it(c[1] .. " over 6 steps matches the f64 rule with bias correction", function()
      local o = { lr = c[2].lr or 1e-3, betas = c[2].betas or { 0.9, 0.999 }, eps = c[2].eps or 1e-8,
                  weight_decay = c[2].weight_decay or 1e-2 }
      local gs = grad_schedule(shapes, 6)
      local params, p0 = make_params("f64")
      local opt = optim.AdamW(params, c[2])
      run(opt, params, gs, 1, 6)
      local ref, m, v = adamw_ref(p0, gs, o, 6)
      R.assert_close(flat_of(params), ref, 1e-12, 1e-14)
      for i = 1, #params do
        R.assert_close(R.flat(opt.state[i].exp_avg:totable()), m[i], 1e-12, 1e-15)
        R.assert_close(R.flat(opt.state[i].exp_avg_sq:totable()), v[i], 1e-12, 1e-15)
        assert.equal(6, opt.state[i].step)
      end
      local p32 = make_params("f32")
      for i, p in ipairs(p32) do loom.no_grad(function() p:copy_(loom.tensor(R.build(p0[i], shapes[i]))) end) end
      run(optim.AdamW(p32, c[2]), p32, gs, 1, 6)
      R.assert_close(flat_of(p32), ref, 1e-5, 1e-6)
    end)
  end

  it("the first step by hand moves each weight by about lr against its gradient's sign", function()
    -- step 1: m = 0.1 g, v = 0.001 g^2; m/bc1 = g, sqrt(v/bc2) = |g|:
    -- p = p (1 - lr wd) - lr g / (|g| + eps)
    local p = loom.tensor({ 1, -2 }, { dtype = "f64", requires_grad = true })
    local opt = optim.AdamW({ p }, { lr = 0.1, weight_decay = 0.5, eps = 1e-8 })
    p.grad = loom.tensor({ 3, -0.5 }, { dtype = "f64" })
    opt:step()
    R.assert_close(p:totable(), { 1 * 0.95 - 0.1 * 3 / (3 + 1e-8), -2 * 0.95 + 0.1 * 0.5 / (0.5 + 1e-8) }, 1e-14, 1e-14)
  end)

  it("bf16 parameters keep f32 master weights; the parameter is the master rounded", function()
    local o = { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0 }
    local vals = { 1, 0.5, -0.75, 2 }
    local p = loom.tensor(vals, { dtype = "bf16", requires_grad = true })
    local opt = optim.AdamW({ p }, o)
    local gs = {}
    for s = 1, 10 do gs[s] = { { 1, 1, -1, 1 } } end
    for s = 1, 10 do
      p.grad = loom.tensor(gs[s][1], { dtype = "bf16" })
      opt:step()
    end
    local master = opt.state[1].master
    assert.equal("f32", master.dtype)
    assert.equal("f32", opt.state[1].exp_avg.dtype)
    local ref = adamw_ref({ vals }, gs, o, 10)[1]
    R.assert_close(master:totable(), ref, 1e-6, 1e-7)
    -- each step moves about lr = 1e-3: 10 steps move 1e-2; bf16's spacing at 1
    -- is 2^-7 = 0.0078, so without a master copy the first weight would
    -- never have moved (each 1e-3 update rounds back to 1)
    assert.is_true(math.abs(ref[1] - (1 - 0.01)) < 1e-4)
    local pv = p:to("f64"):totable()
    for i, m in ipairs(master:totable()) do assert.equal(R.bf16(m), pv[i]) end
    assert.is_true(pv[1] < 1)
    for i = 1, 4 do assert.is_true(math.abs(pv[i] - R.bf16(ref[i])) <= 2 ^ -7 * math.abs(ref[i])) end
  end)

  it("state_dict round trip (through loom.save) continues identically", function()
    local o = { lr = 0.01, betas = { 0.9, 0.95 }, weight_decay = 0.1 }
    local gs = grad_schedule(shapes, 8)
    local pa = make_params("f32")
    local oa = optim.AdamW(pa, o)
    run(oa, pa, gs, 1, 4)
    local path = os.tmpname()
    loom.save({ optim = oa:state_dict(), params = pa }, path)
    local ck = loom.load(path)
    os.remove(path)
    local pb = {}
    for i, p in ipairs(ck.params) do pb[i] = p:requires_grad_(true) end
    local ob = optim.AdamW(pb, { lr = 1 })            -- options come from the state_dict
    ob:load_state_dict(ck.optim)
    assert.equal(0.01, ob:get_lr())
    assert.equal(0.95, ob.defaults.beta2)
    run(oa, pa, gs, 5, 8)
    run(ob, pb, gs, 5, 8)
    R.assert_equal(flat_of(pb), flat_of(pa))
    -- the loaded state is a copy: stepping one does not move the other's
    assert.is_false(oa.state[1].exp_avg:data_ptr() == ob.state[1].exp_avg:data_ptr())
  end)

  it("checks betas", function()
    local p = loom.tensor({ 1 }, { requires_grad = true })
    assert.truthy(errmsg(optim.AdamW, { p }, { betas = 0.9 }):find("betas expected a table of two numbers", 1, true))
  end)
end)

describe("cosine schedule with warmup", function()
  local cosine_lr = optim.lr_scheduler.cosine_lr
  local o = { lr = 1, warmup = 10, total = 110, min_lr = 0.1 }
  it("warms up linearly, then decays along a half cosine to min_lr", function()
    R.assert_close(cosine_lr(1, o), 0.1, 1e-15, 0)
    R.assert_close(cosine_lr(5, o), 0.5, 1e-15, 0)
    R.assert_close(cosine_lr(10, o), 1, 1e-15, 0)
    -- 25 of 100 decay steps: 0.1 + 0.45 (1 + cos(pi/4))
    R.assert_close(cosine_lr(35, o), 0.1 + 0.45 * (1 + 0.70710678118654752), 1e-15, 0)
    R.assert_close(cosine_lr(60, o), 0.55, 1e-15, 1e-15)
    R.assert_close(cosine_lr(85, o), 0.1 + 0.45 * (1 - 0.70710678118654752), 1e-14, 0)
    assert.equal(0.1, cosine_lr(110, o))
    assert.equal(0.1, cosine_lr(500, o))
    -- no warmup: full lr at step 0's end, min_lr 0 by default
    R.assert_close(cosine_lr(50, { lr = 2, total = 100 }), 1, 1e-15, 1e-15)
  end)

  it("CosineWithWarmup sets the optimizer's lr at each step", function()
    local p = loom.tensor({ 1 }, { requires_grad = true })
    local opt = optim.SGD({ p }, { lr = 1 })
    local sched = optim.lr_scheduler.CosineWithWarmup(opt, { warmup = 10, total = 110, min_lr = 0.1 })
    R.assert_close(opt:get_lr(), 0.1, 1e-15, 0)
    for _ = 2, 60 do sched:step() end
    R.assert_close(opt:get_lr(), 0.55, 1e-15, 1e-15)
  end)
end)

describe("clip_grad_norm_", function()
  local clip = loom.nn.utils.clip_grad_norm_
  local function params_with(grads)
    local ps = {}
    for i, g in ipairs(grads) do
      ps[i] = loom.tensor(g, { dtype = "f64", requires_grad = true })
      ps[i].grad = loom.tensor(g, { dtype = "f64" })
    end
    return ps
  end

  it("returns the total norm and scales the gradients to max_norm", function()
    -- |(3, 4, 12)| = 13
    local ps = params_with({ { 3, 4 }, { 12 } })
    local extra = loom.tensor({ 5 }, { requires_grad = true })    -- no gradient: ignored
    ps[3] = extra
    local n = clip(ps, 6.5)
    assert.equal(13, n)
    local coef = 6.5 / (13 + 1e-6)
    R.assert_close(ps[1].grad:totable(), { 3 * coef, 4 * coef }, 1e-15, 0)
    R.assert_close(ps[2].grad:totable(), { 12 * coef }, 1e-15, 0)
    assert.is_nil(extra.grad)
    -- the norm after clipping is max_norm (up to the 1e-6 guard)
    R.assert_close(clip(ps, 100), 6.5, 1e-6, 0)
  end)

  it("leaves gradients alone below max_norm", function()
    local ps = params_with({ { 3, 4 }, { 12 } })
    assert.equal(13, clip(ps, 20))
    assert.same({ 3, 4 }, ps[1].grad:totable())
    assert.same({ 12 }, ps[2].grad:totable())
  end)

  -- f32 gradients are squared in f32 (each square rounded once) and
  -- summed in f64, the sum rounded to f32 per gradient: within 1e-7 of the
  -- exact norm
  it("sums the squares in f64 over f32 and bf16 gradients and takes a single tensor", function()
    local p = loom.tensor({ 1, 1 }, { requires_grad = true })
    p.grad = loom.tensor({ 0.1, 0.2 })
    R.assert_close(clip(p, 1), math.sqrt(R.f32(0.1) ^ 2 + R.f32(0.2) ^ 2), 1e-7, 0)
    local b = loom.tensor({ 1, 1 }, { dtype = "bf16", requires_grad = true })
    b.grad = loom.tensor({ 3, 4 }, { dtype = "bf16" })
    assert.equal(5, clip({ b }, 10))
    local ok, err = pcall(clip, { p }, 0)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("max_norm expected a positive number", 1, true))
  end)
end)
