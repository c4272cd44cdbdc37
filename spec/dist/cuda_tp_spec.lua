-- cuda_tp_spec.lua: tensor parallelism on GPUs over NCCL: the Llama TP plan
-- with sequence parallel and loss parallel on a "cuda" mesh (each rank on
-- its GPU) equals the unsharded model on one GPU: forward, backward and an
-- AdamW step (f32, rtol 1e-5 / atol 1e-5: GPU reductions reorder sums).
-- Skips, saying so, on machines without a GPU for every rank.
local loom, dist, tp = require("loom"), require("loom.distributed"), require("loom.parallel")
local tr = loom.models.transformer

local ngpu = loom.cuda.device_count()
local ws = dist.world_size()
local G = require("support.cuda")
if ngpu == 0 and G.gpu_here() then -- a GPU is here but loom cannot use it: fail, never skip
  G.skip(describe, it, "tensor parallelism on GPUs")
  return
end
if ngpu < ws then -- NCCL needs a GPU of its own for each rank
  local why = ngpu == 0 and "no GPU here (" .. tostring(select(2, loom.device_available("cuda:0"))) .. ")"
              or string.format("%d GPUs for %d ranks", ngpu, ws)
  print("skipping tensor parallelism on GPUs: " .. why)
  describe("tensor parallelism on GPUs", function()
    it("is skipped: " .. why, function() assert.is_true(ngpu < ws) end)
  end)
  return
end

local function close(a, b, what)
  if a.dist ~= nil then a = a:full_tensor() end
  if b.dist ~= nil then b = b:full_tensor() end
  local d = (a:to("cpu"):to("f64") - b:to("cpu"):to("f64")):abs()
  local tol = b:to("cpu"):to("f64"):abs() * 1e-5 + 1e-5
  assert.is_true(d:le(tol):to("f32"):sum():item() == d:numel(), what .. ": max diff " .. d:max():item())
end

describe("tensor parallelism on GPUs", function()
  for _, o in ipairs { { sp = false, lp = false }, { sp = true, lp = true } } do
    it(string.format("equals one GPU (sequence parallel %s, loss parallel %s)", tostring(o.sp), tostring(o.lp)), function()
      local mesh = dist.init_device_mesh("cuda", { ws })
      local cfg = { vocab_size = 64, dim = 64, n_layers = 2, n_heads = 4, max_seq_len = 32 }
      loom.manual_seed(3)
      local ref = loom.device("cuda"):use(tr.new, cfg)
      loom.manual_seed(3)
      local m = loom.device("cuda"):use(tr.new, cfg)
      tp.parallelize_module(m, mesh, tr.tp_plan({ sequence_parallel = o.sp, loss_parallel = o.lp, tp = ws }, m))
      loom.manual_seed(9)
      local ids = loom.randint(1, 65, { 2, 16 }):to("cuda")
      local tgt = loom.randint(1, 65, { 2, 16 }):to("cuda")
      local logits = m(ids)
      local loss
      if o.lp then
        loss = tp.loss_parallel(function() local l = loom.F.cross_entropy(logits, tgt) l:backward() return l end)
      else
        loss = loom.F.cross_entropy(logits, tgt)
        loss:backward()
      end
      local lr = loom.F.cross_entropy(ref(ids), tgt)
      lr:backward()
      close(loss, lr, "loss")
      local pm, pr = m:named_parameters(), ref:named_parameters()
      for i = 1, #pm do close(pm[i][2].grad, pr[i][2].grad, "grad of " .. pm[i][1]) end
      -- eps 1e-4, not 1e-8: AdamW's first step is lr * g / (|g| + eps), which
      -- for a gradient that is rounding noise around 0 is +-lr by its sign
      -- (the emulated device found a 6e-5 difference there with eps 1e-8)
      loom.optim.AdamW(m:parameters(), { lr = 1e-2, eps = 1e-4 }):step()
      loom.optim.AdamW(ref:parameters(), { lr = 1e-2, eps = 1e-4 }):step()
      for i = 1, #pm do close(pm[i][2], pr[i][2], pm[i][1] .. " after AdamW") end
    end)
  end

  -- review item 1: each rank makes a context on its own GPU only (on the
  -- emulated device, which counts them; a GPU has no such counter)
  it("makes no context on another rank's GPU", function()
    local c, why = loom.cuda.emu_counters()
    if not c then -- a GPU build: its runtime counts nothing
      return assert.truthy(why:find("not an emulated CUDA build", 1, true), why)
    end
    assert.equal(0, c.contexts_other_device, "rank " .. dist.rank() .. " made a context on another GPU")
  end)
end)
