-- moe_spec.lua: nn.MoE against transformers' MixtralSparseMoeBlock and
-- Qwen3MoeSparseMoeBlock (norm_topk_prob false and true): the fixtures in
-- spec/fixtures/moe/ were made by scripts/make_moe_fixtures.py with
-- transformers 5.24 (eager experts, f32, random weights, some experts
-- without tokens): forward output, router logits, the load-balancing and z
-- losses, the gradients of x and of every weight, and one AdamW step, all
-- within 1e-5 of the largest reference value. Then, against a loop over
-- tokens written here: capacity drops, counted; f64 central differences;
-- bf16; the multi-layer load-balancing loss; the errors.
local loom = require("loom")
local nn = require("loom.nn")
local R = require("support.ref")

local DIR = "spec/fixtures/moe/"
local NAMES = { "gate.weight", "experts.w1", "experts.w2", "experts.w3" }

-- max |got - want| / max |want|
local function rel(got, want)
  local d = (got:to("f64") - want:to("f64")):abs():max():item()
  return d / math.max(want:to("f64"):abs():max():item(), 1e-30)
end

local function param(m, name)
  return name == "gate.weight" and m.gate.weight or m.experts[name:sub(9)]
end

-- the module a fixture describes, with its weights
local function from_fixture(fx)
  local meta = fx.meta:totable()
  local w1 = fx["experts.w1"]
  local m = nn.MoE { dim = w1:size(3), hidden = w1:size(2), experts = w1:size(1), top_k = meta[1],
                     norm_topk_prob = meta[2] == 1, aux_loss_coef = meta[3] / 1e6,
                     router_z_loss_coef = meta[4] / 1e6 }
  local sd = {}
  for _, n in ipairs(NAMES) do sd[n] = fx[n] end
  m:load_state_dict(sd)
  return m
end

describe("nn.MoE against transformers", function()
  for _, case in ipairs { "mixtral", "qwen3_moe", "qwen3_moe_norm" } do
    it("equals " .. case .. "'s sparse block: forward, losses, gradients and one AdamW step (f32, 1e-5)", function()
      local fx = loom.load_safetensors(DIR .. case .. ".safetensors")
      local m = from_fixture(fx)
      local x = fx.x:clone():requires_grad_()
      local out = m(x)
      local bad = {}
      local function check(what, got, want)
        local e = rel(got, want)
        if not (e <= 1e-5) then bad[#bad + 1] = string.format("%s: relative error %.3g", what, e) end
      end
      check("output", out, fx.out)
      check("router logits", m.router_logits, fx.router_logits)
      check("load-balancing loss", m.balance_loss:reshape(1), fx.aux)
      check("z-loss", m.z_loss:reshape(1), fx.z)
      assert.same(fx.counts:totable(), m.tokens_per_expert)
      assert.equal(0, m.dropped)
      local loss = (out * fx.r):sum() + m.aux_loss
      loss:backward()
      check("grad of x", x.grad, fx["grad.x"])
      for _, n in ipairs(NAMES) do check("grad of " .. n, param(m, n).grad, fx["grad." .. n]) end
      local opt = loom.optim.AdamW(m:parameters(), { lr = 1e-2, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0.01 })
      opt:step()
      for _, n in ipairs(NAMES) do check("after a step, " .. n, param(m, n), fx["step." .. n]) end
      assert.same({}, bad)
    end)
  end

  it("names its parameters so a checkpoint's names map onto them", function()
    local m = nn.MoE { dim = 6, hidden = 10, experts = 4 }
    local got = {}
    for _, kv in ipairs(m:named_parameters()) do got[#got + 1] = kv[1] .. " " .. tostring(kv[2]:size()) end
    assert.same({ "gate.weight loom.Size{4, 6}", "experts.w1 loom.Size{4, 10, 6}", "experts.w2 loom.Size{4, 6, 10}",
                  "experts.w3 loom.Size{4, 10, 6}" }, got)
  end)
end)

-- The block written out token by token (f64 tables from the module's own
-- weights): the router's softmax, its top k by sorting, the weights
-- renormalised, each kept (token, expert) pair's SwiGLU MLP; pairs past
-- an expert's capacity (in token order) dropped.
local function reference(m, x, capacity)
  local W = {}
  for _, n in ipairs(NAMES) do W[n] = param(m, n):to("f64"):totable() end
  local xs = x:to("f64"):totable()
  local E, k, D, H = m.num_experts, m.top_k, m.dim, m.hidden
  local taken, out, dropped = {}, {}, 0
  for e = 1, E do taken[e] = 0 end
  local function dot(a, b) local s = 0 for i = 1, #a do s = s + a[i] * b[i] end return s end
  for t, xt in ipairs(xs) do
    local logit, mx, z, p = {}, -math.huge, 0, {}
    for e = 1, E do logit[e] = dot(W["gate.weight"][e], xt) mx = math.max(mx, logit[e]) end
    for e = 1, E do p[e] = math.exp(logit[e] - mx) z = z + p[e] end
    local order = {}
    for e = 1, E do p[e] = p[e] / z order[e] = e end
    table.sort(order, function(a, b) return p[a] > p[b] end)
    local s = 0
    for j = 1, k do s = s + p[order[j]] end
    out[t] = {}
    for d = 1, D do out[t][d] = 0 end
    for j = 1, k do
      local e = order[j]
      local w = m.norm_topk_prob and p[e] / s or p[e]
      taken[e] = taken[e] + 1
      if capacity and taken[e] > capacity then
        dropped = dropped + 1
      else
        local h = {}
        for i = 1, H do
          local g, u = dot(W["experts.w1"][e][i], xt), dot(W["experts.w3"][e][i], xt)
          h[i] = g / (1 + math.exp(-g)) * u
        end
        for d = 1, D do out[t][d] = out[t][d] + w * dot(W["experts.w2"][e][d], h) end
      end
    end
  end
  return loom.tensor(out, { dtype = "f64" }), dropped
end

describe("nn.MoE", function()
  it("equals the block written token by token, without drops by default", function()
    loom.manual_seed(11)
    local m = nn.MoE { dim = 8, hidden = 12, experts = 5, top_k = 2 }
    local x = loom.randn(3, 7, 8)
    local want = reference(m, x:reshape(21, 8))
    local y = m(x)
    assert.same({ 3, 7, 8 }, y:size():totable())
    assert.is_true(rel(y:reshape(21, 8), want) <= 1e-5)
    local n = 0
    for _, c in ipairs(m.tokens_per_expert) do n = n + c end
    assert.equal(42, n)
    assert.equal(0, m.dropped)
    assert.is_nil(m.aux_loss) -- no coefficient, no loss terms
  end)

  it("drops assignments past an expert's capacity, in token order, and counts them", function()
    loom.manual_seed(12)
    local m = nn.MoE { dim = 6, hidden = 8, experts = 4, top_k = 2, capacity_factor = 0.5, norm_topk_prob = false }
    local x = loom.randn(16, 6)
    local y = m(x)
    local cap = math.ceil(0.5 * 16 * 2 / 4)
    local want, dropped = reference(m, x, cap)
    assert.is_true(dropped > 0, "the case drops some")
    assert.equal(dropped, m.dropped)
    assert.is_true(rel(y, want) <= 1e-5)
    local over = 0
    for _, c in ipairs(m.tokens_per_expert) do over = over + math.max(0, c - cap) end
    assert.equal(over, m.dropped)
    -- the dropped pairs get no gradient; the kept ones do
    m(x:clone():requires_grad_()):sum():backward()
    assert.is_true(m.experts.w1.grad:abs():sum():item() > 0)
  end)

  it("has gradients that match central differences (f64, top-3 of 4, a capacity)", function()
    loom.manual_seed(13)
    local m = nn.MoE { dim = 3, hidden = 4, experts = 4, top_k = 3, capacity_factor = 0.8,
                       aux_loss_coef = 0.1, router_z_loss_coef = 0.01 }
    m:to({ dtype = "f64" })
    local x = loom.randn(5, 3):to("f64")
    local inputs = {}
    for i, t in ipairs { x, m.gate.weight, m.experts.w1, m.experts.w2, m.experts.w3 } do
      inputs[i] = t:detach():clone():requires_grad_()
    end
    R.gradcheck(function(xx, g, w1, w2, w3)
      m.gate.weight, m.experts.w1, m.experts.w2, m.experts.w3 = g, w1, w2, w3
      return m(xx) + m.aux_loss -- the router's losses broadcast over the output
    end, inputs, { tol = 1e-6 })
    assert.is_true(m.dropped > 0, "the capacity drops some")
  end)

  it("runs in bf16 near its f32 self", function()
    loom.manual_seed(14)
    local m = nn.MoE { dim = 16, hidden = 32, experts = 4, top_k = 2 }
    local x = loom.randn(8, 16)
    local want = m(x)
    m:bfloat16()
    local y = m(x:to("bf16"))
    assert.equal("bf16", y.dtype)
    assert.is_true(rel(y, want) < 0.05, "relative error " .. rel(y, want))
  end)

  it("gives transformers' load-balancing loss over several layers", function()
    loom.manual_seed(15)
    local l1, l2 = loom.randn(6, 4), loom.randn(9, 4)
    local got = nn.MoE.load_balancing_loss({ l1, l2 }, 4, 2):item()
    -- by hand: assignment counts and probability sums over both layers' rows
    local count, psum = { 0, 0, 0, 0 }, { 0, 0, 0, 0 }
    for _, l in ipairs { l1, l2 } do
      for _, row in ipairs(l:softmax(2):totable()) do
        local order = { 1, 2, 3, 4 }
        table.sort(order, function(a, b) return row[a] > row[b] end)
        for j = 1, 2 do count[order[j]] = count[order[j]] + 1 end
        for e = 1, 4 do psum[e] = psum[e] + row[e] end
      end
    end
    local want = 0
    for e = 1, 4 do want = want + (count[e] / 15) * (psum[e] / 15) end
    assert.is_true(math.abs(got - 4 * want) < 1e-6)
    local fx = loom.load_safetensors(DIR .. "mixtral.safetensors")
    assert.is_true(rel(nn.MoE.load_balancing_loss({ fx.router_logits }, 6, 2):reshape(1), fx.aux) <= 1e-6)
  end)

  it("refuses bad options and inputs, naming them", function()
    local function err(opts) return R.errmsg(function() return nn.MoE(opts) end) end
    assert.matches("MoE: dim expected an integer", err { hidden = 4, experts = 2 })
    assert.matches("MoE: top_k expected an integer in %[1, 3%], got 4", err { dim = 2, hidden = 4, experts = 3, top_k = 4 })
    assert.matches("MoE: capacity_factor expected a finite number > 0, got 0", err { dim = 2, hidden = 4, experts = 3, capacity_factor = 0 })
    assert.matches("MoE: norm_topk_prob expected a boolean", err { dim = 2, hidden = 4, experts = 3, norm_topk_prob = 1 })
    assert.matches("options expected only the keys", err { dim = 2, hidden = 4, experts = 3, topk = 2 })
    local m = nn.MoE { dim = 4, hidden = 4, experts = 2, top_k = 1 }
    assert.matches("MoE: input expected a tensor of size %(..., 4%), got size loom.Size{2, 3}",
                   R.errmsg(function() return m(loom.zeros(2, 3)) end))
  end)
end)

-- on a GPU (the emulated device under LOOM_LIBRARY=build-emu/libloom.so):
-- the fixture's forward and gradients on cuda; said and skipped without one
describe("nn.MoE on cuda", function()
  if loom.cuda.device_count() == 0 then
    it("is skipped: no GPU here", function() assert.equal(0, loom.cuda.device_count()) end)
    return
  end
  it("equals qwen3_moe's block there too (grouped GEMMs on cuBLAS)", function()
    local fx = loom.load_safetensors(DIR .. "qwen3_moe.safetensors")
    local m = from_fixture(fx)
    m:to("cuda")
    local x = fx.x:to("cuda"):requires_grad_()
    local out = m(x)
    local loss = (out * fx.r:to("cuda")):sum() + m.aux_loss
    loss:backward()
    assert.is_true(rel(out:to("cpu"), fx.out) <= 1e-5)
    assert.is_true(rel(x.grad:to("cpu"), fx["grad.x"]) <= 1e-5)
    for _, n in ipairs(NAMES) do assert.is_true(rel(param(m, n).grad:to("cpu"), fx["grad." .. n]) <= 1e-5, n) end
  end)
end)
