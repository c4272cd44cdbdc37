-- hf_families_spec.lua: each family of spec/fixtures/families (Llama 3,
-- Qwen2, Qwen3, Mistral, Phi-3, Gemma, OLMo 2; checked against transformers
-- in spec/hf_families_spec.lua) at TP = the world size under its own plan
-- (its recipe's: with q/k norms, fused projections split, post-norms),
-- with sequence parallelism, and under FSDP over the world, against the
-- same checkpoint in one process: the loss, every gradient (in HF's
-- layout) and the parameters after one AdamW step, relative 1e-5 of each
-- tensor's largest value.
local loom = require("loom")
local dist = require("loom.distributed")
local fsdp = require("loom.distributed.fsdp")
local H = require("support.tp")
local hf = loom.models.hf

local FIX = "spec/fixtures/families/"
local FAMILIES = { "llama3", "qwen2", "qwen3", "mistral", "phi3", "gemma", "olmo2", "mixtral", "qwen3_moe" }
local mesh = H.world_mesh()

local function rel(a, b)
  local d = (a:to("f64") - b:to("f64")):abs():max():item()
  return d / math.max(b:to("f64"):abs():max():item(), 1e-30)
end

-- loss, HF-named gradients and HF-named parameters after one AdamW step
local function train_step(model, ref, lp)
  local loss
  local function fb()
    loss = loom.F.cross_entropy(model(ref.ids + 1), ref.targets + 1)
    local aux = model:aux_loss()   -- (the experts' load-balancing loss)
    if aux then loss = loss + aux end
    loss:backward()
  end
  if lp then require("loom.parallel").loss_parallel(fb) else fb() end
  local grads = hf.hf_grads(model)
  loom.optim.AdamW(model:parameters(), { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-3, weight_decay = 0.1 }):step()
  return loss:item(), grads, hf.hf_state_dict(model)
end

local function compare(bad, what, got, want)
  if math.abs(got[1] - want[1]) / want[1] > 1e-5 then
    bad[#bad + 1] = string.format("%s: loss %.9g vs %.9g", what, got[1], want[1])
  end
  for i, kind in ipairs { "grad", "after AdamW" } do
    for name, t in pairs(want[i + 1]) do
      local r = got[i + 1][name] and rel(got[i + 1][name], t) or math.huge
      if r > 1e-5 then bad[#bad + 1] = string.format("%s: %s %s rel %.3e", what, kind, name, r) end
    end
  end
end

describe("model families at TP, TP + SP and FSDP", function()
  for _, name in ipairs(FAMILIES) do
    it(name .. " equals one process (loss, every gradient, an AdamW step)", function()
      local ref = loom.load_safetensors(FIX .. name .. "/reference.safetensors")
      local want = { train_step(hf.from_pretrained(FIX .. name), ref) }
      local bad = {}
      for _, sp in ipairs { false, true } do
        local m = hf.from_pretrained(FIX .. name, { tp_mesh = mesh, plan = { sequence_parallel = sp, loss_parallel = true } })
        compare(bad, "tp" .. H.ws .. (sp and " + sp" or ""), { train_step(m, ref, true) }, want)
      end
      local m = hf.from_pretrained(FIX .. name)
      for _, block in ipairs(loom.models.recipe(m).fsdp_units(m)) do fsdp.fully_shard(block, { mesh = mesh }) end
      fsdp.fully_shard(m, { mesh = mesh })
      compare(bad, "fsdp" .. H.ws, { train_step(m, ref) }, want)
      assert.same({}, bad)
      assert.is_true(dist.world_size() > 1)
    end)
  end
end)
