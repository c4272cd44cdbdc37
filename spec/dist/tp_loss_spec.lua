-- tp_loss_spec.lua: loss_parallel (vocab-parallel cross entropy) against
-- F.cross_entropy on the full logits, for every option (weight,
-- ignore_index, reduction none/mean/sum, label_smoothing), 2-D and 3-D
-- logits, an uneven class count (7 classes over 2 or 4 ranks), loss and
-- logits gradient; collective counts. Runs on 1, 2 and 4 ranks.
-- Tolerance: f32 rtol 1.3e-6 / atol 1e-5; f64 rtol 1e-12 / atol 1e-12.
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local H = require("support.tp")
local F, Shard, Replicate = loom.F, dist.Shard, dist.Replicate
local mesh = H.world_mesh()

local C = 7

-- logits (rows, C) or (2, rows/2, C) and targets, the same on every rank
local function data(seed, shape, dtype)
  loom.manual_seed(seed)
  local logits = (loom.randn(shape) * 3):to(dtype or "f32")
  local lead = { unpack(shape, 1, #shape - 1) }
  local tgt = loom.randint(1, C + 1, lead)
  return logits, tgt
end

-- fixed random weights for an unreduced loss, so backward sees distinct grads per row
local function weights(loss)
  loom.manual_seed(4242)
  return (loom.rand(loss:size()) + 0.5):to(loss.dtype)
end

-- loss and logits gradient of loss_parallel vs the full cross_entropy
local function compare(bad, what, logits, tgt, opts, rtol, atol)
  local full = logits:clone():requires_grad_(true)
  local want = F.cross_entropy(full, tgt, opts)
  local d = dist.distribute_tensor(logits:clone(), mesh, { Shard(-1) })
  d:requires_grad_(true)
  local cmf, cmb
  local got = tp.loss_parallel(function()
    local l
    cmf, l = dist.comm_mode(function() return F.cross_entropy(d, tgt, opts) end)
    local w = opts and opts.reduction == "none" and weights(want) or nil
    cmb = dist.comm_mode(function() if w then (l * w):sum():backward() else l:backward() end end)
    return l
  end)
  local w = opts and opts.reduction == "none" and weights(want) or nil
  if w then (want * w):sum():backward() else want:backward() end
  H.close(bad, what .. " loss", got, want:detach(), rtol, atol)
  if not (dist.is_dtensor(d.grad) and d.grad.placements[1] == Shard(2 + (logits:dim() - 2))) then
    bad[#bad + 1] = what .. ": the logits gradient should stay sharded on the class dim"
  end
  H.close(bad, what .. " grad", d.grad, full.grad, rtol, atol)
  return cmf, cmb
end

describe("loss_parallel", function()
  it("plain cross entropy: three all_reduces in forward, none in backward", function()
    local logits, tgt = data(1, { 6, C })
    local bad = {}
    local cmf, cmb = compare(bad, "plain", logits, tgt)
    assert.same({}, bad)
    assert.equal(3, cmf.counts.all_reduce)
    assert.equal(3, cmf:get_total_counts())
    assert.equal(0, cmb:get_total_counts())
  end)

  for _, red in ipairs { "mean", "sum", "none" } do
    it("reduction=" .. red .. " on 3-D logits (B, T, C)", function()
      local logits, tgt = data(2, { 2, 5, C })
      local bad = {}
      compare(bad, red, logits, tgt, { reduction = red })
      assert.same({}, bad)
    end)
  end

  -- under autocast a loss runs in f32 (F.cross_entropy's rule): bf16
  -- logits give an f32 loss equal to the full one's, tolerance f32's
  it("bf16 logits under autocast: the loss and its gradient in f32, as F.cross_entropy's", function()
    local logits, tgt = data(7, { 6, C }, "bf16")
    local bad = {}
    loom.autocast("bf16", function() compare(bad, "autocast bf16", logits, tgt, nil, 1.3e-6, 1e-5) end)
    assert.same({}, bad)
    local d = dist.distribute_tensor(logits:clone(), mesh, { Shard(-1) })
    local l = tp.loss_parallel(function() return loom.autocast("bf16", function() return F.cross_entropy(d, tgt) end) end)
    assert.equal("f32", (dist.is_dtensor(l) and l:to_local() or l).dtype)
  end)

  it("weight (per class)", function()
    local logits, tgt = data(3, { 8, C })
    loom.manual_seed(31)
    local w = loom.rand(C) + 0.5
    local bad = {}
    for _, red in ipairs { "mean", "sum", "none" } do compare(bad, "weight " .. red, logits, tgt, { weight = w, reduction = red }) end
    assert.same({}, bad)
  end)

  it("ignore_index: the default -100 and a class id", function()
    local logits, tgt = data(4, { 8, C })
    local t1 = tgt:clone()
    t1:narrow(1, 2, 2):fill_(-100)
    local t2 = tgt:clone()
    t2:narrow(1, 5, 1):fill_(3)
    local bad = {}
    for _, red in ipairs { "mean", "sum", "none" } do
      compare(bad, "ignore -100 " .. red, logits, t1, { reduction = red })
      compare(bad, "ignore 3 " .. red, logits, t2, { ignore_index = 3, reduction = red })
    end
    assert.same({}, bad)
  end)

  it("label_smoothing, alone and with weight and ignore_index", function()
    local logits, tgt = data(5, { 2, 4, C })
    local t = tgt:clone()
    t:narrow(2, 1, 1):fill_(-100)
    loom.manual_seed(32)
    local w = loom.rand(C) + 0.5
    local bad = {}
    for _, red in ipairs { "mean", "sum", "none" } do
      compare(bad, "smoothing " .. red, logits, tgt, { label_smoothing = 0.1, reduction = red })
      compare(bad, "smoothing+weight+ignore " .. red, logits, t,
              { label_smoothing = 0.2, weight = w, ignore_index = -100, reduction = red })
    end
    assert.same({}, bad)
  end)

  it("f64 logits, to f64 precision", function()
    local logits, tgt = data(6, { 5, C }, "f64")
    local bad = {}
    compare(bad, "f64", logits, tgt, { label_smoothing = 0.1 }, H.RTOL64, H.ATOL64)
    assert.same({}, bad)
  end)

  it("plain logits inside loss_parallel compute as usual; results pass through", function()
    local logits, tgt = data(7, { 4, C })
    local a, b = tp.loss_parallel(function() return F.cross_entropy(logits, tgt), 42 end)
    assert.equal(42, b)
    local bad = {}
    H.close(bad, "plain", a, F.cross_entropy(logits, tgt), 0, 0)
    assert.same({}, bad)
  end)

  it("the output of a Colwise projection with use_local_output=false feeds it directly", function()
    local ref, m = H.twins(8, loom.nn.Linear, 6, C)
    tp.parallelize_module(m, mesh, tp.ColwiseParallel{ use_local_output = false })
    loom.manual_seed(9)
    local x = loom.rand(5, 6)
    local tgt = loom.randint(1, C + 1, { 5 })
    local lr = F.cross_entropy(ref(x), tgt)
    lr:backward()
    local l = tp.loss_parallel(function() local l = F.cross_entropy(m(x), tgt) l:backward() return l end)
    local bad = {}
    H.close(bad, "loss", l, lr)
    H.compare_params(bad, "linear", m, ref, true)
    assert.same({}, bad)
  end)

  it("errors name loss_parallel: logits not sharded on the class dim, targets not class ids", function()
    local logits, tgt = data(10, { 4, C })
    local rep = dist.distribute_tensor(logits, mesh, { Replicate() })
    assert.error_matches(function() tp.loss_parallel(function() return F.cross_entropy(rep, tgt) end) end,
                         "loss_parallel.*sharded on the class dim")
    local rows = dist.distribute_tensor(logits, mesh, { Shard(1) })
    assert.error_matches(function() tp.loss_parallel(function() return F.cross_entropy(rows, tgt) end) end,
                         "loss_parallel.*Shard%(dim=1%)")
    local d = dist.distribute_tensor(logits, mesh, { Shard(2) })
    local probs = logits:softmax(2)
    assert.error_matches(function() tp.loss_parallel(function() return F.cross_entropy(d, probs) end) end,
                         "loss_parallel expects class ids as targets")
    assert.error_matches(function() tp.loss_parallel(42) end, "loss_parallel")
    -- the error leaves F.cross_entropy as it was
    local bad = {}
    H.close(bad, "after errors", F.cross_entropy(logits, tgt), F.cross_entropy(logits:clone(), tgt), 0, 0)
    assert.same({}, bad)
  end)
end)
